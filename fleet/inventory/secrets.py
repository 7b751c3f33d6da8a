"""Secrets Switchyard keeps in its database (cluster tokens and kubeconfigs), encrypted.

Fernet (AES-128-CBC with HMAC-SHA256, from ``cryptography``) with a key derived from
``SWITCHYARD_SECRET_KEY`` (default: Django's ``SECRET_KEY``). Rotating that key makes stored
secrets unreadable: they must be entered again (or referenced from the environment instead).

A secret may also be referenced by the name of an environment variable of Switchyard's
processes, but only one that ``SWITCHYARD_KUBE_SECRET_ENV_ALLOWED`` names
(:func:`check_env_name`): whatever is read is sent to a URL the platform admin chose, and the
process's other variables (``SECRET_KEY``, ``DATABASE_URL``, ...) must never leave that way.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

from console.exceptions import DomainError


class SecretUnreadable(DomainError):
    """A stored secret cannot be decrypted with the current key."""


class EnvNotAllowed(DomainError):
    """An environment variable the platform does not let a secret be read from."""


def env_name_allowed(name: str) -> bool:
    """Whether a secret may be read from the environment variable ``name``."""
    return bool(name) and name in settings.SWITCHYARD_KUBE_SECRET_ENV_ALLOWED


def check_env_name(name: str, *, field: str = "kube_secret_env") -> None:
    """EnvNotAllowed on ``field`` unless ``SWITCHYARD_KUBE_SECRET_ENV_ALLOWED`` names ``name``."""
    if env_name_allowed(name):
        return
    allowed = ", ".join(settings.SWITCHYARD_KUBE_SECRET_ENV_ALLOWED) or "none"
    raise EnvNotAllowed(
        f"{name!r} is not an environment variable name Switchyard may read a secret from: only "
        f"those the platform names in SWITCHYARD_KUBE_SECRET_ENV_ALLOWED may be used "
        f"(now: {allowed})",
        field=field,
    )


def _fernet() -> Fernet:
    material = settings.SWITCHYARD_SECRET_KEY or settings.SECRET_KEY
    digest = hashlib.sha256(b"switchyard-secrets:" + material.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt(plain: str) -> str:
    """``plain`` encrypted (empty stays empty)."""
    if not plain:
        return ""
    return _fernet().encrypt(plain.encode()).decode()


def decrypt(token: str, *, field: str = "secret") -> str:
    """The plain text of :func:`encrypt`'s output; SecretUnreadable when the key changed."""
    if not token:
        return ""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise SecretUnreadable(
            "the stored secret cannot be decrypted with the current SWITCHYARD_SECRET_KEY; "
            "enter it again",
            field=field,
        ) from exc


def hint(plain: str) -> str:
    """What may be shown of a secret: its length and last four characters, never more."""
    if not plain:
        return ""
    if len(plain) <= 12:
        return f"{len(plain)} characters"
    return f"…{plain[-4:]} ({len(plain)} characters)"
