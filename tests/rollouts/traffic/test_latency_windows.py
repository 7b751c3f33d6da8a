"""Latency history windows and incremental polls: a week of minute rollups comes back as at
most ROLLUP_POINTS points per version, merged honestly; a poll with ``since`` gets only what
changed, so a chart that polls every 2 s does not fetch its whole window each time."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from rest_framework.test import APIClient

from rollouts.models import LatencyRollup
from rollouts.traffic import latency
from tests.factories import DeploymentFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(tenant_a):
    return DeploymentFactory(tenant=tenant_a, name="scorer")


def rollups(deployment, minutes: int, *, now: float) -> None:
    """One row a minute for ``minutes`` minutes up to now: 60 requests each (1 req/s), the
    p99 of the row its index in ms."""
    start = now - now % 60 - (minutes - 1) * 60
    LatencyRollup.objects.bulk_create(
        LatencyRollup(deployment=deployment, label="v1", minute=datetime.fromtimestamp(start + i * 60, tz=UTC),
                      requests=60, failures=i % 2, rps=1.0, error_rate=100 * (i % 2) / 60,
                      p50_ms=5.0, p95_ms=float(i), p99_ms=float(i), avg_ms=5.0,
                      last_sample_at=datetime.fromtimestamp(start + i * 60 + 59, tz=UTC))
        for i in range(minutes)
    )


def test_a_week_comes_back_merged_to_the_point_budget(deployment):
    now = time.time()
    rollups(deployment, 7 * 1440, now=now)

    week = latency.series(deployment, 7 * 86400)
    points = week["versions"]["v1"]["points"]

    assert week["source"] == "rollups"
    assert len(points) <= latency.ROLLUP_POINTS
    assert len(points) >= latency.ROLLUP_POINTS - 2  # the window's edges may cut a bucket
    # Seven minutes a point: the rate stays 1 req/s, p99 is the worst minute of the seven.
    middle = points[len(points) // 2]
    assert middle["rps"] == pytest.approx(1.0)
    assert middle["p99_ms"] == max(middle["p99_ms"], middle["p95_ms"])
    assert points[-1]["p99_ms"] == 7 * 1440 - 1  # the newest minute is in the last point
    assert middle["error_rate"] == pytest.approx(100 * 3 / 420, abs=100 / 420)


def test_an_hour_keeps_every_minute(deployment):
    now = time.time()
    rollups(deployment, 120, now=now)

    hour = latency.series(deployment, 3600)

    assert hour["source"] == "rollups"
    assert [p["p99_ms"] for p in hour["versions"]["v1"]["points"]][-3:] == [117.0, 118.0, 119.0]
    assert len(hour["versions"]["v1"]["points"]) in (60, 61)


def test_a_poll_since_the_newest_point_gets_only_its_still_filling_slot(deployment):
    now = time.time()
    rollups(deployment, 7 * 1440, now=now)
    full = latency.series(deployment, 7 * 86400)
    newest = full["versions"]["v1"]["points"][-1]

    again = latency.series(deployment, 7 * 86400, since=newest["t"])

    assert again["since"] == newest["slot"]
    assert again["versions"]["v1"]["points"] == [newest]
    assert len(json.dumps(again)) < len(json.dumps(full)) / 100
    assert again["updated_at"] == full["updated_at"]


def test_a_poll_of_the_live_window_gets_the_newest_scrape_on(deployment, settings):
    store = latency._redis()
    key, labels = latency._series_key(deployment.pk, "v1"), latency._labels_key(deployment.pk)
    now = time.time()
    for t in range(int(now) - 120, int(now)):
        store.zadd(key, {json.dumps({"t": t, "rps": 1.0, "p99_ms": float(t % 7)}): t})
    store.sadd(labels, "v1")
    try:
        full = latency.series(deployment, 300)
        newest = full["versions"]["v1"]["points"][-1]["t"]
        nothing_new = latency.series(deployment, 300, since=newest)
        assert full["source"] == "live" and len(full["versions"]["v1"]["points"]) == 120
        assert [p["t"] for p in nothing_new["versions"]["v1"]["points"]] == [newest]
        assert nothing_new["since"] == newest
    finally:
        store.delete(key, labels)


@pytest.mark.parametrize("since", ["abc", "nan", "inf", "-1", str(time.time() + 3600), "1e400"])
def test_a_since_that_is_no_moment_is_a_400_naming_since(deployment, alice, since):
    api = APIClient()
    api.force_authenticate(alice)
    answer = api.get(f"/api/v1/deployments/{deployment.pk}/latency/", {"since": since})
    assert answer.status_code == 400
    assert list(answer.json()) == ["since"]
