"""Quota requests on pages other than the quotas page: the dashboard lists, for platform
admins, the requests waiting for their decision."""

from __future__ import annotations

from typing import Any

from django import template

from fleet.models import QuotaRequest
from fleet.tenancy.scoping import is_platform_admin

register = template.Library()
SHOWN = 10  # the oldest requests listed; the quotas page has them all


@register.simple_tag
def pending_quota_requests(user: Any) -> dict[str, Any] | None:
    """``{% pending_quota_requests user as asked %}``: the oldest pending requests and how
    many wait, for a platform admin (who decides them); None for anyone else."""
    if not is_platform_admin(user):
        return None
    pending = QuotaRequest.objects.filter(state=QuotaRequest.State.PENDING).select_related(
        "tenant").order_by("created_at", "id")
    return {"rows": list(pending[:SHOWN]), "count": pending.count()}
