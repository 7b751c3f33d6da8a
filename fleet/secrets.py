"""Secrets Switchyard keeps in its database (cluster tokens and kubeconfigs), encrypted.

Fernet (AES-128-CBC with HMAC-SHA256, from ``cryptography``) with a key derived from
``SWITCHYARD_SECRET_KEY`` (default: Django's ``SECRET_KEY``). Rotating that key makes stored
secrets unreadable: they must be entered again (or referenced from the environment instead).
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

from fleet.errors import DomainError


class SecretUnreadable(DomainError):
    """A stored secret cannot be decrypted with the current key."""


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
