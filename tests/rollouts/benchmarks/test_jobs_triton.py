"""Benchmark jobs end to end on the real stack: a real Triton, real Redis, the runner process."""

from __future__ import annotations

import pytest

from rollouts.benchmarks import reconciler, results
from rollouts.benchmarks import requests as job_requests
from rollouts.loads import reconciler as load_reconciler
from rollouts.loads import requests as loads
from rollouts.models import BenchmarkJob, ModelLoad

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.triton]


def sweep(world, version, **kwargs):
    fields = {"levels": [1, 2, 4, 8, 16], "duration_s": 2, "warmup_s": 0.5,
              "slo": {"p99_ms": 40}, **kwargs}
    job, _ = job_requests.create_job(world.user, world.deployment, version=version.version, **fields)
    return reconciler.run_to_end(job.pk)


def test_slower_version_carries_less_load_within_its_slo(world):
    fast, slow = world.version(1), world.version(2)
    fast_job = sweep(world, fast)
    slow_job = sweep(world, slow)
    assert fast_job.state == BenchmarkJob.State.SUCCEEDED, fast_job.error
    assert slow_job.state == BenchmarkJob.State.SUCCEEDED, slow_job.error
    assert slow_job.summary["best"]["max_load_rps"] < fast_job.summary["best"]["max_load_rps"]
    # What the job loaded it unloaded again.
    assert not ModelLoad.objects.filter(server=world.server, state=ModelLoad.State.READY).exists()


def test_client_and_server_latency_agree_within_the_measured_client_overhead(world):
    """At concurrency 1 every request the client times is one the server timed: the client's
    mean is the server's mean request time plus the client's and the network's share, which
    the runner measures as the health check's round trip (~0.2-0.3 ms here). Allowed: the
    server's time less 0.1 ms (the two clocks' rounding) up to 5 round trips or 2 ms more."""
    job = sweep(world, world.version(1), levels=[1], refine_steps=0, duration_s=3)
    assert job.state == BenchmarkJob.State.SUCCEEDED, job.error
    level = job.results[0]["levels"][0]
    client_mean, server = level["latency_ms"]["mean"], level["server"]
    overhead = job.summary["best"]["client_overhead_ms"]
    assert server["available"] and server["request_ms"] >= 4.0  # the model sleeps 4 ms
    # The two scrapes that bracket the window take a few ms each, and up to 36 ms each were
    # measured under the full suite on 2 cores (15 requests across the edges at ~207 a
    # second): allowed, the requests of 50 ms at each edge at the measured rate.
    rate = level["ok"] / 3
    assert abs(server["requests"] - level["ok"]) <= max(10, 0.02 * level["ok"], rate * 0.1)
    assert server["request_ms"] - 0.1 <= client_mean <= server["request_ms"] + max(5 * overhead, 2.0), (
        client_mean, server, overhead)
    assert server["queue_ms"] < 1.0  # one request at a time: nothing waits


def test_a_config_sweep_over_instance_counts_finds_a_config_at_least_as_good_and_a_rerun_agrees(world):
    """The model sleeps 4 ms per request on one instance; two instances serve two at once, so
    the sweep must find two at least as good as the default. A second run of the same sweep
    finds each config's max load within 25% of the first (noise on a shared 2-core machine)."""
    version = world.version(1)
    configs = [{}, {"instance_group": 2}]
    first = sweep(world, version, configs=configs, levels=[2, 4, 8, 16], refine_steps=1)
    assert first.state == BenchmarkJob.State.SUCCEEDED, first.error
    default, two = (entry["summary"] for entry in first.results)
    assert first.summary["best_label"] == "2 instances"
    assert two["max_load_rps"] >= default["max_load_rps"]
    # Each config was loaded through the load path with its own config, and unloaded again.
    made = list(ModelLoad.objects.filter(version=version).order_by("pk"))
    assert [load.config_override["instance_group"][0]["count"] if load.config_override else 1
            for load in made] == [1, 2]
    assert all(load.state == ModelLoad.State.UNLOADED for load in made)

    again = sweep(world, version, configs=configs, levels=[2, 4, 8, 16], refine_steps=1)
    assert again.state == BenchmarkJob.State.SUCCEEDED, again.error
    for before, after in zip(first.results, again.results, strict=True):
        a, b = before["summary"]["max_load_rps"], after["summary"]["max_load_rps"]
        assert abs(a - b) <= 0.25 * max(a, b), (before["label"], a, b)

    registered = results.register_config(world.user, first)
    assert registered.version == 2
    assert registered.triton_config["instance_group"][0]["count"] == 2
    assert registered.sha256 == version.sha256 and registered.labels["benchmark_job"] == str(first.pk)
    assert results.register_config(world.user, first) == registered  # a retry registers nothing new


def test_cancel_stops_the_load_within_a_second_and_unloads(world):
    """The load is watched from Triton's own counter of executions: after cancel() it must
    stop growing within 1 s (the runner reads its stop flag every 0.1 s)."""
    import threading
    import time

    import httpx

    world.version(1)
    job, _ = job_requests.create_job(world.user, world.deployment, version=1, levels=[4], duration_s=60,
                             warmup_s=0, refine_steps=0)
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            current = BenchmarkJob.objects.get(pk=job.pk)
            if current.state in BenchmarkJob.FINAL:
                return
            if current.load_id:
                load_reconciler.advance(current.load_id)
            reconciler.advance(job.pk)
            time.sleep(0.2)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    stats = f"{world.triton.http_url}/v2/models/{world.served}/versions/1/stats"

    seen = [0]

    def executions() -> int:
        """Triton's execution count (once the job unloads the model: the last one seen)."""
        found = httpx.get(stats, timeout=5).json().get("model_stats")
        if found:
            seen[0] = int(found[0]["execution_count"])
        return seen[0]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        current = BenchmarkJob.objects.get(pk=job.pk)
        if current.state == BenchmarkJob.State.RUNNING and current.progress > 0:
            with_progress = current
            if executions() > 50:
                break
        time.sleep(0.2)
    else:
        pytest.fail("the job never got going")
    assert with_progress.phase.startswith("sweeping default: level 1")

    job_requests.cancel(world.user, with_progress)
    cancelled_at = time.monotonic()
    last, quiet_since = executions(), None
    while time.monotonic() - cancelled_at < 5:
        now = executions()
        if now == last and quiet_since is None:
            quiet_since = time.monotonic()
        elif now != last:
            quiet_since = None
        last = now
        if quiet_since is not None and time.monotonic() - quiet_since > 1.0:
            break
        time.sleep(0.05)
    assert quiet_since is not None and quiet_since - cancelled_at < 1.0, quiet_since and quiet_since - cancelled_at

    thread.join(30)
    stop.set()
    ended = BenchmarkJob.objects.get(pk=job.pk)
    assert ended.state == BenchmarkJob.State.CANCELLED and "cancelled by" in ended.phase
    load = ModelLoad.objects.get(pk=ended.load_id)
    load_reconciler.run_to_end(load.pk)
    assert ModelLoad.objects.get(pk=load.pk).state == ModelLoad.State.UNLOADED
    assert ended.results[0]["levels"] and ended.results[0]["levels"][0]["cancelled"]


def test_a_server_that_is_gone_fails_the_job_readably(world, triton_runtime, tmp_path):
    """A Triton of its own for this test, the version loaded on it, then killed: the job's
    requests find nobody, and it fails saying so, without a level reported as capacity."""
    import os
    import signal

    from fleet.models import InferenceServer
    from local.triton import start_triton

    repository = tmp_path / "repo"
    repository.mkdir()
    proc = start_triton(triton_runtime, repository, log_path=tmp_path / "triton.log")
    try:
        server = InferenceServer.objects.create(
            cluster=world.cluster, node=world.node, name="doomed", runtime="triton",
            http_url=proc.http_url, metrics_url=proc.metrics_url,
            model_repository=str(repository), log_path=str(tmp_path / "triton.log"))
        world.deployment.servers.add(server)
        version = world.version(1)
        rows, _ = loads.request_load(world.user, world.deployment, version, server_names=["doomed"])
        assert load_reconciler.run_to_end(rows[0].pk).state == ModelLoad.State.READY
        os.kill(proc.pid, signal.SIGKILL)
        # Its inputs read from the model's metadata: the first call already finds nobody.
        job, _ = job_requests.create_job(world.user, world.deployment, version=1, server="doomed",
                                 levels=[1, 2], duration_s=1, warmup_s=0)
        from_metadata = reconciler.run_to_end(job.pk)
        # Inputs given: the load generator finds nobody.
        job, _ = job_requests.create_job(world.user, world.deployment, version=1, server="doomed",
                                 levels=[1, 2], duration_s=1, warmup_s=0,
                                 request={"inputs": [{"name": "INPUT0", "shape": [2],
                                                      "datatype": "FP32", "data": [0.1, 0.2]}]})
        from_runner = reconciler.run_to_end(job.pk)
    finally:
        proc.stop()
    assert from_metadata.state == BenchmarkJob.State.FAILED
    assert "server doomed did not answer" in from_metadata.error
    assert "Connection refused" in from_metadata.error, from_metadata.error
    assert from_runner.state == BenchmarkJob.State.FAILED
    assert "no request succeeded: connect" in from_runner.error, from_runner.error
    assert from_runner.results[0]["levels"][0]["errors"]["connect"] > 0
    assert from_runner.summary["best"] is None


def test_one_job_per_server_and_quota_first(world):
    from console.exceptions import Conflict, QuotaExceeded

    world.version(1)
    first, _ = job_requests.create_job(world.user, world.deployment, version=1, levels=[1])
    with pytest.raises(Conflict) as busy:
        job_requests.create_job(world.user, world.deployment, version=1, levels=[2])
    assert busy.value.field == "server" and f"benchmark {first.pk}" in str(busy.value)
    job_requests.cancel(world.user, first)
    reconciler.run_to_end(first.pk)
    with pytest.raises(QuotaExceeded) as short:  # the world's quota holds 4 cpu instances
        job_requests.create_job(world.user, world.deployment, version=1, configs=[{"instance_group": 8}])
    assert short.value.field == "quota" and "asks 8, 4 left of 4" in str(short.value)
