"""Benchmark jobs end to end on the real stack: a real Triton, real Redis, the runner process."""

from __future__ import annotations

import pytest

from rollouts.benchmarks import jobs
from rollouts.models import BenchmarkJob, ModelLoad

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.triton]


def sweep(world, version, **kwargs):
    fields = {"levels": [1, 2, 4, 8, 16], "duration_s": 2, "warmup_s": 0.5,
              "slo": {"p99_ms": 40}, **kwargs}
    job, _ = jobs.create_job(world.user, world.deployment, version=version.version, **fields)
    return jobs.run_to_end(job.pk)


def test_slower_version_carries_less_load_within_its_slo(world):
    fast, slow = world.version(1), world.version(2)
    fast_job = sweep(world, fast)
    slow_job = sweep(world, slow)
    assert fast_job.state == BenchmarkJob.State.SUCCEEDED, fast_job.error
    assert slow_job.state == BenchmarkJob.State.SUCCEEDED, slow_job.error
    print(fast_job.summary, slow_job.summary)
    assert slow_job.summary["best"]["max_load_rps"] < fast_job.summary["best"]["max_load_rps"]
    # What the job loaded it unloaded again.
    assert not ModelLoad.objects.filter(server=world.server, state=ModelLoad.State.READY).exists()
