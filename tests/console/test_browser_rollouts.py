"""A canary walked from the console to promotion in a real browser (Debian's chromium,
Playwright), on the real stack: versions loaded on the session's REAL Triton through the load
path, traffic through the session's REAL nginx, per-request samples through the REAL
collector into Redis, so the page's chart shows canary and baseline side by side.

No Celery worker: the test thread advances the rollout (and its loads) with
``rollout.run_to_end``, as a worker's ticks would, while the page polls. Screenshots go to the
test's ``tmp_path`` and ``artifacts/screenshots/``.
"""

from __future__ import annotations

import re
import shutil
import threading
import time

import httpx
import pytest
from django.urls import reverse
from playwright.sync_api import expect

from rollouts.canary import reconciler as rollout_reconciler
from rollouts.loads import reconciler as load_reconciler
from rollouts.loads import requests as loads
from rollouts.models import Alias, ModelLoad, Rollout, Route
from rollouts.traffic import routes
from tests.console.test_browser import screenshot
from tests.factories import AliasFactory
from tests.fixtures.samples import CollectorProcess
from tests.rollouts.triton_world import make_world

pytestmark = [pytest.mark.browser, pytest.mark.triton]

State = Rollout.State
INFER = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [0.1, 0.5, 2.0]}]}


def send_traffic(url: str, model: str, stop: threading.Event, statuses: list[int]) -> None:
    """About 50 requests a second through the route until stopped (at most 3 minutes)."""
    deadline = time.monotonic() + 180
    with httpx.Client(base_url=url, timeout=5) as client:
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                statuses.append(client.post(f"/v2/models/{model}/infer", json=INFER).status_code)
            except httpx.HTTPError:
                statuses.append(0)
            stop.wait(0.02)


def test_a_deployer_walks_a_canary_from_the_console_to_promotion(
    transactional_db: None, live_server, use_route_nginx, open_page, settings, tmp_path,
    moto_s3, make_s3_store, local_triton, redis_prefix,
) -> None:
    """GIVEN fraud-scorer v1 loaded on the real Triton and routed through nginx, real traffic
    flowing, and v2 registered; WHEN the deployer starts a canary of v2 from the deployment
    page with the steps 50% then pause, THEN the rollout page shows it loading; as the
    reconciler advances it, the page (polling) shows it paused at 50/50 with v1 and v2 side by
    side on the chart; WHEN he clicks Resume and the reconciler advances again, THEN the page
    shows it succeeded, every step done, and the production alias names v2."""
    collector = CollectorProcess(tmp_path / "collector.log", settings.REDIS_URL,
                                 prefix=redis_prefix)
    settings.SWITCHYARD_COLLECTOR_PORT = collector.port
    settings.SWITCHYARD_ROLLOUT_INTERVAL_S = 0.5
    made_world = make_world(settings, tmp_path, moto_s3, make_s3_store, local_triton)
    world = next(made_world)
    stop = threading.Event()
    statuses: list[int] = []
    thread = None
    errors: list[str] = []
    try:
        v1 = world.version(1)
        rows, _ = loads.request_load(world.user, world.deployment, v1)
        assert load_reconciler.run_to_end(rows[0].pk).state == ModelLoad.State.READY
        route, _ = routes.ensure_route(world.user, world.deployment)
        world.version(2)
        AliasFactory(model=world.model, version=v1, name="production")
        thread = threading.Thread(target=send_traffic, daemon=True,
                                  args=(route.url, world.model.name, stop, statuses))
        thread.start()

        page = open_page(world.user.username)
        page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
        page.goto(f"{live_server.url}{reverse('rollouts:deployment', args=[world.deployment.pk])}")
        expect(page.locator("#no-rollout")).to_have_count(0)
        page.click("#start-canary summary")
        page.select_option("#canary-version", "2")
        page.fill("#canary-steps", '[{"set_weight": 50}, {"pause": {}}]')
        page.fill("#canary-alias", "production")
        page.fill("#canary-reason", "v2 from the console")
        page.locator("#rollouts").screenshot(path=str(tmp_path / "start-canary.png"))
        page.click("#canary-form button[type=submit]")

        rollout = Rollout.objects.get(deployment=world.deployment)
        expect(page).to_have_url(re.compile(rf"/registry/rollouts/{rollout.pk}/$"))
        expect(page.locator("#rollout-state")).to_have_text("Loading")
        expect(page.locator('#rollout-steps li[data-step="1"]')).to_have_attribute(
            "data-status", "to come")

        # The reconciler: loads v2, puts 50% on it, stops at the pause for a person.
        paused = rollout_reconciler.run_to_end(rollout.pk, max_ticks=400)
        assert paused.state == State.PAUSED, (paused.state, paused.reason)
        # The live part sees the new state and reloads the page (buttons included).
        expect(page.locator("#rollout-state")).to_have_text("Paused", timeout=20_000)
        expect(page.locator('#rollout-weights [data-weight="1"]')).to_have_text("50%")
        expect(page.locator('#rollout-weights [data-weight="2"]')).to_have_text("50%")
        expect(page.locator("#rollout-waiting")).to_contain_text("a person to resume (step 2)")
        expect(page.locator('#rollout-steps li[data-step="1"]')).to_have_attribute(
            "data-status", "done")
        expect(page.locator('#rollout-steps li[data-step="2"]')).to_have_attribute(
            "data-status", "current")
        expect(page.locator("#action-pause")).to_have_count(0)
        # Canary and baseline on one chart: both versions in its table of latest numbers.
        chart_rows = page.locator("#rollout-chart table.latency-latest tbody tr")
        expect(chart_rows.filter(has_text="v2 canary")).to_be_visible(timeout=20_000)
        expect(chart_rows.filter(has_text="v1 baseline")).to_be_visible()
        expect(page.locator("#chart-rollout-latency canvas")).to_have_count(1)
        shot = screenshot(page, "rollout-paused.png")
        shutil.copy(shot, tmp_path / "rollout-paused.png")

        page.fill("#action-reason", "50/50 looks fine")
        page.click("#action-resume")
        expect(page.locator(".messages")).to_contain_text("Resume asked for")
        assert Rollout.objects.get(pk=rollout.pk).requested_action == "resume"

        ended = rollout_reconciler.run_to_end(rollout.pk, max_ticks=400)
        assert ended.state == State.SUCCEEDED, (ended.state, ended.reason)
        expect(page.locator("#rollout-state")).to_have_text("Succeeded", timeout=20_000)
        expect(page.locator('#rollout-weights [data-weight="2"]')).to_have_text("100%")
        for step in ("1", "2"):
            expect(page.locator(f'#rollout-steps li[data-step="{step}"]')).to_have_attribute(
                "data-status", "done")
        expect(page.locator("#rollout-events")).to_contain_text(
            "the production alias now names v2")
        expect(page.locator("#rollout-events")).to_contain_text("resumed by")
        expect(page.locator("#no-actions")).to_be_visible()
        # The live part stopped polling (286): no trigger left on it.
        assert page.locator("#rollout-status").get_attribute("hx-trigger") is None
        assert Alias.objects.get(model=world.model, name="production").version.version == 2
        shot = screenshot(page, "rollout-succeeded.png")
        shutil.copy(shot, tmp_path / "rollout-succeeded.png")
    finally:
        stop.set()
        if thread is not None:
            thread.join(10)
        collector.stop()
        # v1 is unloaded once v2 carries everything: let that finish on the shared Triton.
        for load in ModelLoad.objects.filter(server=world.server, state=ModelLoad.State.UNLOADING):
            load_reconciler.run_to_end(load.pk)
        # The route lets nothing unload while it sends a version traffic: drop it first.
        Route.objects.filter(pk=world.deployment.pk).delete()
        next(made_world, None)
    assert errors == []
    assert statuses and set(statuses) <= {200}, set(statuses)
