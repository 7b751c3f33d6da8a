"""Tenant webhooks: notifications of rollout state changes, approvals needed and rollbacks."""

from __future__ import annotations

from typing import Any

from fleet.models import Tenant


def emit(tenant: Tenant, event: str, payload: dict[str, Any], *, summary: str = "") -> int:
    """Queue ``event`` for every webhook of ``tenant`` that listens to it; returns how many
    deliveries were queued. Call it inside the transaction that made the change."""
    return 0
