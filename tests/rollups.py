"""What the latency scraper rolled up, counted the way a test can rely on."""

from __future__ import annotations

from django.db.models import Sum

from rollouts.models import Deployment, LatencyRollup


def requests_rolled_up(deployment: Deployment, label: str | None = None) -> int:
    """Requests in every minute's rollup of ``deployment`` (of one ``label`` when given).

    The scraper keeps a row per minute, so two ticks a moment apart either side of a minute's
    start write two rows: a test that sums them holds whatever the clock says.
    """
    rows = LatencyRollup.objects.filter(deployment=deployment)
    if label is not None:
        rows = rows.filter(label=label)
    return rows.aggregate(total=Sum("requests"))["total"] or 0
