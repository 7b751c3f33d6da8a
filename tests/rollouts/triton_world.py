"""A world for model-load tests on a real Triton: a tenant, its deployer, a cpu quota, a
server on the Triton, artifacts in a real S3 endpoint (moto), and helpers to load and look."""

from __future__ import annotations

import hashlib
import io
import tarfile
import uuid
from collections.abc import Iterator
from typing import Any

import httpx

from fleet.models import Cluster, InferenceServer, Membership, Node
from fleet.quota.admission import usage_for
from local.s3 import DEMO_ACCESS_KEY_ID, DEMO_SECRET_ACCESS_KEY
from local.triton import DEMO_MODELS_DIR
from rollouts.loads import reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, ModelVersion
from tests.factories import (
    DeploymentFactory,
    MembershipFactory,
    ModelFactory,
    QuotaFactory,
    UserFactory,
)

State = ModelLoad.State

BROKEN_MODEL_PY = "import numpy as np\n\nclass TritonPythonModel:\n    def execute(self, requests)\n        return []\n"


def make_config_text(name: str) -> str:
    """The demo fraud scorer's config.pbtxt, named ``name``."""
    return (DEMO_MODELS_DIR / "fraud-scorer" / "config.pbtxt").read_text().replace(
        'name: "fraud-scorer"', f'name: "{name}"')


def make_artifact(name: str, version: int, *, model_py: str | None = None, config: str | None = None) -> bytes:
    """A tar.gz of the demo fraud scorer renamed ``name``: <name>/config.pbtxt, <name>/<v>/model.py."""
    base = DEMO_MODELS_DIR / "fraud-scorer"
    config_text = config if config is not None else make_config_text(name)
    code = model_py if model_py is not None else (base / "1" / "model.py").read_text()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, text in [(f"{name}/config.pbtxt", config_text), (f"{name}/{version}/model.py", code)]:
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_world(settings, tmp_path, moto_s3, make_s3_store, local_triton) -> Iterator[Any]:
    """A tenant, its deployer, a cpu quota, a server on the real Triton, an S3 bucket.

    The body of the ``world`` fixture (tests/rollouts/conftest.py)."""
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
                      store=store, triton=local_triton,
                      # The model's name on the shared Triton (its tenant's slug qualifies it).
                      served=model.name_on(server))

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
        reconciler.run_to_end(load.pk)


def index_state(triton, name: str) -> dict[str, str]:
    rows = httpx.post(f"{triton.http_url}/v2/repository/index", timeout=5).json()
    return {r.get("version", ""): r.get("state", "") for r in rows if r["name"] == name}


def held(world) -> tuple[int, int]:
    usage = usage_for([world.quota])[0]
    return usage.units_used, usage.memory_used_mib


def load_once(world, version: ModelVersion, **kwargs) -> ModelLoad:
    rows, _ = loads.request_load(world.user, world.deployment, version, **kwargs)
    assert len(rows) == 1
    return reconciler.run_to_end(rows[0].pk)
