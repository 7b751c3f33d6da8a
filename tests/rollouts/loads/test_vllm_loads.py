"""Model loads on a REAL vLLM: LoRA adapters at run time, and base-model rolls.

GIVEN the session's vLLM (SmolLM2, LoRA on) registered as a server of a local cluster, and
version artifacts in a real S3 endpoint, WHEN the reconciler advances a load, THEN a LoRA
version is served under its own name next to the base model, and a base-model version gets a
new server process that replaces the old one; a bad adapter fails readably, holding nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from fleet.inventory import health
from fleet.models import AuditEvent, Cluster, InferenceServer, Membership, Node, Placement
from local.s3 import DEMO_ACCESS_KEY_ID, DEMO_SECRET_ACCESS_KEY
from local.vllm import SCRATCH_ENV
from rollouts.loads import drift, reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, ModelVersion
from tests.factories import (
    DeploymentFactory,
    MembershipFactory,
    ModelFactory,
    QuotaFactory,
    UserFactory,
)
from tests.fixtures.triton import switchyard_data_dir
from tests.fixtures.vllm import tar_folder

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]
State = ModelLoad.State


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


@pytest.fixture
def vworld(settings, tmp_path, moto_s3, make_s3_store, local_vllm):
    data = tmp_path / "data"
    data.mkdir()
    (data / "runtimes").symlink_to(switchyard_data_dir() / "runtimes")
    settings.DATA_DIR = data
    settings.SWITCHYARD_S3_ENDPOINT_URL = moto_s3.endpoint_url
    settings.SWITCHYARD_S3_ACCESS_KEY_ID = DEMO_ACCESS_KEY_ID
    settings.SWITCHYARD_S3_SECRET_ACCESS_KEY = DEMO_SECRET_ACCESS_KEY
    settings.SWITCHYARD_ARTIFACT_CACHE = tmp_path / "cache"
    settings.SWITCHYARD_LOAD_TIMEOUT_S = 180
    settings.SWITCHYARD_LOAD_MAX_ATTEMPTS = 1
    cluster = Cluster.objects.create(name="local", kind=Cluster.Kind.LOCAL)
    node = Node.objects.create(cluster=cluster, name="localhost", memory_mib=24 * 1024)
    user = UserFactory(username=f"deployer-{uuid.uuid4().hex[:6]}")
    tenant = MembershipFactory(user=user, role=Membership.Role.DEPLOYER).tenant
    QuotaFactory(tenant=tenant, device_class="cpu", units=4, memory_mib=16 * 1024)
    bucket = f"vllm-{uuid.uuid4().hex[:8]}"
    store = make_s3_store(moto_s3, tmp_path / "upload-cache")
    store.ensure_bucket(bucket)

    def server(name: str, http_url: str) -> InferenceServer:
        return InferenceServer.objects.create(
            cluster=cluster, node=node, name=name, runtime=InferenceServer.Runtime.VLLM,
            http_url=http_url, model_repository=str(tmp_path / f"adapters-{name}"),
        )

    def version(model_name: str, blob: bytes, *, adapter_of: str = "", number: int = 1,
                server_row: InferenceServer):
        model = ModelFactory(tenant=tenant, name=model_name)
        deployment = DeploymentFactory(tenant=tenant, model=model, cluster=cluster, name=model_name)
        deployment.servers.set([server_row])
        uri = f"s3://{bucket}/{model_name}/{number}.tar.gz"
        store.put(uri, blob)
        row = ModelVersion.objects.create(
            model=model, version=number, artifact_uri=uri, sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=len(blob), runtime="vllm", adapter_of=adapter_of,
            estimated_gpu_memory_mib=512, status=ModelVersion.Status.APPROVED,
        )
        return row, deployment

    return {"user": user, "server": server, "version": version, "tenant": tenant}


def served(http_url: str) -> dict[str, str | None]:
    data = httpx.get(f"{http_url}/v1/models", timeout=10).json()["data"]
    return {m["id"]: m.get("parent") for m in data}


def run(vworld, version, deployment, action: str = "load") -> ModelLoad:
    if action == "load":
        rows, _ = loads.request_load(vworld["user"], deployment, version)
    else:
        rows = loads.request_unload(vworld["user"], deployment, version)
    return reconciler.run_to_end(rows[0].pk, max_steps=30)


def test_a_lora_version_is_served_next_to_its_base_and_unloaded(vworld, local_vllm, lora_adapter_artifact):
    server = vworld["server"]("vllm-lora", local_vllm.http_url)
    name = f"support-lora-{uuid.uuid4().hex[:4]}"
    version, deployment = vworld["version"](
        name, Path(lora_adapter_artifact).read_bytes(), adapter_of="smollm2", server_row=server
    )

    load = run(vworld, version, deployment)

    assert load.state == State.READY, load.error
    assert served(local_vllm.http_url)[f"{name}-v1"] == "smollm2"
    answer = httpx.post(f"{local_vllm.http_url}/v1/completions", timeout=60, json={
        "model": f"{name}-v1", "prompt": "The sea is", "max_tokens": 5, "temperature": 0})
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"]
    assert Placement.objects.get(pk=load.placement_id).state == Placement.State.ACTIVE

    load = run(vworld, version, deployment, "unload")

    assert load.state == State.UNLOADED, load.error
    assert f"{name}-v1" not in served(local_vllm.http_url)
    assert not (Path(server.model_repository) / f"{name}-v1").exists()


def test_an_adapter_gone_from_the_server_is_marked_lost_and_loads_again(
    vworld, local_vllm, lora_adapter_artifact
):
    """GIVEN a LoRA version ready on vLLM, WHEN the adapter disappears from the server behind
    Switchyard's back (as after a restart, where vLLM forgets runtime adapters), THEN the next
    probe and reconcile mark the load lost with the reason and free its quota, and a new load
    request serves it again."""
    server = vworld["server"]("vllm-drift", local_vllm.http_url)
    name = f"drift-lora-{uuid.uuid4().hex[:4]}"
    version, deployment = vworld["version"](
        name, Path(lora_adapter_artifact).read_bytes(), adapter_of="smollm2", server_row=server
    )
    load = run(vworld, version, deployment)
    assert load.state == State.READY, load.error

    gone = httpx.post(f"{local_vllm.http_url}/v1/unload_lora_adapter", timeout=30,
                      json={"lora_name": f"{name}-v1"})
    assert gone.status_code == 200, gone.text
    # Only an index read after the load was ready (with the clock skew allowed) may judge it.
    time.sleep(drift.CLOCK_SKEW_S)
    assert health.check_server(server.pk).health == InferenceServer.Health.HEALTHY

    assert drift.reconcile_all()["lost"] == 1
    load.refresh_from_db()
    assert load.state == State.LOST
    assert "no longer reports v1" in load.error
    assert Placement.objects.get(pk=load.placement_id).state == Placement.State.RELEASED
    assert AuditEvent.objects.filter(object_type="rollouts.modelload", object_id=str(load.pk),
                                     verb="lost").exists()

    again = run(vworld, version, deployment)
    assert again.pk != load.pk
    assert again.state == State.READY, again.error
    assert served(local_vllm.http_url)[f"{name}-v1"] == "smollm2"
    run(vworld, version, deployment, "unload")


def test_a_broken_adapter_fails_readably_and_holds_nothing(vworld, local_vllm):
    server = vworld["server"]("vllm-broken", local_vllm.http_url)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, data in [("adapter/adapter_config.json", b'{"r": "not a number"}'),
                           ("adapter/adapter_model.safetensors", b"garbage")]:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    version, deployment = vworld["version"](
        f"broken-lora-{uuid.uuid4().hex[:4]}", buffer.getvalue(), adapter_of="smollm2", server_row=server
    )

    load = run(vworld, version, deployment)

    assert load.state == State.FAILED
    assert load.error
    assert Placement.objects.get(pk=load.placement_id).state == Placement.State.RELEASED
    assert version.model.name + "-v1" not in served(local_vllm.http_url)
    assert httpx.get(f"{local_vllm.http_url}/health", timeout=5).status_code == 200


def test_a_base_model_version_rolls_a_new_server_process(vworld, vllm_base_model, tmp_path, settings):
    server = vworld["server"]("vllm-roll", "http://127.0.0.1:9")
    blob = tar_folder(vllm_base_model, tmp_path / "base.tar.gz", arcroot="smollm2").read_bytes()
    version, deployment = vworld["version"]("smollm2", blob, server_row=server)

    load = run(vworld, version, deployment)

    assert load.state == State.READY, load.error
    server.refresh_from_db()
    assert server.http_url != "http://127.0.0.1:9"
    assert "smollm2" in served(server.http_url)
    pidfile = Path(settings.DATA_DIR) / "local" / "run" / "vllm-vllm-roll.json"
    assert pidfile.exists()
    # The server the roll started, as another process sees it: its pid from the pidfile, its
    # process group (API server, engine core, worker) and its scratch folder.
    pid = json.loads(pidfile.read_text())["pid"]
    group = [p.pid for p in psutil.process_iter() if _group_of(p.pid) == pid]
    scratch = Path(psutil.Process(pid).environ()[SCRATCH_ENV])
    assert pid in group and len(group) >= 2 and scratch.is_dir()

    load = run(vworld, version, deployment, "unload")

    assert load.state == State.UNLOADED, load.error
    assert not pidfile.exists()
    # Stopped from its pid: every process of its group ended, its scratch folder is gone.
    assert not [p for p in group if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not scratch.exists()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.http_url}/health", timeout=3)
