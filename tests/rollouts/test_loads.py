"""Model loads end to end: S3 (moto server) → quota → real Triton, and every way back.

GIVEN a tenant with a cpu quota, a deployment on a server record that points at the session's
real Triton, and versions whose artifacts sit in a real S3 endpoint (moto's server mode),
WHEN the reconciler advances a load, THEN the version ends READY on the server, or FAILED with
a readable reason and nothing left behind (no quota held, no files, nothing loaded).
Every test uses its own model name: the Triton is shared by the whole session.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import tarfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
from django.db import connections

from fleet.errors import Conflict, DomainError
from fleet.models import Cluster, InferenceServer, Membership, Node, Placement
from fleet.quota import usage_for
from fleet.runtime.s3_local import DEMO_ACCESS_KEY_ID, DEMO_SECRET_ACCESS_KEY
from fleet.runtime.triton_local import DEMO_MODELS_DIR
from rollouts import loads
from rollouts.models import ModelLoad, ModelVersion
from tests.factories import (
    DeploymentFactory,
    MembershipFactory,
    ModelFactory,
    QuotaFactory,
    UserFactory,
)

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
State = ModelLoad.State

BROKEN_MODEL_PY = "import numpy as np\n\nclass TritonPythonModel:\n    def execute(self, requests)\n        return []\n"


def make_artifact(name: str, version: int, *, model_py: str | None = None, config: str | None = None) -> bytes:
    """A tar.gz of the demo fraud scorer renamed ``name``: <name>/config.pbtxt, <name>/<v>/model.py."""
    base = DEMO_MODELS_DIR / "fraud-scorer"
    config_text = config if config is not None else (base / "config.pbtxt").read_text().replace(
        'name: "fraud-scorer"', f'name: "{name}"'
    )
    code = model_py if model_py is not None else (base / "1" / "model.py").read_text()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, text in [(f"{name}/config.pbtxt", config_text), (f"{name}/{version}/model.py", code)]:
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def world(settings, tmp_path, moto_s3, make_s3_store, local_triton):
    """A tenant, its deployer, a cpu quota, a server on the real Triton, an S3 bucket."""
    settings.SWITCHYARD_S3_ENDPOINT_URL = moto_s3.endpoint_url
    settings.SWITCHYARD_S3_ACCESS_KEY_ID = DEMO_ACCESS_KEY_ID
    settings.SWITCHYARD_S3_SECRET_ACCESS_KEY = DEMO_SECRET_ACCESS_KEY
    settings.SWITCHYARD_ARTIFACT_CACHE = tmp_path / "cache"
    settings.SWITCHYARD_LOAD_TIMEOUT_S = 45
    settings.SWITCHYARD_LOAD_LEASE_S = 2
    settings.SWITCHYARD_LOAD_MAX_ATTEMPTS = 2
    cluster = Cluster.objects.create(name=f"local-{uuid.uuid4().hex[:6]}", kind=Cluster.Kind.LOCAL)
    node = Node.objects.create(cluster=cluster, name="localhost", memory_mib=4096)
    server = InferenceServer.objects.create(
        cluster=cluster, node=node, name="triton", runtime=InferenceServer.Runtime.TRITON,
        http_url=local_triton.http_url, model_repository=str(local_triton.model_repository),
        log_path=str(local_triton.log_path),
    )
    user = UserFactory(username=f"deployer-{uuid.uuid4().hex[:6]}")
    membership = MembershipFactory(user=user, role=Membership.Role.DEPLOYER)
    tenant = membership.tenant
    quota = QuotaFactory(tenant=tenant, device_class="cpu", units=4, memory_mib=1024)
    model = ModelFactory(tenant=tenant, name=f"lt-{uuid.uuid4().hex[:8]}")
    deployment = DeploymentFactory(tenant=tenant, model=model, cluster=cluster, name="d")
    deployment.servers.set([server])
    bucket = f"artifacts-{uuid.uuid4().hex[:8]}"
    store = make_s3_store(moto_s3, tmp_path / "upload-cache")
    store.ensure_bucket(bucket)

    class World:
        pass

    w = World()
    w.__dict__.update(cluster=cluster, node=node, server=server, user=user, tenant=tenant,
                      quota=quota, model=model, deployment=deployment, bucket=bucket,
                      store=store, triton=local_triton)

    def version(number: int, *, blob: bytes | None = None, sha256: str | None = None,
                config: dict | None = None, memory: int = 64) -> ModelVersion:
        blob = blob if blob is not None else make_artifact(model.name, number)
        uri = f"s3://{bucket}/{model.name}/{number}.tar.gz"
        store.put(uri, blob)
        return ModelVersion.objects.create(
            model=model, version=number, artifact_uri=uri,
            sha256=sha256 or hashlib.sha256(blob).hexdigest(), size_bytes=len(blob),
            runtime="triton", backend="python", estimated_gpu_memory_mib=memory,
            triton_config=config or {}, status=ModelVersion.Status.APPROVED,
        )

    w.version = version
    yield w
    # Leave the shared Triton as we found it.
    for load in ModelLoad.objects.filter(server=server, state=State.READY):
        loads.request_unload(user, deployment, load.version)
        loads.run_to_end(load.pk)


def index_state(triton, name: str) -> dict[str, str]:
    rows = httpx.post(f"{triton.http_url}/v2/repository/index", timeout=5).json()
    return {r.get("version", ""): r.get("state", "") for r in rows if r["name"] == name}


def held(world) -> tuple[int, int]:
    usage = usage_for([world.quota])[0]
    return usage.units_used, usage.memory_used_mib


def load_once(world, version: ModelVersion, **kwargs) -> ModelLoad:
    rows, _ = loads.request_load(world.user, world.deployment, version, **kwargs)
    assert len(rows) == 1
    return loads.run_to_end(rows[0].pk)


def test_it_loads_a_version_from_s3_onto_triton_and_unloads_it(world):
    v1 = world.version(1)
    load = load_once(world, v1)

    assert load.state == State.READY, load.error
    assert index_state(world.triton, world.model.name)["1"] == "READY"
    assert load.bytes_done == load.bytes_total == v1.size_bytes
    assert len(load.config_hash) == 64
    placement = Placement.objects.get(pk=load.placement_id)
    assert (placement.state, placement.config_hash, placement.units, placement.memory_mib) == (
        Placement.State.ACTIVE, load.config_hash, 1, 64)
    assert held(world) == (1, 64)
    states = [e.state for e in load.events.all()]
    assert states[:1] == [State.PENDING] and states[-1] == State.READY
    assert {State.ADMITTED, State.FETCHING, State.PLACING, State.LOADING} <= set(states)

    loads.request_unload(world.user, world.deployment, v1)
    load = loads.run_to_end(load.pk)

    assert load.state == State.UNLOADED
    assert index_state(world.triton, world.model.name).get("1") != "READY"
    assert not (Path(world.server.model_repository) / world.model.name / "1").exists()
    assert held(world) == (0, 0)


def test_loading_a_ready_version_again_changes_nothing(world):
    v1 = world.version(1)
    first = load_once(world, v1)
    events = first.events.count()

    rows, created = loads.request_load(world.user, world.deployment, v1)

    assert created is False and [r.pk for r in rows] == [first.pk]
    assert ModelLoad.objects.filter(version=v1).count() == 1
    assert first.events.count() == events
    assert held(world) == (1, 64)


def test_a_second_version_with_more_instances_gets_its_own_config(world):
    v1 = world.version(1)
    v2 = world.version(2, config={"instance_group": [{"count": 2, "kind": "KIND_CPU"}]})
    first = load_once(world, v1)
    second = load_once(world, v2)

    assert second.state == State.READY, second.error
    assert index_state(world.triton, world.model.name) == {"1": "READY", "2": "READY"}
    config = httpx.get(
        f"{world.triton.http_url}/v2/models/{world.model.name}/versions/2/config", timeout=5
    ).json()
    assert config["instance_group"][0]["count"] == 2
    assert second.config_hash != first.config_hash
    # Two instances of v2 count twice against the cpu quota.
    assert held(world) == (1 + 2, 64 + 128)


def test_an_idempotency_key_returns_the_first_answer_and_refuses_another_request(world):
    v1, v2 = world.version(1), world.version(2)
    rows, created = loads.request_load(world.user, world.deployment, v1, idempotency_key="ci-42")
    again, created_again = loads.request_load(world.user, world.deployment, v1, idempotency_key="ci-42")

    assert created and not created_again and [r.pk for r in again] == [r.pk for r in rows]
    with pytest.raises(Conflict) as refused:
        loads.request_load(world.user, world.deployment, v2, idempotency_key="ci-42")
    assert refused.value.field == "idempotency_key"
    loads.run_to_end(rows[0].pk)


def test_a_second_load_of_the_model_in_flight_is_a_conflict(world):
    v1, v2 = world.version(1), world.version(2)
    rows, _ = loads.request_load(world.user, world.deployment, v1)

    with pytest.raises(Conflict, match="in flight") as refused:
        loads.request_load(world.user, world.deployment, v2)

    assert refused.value.field == "version"
    assert ModelLoad.objects.filter(version=v2).count() == 0
    loads.run_to_end(rows[0].pk)


def test_quota_exceeded_fails_readably_and_holds_nothing(world):
    world.quota.units, world.quota.memory_mib = 1, 1024
    world.quota.save()
    big = world.version(1, config={"instance_group": [{"count": 3, "kind": "KIND_CPU"}]})

    load = load_once(world, big)

    assert load.state == State.FAILED
    assert "model instances quota" in load.error and "asks 3, 1 left of 1" in load.error
    assert held(world) == (0, 0)
    assert world.model.name not in {r["name"] for r in httpx.post(
        f"{world.triton.http_url}/v2/repository/index", timeout=5).json()}


def test_node_memory_is_admitted_too(world):
    world.node.memory_mib = 100
    world.node.save()
    load = load_once(world, world.version(1, memory=200))

    assert load.state == State.FAILED
    assert "node localhost has too little free memory: asks 200 MiB, 100 MiB free" in load.error


def test_a_checksum_mismatch_fails_and_leaves_nothing(world, settings):
    version = world.version(1, sha256="0" * 64)

    load = load_once(world, version)

    assert load.state == State.FAILED
    assert "0" * 64 in load.error and "sha256" in load.error
    assert held(world) == (0, 0)
    assert not list(Path(settings.SWITCHYARD_ARTIFACT_CACHE).glob("*"))
    assert not (Path(world.server.model_repository) / world.model.name).exists()


def test_a_broken_model_fails_with_the_servers_explanation_and_is_cleaned_up(world):
    broken = world.version(1, blob=make_artifact(world.model.name, 1, model_py=BROKEN_MODEL_PY))

    load = load_once(world, broken)

    assert load.state == State.FAILED
    assert "model.py" in load.error and ("line 4" in load.error or "SyntaxError" in load.error)
    assert held(world) == (0, 0)
    assert not (Path(world.server.model_repository) / world.model.name / "1").exists()
    assert index_state(world.triton, world.model.name).get("1") != "READY"


def test_an_unreachable_server_is_retried_then_fails_and_releases_quota(world, settings):
    world.server.http_url = "http://127.0.0.1:9"
    world.server.save()
    load = load_once(world, world.version(1))

    assert load.state == State.FAILED
    assert "127.0.0.1:9" in load.error
    assert held(world) == (0, 0)
    assert any("retry" in e.message for e in load.events.all())


def test_production_deployments_load_approved_versions_only(world):
    world.deployment.production = True
    world.deployment.save()
    version = world.version(1)
    version.status = ModelVersion.Status.PENDING_APPROVAL
    ModelVersion.objects.filter(pk=version.pk).update(status=version.status)

    with pytest.raises(DomainError, match="approved versions only"):
        loads.request_load(world.user, world.deployment, version)


def _killed_worker(load_id: int) -> None:
    """Run one step the way a worker does, and die in the middle of the download."""
    from fleet.adapters import s3

    real_fetch = s3.S3ArtifactStore.fetch

    def fetch_then_die(self, uri, *, sha256, size, progress=None):
        if progress:
            progress(size // 2, size)
        os._exit(17)  # no cleanup, no finally: a SIGKILLed worker

    s3.S3ArtifactStore.fetch = fetch_then_die
    try:
        loads.advance(load_id)
    finally:
        s3.S3ArtifactStore.fetch = real_fetch


def test_a_worker_killed_mid_fetch_is_taken_over_and_the_load_finishes(world):
    version = world.version(1)
    rows, _ = loads.request_load(world.user, world.deployment, version)
    load_id = rows[0].pk
    loads.advance(load_id)  # pending → admitted

    connections.close_all()  # the child opens its own connection
    child = multiprocessing.get_context("fork").Process(target=_killed_worker, args=(load_id,))
    child.start()
    child.join(60)
    assert child.exitcode == 17

    stuck = ModelLoad.objects.get(pk=load_id)
    assert stuck.state == State.FETCHING and stuck.lease_owner  # claimed, then abandoned
    assert loads.advance(load_id) is None  # the lease still holds: nobody steps in yet
    time.sleep(2.2)  # the lease runs out
    load = loads.run_to_end(load_id)

    assert load.state == State.READY, load.error
    assert any("took over" in e.message for e in load.events.all())
    assert held(world) == (1, 64)
