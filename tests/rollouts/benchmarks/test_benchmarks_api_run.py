"""A benchmark through the API on the real stack: asked for with POST, driven by the
reconciler (``reconciler.run_to_end``, one tick at a time) while the job is polled as CI polls it,
then read back through ``/results/``: a real Triton, real Redis, the runner process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from fleet.models import Membership
from fleet.tenancy import tokens
from rollouts.benchmarks import reconciler
from rollouts.models import BenchmarkJob, ModelLoad
from tests.factories import MembershipFactory, UserFactory
from tests.fixtures import sent_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.triton]

URL = "/api/v1/benchmarks/"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    """The test is the reconciler here: what would go to the broker is kept."""
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_benchmark", sent.append)
    return sent


def test_a_sweep_asked_for_through_the_api_is_polled_to_consistent_figures(world):
    world.version(1)
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(world.user)

    made = client.post(URL, {"deployment": world.deployment.name, "version": 1,
                             "levels": [1, 2], "duration_s": 1, "warmup_s": 0.2,
                             "slo": {"p99_ms": 500}}, format="json",
                       HTTP_IDEMPOTENCY_KEY="ci-build-1")
    assert made.status_code == 201, made.content
    job_id = made.json()["id"]

    seen: list[dict[str, Any]] = []
    for _ in range(600):
        reconciler.run_to_end(job_id, max_ticks=1, tick_s=0.1)
        polled = client.get(f"{URL}{job_id}/")
        assert polled.status_code == 200
        seen.append(polled.json())
        if polled.json()["is_final"]:
            break
    job = seen[-1]
    assert job["state"] == "succeeded", (job["phase"], job["error"])

    # What a poller sees: the states in order, progress that never goes back, then 1.
    states = [row["state"] for row in seen]
    assert "running" in states
    order = ["queued", "loading", "running", "unloading", "succeeded"]
    assert [order.index(s) for s in states] == sorted(order.index(s) for s in states)
    progress = [row["progress"] for row in seen]
    assert progress == sorted(progress) and progress[-1] == 1.0
    assert job["phase"].startswith("done")

    results = client.get(f"{URL}{job_id}/results/")
    assert results.status_code == 200
    body = results.json()
    assert (body["state"], body["version"], body["server"]) == ("succeeded", 1, "triton")
    [config] = body["configs"]
    levels = [level for level in config["levels"] if not level["refinement"]]
    assert [level["value"] for level in levels] == [1, 2]
    for level in config["levels"]:
        latency = level["latency_ms"]
        assert level["throughput_rps"] > 0 and level["ok"] > 0
        assert level["requests"] == level["ok"] + sum(level["errors"].values())
        assert latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
        # The server's own view of the same window: it counted requests and timed them.
        server = level["server"]
        assert server["available"] is True, server
        assert server["requests"] > 0 and server["compute_ms"] > 0
        assert server["request_ms"] >= server["compute_ms"]
        assert level["within_slo"] is (not level["verdict"])
    # The summary names the highest level within the SLO and the most a level within the SLO
    # carried up to it.
    best = body["summary"]["best"]
    carried = [level for level in config["levels"] if level["within_slo"]]
    assert best["max_load"] == max(level["value"] for level in carried)
    assert best["max_load_rps"] == max(level["throughput_rps"] for level in carried
                                       if level["value"] <= best["max_load"])
    assert body["summary"]["best_label"] == "default" and config["summary"] == best

    # The detail carries the same levels, and a retried request replays the job.
    detail = client.get(f"{URL}{job_id}/").json()
    assert [lvl["throughput_rps"] for lvl in detail["results"][0]["levels"]] == [
        lvl["throughput_rps"] for lvl in config["levels"]]
    again = client.post(URL, {"deployment": world.deployment.name, "version": 1,
                              "levels": [1, 2], "duration_s": 1, "warmup_s": 0.2,
                              "slo": {"p99_ms": 500}}, format="json",
                        HTTP_IDEMPOTENCY_KEY="ci-build-1")
    assert (again.status_code, again.json()["id"]) == (200, job_id)
    assert BenchmarkJob.objects.count() == 1
    # What the job loaded it unloaded again.
    assert not ModelLoad.objects.filter(server=world.server, state=ModelLoad.State.READY).exists()


def test_the_cli_starts_a_sweep_waits_for_it_and_prints_its_summary(world, live_server):
    """A CI job's view: ``switchyard benchmark start --wait`` in a process of its own, against
    the live API, while the reconciler drives the job here."""
    world.version(1)
    admin = UserFactory(username=f"admin-{world.user.username}")
    MembershipFactory(user=admin, tenant=world.deployment.tenant, role=Membership.Role.ADMIN)
    secret = tokens.issue(admin, world.deployment.tenant, "bench-ci",
                          Membership.Role.DEPLOYER).secret
    env = {**os.environ, "SWITCHYARD_URL": live_server.url, "SWITCHYARD_TOKEN": secret}
    waiter = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "benchmark", "start", "--deployment",
         world.deployment.name, "--version", "1", "--levels", "1,2", "--duration-s", "1",
         "--warmup-s", "0.2", "--slo", '{"p99_ms": 500}', "--wait", "--timeout", "120"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not BenchmarkJob.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        job = reconciler.run_to_end(BenchmarkJob.objects.get().pk)
        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()

    assert job.state == BenchmarkJob.State.SUCCEEDED, job.error
    assert waiter.returncode == 0, (out, err)
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"benchmark {job.pk} requested: v1 of ")
    assert any(line.startswith(f"benchmark {job.pk}: running ") for line in lines), lines
    best = job.summary["best"]
    assert lines[-1] == (
        f"benchmark {job.pk} succeeded: v1 on triton, max load within the SLO concurrency "
        f"{best['max_load']:g}: {best['max_load_rps']:.1f} req/s, p99 {best['max_load_p99_ms']:.1f} ms")
