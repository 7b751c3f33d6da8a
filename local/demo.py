"""Demo data: two tenants, a user per role, models with versions, quotas, the local cluster.

Idempotent: running it twice changes nothing. Artifact digests and sizes are those of real
deterministic tarballs of the demo model folders; the demo uploads them to its S3 endpoint
(moto's server mode) and loads the approved versions from there, the production path. It
uploads the next build of fraud-scorer too, unregistered: docs/api.md's walkthrough registers
and loads it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from console.exceptions import DomainError
from fleet import audit
from fleet.models import (
    GPU,
    Cluster,
    Cohort,
    DevicePrice,
    InferenceServer,
    Membership,
    Node,
    Quota,
    Tenant,
)
from local import cluster as local_cluster
from local.triton import DEMO_MODELS_DIR
from rollouts.loads import reconciler as load_reconciler
from rollouts.loads import requests as loads
from rollouts.models import Alias, Deployment, Model, ModelLoad, ModelVersion, Route
from rollouts.traffic import routes

Role = Membership.Role
Status = ModelVersion.Status
BUCKET = "switchyard-demo"

USERS = [
    # username, tenant, role
    ("alice", "acme", Role.ADMIN),
    ("erin", "acme", Role.APPROVER),
    ("dave", "acme", Role.DEPLOYER),
    ("bob", "acme", Role.VIEWER),
    ("charlie", "globex", Role.ADMIN),
    ("grace", "globex", Role.APPROVER),
]


@dataclass(frozen=True)
class DemoVersion:
    model: str
    version: int
    status: str
    memory_mib: int
    git_sha: str
    training_run: str
    source: int = 0  # the demo model folder its files come from (0: its own version's)


VERSIONS = [
    DemoVersion("fraud-scorer", 1, Status.APPROVED, 64, "4f1c2a9e", "train-2026-10-02"),
    DemoVersion("fraud-scorer", 2, Status.PENDING_APPROVAL, 64, "9b7d0e31", "train-2026-11-14"),
    # Retrained, as fast as version 1: the candidate a canary promotes.
    DemoVersion("fraud-scorer", 3, Status.APPROVED, 64, "d41e7c08", "train-2026-11-20", source=1),
    DemoVersion("sentiment", 1, Status.APPROVED, 48, "c0ffee12", "sent-2026-09-30"),
]
# The next build of fraud-scorer (retrained again, as fast as version 1): its artifact is
# uploaded with the others but it is not registered. A pipeline registers it, as the API
# walkthrough (docs/api.md) does.
NEXT_BUILD = DemoVersion("fraud-scorer", 4, Status.REGISTERED, 64, "7c2b9e14", "train-2026-11-27",
                         source=1)
OWNERS = {"fraud-scorer": "acme", "sentiment": "globex"}
DESCRIPTIONS = {
    "fraud-scorer": "Scores card transactions for fraud; v2 adds merchant features (slower).",
    "sentiment": "Classifies support tickets as positive or negative.",
}


def artifact_uri(model: str, version: int) -> str:
    """Where the demo's S3 endpoint holds a demo version's artifact."""
    return f"s3://{BUCKET}/{model}/{version}/model.tar.gz"


def artifact(model: str, version: int, source: int = 0) -> tuple[bytes, str]:
    """A deterministic .tar.gz of config.pbtxt and the version folder (the files of folder
    ``source`` when given), and its sha256."""
    base = DEMO_MODELS_DIR / model
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz, tarfile.open(
        fileobj=gz, mode="w", format=tarfile.PAX_FORMAT
    ) as tar:
        folder = base / str(source or version)
        paths = [base / "config.pbtxt", *sorted(folder.rglob("*"))]
        for path in paths:
            if path.is_dir() or "__pycache__" in path.parts:
                continue
            data = path.read_bytes()
            inside = path.relative_to(base)
            if folder in path.parents:
                inside = Path(str(version)) / path.relative_to(folder)
            info = tarfile.TarInfo(str(Path(model) / inside))
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    blob = buffer.getvalue()
    return blob, hashlib.sha256(blob).hexdigest()


def seed(password: str, s3_endpoint: str | None = None) -> None:
    """Create the demo rows; with ``s3_endpoint``, also upload every version's artifact there."""
    store = None
    if s3_endpoint:
        from fleet.adapters.s3 import S3ArtifactStore

        store = S3ArtifactStore(settings.SWITCHYARD_ARTIFACT_CACHE, endpoint_url=s3_endpoint)
    with transaction.atomic():
        _seed(password, store)


def demo_version(deployment: Deployment) -> ModelVersion | None:
    """The version a demo deployment serves: the one ``@production`` names when it is
    approved, else the newest approved one (None when none is)."""
    approved = deployment.model.versions.filter(status=Status.APPROVED)
    alias = Alias.objects.filter(model=deployment.model, name="production",
                                 version__in=approved).select_related("version").first()
    return alias.version if alias is not None else approved.order_by("-version").first()


def request_demo_loads(with_vllm: bool = False) -> list[ModelLoad]:
    """Load each demo deployment's version (:func:`demo_version`) onto it, as its tenant's
    deployer would. One a deployment: loads of one model on a server go one at a time, and a
    version approved in an earlier run waits for a person to load it again.

    The local servers start empty, so loads remembered from an earlier run are released first.
    """
    server = local_cluster.register_configured()
    load_reconciler.forget_server_state(server, "the local Triton restarted with an empty repository")
    vllm = InferenceServer.objects.filter(
        cluster=server.cluster, name=local_cluster.VLLM_SERVER_NAME
    ).first()
    if vllm is not None:
        load_reconciler.forget_server_state(vllm, "the local vLLM restarted")
    started: list[ModelLoad] = []
    deployments = Deployment.objects.filter(cluster=server.cluster).select_related("model", "tenant")
    for deployment in deployments.order_by("pk"):
        on_vllm = deployment.servers.filter(runtime=InferenceServer.Runtime.VLLM).exists()
        if on_vllm and not with_vllm:
            continue
        members = Membership.objects.filter(tenant=deployment.tenant)
        deployer = members.filter(role=Role.DEPLOYER).first() or members.filter(role=Role.ADMIN).first()
        version = demo_version(deployment)
        if version is not None:
            rows, _ = loads.request_load(deployer.user, deployment, version)
            started.extend(rows)
    return started


def route_ports() -> dict[str, int]:
    """The port each demo deployment on the local Triton gets at a fresh start
    (:func:`route_in_order` routes them in this order, each on the first free port)."""
    server = InferenceServer.objects.filter(name=local_cluster.SERVER_NAME,
                                            cluster__name=local_cluster.CLUSTER_NAME).first()
    deployments = Deployment.objects.filter(servers=server).order_by("pk")
    ports = list(settings.SWITCHYARD_ROUTE_PORTS)
    return {deployment.name: ports[i] for i, deployment in enumerate(deployments)}


def route_in_order(started: list[ModelLoad], max_steps: int = 60) -> list[Route]:
    """Carry out the demo's Triton loads here, one deployment after the other in the order
    they were made, and give each deployment its route as soon as its version is ready.

    Routes take the first free port of ``SWITCHYARD_ROUTE_PORTS`` when they are made, so
    this gives the demo the same ports at every fresh start (``fraud-scorer-prod`` 18100,
    ``sentiment-prod`` 18101: the README and docs/operations.md name them); left to the
    worker, whichever load was ready first would take 18100. Loads onto vLLM and any load
    that does not settle here are left to the worker, and their routes to beat's route tick.
    """
    made: list[Route] = []
    for load in sorted(started, key=lambda row: row.deployment_id):
        if load.server.runtime != InferenceServer.Runtime.TRITON:
            continue
        if load_reconciler.run_to_end(load.pk, max_steps).state != ModelLoad.State.READY:
            continue
        try:
            route, _made_now = routes.ensure_route(None, load.deployment)
        except DomainError:
            continue  # beat's route tick tries again, and logs why
        made.append(route)
    return made


def seed_vllm(s3_endpoint: str) -> None:
    """A LoRA adapter model for the local vLLM: made with peft, uploaded to S3, deployed."""
    from fleet.adapters.s3 import S3ArtifactStore
    from local import vllm as vllm_local

    runtime = vllm_local.ensure_runtime(settings.DATA_DIR)
    base = vllm_local.ensure_base_model(runtime, settings.DATA_DIR)
    adapter = vllm_local.make_lora_adapter(runtime, base, settings.DATA_DIR / "demo" / "support-tone")
    blob = _tar_folder(adapter, "adapter")
    digest = hashlib.sha256(blob).hexdigest()
    uri = f"s3://{BUCKET}/support-tone/1/adapter.tar.gz"
    store = S3ArtifactStore(settings.SWITCHYARD_ARTIFACT_CACHE, endpoint_url=s3_endpoint)
    store.ensure_bucket(BUCKET)
    store.put(uri, blob)
    server = InferenceServer.objects.get(name=local_cluster.VLLM_SERVER_NAME, cluster__name="local")
    with transaction.atomic():
        acme = Tenant.objects.get(slug="acme")
        dave = get_user_model().objects.get(username="dave")
        model, _ = Model.objects.get_or_create(
            tenant=acme, name="support-tone",
            defaults={"description": "LoRA adapter on SmolLM2 that answers in the support team's tone."},
        )
        version = model.versions.filter(version=1).first()
        if version is not None and version.sha256 != digest:
            # The adapter names its base model's folder, which moves with the data folder.
            raise RuntimeError("support-tone v1 was registered from another data folder; reset the demo")
        if version is None:
            ModelVersion.objects.create(
                model=model, version=1, artifact_uri=uri, sha256=digest, size_bytes=len(blob),
                runtime=ModelVersion.Runtime.VLLM, adapter_of=local_cluster.VLLM_BASE_MODEL,
                estimated_gpu_memory_mib=64, status=Status.APPROVED, registered_by=dave,
                approval_requested_by=dave, decided_by=get_user_model().objects.get(username="erin"),
                status_reason="demo data", labels={"team": "acme", "framework": "peft"},
            )
        deployment, _ = Deployment.objects.get_or_create(
            tenant=acme, name="support-tone-staging",
            defaults={"model": model, "cluster": server.cluster, "slo_p99_ms": 2000,
                      "description": "LoRA adapter served by the local vLLM"},
        )
        deployment.servers.set([server])


def _tar_folder(folder: Path, root: str) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz, tarfile.open(
        fileobj=gz, mode="w", format=tarfile.PAX_FORMAT
    ) as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_dir() or path.name.startswith(".switchyard"):
                continue
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{root}/{path.relative_to(folder).as_posix()}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _seed(password: str, store: object) -> None:
    user_model = get_user_model()
    tenants = {
        "acme": Tenant.objects.update_or_create(slug="acme", defaults={"name": "Acme Payments"})[0],
        "globex": Tenant.objects.update_or_create(slug="globex", defaults={"name": "Globex Support"})[0],
    }
    root, created = user_model.objects.get_or_create(
        username="root", defaults={"is_superuser": True, "is_staff": True, "email": "root@localhost"}
    )
    if created:
        root.set_password(password)
        root.save()
    for username, slug, role in USERS:
        user, created = user_model.objects.get_or_create(username=username)
        if created:
            user.set_password(password)
            user.save()
        Membership.objects.update_or_create(user=user, tenant=tenants[slug], defaults={"role": role})

    # Both teams lend each other unused CPU capacity; globex may borrow 2 instances.
    pool, _ = Cohort.objects.get_or_create(
        name="cpu-pool", defaults={"description": "The demo's teams share the local CPU servers"})
    Tenant.objects.filter(pk__in=[t.pk for t in tenants.values()], cohort__isnull=True).update(
        cohort=pool)
    for slug, device_class, units, memory, borrow_units, borrow_memory in [
        ("acme", "cpu", 8, 4096, 0, 0),
        ("acme", "nvidia-a100-80gb", 4, 4 * 81920, 0, 0),
        ("globex", "cpu", 4, 2048, 2, 1024),
        ("globex", "nvidia-l4", 2, 2 * 23034, 0, 0),
    ]:
        Quota.objects.get_or_create(
            tenant=tenants[slug], device_class=device_class,
            defaults={"units": units, "memory_mib": memory,
                      "borrowing_limit_units": borrow_units,
                      "borrowing_limit_memory_mib": borrow_memory},
        )

    # What an hour of each class costs: the versions' pages and the Costs page show money.
    for device_class, price in (("cpu", "0.05"), ("nvidia-a100-80gb", "3.40"),
                                ("nvidia-l4", "0.80")):
        DevicePrice.objects.get_or_create(device_class=device_class,
                                          defaults={"per_unit_hour": price, "currency": "USD"})

    _seed_gpu_inventory()
    server = local_cluster.register_configured()
    cluster = server.cluster

    for spec in VERSIONS:
        tenant = tenants[OWNERS[spec.model]]
        model, _ = Model.objects.get_or_create(
            tenant=tenant, name=spec.model, defaults={"description": DESCRIPTIONS[spec.model]}
        )
        blob, digest = artifact(spec.model, spec.version, spec.source)
        requester = user_model.objects.get(username="dave" if tenant.slug == "acme" else "charlie")
        approver = user_model.objects.get(username="erin" if tenant.slug == "acme" else "grace")
        version, created = ModelVersion.objects.get_or_create(
            model=model,
            version=spec.version,
            defaults={
                "artifact_uri": artifact_uri(spec.model, spec.version),
                "sha256": digest,
                "size_bytes": len(blob),
                "runtime": ModelVersion.Runtime.TRITON,
                "backend": "python",
                "triton_config": {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]},
                "gpus": 1,
                "estimated_gpu_memory_mib": spec.memory_mib,
                "labels": {"team": tenant.slug, "framework": "python"},
                "git_sha": spec.git_sha,
                "training_run": spec.training_run,
                "status": spec.status,
                "registered_by": requester,
                "approval_requested_by": requester,
                "decided_by": approver if spec.status == Status.APPROVED else None,
                "status_reason": "demo data" if spec.status == Status.APPROVED else "",
            },
        )
        if created:
            audit.record(requester, "registered", version, tenant=tenant, after={"version": spec.version})
            audit.record(requester, "requested_approval", version, tenant=tenant,
                         after={"status": Status.PENDING_APPROVAL})
            if spec.status == Status.APPROVED:
                audit.record(approver, "approved", version, tenant=tenant,
                             before={"status": Status.PENDING_APPROVAL},
                             after={"status": Status.APPROVED}, reason="demo data")
        if store is not None:
            uri = version.artifact_uri
            store.ensure_bucket(uri.split("/")[2])
            store.put(uri, blob)
    if store is not None:
        blob, _ = artifact(NEXT_BUILD.model, NEXT_BUILD.version, NEXT_BUILD.source)
        store.put(artifact_uri(NEXT_BUILD.model, NEXT_BUILD.version), blob)

    fraud = Model.objects.get(tenant=tenants["acme"], name="fraud-scorer")
    Alias.objects.get_or_create(model=fraud, name="production", defaults={"version": fraud.versions.get(version=1)})
    Alias.objects.get_or_create(model=fraud, name="staging", defaults={"version": fraud.versions.get(version=2)})
    sentiment = Model.objects.get(tenant=tenants["globex"], name="sentiment")
    Alias.objects.get_or_create(model=sentiment, name="production", defaults={"version": sentiment.versions.get(version=1)})

    for tenant, model, name, p99 in [
        (tenants["acme"], fraud, "fraud-scorer-prod", 50),
        (tenants["globex"], sentiment, "sentiment-prod", 100),
    ]:
        deployment, created = Deployment.objects.get_or_create(
            tenant=tenant, name=name,
            defaults={"model": model, "cluster": cluster, "production": True, "slo_p99_ms": p99,
                      "description": f"{model.name} on the local Triton"},
        )
        if created:
            deployment.servers.set([server])


def _seed_gpu_inventory() -> None:
    """An example static GPU cluster's inventory (nodes and GPUs, incl. MIG slices).

    It has no inference servers: nothing in the demo pretends to serve from GPUs it lacks.
    """
    cluster, _ = Cluster.objects.get_or_create(
        name="gpu-lab",
        defaults={"kind": Cluster.Kind.STATIC,
                  "description": "Example GPU inventory (no servers reachable from the demo)"},
    )
    node, _ = Node.objects.get_or_create(
        cluster=cluster, name="dgx-a100-01",
        defaults={"hostname": "dgx-a100-01.lab", "cpu_cores": 128, "memory_mib": 1024 * 1024},
    )
    for index in range(2):
        gpu, _ = GPU.objects.get_or_create(
            uuid=f"GPU-5f0e6a1c-0000-4000-8000-00000000000{index}",
            defaults={"node": node, "index": index, "model": "NVIDIA A100-SXM4-80GB",
                      "device_class": "nvidia-a100-80gb", "memory_mib": 81920},
        )
        if index == 1:
            for n, profile in enumerate(["3g.40gb", "3g.40gb"]):
                GPU.objects.get_or_create(
                    uuid=f"MIG-5f0e6a1c-0001-4000-8000-00000000001{n}",
                    defaults={"node": node, "index": index, "model": "NVIDIA A100-SXM4-80GB MIG",
                              "device_class": "nvidia-a100-80gb", "memory_mib": 40960,
                              "parent": gpu, "mig_profile": profile},
                )
