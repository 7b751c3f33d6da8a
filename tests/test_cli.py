"""``switchyard`` (console/cli.py) against a live server with a real tenant token.

Rollouts are asked for through the API and moved on by calling the domain (the reconciler's
``advance``, or the row's end written as the reconciler would) while the CLI polls; the exit
codes and the printed reasons are what a CI job sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from console import cli
from fleet.models import Cluster, Membership
from fleet.tenancy import tokens
from rollouts.canary import reconciler as rollout_reconciler
from rollouts.models import BenchmarkJob, ModelLoad, ModelVersion, Rollout
from tests.api.benchmark_rows import finished_job
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
    QuotaFactory,
)
from tests.fixtures import sent_tasks

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def enqueued_rollouts(monkeypatch):
    """The live server runs in this process: what it would send to the broker is kept here."""
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_rollout", sent.append)
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_benchmark", sent.append)
    return sent


@pytest.fixture
def deployment(transactional_db, tenant_a):
    cluster = ClusterFactory(name=f"c-{uuid.uuid4().hex[:6]}", kind=Cluster.Kind.LOCAL)
    server = InferenceServerFactory(cluster=cluster, name="triton-a", http_url="http://127.0.0.1:9")
    model = ModelFactory(tenant=tenant_a, name="scorer")
    v1 = ModelVersionFactory(model=model, version=1, status=ModelVersion.Status.APPROVED)
    for number in (2, 3):
        ModelVersionFactory(model=model, version=number, status=ModelVersion.Status.APPROVED)
    found = DeploymentFactory(model=model, cluster=cluster, name="scorer")
    found.servers.set([server])
    ModelLoad.objects.create(tenant=tenant_a, deployment=found, server=server, version=v1,
                             state=ModelLoad.State.READY, requested_by_label="seed")
    return found


@pytest.fixture
def token(alice, tenant_a) -> str:
    return tokens.issue(alice, tenant_a, "release-pipeline", Membership.Role.DEPLOYER).secret


@pytest.fixture
def switchyard(live_server, token):
    """Run the CLI as a CI job would: a separate process, the server and token from the env."""

    def run(*args: str, token_value: str | None = None, **kwargs: Any):
        env = {**os.environ, "SWITCHYARD_URL": live_server.url,
               "SWITCHYARD_TOKEN": token if token_value is None else token_value}
        return subprocess.run([sys.executable, "-m", "console.cli", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60, **kwargs)

    def start(*args: str) -> subprocess.Popen:
        env = {**os.environ, "SWITCHYARD_URL": live_server.url, "SWITCHYARD_TOKEN": token}
        return subprocess.Popen([sys.executable, "-m", "console.cli", *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    run.start = start
    return run


def started(switchyard, deployment, *args: str) -> int:
    done = switchyard("rollout", "start", "--deployment", str(deployment.pk), "--version", "2",
                      *args)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return int(done.stdout.strip())


def test_start_prints_the_id_and_status_shows_the_rollout(switchyard, deployment):
    done = switchyard("rollout", "start", "--deployment", "scorer", "--version", "2",
                      "--steps", '[{"set_weight": 10}, {"analysis": {"alpha": 0.01}}]',
                      "--analysis", '{"planned_samples": 500}', "--reason", "release 118")

    assert done.returncode == 0, done.stderr
    row = Rollout.objects.get(pk=int(done.stdout))
    assert "requested: canary of v2 against v1, loading" in done.stderr
    assert row.steps == [{"set_weight": 10}, {"analysis": {"alpha": 0.01}}]
    assert (row.analysis, row.reason) == ({"planned_samples": 500}, "release 118")
    assert row.requested_by_label.startswith("token:release-pipeline")
    status = switchyard("rollout", "status", str(row.pk))
    assert status.returncode == 0
    assert f"rollout {row.pk} of scorer: canary of v2 against v1" in status.stdout
    assert f"rollout {row.pk}: loading" in status.stdout


def test_the_same_idempotency_key_gives_the_same_rollout(switchyard, deployment):
    first = started(switchyard, deployment, "--idempotency-key", "release-118")
    again = started(switchyard, deployment, "--idempotency-key", "release-118")

    assert first == again
    assert Rollout.objects.count() == 1


def test_wait_prints_each_change_and_exits_4_when_aborted_with_the_reason(switchyard, deployment):
    rollout_id = started(switchyard, deployment)
    waiter = switchyard.start("rollout", "wait", str(rollout_id), "--timeout", "30")
    first = waiter.stdout.readline()
    assert first.startswith(f"rollout {rollout_id}: loading"), first

    aborted = switchyard("rollout", "abort", str(rollout_id), "--reason", "wrong build")
    assert aborted.returncode == 0, aborted.stderr
    assert "abort asked for" in aborted.stdout
    time.sleep(1.5)  # the waiter sees the action asked for before the tick carries it out
    rollout_reconciler.advance(rollout_id, force=True)
    out, err = waiter.communicate(timeout=30)

    assert waiter.returncode == cli.ABORTED, (first, out, err)
    assert "loading, abort asked for" in out
    assert out.strip().splitlines()[-1] == (
        f"rollout {rollout_id} aborted: aborted by token:release-pipeline@tenant-a (wrong build)")


@pytest.mark.parametrize(("state", "reason", "code"), [
    (Rollout.State.SUCCEEDED, "v2 promoted", cli.OK),
    (Rollout.State.ROLLED_BACK, "analysis failed at 10% to v2: p99 +40% (8 ms)", cli.ROLLED_BACK),
    (Rollout.State.FAILED, "Switchyard failed unexpectedly while loading (RuntimeError: x)",
     cli.FAILED),
])
def test_wait_exits_by_how_the_rollout_ended(switchyard, deployment, state, reason, code):
    rollout_id = started(switchyard, deployment)
    Rollout.objects.filter(pk=rollout_id).update(state=state, reason=reason,
                                                 weights={"1": 100})

    done = switchyard("rollout", "wait", str(rollout_id))

    assert done.returncode == code, (done.stdout, done.stderr)
    assert done.stdout.strip().splitlines()[-1] == (
        f"rollout {rollout_id} {state.replace('_', ' ')}: {reason}")


def test_wait_times_out_with_5_and_says_where_the_rollout_stands(switchyard, deployment):
    rollout_id = started(switchyard, deployment)
    Rollout.objects.filter(pk=rollout_id).update(
        state=Rollout.State.PROGRESSING, step_index=2, started_at=Rollout.objects.get(
            pk=rollout_id).created_at, weights={"1": 75, "2": 25})

    done = switchyard("rollout", "wait", str(rollout_id), "--timeout", "1.5")

    assert done.returncode == cli.WAITING
    assert (f"rollout {rollout_id}: progressing, step 3/6 (set weight 25%), weights v1 75%, "
            "v2 25%") in done.stdout
    assert "timed out after 1.5s" in done.stdout


def test_start_and_wait_stops_when_an_approver_is_needed(switchyard, deployment):
    deployment.production = True
    deployment.save()

    done = switchyard("rollout", "start", "--deployment", str(deployment.pk), "--version", "2",
                      "--wait", "--stop-when-waiting")

    assert done.returncode == cli.WAITING, (done.stdout, done.stderr)
    assert "waits for a person: an approver who is not the requester" in done.stdout


def test_refusals_exit_1_with_the_servers_reason(switchyard, deployment, tenant_b):
    first = started(switchyard, deployment)

    second = switchyard("rollout", "start", "--deployment", str(deployment.pk), "--version", "3")
    missing = switchyard("rollout", "status", "999999")
    wrong_state = switchyard("rollout", "resume", str(first))
    bad_token = switchyard("rollout", "status", str(first), token_value="sy_nope_nope")
    no_token = switchyard("rollout", "status", str(first), token_value="")
    bad_steps = switchyard("rollout", "start", "--deployment", "1", "--steps", "[5,")
    no_id = switchyard("rollout", "wait")
    refused = switchyard("rollout", "start", "--deployment", str(deployment.pk), "--version", "2",
                         "--steps", '[{"set_weight": 150}]', "--idempotency-key", "other")

    for done in (second, missing, wrong_state, bad_token, no_token, bad_steps, no_id, refused):
        assert done.returncode == cli.ERROR, (done.args, done.stdout, done.stderr)
    assert f"HTTP 409: deployment: rollout {first} is loading" in second.stderr
    assert "HTTP 404: No Rollout matches the given query." in missing.stderr
    assert "HTTP 409: action: " in wrong_state.stderr and "resume needs it paused" in wrong_state.stderr
    assert "HTTP 401" in bad_token.stderr
    assert "set SWITCHYARD_TOKEN" in no_token.stderr
    assert "--steps is not valid JSON" in bad_steps.stderr
    assert "required: id" in no_id.stderr
    assert "HTTP 400: steps: steps[0]: set_weight is an integer from 0 to 100" in refused.stderr


def test_an_unreachable_server_exits_1(monkeypatch, capsys):
    monkeypatch.setenv("SWITCHYARD_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SWITCHYARD_TOKEN", "sy_x_y")

    code = cli.main(["rollout", "status", "1"])

    assert code == cli.ERROR
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


def test_waiting_rides_out_a_server_that_is_briefly_unreachable(capsys):
    answers: list[Any] = [cli.Refused(0, "cannot reach x: refused"), cli.Refused(502, "bad"),
                          {"id": 7, "state": "succeeded", "reason": "v2 promoted", "steps": []}]

    class Flaky(cli.Client):
        def rollout(self, rollout_id: int) -> dict[str, Any]:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    code = cli.wait(Flaky("http://x", "t"), 7, timeout=30, sleep=lambda s: None)

    out, err = capsys.readouterr()
    assert code == cli.OK
    assert err.count("trying again") == 1
    assert out.strip().splitlines()[-1] == "rollout 7 succeeded: v2 promoted"


# --- benchmarks -----------------------------------------------------------------------------


@pytest.fixture
def bench(deployment, tenant_a):
    """The deployment above (one server), with a CPU quota a benchmark is admitted against."""
    QuotaFactory(tenant=tenant_a, device_class="cpu")
    return deployment


def benchmark_started(switchyard, *args: str) -> int:
    done = switchyard("benchmark", "start", "--deployment", "scorer", "--version", "2", *args)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return int(done.stdout.strip())


def test_benchmark_start_prints_the_id_and_status_shows_the_job(switchyard, bench):
    done = switchyard("benchmark", "start", "--deployment", "scorer", "--version", "2",
                      "--levels", "8,1,4", "--duration-s", "3", "--warmup-s", "0.5",
                      "--slo", '{"p99_ms": 25}', "--idempotency-key", "build-9")

    assert done.returncode == 0, done.stderr
    job = BenchmarkJob.objects.get(pk=int(done.stdout))
    assert "requested: v2 of scorer on triton-a, concurrency 1, 4, 8, queued" in done.stderr
    assert (job.levels, job.duration_s, job.warmup_s, job.slo["p99_ms"]) == ([1, 4, 8], 3, 0.5, 25)
    assert job.requested_by_label.startswith("token:release-pipeline")
    again = benchmark_started(switchyard, "--levels", "8,1,4", "--duration-s", "3",
                              "--warmup-s", "0.5", "--slo", '{"p99_ms": 25}',
                              "--idempotency-key", "build-9")
    assert again == job.pk
    status = switchyard("benchmark", "status", str(job.pk))
    assert status.returncode == 0
    assert f"benchmark {job.pk} of v2 of scorer on triton-a (scorer)" in status.stdout
    assert f"benchmark {job.pk}: queued 0%, queued" in status.stdout


def test_benchmark_wait_prints_progress_then_the_summary_and_exits_0(switchyard, bench):
    job_id = benchmark_started(switchyard, "--levels", "1,2,4")
    waiter = switchyard.start("benchmark", "wait", str(job_id), "--timeout", "30")
    first = waiter.stdout.readline()
    assert first.strip() == f"benchmark {job_id}: queued 0%, queued", first

    BenchmarkJob.objects.filter(pk=job_id).update(
        state=BenchmarkJob.State.RUNNING, progress=0.5, phase="level 2 of 3: concurrency 2")
    time.sleep(1.5)  # the waiter polls every second
    measured = finished_job(bench, bench.model.versions.get(version=1), rps=240.0,
                            server=bench.servers.first(), state=BenchmarkJob.State.FAILED)
    BenchmarkJob.objects.filter(pk=job_id).update(
        state=BenchmarkJob.State.SUCCEEDED, progress=1.0, phase="done: concurrency 2",
        results=measured.results, summary=measured.summary)
    out, err = waiter.communicate(timeout=30)

    assert waiter.returncode == cli.OK, (first, out, err)
    lines = out.strip().splitlines()
    assert f"benchmark {job_id}: running 50%, level 2 of 3: concurrency 2" in lines
    assert lines[-2:] == [
        f"benchmark {job_id}: succeeded, done: concurrency 2",
        f"benchmark {job_id} succeeded: v2 on triton-a, max load within the SLO concurrency 2: "
        "240.0 req/s, p99 9.5 ms",
    ]


@pytest.mark.parametrize(("state", "fields", "code", "last"), [
    (BenchmarkJob.State.FAILED, {"phase": "the load failed", "error": "the load of default "
                                 "ended failed: Triton refused the config\ntraceback"},
     cli.FAILED, "failed: the load of default ended failed: Triton refused the config"),
    (BenchmarkJob.State.CANCELLED, {"phase": "cancelled by erin"}, cli.ABORTED,
     "cancelled: cancelled by erin"),
])
def test_benchmark_wait_exits_by_how_the_job_ended(switchyard, bench, state, fields, code, last):
    job_id = benchmark_started(switchyard)
    BenchmarkJob.objects.filter(pk=job_id).update(state=state, **fields)

    done = switchyard("benchmark", "wait", str(job_id))

    assert done.returncode == code, (done.stdout, done.stderr)
    assert done.stdout.strip().splitlines()[-1] == f"benchmark {job_id} {last}"


def test_a_config_sweep_summary_names_the_best_config_and_each_configs_figure(capsys):
    row = {"id": 4, "state": "succeeded", "version": 1, "server": "triton", "mode": "rate",
           "phase": "done", "progress": 1.0, "summary": {
               "best_label": "2 instances",
               "best": {"max_load": 200, "max_load_rps": 198.4, "max_load_p99_ms": None},
               "configs": [{"label": "1 instance", "max_load_rps": None, "error": ""},
                           {"label": "2 instances", "max_load_rps": 198.4, "error": ""},
                           {"label": "4 instances", "max_load_rps": None,
                            "error": "could not load 4 instances: quota"}]}}

    assert cli.benchmark_summary(row) == [
        "benchmark 4 succeeded: v1 on triton, max load within the SLO 200 req/s offered: "
        "198.4 req/s",
        "best config: 2 instances",
        "  1 instance: no level within the SLO",
        "  2 instances: 198.4 req/s",
        "  4 instances: could not load 4 instances: quota",
    ]


def test_benchmark_wait_times_out_with_5(switchyard, bench):
    job_id = benchmark_started(switchyard)
    BenchmarkJob.objects.filter(pk=job_id).update(state=BenchmarkJob.State.LOADING,
                                                  phase="loading default on triton-a")

    done = switchyard("benchmark", "wait", str(job_id), "--timeout", "1.5")

    assert done.returncode == cli.WAITING
    assert f"benchmark {job_id}: loading 0%, loading default on triton-a" in done.stdout
    assert "timed out after 1.5s" in done.stdout


def test_benchmark_cancel_and_refusals(switchyard, bench):
    job_id = benchmark_started(switchyard)

    cancelled = switchyard("benchmark", "cancel", str(job_id))
    busy = switchyard("benchmark", "start", "--deployment", "scorer", "--version", "3")
    bad_level = switchyard("benchmark", "start", "--deployment", "scorer", "--version", "2",
                           "--levels", "600", "--idempotency-key", "other")
    bad_arg = switchyard("benchmark", "start", "--deployment", "scorer", "--version", "2",
                         "--levels", "1,x")
    missing = switchyard("benchmark", "wait", "999999")

    assert cancelled.returncode == cli.OK, cancelled.stderr
    assert cancelled.stdout.strip() == (
        f"cancel asked for; benchmark {job_id}: queued 0%, queued; cancel asked for by "
        "token:release-pipeline@tenant-a")
    assert BenchmarkJob.objects.get(pk=job_id).cancel_requested_by.startswith("token:")
    for done in (busy, bad_level, bad_arg, missing):
        assert done.returncode == cli.ERROR, (done.args, done.stdout, done.stderr)
    assert (f"HTTP 409: server: benchmark {job_id} is queued on triton-a: one job per server "
            "at a time") in busy.stderr
    assert "HTTP 400: levels: from 1 to 512, got 600" in bad_level.stderr
    assert "--levels takes numbers separated by commas, got 'x'" in bad_arg.stderr
    assert "HTTP 404: No BenchmarkJob matches the given query." in missing.stderr


class Rows:
    """A client whose job reads as the rows given, one a poll (the last one from then on)."""

    def __init__(self, *rows: dict[str, Any]) -> None:
        self.rows = list(rows)

    def benchmark(self, job_id: int) -> dict[str, Any]:
        return self.rows.pop(0) if len(self.rows) > 1 else self.rows[0]


def job_row(state: str, progress: float, phase: str) -> dict[str, Any]:
    return {"id": 7, "state": state, "progress": progress, "phase": phase, "mode": "concurrency",
            "version": 2, "server": "triton-a", "error": "",
            "summary": {"best": {"max_load": 4, "max_load_rps": 310.0, "max_load_p99_ms": 8.0}}}


SWEEP = [job_row("running", 0.1, "sweeping default: level 1: concurrency 1"),
         job_row("running", 0.2, "sweeping default: level 1: concurrency 1"),
         job_row("running", 0.4, "sweeping default: level 2: concurrency 4"),
         job_row("running", 0.5, "sweeping default: level 2: concurrency 4"),
         job_row("succeeded", 1.0, "done")]


def test_benchmark_wait_on_a_terminal_updates_one_line_in_place(capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)

    code = cli.wait_benchmark(Rows(*SWEEP), 7, timeout=60, sleep=lambda s: None)

    out = capsys.readouterr().out
    assert code == cli.OK
    progress, *after = out.split("\n")
    # Every poll's change rewrote the same line; the summary starts a line of its own.
    assert progress.count("\r\x1b[K") == 5
    assert progress.endswith("benchmark 7: succeeded, done")
    assert "benchmark 7: running 20%, sweeping default: level 1: concurrency 1\r" in progress
    assert after == ["benchmark 7 succeeded: v2 on triton-a, max load within the SLO "
                     "concurrency 4: 310.0 req/s, p99 8.0 ms", ""]


def test_benchmark_wait_in_a_log_prints_a_line_per_level_not_per_percent(capsys):
    code = cli.wait_benchmark(Rows(*SWEEP), 7, timeout=60, sleep=lambda s: None)

    lines = capsys.readouterr().out.splitlines()
    assert code == cli.OK
    assert "\r" not in "".join(lines)
    assert lines == [
        "benchmark 7: running 10%, sweeping default: level 1: concurrency 1",
        "benchmark 7: running 40%, sweeping default: level 2: concurrency 4",
        "benchmark 7: succeeded, done",
        "benchmark 7 succeeded: v2 on triton-a, max load within the SLO concurrency 4: "
        "310.0 req/s, p99 8.0 ms",
    ]


@pytest.mark.parametrize(("mode", "value"), [("concurrency", 4), ("concurrency", 16.0),
                                             ("rate", 200), ("rate", 12.5)])
def test_the_cli_and_the_benchmark_page_name_a_level_alike(mode, value):
    from rollouts.benchmarks import specs

    assert cli.level_name(mode, value) == specs.level_name(mode, value)
    assert cli.load_text(mode, {"max_load": value, "max_load_rps": 1.0}).startswith(
        specs.level_name(mode, value) + ":")
