"""A config sweep started from the console in a real browser (Debian's chromium, Playwright),
on the real stack: the session's REAL Triton, artifacts in a real S3 endpoint (moto), each
config loaded through the load path, the REAL runner process sweeping the levels and reporting
through the REAL Redis.

No Celery worker: the test thread advances the job and its loads tick by tick (as
``reconciler.run_to_end`` does, as a worker's ticks would) while the page polls, and between ticks
reads what the page shows. Screenshots go to ``artifacts/screenshots/``.
"""

from __future__ import annotations

import re
import time

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from rollouts.benchmarks import reconciler as benchmark_reconciler
from rollouts.loads import reconciler as load_reconciler
from rollouts.models import BenchmarkJob, ModelLoad, ModelVersion
from tests.console.test_browser import screenshot
from tests.fixtures import sent_tasks
from tests.rollouts.triton_world import make_world

pytestmark = [pytest.mark.browser, pytest.mark.triton]


def test_a_deployer_runs_a_config_sweep_from_the_console_and_registers_the_best(
    transactional_db: None, live_server, open_page, settings, tmp_path, moto_s3,
    make_s3_store, local_triton, redis_prefix, monkeypatch,
) -> None:
    """GIVEN fraud-scorer v1 registered (not loaded) on a deployment served by the real
    Triton; WHEN the deployer fills the deployment page's benchmark form (concurrency 1, 2,
    4, 8; 1.5 s a level; p99 SLO 30 ms; instance counts 1, 2) and submits, THEN he lands on
    the job's page; as the job runs, its progress bar moves and the curve gains points
    without a reload; once it ends the page shows it succeeded, the curve with both configs,
    a table for each, the configs compared with the best marked, stops polling, and offers to
    register the best config as v2, which he does."""
    settings.SWITCHYARD_BENCHMARK_LEASE_S = 5
    settings.DATA_DIR = tmp_path / "data"
    # The job is advanced here, tick by tick: what would go to the broker is kept.
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_benchmark", sent.append)
    made_world = make_world(settings, tmp_path, moto_s3, make_s3_store, local_triton)
    world = next(made_world)
    errors: list[str] = []
    try:
        world.server.metrics_url = local_triton.metrics_url
        world.server.grpc_url = local_triton.grpc_url
        world.server.save(update_fields=["metrics_url", "grpc_url"])
        world.version(1)

        page = open_page(world.user.username)
        page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{live_server.url}{reverse('rollouts:deployment', args=[world.deployment.pk])}")
        expect(page.locator("#no-benchmarks")).to_be_visible()
        page.click("#start-benchmark summary")
        page.select_option("#bench-version", "1")
        page.fill("#bench-levels", "1, 2, 4, 8")
        page.fill("#bench-duration", "1.5")
        page.fill("#bench-warmup", "0.5")
        page.fill("#bench-slo", "30")
        page.fill("#bench-instances", "1, 2")
        page.locator("#benchmarks").screenshot(path=str(tmp_path / "start-benchmark.png"))
        page.click("#benchmark-form button[type=submit]")

        job = BenchmarkJob.objects.get(deployment=world.deployment)
        expect(page).to_have_url(re.compile(rf"/registry/benchmarks/{job.pk}/$"))
        expect(page.locator("#benchmark-state")).to_have_text("Queued")
        assert [c["instance_group"][0]["count"] for c in job.configs] == [1, 2]
        assert job.slo["p99_ms"] == 30 and job.levels == [1, 2, 4, 8]
        expect(page.locator("#action-cancel")).to_be_visible()
        status_url = reverse("rollouts:benchmark-status", args=[job.pk])
        polls: list[float] = []
        page.on("request", lambda r: polls.append(time.monotonic()) if status_url in r.url
                else None)

        # The reconciler, tick by tick; between ticks, what the page shows.
        progress_seen: list[float] = []
        points_seen: list[int] = []
        states_seen: list[str] = []
        mid_shot = False
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            row = BenchmarkJob.objects.get(pk=job.pk)
            if row.state in BenchmarkJob.FINAL:
                break
            if row.load_id:
                load_reconciler.advance(row.load_id)
            _state, again = benchmark_reconciler.advance(job.pk)
            if not again:
                time.sleep(0.2)
            bar = page.locator("#benchmark-progress")
            if row.state in BenchmarkJob.ACTIVE and bar.count():
                progress_seen.append(float(bar.get_attribute("aria-valuenow") or 0))
                states_seen.append(page.locator("#benchmark-state").inner_text())
                points_seen.append(int(page.locator("#benchmark-curve").get_attribute(
                    "data-points") or 0))
                if not mid_shot and points_seen[-1] >= 3 and row.state == "running":
                    screenshot(page, "benchmark-running.png")
                    mid_shot = True
        job = BenchmarkJob.objects.get(pk=job.pk)
        assert job.state == BenchmarkJob.State.SUCCEEDED, (job.state, job.error, job.phase)

        # While it ran the page moved by itself: the bar went up step by step, the curve
        # gained points, the state went through loading and running.
        distinct = sorted(set(progress_seen))
        assert len(distinct) >= 4, distinct
        assert progress_seen == sorted(progress_seen) or max(progress_seen) > progress_seen[0]
        # Values between, not a jump to the end (the bar may read 100 already when the job
        # finished between reading its row and reading the page).
        assert len([p for p in distinct if 0 < p < 100]) >= 3, distinct
        assert max(points_seen) >= 3, points_seen
        assert {"Loading", "Running"} <= set(states_seen), set(states_seen)

        # Once final the live part answers 286 and reloads the page: buttons follow.
        expect(page.locator("#benchmark-state")).to_have_text("Succeeded", timeout=15_000)
        expect(page.locator("#benchmark-pct")).to_have_text("100%")
        assert page.locator("#benchmark-status").get_attribute("hx-trigger") is None
        expect(page.locator("#action-cancel")).to_have_count(0)
        # The curve: one colour per config, both drawn on one canvas, with the SLO.
        expect(page.locator("#benchmark-curve canvas")).to_have_count(1)
        legend = page.locator("#benchmark-curve .u-legend")
        for label in ("1 instance p99", "2 instances p99", "2 instances p50"):
            expect(legend).to_contain_text(label)
        expect(page.locator("#benchmark-curve")).to_have_attribute(
            "aria-label", re.compile(r"SLO p99 30\.0 ms$"))
        # A table per config, the configs compared, the best marked.
        expect(page.locator("section.bench-levels")).to_have_count(2)
        expect(page.locator("#levels-0 tbody tr").first).to_be_visible()
        expect(page.locator("#benchmark-configs tr[data-best]")).to_have_count(1)
        best = job.summary["best_config"]
        expect(page.locator(f'#benchmark-configs tr[data-config="{best}"]')).to_have_attribute(
            "data-best", "true")
        expect(page.locator("#summary-max-load")).to_contain_text("concurrency")
        expect(page.locator("#summary-rps")).to_contain_text("req/s")
        # The server's own view beside the client's.
        expect(page.locator("#levels-0 tbody tr").first).not_to_contain_text("n/a")
        # No more polling: nothing asked for the live part over 2.5 s.
        polls.clear()
        page.wait_for_timeout(2500)
        assert polls == []
        shot = screenshot(page, "benchmark-sweep.png")
        assert shot.exists()

        # The compare page draws both runs' best configs on one chart (here a job against
        # itself: no difference).
        page.goto(f"{live_server.url}{reverse('rollouts:benchmark-compare')}?a={job.pk}&b={job.pk}")
        expect(page.locator("#compare-curve canvas")).to_have_count(1)
        expect(page.locator("#compare-curve .u-legend")).to_contain_text("A: 2 instances p99")
        expect(page.locator("#compare-curve .u-legend")).to_contain_text("B: 2 instances p99")
        expect(page.locator("#delta")).to_contain_text("B carries 0.0% more")
        screenshot(page, "benchmark-compare.png")
        page.goto(f"{live_server.url}{reverse('rollouts:benchmark', args=[job.pk])}")

        # Register the best config as v2.
        button = page.locator("#action-register")
        expect(button).to_have_text("Register this config as version 2")
        button.click()
        made = ModelVersion.objects.get(model=world.model, version=2)
        expect(page).to_have_url(re.compile(rf"/registry/versions/{made.pk}/$"))
        expect(page.locator(".messages")).to_contain_text(f"from benchmark {job.pk}")
        assert made.labels["benchmark_job"] == str(job.pk)
        assert made.triton_config["instance_group"][0]["count"] == best + 1
        # v1's page shows the figures of its benchmark.
        page.goto(f"{live_server.url}{reverse('rollouts:version', args=[job.version.pk])}")
        expect(page.locator("#version-benchmark-link")).to_have_text(f"benchmark {job.pk}")
        expect(page.locator("#version-rps")).to_contain_text("req/s")
        # What the job loaded, it unloaded.
        assert not ModelLoad.objects.filter(server=world.server,
                                            state=ModelLoad.State.READY).exists()
    finally:
        for load in ModelLoad.objects.filter(server=world.server,
                                             state__in=[ModelLoad.State.UNLOADING,
                                                        *ModelLoad.IN_FLIGHT]):
            load_reconciler.run_to_end(load.pk)
        next(made_world, None)
    assert errors == []
