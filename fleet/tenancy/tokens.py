"""API tokens: issue, authenticate, revoke.

A token reads ``sy_<prefix>_<secret>``. The prefix (8 characters) finds the row; the stored
digest is an HMAC-SHA256 of the whole token keyed with SECRET_KEY, compared in constant time.
Rotating SECRET_KEY therefore invalidates every token, on purpose.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.models import APIToken, Membership, Tenant
from fleet.tenancy.scoping import require_role, token_of

TOKEN_PREFIX = "sy_"
TOKEN_RE = re.compile(r"^sy_(?P<prefix>[0-9a-f]{8})_(?P<secret>[A-Za-z0-9_-]{20,})$")
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedToken:
    token: APIToken
    secret: str  # the full token, shown once


def _digest(raw: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), raw.encode(), hashlib.sha256).hexdigest()


def person_id(actor: Any) -> int | None:
    """The id of the person who stands behind ``actor``: the user itself, or for a token the
    person recorded on it (who made it, or who made the token that made it)."""
    if actor is None:
        return None
    token = token_of(actor)
    if token is not None:
        return token.created_by_id
    return actor.pk


def issue(
    actor: Any,
    tenant: Tenant,
    name: str,
    role: str = Membership.Role.DEPLOYER,
    expires_at: datetime | None = None,
) -> IssuedToken:
    """Create a token for ``tenant``. Needs the admin role in that tenant."""
    require_role(actor, tenant, Membership.Role.ADMIN)
    if expires_at is not None and expires_at <= timezone.now():
        raise Conflict("expiry must be in the future", field="expires_at")
    if not name or len(name) > 100:
        raise DomainError("give the token a name of 1 to 100 characters", field="name")
    active = APIToken.objects.filter(tenant=tenant, name=name, revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )
    if active.exists():
        raise Conflict(f"an active token named {name!r} already exists", field="name")
    maker = token_of(actor)
    prefix = secrets.token_hex(4)
    while APIToken.objects.filter(prefix=prefix).exists():  # pragma: no cover - 1 in 4 billion
        prefix = secrets.token_hex(4)
    raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    token = APIToken.objects.create(
        tenant=tenant,
        name=name,
        role=role,
        prefix=prefix,
        digest=_digest(raw),
        created_by_id=person_id(actor),
        created_by_token=maker,
        expires_at=expires_at,
    )
    audit.record(actor, "created", token, tenant=tenant, after={"name": name, "role": role})
    return IssuedToken(token=token, secret=raw)


def authenticate(raw: str) -> tuple[APIToken | None, str]:
    """Return (token, "") for a valid token, else (None, why) without saying which part failed
    beyond what the holder of the token may know (expired or revoked)."""
    # The secret part is URL-safe base64 and may itself contain "_": split by position.
    match = TOKEN_RE.match(raw)
    if match is None:
        return None, "malformed token"
    # The prefix is unique: ordered by id, not by the model's tenant slug and name (a sort).
    token = (APIToken.objects.select_related("tenant").filter(prefix=match["prefix"])
             .order_by().first())
    if token is None or not hmac.compare_digest(token.digest, _digest(raw)):
        return None, "invalid token"
    if token.is_revoked:
        return None, "token revoked"
    if token.is_expired:
        return None, "token expired"
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        APIToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token, ""


def revoke(actor: Any, token: APIToken, reason: str = "") -> APIToken:
    """Revoke a token (idempotent: revoking a revoked token changes nothing)."""
    require_role(actor, token.tenant, Membership.Role.ADMIN)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit.record(actor, "revoked", token, tenant=token.tenant, reason=reason)
    return token
