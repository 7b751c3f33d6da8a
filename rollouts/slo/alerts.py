"""The SLO tick: every deployment's status brought up to date, burn-rate alerts opened and
resolved, and the tenant's webhooks told.

The rules are the Google SRE workbook's multiwindow, multi-burn-rate alerts, per objective
(errors, latency): **fast burn** when the last hour and the last 5 minutes both burn over
14.4 times the budget's rate (2% of a 30-day budget in an hour), **slow burn** when the last
6 hours and the last 30 minutes both burn over 6 (5% in 6 hours). An alert opens as a
``SloAlert`` row when both windows of its rule burn over the factor and resolves when the
short window no longer does, once it has been open for its short window at least (so it
ends minutes after the traffic recovers, not hours, and a start-up burst whose windows are
all the same minute does not open and resolve it within seconds). A
slow burn does not open on an objective a fast burn already fires on (Alertmanager users
write the same inhibition): one page for one incident.
``deploy/prometheus/slo-rules.yml`` states the same rules for Prometheus.

Idempotent: a tick that runs twice, or on two workers at once, opens one alert (a unique
constraint holds one firing alert per deployment, rule and objective) and tells it once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from fleet.webhooks import events as webhook_events
from rollouts.models import Deployment, SloAlert, SloStatus

from . import neighbours, routed, status

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    name: str
    long: str
    short: str
    factor: float


RULES = (Rule(SloAlert.Rule.FAST_BURN, "1h", "5m", 14.4), Rule(SloAlert.Rule.SLOW_BURN, "6h", "30m", 6.0))
WINDOW_WORDS = {"5m": "5 minutes", "30m": "30 minutes", "1h": "1 hour", "6h": "6 hours"}


def tick(now: datetime | None = None) -> dict[str, int]:
    """Evaluate every deployment in use. Returns counts for the log."""
    now = now or timezone.now()
    deployments = list(Deployment.objects.filter(archived_at__isnull=True).select_related("tenant", "model"))
    routed.fold(deployments, now.timestamp())
    found = status.counts(deployments, now)
    firing = {(a.deployment_id, a.rule, a.sli): a for a in SloAlert.objects.filter(state=SloAlert.State.FIRING)}
    current = {s.pk: s for s in SloStatus.objects.filter(deployment__in=deployments)}
    opened = resolved = changed = 0
    for deployment in deployments:
        counts = found.get(deployment.pk, {})
        verdict = status.evaluate(deployment, counts)
        alert_open = False
        fast: set[str] = set()  # objectives a fast burn fires on: no slow burn opens beside it
        for rule in RULES:
            for sli, objective in verdict.objectives.items():
                alert = firing.pop((deployment.pk, rule.name, sli), None)
                long, short = objective.burn[rule.long], objective.burn[rule.short]
                burning = long is not None and short is not None and long > rule.factor and short > rule.factor
                if rule.name == SloAlert.Rule.FAST_BURN and (burning or alert is not None):
                    fast.add(sli)
                if alert is None and burning and rule.name == SloAlert.Rule.SLOW_BURN and sli in fast:
                    continue
                if alert is None and burning:
                    opened += _open(deployment, rule, sli, long, short, now)
                    alert_open = True
                elif alert is not None and (short is None or short <= rule.factor) and \
                        now - alert.opened_at >= timedelta(seconds=status.WINDOWS[rule.short]):
                    resolved += _resolve(alert, short, now)
                else:
                    alert_open = alert_open or alert is not None
                    if alert is not None and short is not None and short > alert.peak_burn:
                        SloAlert.objects.filter(pk=alert.pk).update(peak_burn=status.finite(short))
        if alert_open:
            verdict = status.evaluate(deployment, counts, alert_open=True)
        changed += _save(deployment, verdict, current.get(deployment.pk), now)
        neighbours.record(deployment, verdict.state, verdict.reason, now)
    for alert in firing.values():  # its deployment was archived: nothing serves it any more
        resolved += _resolve(alert, None, now, why="resolved: the deployment was deleted (archived)")
    return {"deployments": len(deployments), "opened": opened, "resolved": resolved, "changed": changed}


def _burn_words(rate: float) -> str:
    return "without limit" if rate >= 1e9 else f"{rate:.1f}x"


def _open(deployment: Deployment, rule: Rule, sli: str, long: float, short: float, now: datetime) -> int:
    long, short = status.finite(long), status.finite(short)
    label = "error" if sli == SloAlert.Sli.ERRORS else "latency"
    summary = (f"{deployment.name}: {SloAlert.Rule(rule.name).label.lower()} of its {label} budget "
               f"({_burn_words(long)} over {WINDOW_WORDS[rule.long]}, {_burn_words(short)} over "
               f"{WINDOW_WORDS[rule.short]}; alert above {rule.factor:g}x)")
    try:
        with transaction.atomic():
            alert = SloAlert.objects.create(
                deployment=deployment, rule=rule.name, sli=sli, summary=summary[:300], burn_long=long,
                burn_short=short, peak_burn=short, opened_at=now,
                events=[{"at": now, "text": f"opened: {summary}"}],
            )
            _tell(alert, "slo.alert_opened")
    except IntegrityError:
        return 0  # another tick opened it
    log.info("SLO alert opened on %s: %s", deployment, summary)
    return 1


def _resolve(alert: SloAlert, short: float | None, now: datetime, why: str = "") -> int:
    rule = next(r for r in RULES if r.name == alert.rule)
    text = why or (f"resolved: the last {WINDOW_WORDS[rule.short]} burn "
                   + (f"{_burn_words(short)}" if short is not None else "nothing (no traffic)")
                   + f", not over {rule.factor:g}x")
    with transaction.atomic():
        updated = SloAlert.objects.filter(pk=alert.pk, state=SloAlert.State.FIRING).update(
            state=SloAlert.State.RESOLVED, resolved_at=now, events=[*alert.events, {"at": now, "text": text}])
        if not updated:
            return 0
        alert.refresh_from_db()
        _tell(alert, "slo.alert_resolved")
    log.info("SLO alert resolved on %s: %s", alert.deployment, text)
    return 1


def payload(alert: SloAlert) -> dict:
    deployment = alert.deployment
    return {
        "alert_id": alert.pk, "deployment": deployment.name, "model": deployment.model.name,
        "state": alert.state, "rule": alert.rule, "sli": alert.sli, "summary": alert.summary,
        "burn_long": alert.burn_long, "burn_short": alert.burn_short, "peak_burn": alert.peak_burn,
        "opened_at": alert.opened_at, "resolved_at": alert.resolved_at,
        "severity": "critical" if alert.rule == SloAlert.Rule.FAST_BURN else "error",
        "dedup_key": f"switchyard-slo-alert-{alert.pk}",
    }


def _tell(alert: SloAlert, event: str) -> None:
    word = "opened" if event == "slo.alert_opened" else "resolved"
    webhook_events.emit(alert.deployment.tenant, event, payload(alert),
                        summary=f"SLO alert {word}: {alert.summary}")


def _save(deployment: Deployment, verdict: status.Verdict, before: SloStatus | None, now: datetime) -> int:
    fields = {
        "state": verdict.state, "reason": verdict.reason, "budget_left": status.finite(verdict.budget_left),
        "burn_5m": status.finite(verdict.burn["5m"]), "burn_30m": status.finite(verdict.burn["30m"]),
        "burn_1h": status.finite(verdict.burn["1h"]), "burn_6h": status.finite(verdict.burn["6h"]),
        "detail": {"objectives": {k: o.as_json() for k, o in verdict.objectives.items()},
                   "requests": verdict.requests, "window_days": deployment.slo_window_days},
        "evaluated_at": now,
    }
    changed = before is None or before.state != verdict.state
    if changed:
        fields["since"] = now
        log.info("SLO of %s: %s (%s)", deployment, verdict.state, verdict.reason)
    SloStatus.objects.update_or_create(deployment=deployment, defaults=fields)
    return int(changed)
