"""SLO status, budget and burn-rate alerts from the minute rollups (rollouts.slo)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from fleet.adapters.metrics import rates
from fleet.adapters.metrics.values import Counters, Histogram
from fleet.models import Webhook, WebhookDelivery
from fleet.webhooks import delivery as webhook_delivery
from rollouts.models import LatencyRollup, SloAlert, SloStatus
from rollouts.slo import alerts, status
from tests.factories import DeploymentFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 28, 12, 0, 30, tzinfo=UTC)


def minutes(deployment, start_min_ago: int, end_min_ago: int, *, rpm: int, failed: float = 0.0,
            slow: float = 0.0, label: str = "v1", now: datetime = NOW) -> None:
    """One rollup row a minute from ``start_min_ago`` to ``end_min_ago`` (both included)
    minutes before ``now``'s minute, with ``rpm`` requests, a share ``failed`` failing and a
    share ``slow`` of the answered ones slower than the SLO."""
    floor = now.replace(second=0, microsecond=0)
    span = [floor - timedelta(minutes=ago) for ago in range(end_min_ago, start_min_ago + 1)]
    LatencyRollup.objects.filter(deployment=deployment, label=label, minute__in=span).delete()
    failures = round(rpm * failed)
    LatencyRollup.objects.bulk_create(
        LatencyRollup(deployment=deployment, label=label, minute=minute, requests=rpm, failures=failures,
                      slow=round((rpm - failures) * slow))
        for minute in span
    )


# --- reading the distribution ------------------------------------------------------------


def test_share_over_reads_a_histogram_and_a_summary():
    # 100 requests: 50 by 100 ms, 90 by 200 ms, 100 by 400 ms.
    hist = Histogram(buckets=((0.1, 50.0), (0.2, 90.0), (0.4, 100.0), (math.inf, 100.0)), count=100.0)
    cur = Counters(engine="vllm", success=100.0, histograms={"e2e": hist})
    window = rates.window(None, cur, 1.0)
    assert rates.share_over(window.latency_cdf, 150.0) == pytest.approx(0.30)
    assert rates.share_over(window.latency_cdf, 400.0) == pytest.approx(0.0)
    assert rates.share_over(window.latency_cdf, 50.0) == pytest.approx(0.75)
    # Triton's summary: p50 10 ms, p99 30 ms; between them linear, past p99 nothing known.
    summary = ((10.0, 0.5), (30.0, 0.99))
    assert rates.share_over(summary, 20.0) == pytest.approx(1 - (0.5 + 0.49 / 2))
    assert rates.share_over(summary, 31.0) == 0.0
    assert rates.share_over((), 31.0) is None


# --- status ------------------------------------------------------------------------------


def test_an_hour_within_the_slo_is_ok_with_its_budget_mostly_left():
    d = DeploymentFactory(slo_error_rate=Decimal("1.00"), slo_p99_ms=100)
    minutes(d, 60, 0, rpm=1000, failed=0.002, slow=0.002)

    (verdict,) = [status.evaluate(d, status.counts([d], NOW)[d.pk])]

    assert verdict.state == SloStatus.State.OK
    assert verdict.burn["5m"] == pytest.approx(0.2, rel=0.05)
    assert verdict.budget_left == pytest.approx(0.8, rel=0.05)


def test_five_minutes_over_the_ceiling_breach_within_a_tick_and_name_what():
    d = DeploymentFactory(slo_error_rate=Decimal("1.00"), slo_p99_ms=100)
    minutes(d, 60, 2, rpm=600)
    minutes(d, 1, 0, rpm=600, failed=0.5)  # half of the requests fail since a minute

    verdict = status.evaluate(d, status.counts([d], NOW)[d.pk])

    assert verdict.state == SloStatus.State.BREACHING
    assert "of requests failed over the last 5 minutes (ceiling 1.00%)" in verdict.reason
    assert verdict.objectives["errors"].burn["5m"] > 1 > verdict.objectives["latency"].burn["5m"]


def test_slow_answers_breach_the_latency_objective_and_failures_stay_out_of_it():
    d = DeploymentFactory(slo_error_rate=Decimal("5.00"), slo_p99_ms=100)
    minutes(d, 10, 0, rpm=600, failed=0.02, slow=0.03)  # 18 of 588 answers: 3.06%
    verdict = status.evaluate(d, status.counts([d], NOW)[d.pk])
    assert verdict.reason == "3.1% of answers were slower than 100 ms over the last 5 minutes (1% allowed)"


def test_no_request_in_five_minutes_is_no_traffic_and_a_spent_budget_is_breaching():
    quiet = DeploymentFactory()
    minutes(quiet, 120, 10, rpm=60)
    assert status.evaluate(quiet, status.counts([quiet], NOW)[quiet.pk]).state == SloStatus.State.NO_TRAFFIC

    spent = DeploymentFactory(slo_window_days=1, slo_error_rate=Decimal("1.00"))
    minutes(spent, 600, 400, rpm=600, failed=0.05)  # hours ago, 5x the ceiling
    minutes(spent, 3, 0, rpm=600)
    verdict = status.evaluate(spent, status.counts([spent], NOW)[spent.pk])
    assert verdict.state == SloStatus.State.BREACHING and verdict.budget_left < 0
    assert "budget of the last 1 days is spent" in verdict.reason


def test_an_hour_burning_faster_than_the_window_allows_is_at_risk():
    d = DeploymentFactory(slo_error_rate=Decimal("1.00"), slo_window_days=1)
    minutes(d, 1439, 61, rpm=600)  # a clean day before
    minutes(d, 60, 6, rpm=600, failed=0.02)  # 2x the ceiling for most of the hour
    minutes(d, 5, 0, rpm=600)
    verdict = status.evaluate(d, status.counts([d], NOW)[d.pk])
    assert verdict.state == SloStatus.State.AT_RISK
    assert "the last hour spent the error budget" in verdict.reason


def test_a_zero_error_budget_burns_without_limit_on_one_error():
    d = DeploymentFactory(slo_error_rate=Decimal("0"))
    minutes(d, 4, 0, rpm=1000, failed=0.001)
    verdict = status.evaluate(d, status.counts([d], NOW)[d.pk])
    assert verdict.state == SloStatus.State.BREACHING and math.isinf(verdict.burn["5m"])
    assert status.finite(verdict.burn["5m"]) == 1e9


# --- alerts ------------------------------------------------------------------------------


def hooks(tenant):
    return [Webhook.objects.create(tenant=tenant, name=f"h-{fmt}", url="http://127.0.0.1:9/", secret="whsec_x",
                                   format=fmt, routing_key="R0UTINGKEY" if fmt == "pagerduty" else "",
                                   events=["slo.alert_opened", "slo.alert_resolved"])
            for fmt in ("json", "slack", "pagerduty")]


def test_a_fast_burn_opens_one_alert_tells_every_format_and_resolves_when_traffic_recovers(django_capture_on_commit_callbacks):
    d = DeploymentFactory(slo_error_rate=Decimal("1.00"), slo_p99_ms=100)
    hooks(d.tenant)
    minutes(d, 60, 6, rpm=600)
    minutes(d, 5, 0, rpm=600, failed=0.5)  # 5 min of half failing: 1 h burns ~4.6, 5 min ~50

    assert alerts.tick(NOW)["opened"] == 0  # 1 h not yet over 14.4
    minutes(d, 25, 6, rpm=600, failed=0.5)
    with django_capture_on_commit_callbacks():
        counts = alerts.tick(NOW)
    assert counts["opened"] == 1
    assert alerts.tick(NOW)["opened"] == 0  # the next tick opens nothing twice
    (alert,) = SloAlert.objects.filter(deployment=d)
    assert (alert.rule, alert.sli, alert.state) == ("fast_burn", "errors", "firing")
    assert alert.burn_long > 14.4 and alert.burn_short > 14.4
    assert SloStatus.objects.get(deployment=d).state == SloStatus.State.BREACHING

    sent = {x.webhook.format: x for x in WebhookDelivery.objects.filter(event="slo.alert_opened")}
    assert set(sent) == {"json", "slack", "pagerduty"}
    slack = json.loads(webhook_delivery.body_of(sent["slack"]))
    assert slack["text"].startswith(f"SLO alert opened: {d.name}: fast burn of its error budget")
    page = json.loads(webhook_delivery.body_of(sent["pagerduty"]))
    assert page["event_action"] == "trigger" and page["routing_key"] == "R0UTINGKEY"
    assert page["dedup_key"] == f"switchyard-slo-alert-{alert.pk}"
    assert page["payload"]["severity"] == "critical" and page["payload"]["component"] == d.name

    # The traffic recovers. A minute later the last five minutes still burn (and it has not
    # been open five minutes): it stays. Five clean minutes later it resolves.
    minutes(d, 0, 0, rpm=600, now=NOW + timedelta(minutes=1))
    assert alerts.tick(NOW + timedelta(minutes=1))["resolved"] == 0
    later = NOW + timedelta(minutes=6)
    minutes(d, 4, 0, rpm=600, now=later)
    assert alerts.tick(later)["resolved"] == 1
    alert.refresh_from_db()
    assert alert.state == "resolved" and [e["text"].split(":")[0] for e in alert.events] == ["opened", "resolved"]
    resolved = WebhookDelivery.objects.get(event="slo.alert_resolved", webhook__format="pagerduty")
    body = json.loads(webhook_delivery.body_of(resolved))
    assert body == {"routing_key": "R0UTINGKEY", "event_action": "resolve",
                    "dedup_key": f"switchyard-slo-alert-{alert.pk}"}


def test_a_slow_burn_opens_the_slow_rule_only():
    d = DeploymentFactory(slo_error_rate=Decimal("1.00"))
    minutes(d, 360, 0, rpm=600, failed=0.08)  # 8x the budget's rate for six hours
    alerts.tick(NOW)
    assert list(SloAlert.objects.filter(deployment=d).values_list("rule", "sli")) == [("slow_burn", "errors")]


def test_another_tenant_sees_no_status_or_alert_of_this_one(client):
    from tests.factories import MembershipFactory, UserFactory
    d = DeploymentFactory(slo_error_rate=Decimal("1.00"))
    minutes(d, 60, 0, rpm=600, failed=0.5)
    alerts.tick(NOW)
    outsider = UserFactory()
    MembershipFactory(user=outsider)
    assert SloStatus.objects.visible_to(outsider).count() == 0
    assert SloAlert.objects.visible_to(outsider).count() == 0
    assert SloAlert.objects.count() == 1


def test_an_archived_deployments_open_alert_is_resolved_saying_why():
    d = DeploymentFactory(slo_error_rate=Decimal("1.00"))
    minutes(d, 10, 0, rpm=600, failed=0.5)
    alerts.tick(NOW)
    (alert,) = SloAlert.objects.filter(deployment=d, state="firing")
    d.archived_at = NOW
    d.save()

    assert alerts.tick(NOW)["resolved"] == 1
    alert.refresh_from_db()
    assert alert.state == "resolved" and alert.events[-1]["text"] == "resolved: the deployment was deleted (archived)"
