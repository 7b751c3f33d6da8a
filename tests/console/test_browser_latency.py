"""A person watches live latency: real traffic to the real Triton shows up on the page.

GIVEN a deployment on the session's Triton and its deployment page open in Chromium, WHEN real
inference requests are sent and the scraper ticks, THEN the page's numbers change by
themselves (no reload) and agree with the server's own counters and with the API.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime

import httpx
import pytest
from playwright.sync_api import expect

from fleet.adapters.metrics import parsing
from fleet.models import InferenceServer, Membership
from rollouts.models import LatencyRollup
from rollouts.traffic import latency
from tests.console.conftest import SCREENSHOTS
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    MembershipFactory,
    ModelFactory,
    TenantFactory,
    UserFactory,
)
from tests.fixtures.triton import serve_demo_models_as
from tests.rollups import requests_rolled_up

pytestmark = [pytest.mark.browser, pytest.mark.triton]
INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}]}


# The demo's fraud-scorer as a tenant's model is named on the shared Triton.
SERVED = "latency-browser.fraud-scorer"


def success_count(triton, version: str) -> float:
    text = httpx.get(triton.metrics_url, timeout=5).text
    return parsing.parse("triton", text)[(SERVED, version)].success


def send(triton, version: int, count: int) -> None:
    with httpx.Client(base_url=triton.http_url, timeout=10) as client:
        for _ in range(count):
            assert client.post(f"/v2/models/{SERVED}/versions/{version}/infer", json=INFER).status_code == 200


def test_the_deployment_page_follows_real_traffic(open_page, live_server, local_triton, transactional_db):
    alice = UserFactory(username="alice")
    tenant = MembershipFactory(user=alice, role=Membership.Role.ADMIN,
                               tenant=TenantFactory(slug="latency-browser")).tenant
    serve_demo_models_as(local_triton, tenant.slug)
    cluster = ClusterFactory(name="latency-browser")
    server = InferenceServerFactory(cluster=cluster, name="triton", runtime=InferenceServer.Runtime.TRITON,
                                    http_url=local_triton.http_url, metrics_url=local_triton.metrics_url)
    model = ModelFactory(tenant=tenant, name="fraud-scorer")
    deployment = DeploymentFactory(tenant=tenant, model=model, cluster=cluster, name="fraud", slo_p99_ms=50)
    deployment.servers.set([server])
    latency.tick()

    page = open_page("alice")
    page.goto(f"{live_server.url}/registry/deployments/{deployment.pk}/")
    page.evaluate("window.__notReloaded = true")

    before = success_count(local_triton, "1")
    send(local_triton, 1, 30)
    time.sleep(0.3)
    latency.tick()
    sent = success_count(local_triton, "1") - before

    row = page.locator("table.latency-latest tr", has_text="v1")
    expect(row).to_be_visible(timeout=10_000)
    api = httpx.get(f"{live_server.url}/api/v1/deployments/{deployment.pk}/latency/?window=300",
                    cookies={c["name"]: c["value"] for c in page.context.cookies()}, timeout=5).json()
    newest = api["versions"]["v1"]["points"][-1]
    expect(row.locator("td").nth(1)).to_have_text(f"{newest['rps']:.1f} req/s", timeout=10_000)
    assert sent == 30
    assert requests_rolled_up(deployment, "v1") == sent
    expect(page.locator("[data-age]").first).to_contain_text("updated")

    # Traffic moves to v2: on the open page v2's rate rises and v1's drops to zero.
    send(local_triton, 2, 10)
    time.sleep(0.3)
    latency.tick()
    v2 = page.locator("table.latency-latest tr", has_text="v2")
    expect(v2.locator("td").nth(1)).not_to_have_text("0.0 req/s", timeout=10_000)
    expect(v2.locator("td").nth(1)).to_have_text(re.compile(r"^\d+\.\d req/s$"))
    expect(row.locator("td").nth(1)).to_have_text("0.0 req/s")
    assert requests_rolled_up(deployment, "v2") == 10
    assert page.evaluate("window.__notReloaded") is True
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "live-latency.png"), full_page=True)


def test_the_chart_polls_only_what_is_new_and_offers_longer_windows(open_page, live_server, transactional_db):
    """A page left open fetches its window once, then only the newest points; choosing "24 h"
    fetches that window from the minute rollups, and times read in 24-hour UTC."""
    alice = UserFactory(username="alice")
    tenant = MembershipFactory(user=alice, role=Membership.Role.ADMIN).tenant
    deployment = DeploymentFactory(tenant=tenant, name="history", slo_p99_ms=50)
    now = time.time()
    first = now - now % 60 - 1439 * 60
    LatencyRollup.objects.bulk_create(
        LatencyRollup(deployment=deployment, label="v1", minute=datetime.fromtimestamp(first + i * 60, tz=UTC),
                      requests=60, rps=1.0, p50_ms=4.0, p95_ms=6.0, p99_ms=8.0, avg_ms=4.0,
                      last_sample_at=datetime.fromtimestamp(first + i * 60 + 59, tz=UTC))
        for i in range(1440))
    store = latency._redis()
    key, labels = latency._series_key(deployment.pk, "v1"), latency._labels_key(deployment.pk)
    for t in range(int(now) - 280, int(now)):
        store.zadd(key, {json.dumps({"t": t, "rps": 2.0, "error_rate": 0.0, "p50_ms": 3.0,
                                     "p95_ms": 4.0, "p99_ms": 5.0, "avg_ms": 3.0}): t})
    store.sadd(labels, "v1")
    def polls() -> list[tuple[str, int]]:
        """The latency fetches the page made, with the size of each answer's body."""
        return [(e["name"], e["size"]) for e in page.evaluate(
            "performance.getEntriesByType('resource').filter(e => e.name.includes('/latency/'))"
            ".map(e => ({name: e.name, size: e.decodedBodySize}))")]

    try:
        page = open_page("alice")
        page.goto(f"{live_server.url}/registry/deployments/{deployment.pk}/")
        expect(page.locator("#latency .u-legend").first).to_contain_text("Time (UTC)")
        for _ in range(2):  # two more polls (every 2 s while the chart is on screen)
            with page.expect_response(lambda r: "since=" in r.url, timeout=15_000):
                pass
        full, *later = [p for p in polls() if "window=300" in p[0]]
        assert "since=" not in full[0] and later and all("since=" in url for url, _ in later)
        assert max(size for _, size in later) < full[1] / 20, polls()

        page.click("#latency button[data-latency-window='86400']")
        expect(page.locator("#latency button[data-latency-window='86400']")).to_have_attribute(
            "aria-pressed", "true")
        expect(page.locator("table.latency-latest tr", has_text="v1").locator("td").nth(1)).to_have_text(
            "1.0 req/s", timeout=10_000)
        day = [url for url, _ in polls() if "window=86400" in url]
        assert day and "since=" not in day[0]
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#latency").screenshot(path=str(SCREENSHOTS / "latency-24h.png"))
    finally:
        store.delete(key, labels)


def test_a_spike_is_marked_not_flattening_and_an_empty_chart_still_draws_its_slo(
        open_page, live_server, transactional_db):
    """One 2 s spike among 5 ms points: the chart's range stops above the rest and marks the
    spike (its value kept); the time axis names each tick once; a deployment without traffic
    draws its SLO line across the window, saying there is no traffic yet."""
    alice = UserFactory(username="alice")
    tenant = MembershipFactory(user=alice, role=Membership.Role.ADMIN).tenant
    spiky = DeploymentFactory(tenant=tenant, name="spiky", slo_p99_ms=50)
    quiet = DeploymentFactory(tenant=tenant, name="quiet", slo_p99_ms=50)
    now = time.time()
    store = latency._redis()
    key, labels = latency._series_key(spiky.pk, "v1"), latency._labels_key(spiky.pk)
    for t in range(int(now) - 280, int(now)):
        p99 = 2000.0 if t == int(now) - 140 else 5.0
        store.zadd(key, {json.dumps({"t": t, "rps": 2.0, "error_rate": 0.0, "p50_ms": 3.0,
                                     "p95_ms": 4.0, "p99_ms": p99, "avg_ms": 3.0}): t})
    store.sadd(labels, "v1")
    try:
        page = open_page("alice")
        page.goto(f"{live_server.url}/registry/deployments/{spiky.pk}/")
        chart = page.locator("#chart-latency")
        expect(chart).to_have_attribute("data-clipped", "2000", timeout=15_000)
        assert float(chart.get_attribute("data-ytop")) < 100  # the 5 ms points and the 50 ms SLO fill it
        ticks = chart.get_attribute("data-x-labels").split(",")
        assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), ticks
        assert "SLO p99" in page.locator("#latency .u-legend").first.inner_text()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#latency").screenshot(path=str(SCREENSHOTS / "latency-spike.png"))

        page.goto(f"{live_server.url}/registry/deployments/{quiet.pk}/")
        empty = page.locator("#chart-latency")
        expect(empty.locator("canvas")).to_have_count(1, timeout=15_000)
        expect(page.locator("#latency").get_by_text("No traffic in this window yet.").first).to_be_visible()
        assert "SLO p99" in empty.locator("xpath=..").inner_text()
        page.locator("#latency").screenshot(path=str(SCREENSHOTS / "latency-empty.png"))
    finally:
        store.delete(key, labels)
