"""Each deployment's SLO status, error budget and burn rates, from its minute rollups.

A deployment's SLO has two objectives, each with an error budget: **errors** (at most
``slo_error_rate`` percent of requests fail: that share is the budget) and **latency** (99%
of the answered requests within ``slo_p99_ms``: 1% may be slower). Over a window, an
objective's *burn rate* is the share of its bad requests divided by its budget: 1.0 spends the
budget exactly by the end of the SLO window, 14.4 spends 2% of a 30-day budget in an hour.
The *budget left* is 1 minus the share spent over the deployment's ``slo_window_days``.

The counts come, per window, from the router where the deployment's traffic went through its
route (``RoutedMinute``, ``rollouts.slo.routed``: every request with its status and exact
latency), else from ``LatencyRollup`` (the servers' own metrics, upserted every scrape tick:
requests, failures and the answered requests slower than the latency SLO read off each
server's latency distribution, ``fleet.adapters.metrics.rates.share_over``). The servers'
metrics miss failures a backend answers itself (Triton counts a Python model's error answer
as a success), so a deployment without a route is judged on what its servers admit. A
window of N minutes takes the rows whose minute started within the last N minutes plus the
current one, so "5 minutes" is 5 to 6 minutes of traffic and moves with every tick.

:func:`evaluate` is pure (counts in, verdict out); :func:`counts` reads every deployment's
windows in one query.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, Sum

from rollouts.models import Deployment, LatencyRollup, RoutedMinute, SloStatus

#: The windows burn rates are read over (seconds).
WINDOWS: dict[str, int] = {"5m": 300, "30m": 1800, "1h": 3600, "6h": 21600}
LATENCY_BUDGET = 0.01  # the SLO is a p99: 1% of the answered requests may be slower
AT_RISK_BUDGET_LEFT = 0.25
BUDGET = "budget"  # the key of the SLO window's counts


@dataclass(frozen=True)
class Counts:
    requests: float = 0.0
    failures: float = 0.0
    slow: float = 0.0


@dataclass(frozen=True)
class Objective:
    """One objective's burn rate per window and the share of its budget left."""

    name: str
    budget: float
    burn: dict[str, float | None]
    budget_left: float | None

    def as_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "budget_left": finite(self.budget_left),
                "burn": {k: finite(v) for k, v in self.burn.items()}}


@dataclass(frozen=True)
class Verdict:
    state: str
    reason: str
    budget_left: float | None
    burn: dict[str, float | None]
    objectives: dict[str, Objective] = field(default_factory=dict)
    requests: dict[str, float] = field(default_factory=dict)


def finite(value: float | None) -> float | None:
    """JSON and the database take no infinity: a burn with a zero budget reads as 1e9."""
    if value is None:
        return None
    return min(value, 1e9)


def _burn(bad: float, total: float, budget: float) -> float | None:
    if total <= 0:
        return None
    ratio = bad / total
    if budget <= 0:
        return math.inf if ratio > 0 else 0.0
    return ratio / budget


def _objective(name: str, budget: float, counts: dict[str, Counts], bad: str) -> Objective:
    def total(c: Counts) -> float:
        # Latency is judged on the answered requests; errors on all of them.
        return c.requests - c.failures if bad == "slow" else c.requests

    burn = {w: _burn(getattr(counts.get(w, Counts()), bad), total(counts.get(w, Counts())), budget)
            for w in WINDOWS}
    spent = _burn(getattr(counts.get(BUDGET, Counts()), bad), total(counts.get(BUDGET, Counts())), budget)
    return Objective(name, budget, burn, None if spent is None else 1.0 - spent)


def _worst(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def evaluate(deployment: Deployment, counts: dict[str, Counts], *, alert_open: bool = False) -> Verdict:
    """The status of ``deployment`` from its counts per window (``WINDOWS`` keys and
    ``BUDGET``). ``alert_open``: a burn-rate alert is firing on it (breaching whatever the
    last five minutes say)."""
    error_budget = float(deployment.slo_error_rate) / 100.0
    objectives = {
        "errors": _objective("errors", error_budget, counts, "failures"),
        "latency": _objective("latency", LATENCY_BUDGET, counts, "slow"),
    }
    burn = {w: _worst(o.burn[w] for o in objectives.values()) for w in WINDOWS}
    lefts = [o.budget_left for o in objectives.values() if o.budget_left is not None]
    budget_left = min(lefts) if lefts else None
    requests = {w: counts.get(w, Counts()).requests for w in (*WINDOWS, BUDGET)}
    days = deployment.slo_window_days

    def verdict(state: str, reason: str) -> Verdict:
        return Verdict(state, reason[:300], budget_left, burn, objectives, requests)

    over = _over_now(deployment, counts.get("5m", Counts()), objectives)
    if over:
        return verdict(SloStatus.State.BREACHING, over)
    if budget_left is not None and budget_left <= 0:
        return verdict(SloStatus.State.BREACHING, f"the error budget of the last {days} days is spent "
                                                  f"({_pct(1 - budget_left)} of it)")
    if alert_open:
        return verdict(SloStatus.State.BREACHING, "a burn-rate alert is open")
    if not requests["5m"]:
        return verdict(SloStatus.State.NO_TRAFFIC, "no request in the last 5 minutes")
    if burn["1h"] is not None and burn["1h"] > 1:
        return verdict(SloStatus.State.AT_RISK,
                       f"the last hour spent the error budget {_times(burn['1h'])} as fast as "
                       f"{days} days allow")
    if budget_left is not None and budget_left < AT_RISK_BUDGET_LEFT:
        return verdict(SloStatus.State.AT_RISK,
                       f"{_pct(budget_left)} of the {days}-day error budget is left")
    return verdict(SloStatus.State.OK, "within the SLO")


def _over_now(deployment: Deployment, last: Counts, objectives: dict[str, Objective]) -> str:
    """Why the last five minutes are over the SLO as written, or ""."""
    reasons = []
    if (objectives["errors"].burn["5m"] or 0) > 1:
        reasons.append(f"{_pct(last.failures / last.requests)} of requests failed over the last "
                       f"5 minutes (ceiling {deployment.slo_error_rate}%)")
    if (objectives["latency"].burn["5m"] or 0) > 1:
        answered = last.requests - last.failures
        reasons.append(f"{_pct(last.slow / answered)} of answers were slower than "
                       f"{deployment.slo_p99_ms} ms over the last 5 minutes (1% allowed)")
    return "; ".join(reasons)


def _pct(share: float) -> str:
    value = share * 100
    return f"{value:.2g}%" if value < 10 else f"{value:.0f}%"


def _times(rate: float) -> str:
    return "infinitely" if math.isinf(rate) else f"{rate:.1f}x"


def counts(deployments: list[Deployment], now: datetime) -> dict[int, dict[str, Counts]]:
    """Every deployment's counts per window, in one query over the minute rollups."""
    if not deployments:
        return {}
    floor = now.replace(second=0, microsecond=0)
    starts = {w: floor - timedelta(seconds=s) for w, s in WINDOWS.items()}
    days = sorted({d.slo_window_days for d in deployments})
    starts.update({f"d{n}": floor - timedelta(days=n) for n in days})
    aggregates = {}
    for key, start in starts.items():
        for column in ("requests", "failures", "slow"):
            aggregates[f"{key}__{column}"] = Sum(column, filter=Q(minute__gte=start), default=0)
    by_id = {d.pk: d for d in deployments}
    sources = []
    for model in (LatencyRollup, RoutedMinute):
        rows = (model.objects.filter(deployment__in=deployments, minute__gte=min(starts.values()))
                .values("deployment").annotate(**aggregates))
        sources.append({row["deployment"]: row for row in rows})
    scraped, routed = sources
    found: dict[int, dict[str, Counts]] = {}
    for pk in scraped.keys() | routed.keys():
        deployment = by_id[pk]

        def of(key: str, pk: int = pk) -> Counts:
            # The router's counts where it saw the window's traffic, else the servers'.
            row = routed.get(pk) if routed.get(pk, {}).get(f"{key}__requests") else scraped.get(pk)
            if row is None:
                return Counts()
            return Counts(*(float(row[f"{key}__{c}"]) for c in ("requests", "failures", "slow")))

        found[pk] = {**{w: of(w) for w in WINDOWS}, BUDGET: of(f"d{deployment.slo_window_days}")}
    return found
