"""The deployment page's Traffic panel in a real browser (Debian's chromium, Playwright), with
the route put in force on the session's REAL nginx (``tests/fixtures/route_nginx.py``).

The servers behind the route are never called (``http://127.0.0.1:9``): the panel shows what
is in force, so nginx only has to accept the route. Screenshots go to
``artifacts/screenshots/``.
"""

from __future__ import annotations

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
