"""What the console shows of SLOs: the dashboard's summary (every deployment the viewer may
see that is not within its SLO, and the open alerts) and a deployment's own panel."""

from __future__ import annotations

from typing import Any

from django.db.models import Case, IntegerField, Value, When

from rollouts.models import Deployment, SloAlert, SloStatus
from rollouts.slo import neighbours

#: The order troubled deployments are listed in: the worst first.
SEVERITY = Case(When(state=SloStatus.State.BREACHING, then=Value(0)),
                When(state=SloStatus.State.AT_RISK, then=Value(1)), default=Value(2), output_field=IntegerField())
SHOWN = 10
WINDOWS = ("5m", "30m", "1h", "6h")


def summary(user: Any) -> dict[str, Any]:
    """Counts per state over the viewer's deployments in use, the troubled ones (breaching,
    then at risk, the longest first), and the firing alerts, newest first."""
    statuses = SloStatus.objects.visible_to(user).filter(deployment__archived_at__isnull=True)
    counts = {state: 0 for state in SloStatus.State.values}
    for row in statuses.values("state"):
        counts[row["state"]] += 1
    in_use = Deployment.objects.visible_to(user).filter(archived_at__isnull=True).count()
    counts[SloStatus.State.NO_TRAFFIC] += max(in_use - sum(counts.values()), 0)  # not evaluated yet
    troubled = (statuses.filter(state__in=(SloStatus.State.BREACHING, SloStatus.State.AT_RISK))
                .select_related("deployment__tenant").order_by(SEVERITY, "since"))
    firing = (SloAlert.objects.visible_to(user).filter(state=SloAlert.State.FIRING)
              .select_related("deployment__tenant"))
    return {
        "counts": [(SloStatus.State(s), counts[s]) for s in SloStatus.State.values if counts[s]],
        "troubled": list(troubled[:SHOWN]),
        "troubled_count": troubled.count(),
        "firing": list(firing[:SHOWN]),
        "firing_count": firing.count(),
        "deployment_count": in_use,
    }


def deployment_panel(user: Any, deployment: Deployment) -> dict[str, Any]:
    """A deployment's status (None before its first evaluation), its latest alerts, and the
    changes on its servers that coincided with it or another going over its SLO."""
    found = SloStatus.objects.filter(deployment=deployment).first()
    objectives = []
    if found is not None:
        for name, label in (("errors", "Errors"), ("latency", "Latency")):
            data = found.detail.get("objectives", {}).get(name)
            if data:
                objectives.append({"label": label, "budget_pct": data["budget"] * 100,
                                   "left_pct": None if data["budget_left"] is None else data["budget_left"] * 100,
                                   "burns": [data["burn"].get(w) for w in WINDOWS]})
    return {
        "slo": found,
        "objectives": objectives,
        "alerts": list(SloAlert.objects.filter(deployment=deployment)[:SHOWN]),
        "neighbours": neighbours.for_page(user, deployment, SHOWN),
        "window_days": deployment.slo_window_days,
        "budget_left_pct": None if found is None or found.budget_left is None else found.budget_left * 100,
    }
