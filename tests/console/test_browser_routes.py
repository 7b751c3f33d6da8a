"""The deployment page's Traffic panel in a real browser (Debian's chromium, Playwright), with
the route put in force on the session's REAL nginx (``tests/fixtures/route_nginx.py``).

The servers behind the route are never called (``http://127.0.0.1:9``): the panel shows what
is in force, so nginx only has to accept the route. Screenshots go to
``artifacts/screenshots/``.
"""

from __future__ import annotations

import collections
import re
import time

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from fleet.models import Cluster
from rollouts.models import ModelLoad, Route
from tests.console.test_browser import screenshot
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)
from tests.fixtures.triton import serve_demo_models_as

pytestmark = pytest.mark.browser


def test_a_deployer_moves_the_split_in_the_traffic_panel(
    transactional_db: None, live_server, use_route_nginx, dave, open_page
) -> None:
    """GIVEN a deployment with versions 1 and 2 ready and no route,
    WHEN dave creates the default route, THEN the panel shows the client URL and v2 at 100 %;
    WHEN he asks for 90/20, THEN the form says the weights must sum to 100, in place;
    WHEN he asks for 90/10 with a reason, THEN the bars, the revision history and nginx agree."""
    tenant = dave.memberships.get().tenant
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.LOCAL)
    server = InferenceServerFactory(cluster=cluster, name="triton", http_url="http://127.0.0.1:9")
    model = ModelFactory(tenant=tenant, name="fraud-scorer")
    deployment = DeploymentFactory(model=model, cluster=cluster, name="fraud")
    deployment.servers.set([server])
    for number in (1, 2):
        ModelLoad.objects.create(
            tenant=tenant, deployment=deployment, server=server, state=ModelLoad.State.READY,
            version=ModelVersionFactory(model=model, version=number), requested_by_label="dave",
        )
    errors: list[str] = []

    page = open_page("dave")
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.goto(f"{live_server.url}{reverse('rollouts:deployment', args=[deployment.pk])}")
    page.click("#route-default button[type=submit]")

    route = Route.objects.get(pk=deployment.pk)
    expect(page.locator("#route-url")).to_have_text(route.url)
    expect(page.locator('#route-split tr[data-variant="v2-triton"] td[data-weight]')).to_have_text("100%")

    page.fill("#id_weight_1", "90")
    page.fill("#id_weight_2", "20")
    page.click("#route-form button[type=submit]")
    expect(page.locator("#weights-error")).to_have_text("must sum to 100, got 110")

    errors.clear()  # the refusal above is a 400, which the browser reports as an error
    page.fill("#id_weight_2", "10")
    page.fill("#route-reason", "canary v2")
    page.click("#route-form button[type=submit]")
    expect(page.locator('#route-split tr[data-variant="v1-triton"] td[data-weight]')).to_have_text("90%")
    expect(page.locator('#route-history tr[data-revision="2"]')).to_contain_text("canary v2")
    bar = page.locator('#route-split tr[data-variant="v2-triton"] .bar > span')
    assert bar.evaluate("el => el.style.width") == "10%"
    assert Route.objects.get(pk=deployment.pk).version_weights == {1: 90, 2: 10}
    screenshot(page, "deployment-traffic.png")
    assert errors == []


@pytest.mark.triton
def test_a_deployer_splits_real_traffic_and_watches_each_variant_live(
    transactional_db: None, live_server, use_route_nginx, dave, open_page, local_triton,
    settings, redis_prefix, tmp_path,
) -> None:
    """The data plane end to end, as a deployer sees it: real requests go to the route's URL
    on the real nginx in front of the session's real Triton (fraud-scorer v1 ~4 ms, v2
    ~12 ms); every one becomes a sample through the real collector; the page shows each
    variant live. GIVEN all traffic on v1, WHEN dave moves the split to 90/10 in the console,
    THEN v2 appears in the live latency table by itself; WHEN he switches to sticky routing by
    a header and mirrors half the requests to v2, THEN the mirrored copies appear apart; every
    change is in the audit log with who and why."""
    import threading

    import httpx

    from fleet.models import AuditEvent
    from tests.rollouts.traffic.test_samples import CollectorProcess

    collector = CollectorProcess(tmp_path / "collector.log", settings.REDIS_URL,
                                 prefix=redis_prefix)
    settings.SWITCHYARD_COLLECTOR_PORT = collector.port
    tenant = dave.memberships.get().tenant
    # The demo's fraud-scorer on the session's Triton under the name the tenant's model has there.
    serve_demo_models_as(local_triton, tenant.slug)
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.LOCAL)
    server = InferenceServerFactory(cluster=cluster, name="triton", http_url=local_triton.http_url)
    model = ModelFactory(tenant=tenant, name="fraud-scorer")
    deployment = DeploymentFactory(model=model, cluster=cluster, name="fraud")
    deployment.servers.set([server])
    for number in (1, 2):
        ModelLoad.objects.create(
            tenant=tenant, deployment=deployment, server=server, state=ModelLoad.State.READY,
            version=ModelVersionFactory(model=model, version=number), requested_by_label="dave",
        )
    stop = threading.Event()
    sent: list[int] = []

    def traffic(url: str) -> None:
        """About 30 requests a second, for at most 90 s, as user-1 … user-20."""
        body = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32",
                            "data": [0.1, 0.5, 2.0]}]}
        deadline = time.monotonic() + 90
        with httpx.Client(base_url=url, timeout=5) as client:
            while not stop.is_set() and time.monotonic() < deadline:
                user = f"user-{len(sent) % 20}"
                response = client.post("/v2/models/fraud-scorer/infer", json=body,
                                       headers={"X-User": user})
                sent.append(response.status_code)
                stop.wait(0.03)

    def apply(reason: str, **fields: str) -> None:
        for selector, value in fields.items():
            element = page.locator(f"#{selector}")
            if element.evaluate("el => el.tagName") == "SELECT":
                element.select_option(value)
            else:
                element.fill(value)
        page.fill("#route-reason", reason)
        page.click("#route-form button[type=submit]")
        expect(page.locator("#route-history tr").nth(1)).to_contain_text(reason)

    def live_row(label: str):
        """The live latency table's row of ``label`` (its charts poll only while on screen:
        after a change the page opens at the Traffic panel, so look at them first)."""
        page.locator("#latency").scroll_into_view_if_needed()
        return page.locator("#latency table.latency-latest tbody tr",
                            has=page.locator("td", has_text=re.compile(rf"^{re.escape(label)}$")))

    def split_cell(variant: str, cell: str):
        return page.locator(f'#route-split tr[data-variant="{variant}"] td[{cell}]')

    page = open_page("dave")
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    thread = None
    try:
        page.goto(f"{live_server.url}{reverse('rollouts:deployment', args=[deployment.pk])}")
        page.click("#route-default button[type=submit]")
        route = Route.objects.get(pk=deployment.pk)
        apply("all on v1", id_weight_1="100", id_weight_2="0")
        thread = threading.Thread(target=traffic, args=(route.url,), daemon=True)
        thread.start()
        expect(live_row("v1-triton")).to_be_visible(timeout=20_000)
        expect(live_row("v2-triton")).to_have_count(0)

        apply("canary v2", id_weight_1="90", id_weight_2="10")
        # Samples reach Redis within about 0.1 s, the endpoint shows a slice once it has ended
        # (1 s) and the page polls every 2 s: v2 shows within ~3 s; 20 s of margin for a busy
        # 2-core machine.
        expect(live_row("v2-triton")).to_be_visible(timeout=20_000)
        # At 10% of ~30 requests a second a one-second slice may hold none of v2's: wait for
        # one that does, as a person watching would.
        expect(live_row("v2-triton").locator("td").nth(1)).not_to_have_text("0.0 req/s",
                                                                           timeout=20_000)
        # The Traffic panel's own table shows each variant's latency too (it refreshes every
        # 2 s): v2, three times slower, has a median of its own.
        page.locator("#traffic").scroll_into_view_if_needed()
        expect(split_cell("v2-triton", "data-p50")).to_have_text(re.compile(r"^\d+\.\d ms$"),
                                                                  timeout=20_000)
        v1_p50 = float(split_cell("v1-triton", "data-p50").inner_text().split()[0])
        v2_p50 = float(split_cell("v2-triton", "data-p50").inner_text().split()[0])
        assert v2_p50 > v1_p50, (v1_p50, v2_p50)

        apply("A/B by user", **{"route-policy-input": "sticky", "route-header-input": "X-User"})
        expect(page.locator("#route-policy")).to_have_text("sticky by header")
        apply("shadow v2", **{"route-mirror-input": "2", "route-mirror-percent": "50"})
        expect(live_row("v2-triton (mirror)")).to_be_visible(timeout=20_000)
        page.locator("#traffic").scroll_into_view_if_needed()
        expect(page.locator('#route-split tr[data-variant="v2-triton"] [data-copies]')).to_be_visible(
            timeout=20_000)
        screenshot(page, "deployment-traffic-live.png")
    finally:
        stop.set()
        if thread is not None:
            thread.join(10)
        collector.stop()

    assert errors == []
    assert sent and set(sent) == {200}, collections.Counter(sent)
    route.refresh_from_db()
    assert (route.policy, route.sticky_header, route.mirror_percent) == ("sticky", "X-User", 50)
    events = AuditEvent.objects.filter(object_type="rollouts.route", object_id=str(deployment.pk))
    changes = [(e.actor_label, e.reason) for e in events.filter(verb="route_changed").order_by("pk")]
    assert changes[-4:] == [("dave", "all on v1"), ("dave", "canary v2"), ("dave", "A/B by user"),
                            ("dave", "shadow v2")]
