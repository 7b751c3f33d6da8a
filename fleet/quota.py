"""Quota usage: what each tenant holds against each quota, from active placements."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Sum

from fleet.models import Placement, Quota


@dataclass(frozen=True)
class QuotaUsage:
    quota: Quota
    units_used: int
    memory_used_mib: int

    @property
    def units_left(self) -> int:
        return max(self.quota.units - self.units_used, 0)

    @property
    def memory_left_mib(self) -> int:
        return max(self.quota.memory_mib - self.memory_used_mib, 0)

    @property
    def units_percent(self) -> int:
        return _percent(self.units_used, self.quota.units)

    @property
    def memory_percent(self) -> int:
        return _percent(self.memory_used_mib, self.quota.memory_mib)


def _percent(used: int, limit: int) -> int:
    if limit <= 0:
        return 100 if used else 0
    return min(round(100 * used / limit), 100)


def usage_for(quotas: list[Quota]) -> list[QuotaUsage]:
    """Usage of each quota, with one aggregate query for the lot."""
    if not quotas:
        return []
    rows = (
        Placement.objects.filter(
            state__in=Placement.HOLDING, tenant__in={q.tenant_id for q in quotas}
        )
        .values("tenant_id", "device_class")
        .annotate(units=Sum("units"), memory=Sum("memory_mib"))
    )
    held = {(r["tenant_id"], r["device_class"]): (r["units"], r["memory"]) for r in rows}
    return [
        QuotaUsage(q, *held.get((q.tenant_id, q.device_class), (0, 0)))
        for q in quotas
    ]
