"""A person watches live latency: real traffic to the real Triton shows up on the page.

GIVEN a deployment on the session's Triton and its deployment page open in Chromium, WHEN real
inference requests are sent and the scraper ticks, THEN the page's numbers change by
themselves (no reload) and agree with the server's own counters and with the API.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
from playwright.sync_api import expect

from fleet.adapters import metrics
from fleet.models import InferenceServer, Membership
from rollouts import latency
from rollouts.models import LatencyRollup
from tests.console.conftest import SCREENSHOTS
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    MembershipFactory,
    ModelFactory,
    UserFactory,
)

pytestmark = [pytest.mark.browser, pytest.mark.triton]
INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}]}


def success_count(triton, version: str) -> float:
    text = httpx.get(triton.metrics_url, timeout=5).text
    return metrics.parse("triton", text)[("fraud-scorer", version)].success


def send(triton, version: int, count: int) -> None:
    with httpx.Client(base_url=triton.http_url, timeout=10) as client:
        for _ in range(count):
            assert client.post(f"/v2/models/fraud-scorer/versions/{version}/infer", json=INFER).status_code == 200


def test_the_deployment_page_follows_real_traffic(open_page, live_server, local_triton, transactional_db):
    alice = UserFactory(username="alice")
    tenant = MembershipFactory(user=alice, role=Membership.Role.ADMIN).tenant
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
    assert LatencyRollup.objects.get(deployment=deployment, label="v1").requests == sent
    expect(page.locator("[data-age]").first).to_contain_text("updated")

    # Traffic moves to v2: on the open page v2's rate rises and v1's drops to zero.
    send(local_triton, 2, 10)
    time.sleep(0.3)
    latency.tick()
    v2 = page.locator("table.latency-latest tr", has_text="v2")
    expect(v2.locator("td").nth(1)).not_to_have_text("0.0 req/s", timeout=10_000)
    expect(v2.locator("td").nth(1)).to_have_text(re.compile(r"^\d+\.\d req/s$"))
    expect(row.locator("td").nth(1)).to_have_text("0.0 req/s")
    assert LatencyRollup.objects.get(deployment=deployment, label="v2").requests == 10
    assert page.evaluate("window.__notReloaded") is True
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "live-latency.png"), full_page=True)
