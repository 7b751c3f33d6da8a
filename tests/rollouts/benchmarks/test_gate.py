"""The benchmark gate's arithmetic, over the newest succeeded benchmark of each version."""

from __future__ import annotations

import pytest
from django.utils import timezone

from console.exceptions import DomainError
from fleet.models import Cluster, InferenceServer
from rollouts.benchmarks import results
from rollouts.canary import specs as rollout_specs
from rollouts.models import BenchmarkJob, ModelVersion
from tests.factories import DeploymentFactory, ModelFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions():
    model = ModelFactory()
    cluster = Cluster.objects.create(name="c", kind=Cluster.Kind.LOCAL)
    server = InferenceServer.objects.create(cluster=cluster, name="t", runtime="triton",
                                            http_url="http://127.0.0.1:9")
    deployment = DeploymentFactory(tenant=model.tenant, model=model, cluster=cluster)
    made = [ModelVersion.objects.create(model=model, version=n, artifact_uri=f"s3://b/{n}",
                                        sha256="a" * 64, size_bytes=1, runtime="triton")
            for n in (1, 2)]
    return deployment, server, made


def finished(deployment, server, version, rps, *, mode="concurrency", state="succeeded", days=0,
             device_class="cpu"):
    return BenchmarkJob.objects.create(
        tenant=deployment.tenant, deployment=deployment, version=version, server=server,
        protocol="triton_http", mode=mode, levels=[1], state=state, requested_by_label="t",
        summary={"best": {"max_load_rps": rps}, "device_class": device_class}, finished_at=timezone.now() - timezone.timedelta(days=days),
    )


def test_within_the_allowed_drop_passes_and_past_it_fails(versions):
    deployment, server, (v1, v2) = versions
    finished(deployment, server, v1, 200.0)
    job = finished(deployment, server, v2, 181.0)
    assert results.gate(v2, v1, 10)["passed"] is True
    job.delete()
    finished(deployment, server, v2, 179.0)
    found = results.gate(v2, v1, 10)
    assert found["passed"] is False and found["drop_pct"] == pytest.approx(10.5)
    assert "below v1" in found["message"]


def test_the_newest_succeeded_benchmark_counts_and_failed_ones_do_not(versions):
    deployment, server, (v1, v2) = versions
    finished(deployment, server, v1, 200.0)
    finished(deployment, server, v2, 100.0, days=2)
    finished(deployment, server, v2, 199.0)
    finished(deployment, server, v2, 10.0, state="failed")
    assert results.gate(v2, v1, 5)["passed"] is True


def test_missing_benchmarks_or_another_mode_leave_the_gate_undecided(versions):
    deployment, server, (v1, v2) = versions
    finished(deployment, server, v1, 200.0)
    assert results.gate(v2, v1, 10)["passed"] is None
    finished(deployment, server, v2, 200.0, mode="rate")
    undecided = results.gate(v2, v1, 10)
    assert undecided["passed"] is None and "v2" in undecided["message"]


def test_the_step_is_checked_when_a_rollout_is_asked_for():
    assert rollout_specs.parse_steps([{"benchmark": {}}]) == [{"benchmark": {"max_drop_pct": 10.0}}]
    assert rollout_specs.parse_steps([{"benchmark": {"max_drop_pct": 5, "mode": "rate"}}])[0] == {
        "benchmark": {"max_drop_pct": 5.0, "mode": "rate"}}
    for bad in ({"max_drop_pct": -1}, {"max_drop_pct": 101}, {"max_drop_pct": "x"},
                {"mode": "fast"}, {"other": 1}, []):
        with pytest.raises(DomainError) as caught:
            rollout_specs.parse_steps([{"benchmark": bad}])
        assert caught.value.field == "steps[0]"


def test_benchmarks_on_different_device_classes_are_not_compared(versions):
    deployment, server, (v1, v2) = versions
    finished(deployment, server, v1, 200.0, device_class="a100-80gb")
    finished(deployment, server, v2, 100.0, device_class="cpu")
    found = results.gate(v2, v1, 10)
    assert found["passed"] is None and "a100-80gb" in found["message"]
