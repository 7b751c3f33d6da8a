"""The audit trail: recording changes in the audit log, for every writer in every app.
Taking the log out and keeping it to its retention is ``fleet.audit.export``."""

from __future__ import annotations

from typing import Any

from django.db import models

from fleet.models import AuditEvent, Tenant
from fleet.tenancy.scoping import token_of


def actor_label(actor: Any) -> str:
    if actor is None:
        return "system"
    token = token_of(actor)
    if token is not None:
        return f"token:{token.name}@{token.tenant.slug}"
    return actor.get_username()


def snapshot(obj: models.Model, fields: list[str]) -> dict[str, Any]:
    """JSON-safe values of ``fields`` (foreign keys as ids), for before/after."""
    data: dict[str, Any] = {}
    for name in fields:
        field = obj._meta.get_field(name)
        value = getattr(obj, field.attname)
        if value is not None and not isinstance(value, (str, int, float, bool, list, dict)):
            value = str(value)
        data[name] = value
    return data


def record(
    actor: Any,
    verb: str,
    obj: models.Model,
    *,
    tenant: Tenant | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    reason: str = "",
) -> AuditEvent:
    """Append one event. ``actor`` is a user, a token principal, or None for the system."""
    token = token_of(actor) if actor is not None else None
    user = actor if actor is not None and token is None and actor.is_authenticated else None
    return AuditEvent.objects.create(
        tenant=tenant,
        actor_user=user,
        actor_token=token,
        actor_label=actor_label(actor),
        verb=verb,
        object_type=obj._meta.label_lower,
        object_id=str(obj.pk),
        object_repr=str(obj)[:300],
        before=before or {},
        after=after or {},
        reason=reason,
    )
