"""What a benchmark job may ask for, checked before anything runs."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied

from console.exceptions import DomainError
from fleet.models import Membership
from rollouts.benchmarks import results, specs
from rollouts.models import BenchmarkJob, ModelVersion
from tests.factories import MembershipFactory, ModelFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def version():
    model = ModelFactory()
    return ModelVersion.objects.create(
        model=model, version=1, artifact_uri="s3://b/1", sha256="a" * 64, size_bytes=1,
        runtime="triton", triton_config={"max_batch_size": 8})


def test_whole_numbers_written_as_floats_are_whole_numbers(version):
    [config] = specs.parse_configs([{"instance_group": 2.0, "dynamic_batching": {
        "max_queue_delay_microseconds": 100.0, "preferred_batch_size": [4.0, 8]}}], version)
    assert config["instance_group"][0]["count"] == 2
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 100,
                                          "preferred_batch_size": [4, 8]}
    spread = specs.parse_request({"output_tokens": {"mean": 24, "spread": 2.0}}, "openai_chat")
    assert spread["output_tokens"] == {"mean": 24, "spread": 2}


@pytest.mark.parametrize("bad, field", [
    ({"dynamic_batching": {"max_queue_delay_microseconds": 1.5}},
     "configs[0].dynamic_batching.max_queue_delay_microseconds"),
    ({"dynamic_batching": {"preferred_batch_size": [0]}}, "configs[0].dynamic_batching.preferred_batch_size"),
    ({"dynamic_batching": {"preferred_batch_size": [True]}}, "configs[0].dynamic_batching.preferred_batch_size"),
    ({"instance_group": 0}, "configs[0].instance_group"),
    ({"instance_group": 17}, "configs[0].instance_group"),
    ({"max_batch_size": 2.5}, "configs[0].max_batch_size"),
    ({"sleep": 1}, "configs[0]"),
])
def test_bad_overrides_name_their_field(version, bad, field):
    with pytest.raises(DomainError) as caught:
        specs.parse_configs([bad], version)
    assert caught.value.field == field


def test_false_is_not_zero():
    for name in ("warmup_s", "max_requests", "refine_steps"):
        with pytest.raises(DomainError) as caught:
            specs.at_least_zero(False, name, 10)
        assert caught.value.field == name
    assert specs.at_least_zero(0, "warmup_s", 10) == 0.0


def test_only_a_deployer_registers_a_config_whatever_the_job(version):
    viewer = MembershipFactory(tenant=version.model.tenant, role=Membership.Role.VIEWER).user
    job = BenchmarkJob(tenant=version.model.tenant, version=version, state="running")
    with pytest.raises(PermissionDenied):
        results.register_config(viewer, job)


def test_runner_files_older_than_a_week_go_except_an_active_jobs(settings, tmp_path, version):
    import os
    import time

    from rollouts.benchmarks import runs

    settings.DATA_DIR = tmp_path
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    week = 7 * 24 * 3600
    old, fresh, running = (folder / f"{name}.log" for name in ("old", "fresh", "running"))
    for path in (old, fresh, running):
        path.write_text("log")
    for path in (old, running):
        os.utime(path, (time.time() - week - 60,) * 2)
    BenchmarkJob.objects.create(
        tenant=version.model.tenant, deployment=_deployment(version), version=version,
        server=_server(), protocol="triton_http", levels=[1], state="running", run_id="running",
        requested_by_label="t")

    assert runs.prune_runner_files() == 1
    assert not old.exists() and fresh.exists() and running.exists()


def _server():
    from fleet.models import Cluster, InferenceServer

    cluster = Cluster.objects.create(name="c", kind=Cluster.Kind.LOCAL)
    return InferenceServer.objects.create(cluster=cluster, name="t", runtime="triton",
                                          http_url="http://127.0.0.1:9")


def _deployment(version):
    from fleet.models import Cluster
    from tests.factories import DeploymentFactory

    cluster = Cluster.objects.create(name="d", kind=Cluster.Kind.LOCAL)
    return DeploymentFactory(tenant=version.model.tenant, model=version.model, cluster=cluster)
