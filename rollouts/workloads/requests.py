"""Server workloads: Triton and vLLM servers Switchyard creates and owns on Kubernetes.

A deployment on a Kubernetes cluster can have Switchyard run its servers as apps/v1
Deployments and Services in a namespace (``fleet.adapters.kube_workloads`` writes them with
server-side apply). The requests (:func:`create_workload`, :func:`scale`,
:func:`roll_version`, :func:`delete_workload`) check the caller and the input
(``rollouts.workloads.checks``), admit the quota first (the version's GPUs x replicas on the
device class the GPU resource and the node selector name), write the row and hand it to the
reconciler (``rollouts.workloads.reconciler``), which applies, waits and rolls back.

Servers run only in namespaces a platform admin granted the tenant (``fleet.tenancy.namespaces``; a
request that names none gets the first granted), and a vLLM version's labels may name only a
Secret of that namespace (``vllm.hf_token_secret``) and flags the platform allows
(``vllm.args``, ``SWITCHYARD_VLLM_ALLOWED_ARGS``): checked at creation and at each roll.

Autoscaled workloads (``min_replicas`` and ``max_replicas`` given at creation) are scaled by
an ``autoscaling/v2`` HorizontalPodAutoscaler Switchyard applies beside the Deployment, on the
metrics Switchyard exports for prometheus-adapter (its replica recommendation and the p99
against the SLO). Their Deployment leaves ``spec.replicas`` to the HPA, and their quota is
admitted for ``max_replicas`` up front: the HPA may scale up to it at any time, and a pod it
adds is never one the quota did not count. :func:`set_replica_range` changes the range
(admitting a higher maximum first, as :func:`scale` does); :func:`scale` refuses them. The mode
is not switchable afterwards (see ``ServerWorkload``): ``spec.replicas`` would change
server-side-apply managers, which resets it.

States (``ServerWorkload.State``): pending → applying (the Deployment, and on creation the
Service, applied) → progressing (the Deployment's status read through the API until every
replica is updated and available) → ready. A change (a replica count, a vLLM base-model
version) goes back through applying. When the new pods are not available by the change's
deadline (``SWITCHYARD_KUBE_ROLLOUT_DEADLINE_S``), or the controller reports
ProgressDeadlineExceeded, ``rolling_back`` re-applies the manifest that was in force before
(``previous_spec``) and the row ends ``failed`` with the reason. ``deleting`` → ``deleted``
removes both objects and releases the quota.

Failures of the API (``KubeError``): transient ones (unreachable, 5xx, 409 on a stale write)
are retried, backing off, until the change's deadline; a refusal (403) is retried too until it
has lasted ``SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S`` (an API server that has just started refuses
everything for a moment); permanent ones (401, 422, a missing object) end the change at once.
Either way the reason is on the row (``error``, ``detail``), never a 500, and nothing is left
half-applied: a creation that fails removes what it applied and releases the quota (until it
could remove it, it stays ``deleting``, holding the quota); a change that fails rolls back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.celery import send_soon
from console.exceptions import Conflict, DomainError, QuotaExceeded
from fleet import audit
from fleet.adapters import kube_workloads as kw
from fleet.audit import actor_label
from fleet.models import AuditEvent, InferenceServer, Membership, Placement
from fleet.quota import admission as quota
from fleet.tenancy import namespaces
from fleet.tenancy.scoping import require_role, token_of
from rollouts import idempotency
from rollouts.models import Deployment, ModelVersion, Route, ServerWorkload
from rollouts.traffic import routes
from rollouts.workloads.checks import (
    NOT_SWITCHABLE,
    check_gpu_resource,
    check_image,
    check_names,
    check_node_selector,
    check_range,
    check_replicas,
    check_runnable,
    check_storage,
    check_version,
    range_words,
)
from rollouts.workloads.specs import (
    demand,
    device_class,
    held_text,
    service_urls,
)

log = logging.getLogger(__name__)
State = ServerWorkload.State

CREATED = "created_workload"


def _left_nothing() -> Any:
    """Workloads whose creation failed with nothing applied (nothing on the cluster, quota
    released): they hold no name and no pod labels."""
    return ServerWorkload.objects.filter(state=State.FAILED, applied_spec={}).exclude(
        placement__state__in=Placement.HOLDING)


def _supersede(actor: Any, cluster_id: int, namespace: str, name: str) -> None:
    """A creation that failed with nothing applied gives its name to a new one: it ends
    ``deleted`` (as if deleted, its history kept), and its server leaves its deployment."""
    for old in _left_nothing().filter(cluster_id=cluster_id, namespace=namespace,
                                       name=name).select_related("deployment", "server"):
        ServerWorkload.objects.filter(pk=old.pk).update(
            state=State.DELETED, updated_at=timezone.now(),
            detail=f"{old.detail} Superseded by a new creation of {name}, asked by "
                   f"{actor_label(actor)}.")
        if old.server is not None:
            old.deployment.servers.remove(old.server)
        audit.record(actor, "superseded_workload", old, tenant=old.tenant,
                     before={"state": State.FAILED}, after={"state": State.DELETED})


def _check_free(cluster_id: int, namespace: str, name: str,
                labels: dict[str, str]) -> InferenceServer | None:
    """Refuse a name, or pod labels, another live workload in the namespace has; answer the
    retired managed server of that name, which the new workload takes over. A creation that
    failed with nothing applied (:func:`_left_nothing`) is not live."""
    live = ServerWorkload.objects.filter(cluster_id=cluster_id).exclude(
        state=State.DELETED).exclude(pk__in=_left_nothing().values("pk"))
    if live.filter(namespace=namespace, name=name).exists():
        raise Conflict(f"a server named {name} already runs in namespace {namespace}",
                       field="name")
    for other in live.filter(namespace=namespace, runtime=labels[kw.APP_LABEL]).select_related(
        "deployment", "version"
    ):
        if kw.pod_labels(kw.ServerSpec(
            name=other.name, namespace=namespace, runtime=other.runtime,
            deployment=other.deployment.name, version=other.version.version, image="",
            replicas=0, node_selector={},
        )) == labels:
            shown = ", ".join(f"{k}={v}" for k, v in labels.items())
            raise Conflict(
                f"the pods of another server in namespace {namespace} carry the labels "
                f"{shown}: two Deployments would select each other's pods; run this one in "
                "another namespace", field="namespace",
            )
    server = InferenceServer.objects.filter(cluster_id=cluster_id, name=name).first()
    if server is None:
        return None
    retired = server.source == InferenceServer.Source.MANAGED and not live.filter(
        server=server).exists()
    if not retired:
        raise Conflict(f"cluster already has a server named {name}", field="name")
    return server


def _replay(deployment: Deployment, key: str, fingerprint: str) -> ServerWorkload | None:
    """The workload an earlier request with ``key`` created, or None; a Conflict when that
    request asked for something else. (The key is kept with the creation's audit entry.)"""
    event = (AuditEvent.objects.filter(tenant=deployment.tenant, verb=CREATED,
                                       object_type="rollouts.serverworkload",
                                       after__idempotency_key=key)
             .order_by("-id").first())
    if event is None:
        return None
    idempotency.check_replay(event.after.get("fingerprint"), fingerprint)
    return ServerWorkload.objects.select_related("deployment", "version").get(
        pk=int(event.object_id))


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


def create_workload(
    deployment: Deployment,
    version: ModelVersion,
    actor: Any,
    *,
    name: str,
    replicas: int | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    namespace: str = "",
    gpu_resource: str = kw.GPU_RESOURCE,
    node_selector: dict[str, str] | None = None,
    model_repository: str = "",
    volume_claim: str = "",
    image: str = "",
    idempotency_key: str = "",
) -> tuple[ServerWorkload, bool]:
    """Run ``version`` on ``replicas`` servers (default 1) of a deployment on a Kubernetes
    cluster, or on ``min_replicas`` to ``max_replicas`` an HPA chooses (autoscaled; then no
    ``replicas``): (the workload, whether it is new).

    The quota (the version's GPUs x replicas, and its GPU memory x replicas, on the device
    class of ``gpu_resource`` on the product ``node_selector`` names; for an autoscaled one
    x ``max_replicas``) is admitted before anything is written; a managed InferenceServer
    (``http://<name>.<namespace>.svc:8000``) joins the deployment's servers; the reconciler
    then applies the Deployment and Service (and the HPA). The same Idempotency-Key with the
    same request answers the workload it created. Autoscaled or not is decided here, for
    good (see ``NOT_SWITCHABLE``). ``namespace`` is one granted to the deployment's tenant
    on its cluster (empty: the first granted), else a 400 on ``namespace``.
    """
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    cluster = deployment.cluster
    if not cluster.is_kubernetes:
        # What the deployment is, not what the request says: a conflict, as an archived one.
        raise Conflict(
            f"deployment {deployment.name} is on {cluster.get_kind_display().lower()} cluster "
            f"{cluster.name}: Switchyard runs servers on Kubernetes clusters only",
            field="deployment",
        )
    check_version(deployment, version)
    check_names(name, namespace)
    namespace = namespaces.resolve(deployment.tenant, cluster, namespace)
    autoscaled = min_replicas is not None or max_replicas is not None
    if autoscaled:
        min_replicas, max_replicas = check_range(min_replicas, max_replicas)
        if replicas is not None:
            raise DomainError("an autoscaled server's replica count is its HPA's: give "
                              "min_replicas and max_replicas, not replicas", field="replicas")
        replicas = min_replicas  # what the HPA raises the Deployment to first
    else:
        replicas = check_replicas(1 if replicas is None else replicas, 1)
    check_gpu_resource(gpu_resource)
    selector = check_node_selector(node_selector if node_selector is not None else {})
    check_storage(version.runtime, model_repository, volume_claim)
    check_runnable(version, model_repository, volume_claim)
    image = image or (settings.SWITCHYARD_TRITON_IMAGE if version.runtime == kw.TRITON
                      else settings.SWITCHYARD_VLLM_IMAGE)
    check_image(image)
    klass = device_class(selector[kw.PRODUCT_LABEL], gpu_resource, deployment.cluster)
    scaling: dict[str, int] = (
        {"min_replicas": min_replicas, "max_replicas": max_replicas} if autoscaled
        else {"replicas": replicas}
    )
    fingerprint = idempotency.fingerprint(
        deployment=deployment.pk, version=version.pk, name=name, namespace=namespace,
        gpu_resource=gpu_resource, node_selector=selector, model_repository=model_repository,
        volume_claim=volume_claim, image=image, **scaling,
    )
    request = {
        "name": name, "namespace": namespace, "replicas": replicas, "runtime": version.runtime,
        "image": image, "gpu_resource": gpu_resource, "node_selector": selector,
        "model_repository": model_repository, "volume_claim": volume_claim,
        "min_replicas": min_replicas, "max_replicas": max_replicas,
    }

    def taken() -> None:
        # Another request took the name between our checks and the insert (the unique
        # constraint has the last word), and it did not carry our key.
        raise Conflict(f"a server named {name} was just created in namespace {namespace}",
                       field="name") from None

    return idempotency.create_once(
        lambda: _create(deployment, version, actor, request, klass, idempotency_key, fingerprint),
        key=idempotency_key, replay=lambda: _replay(deployment, idempotency_key, fingerprint),
        refuse=taken)


def _create(
    deployment: Deployment, version: ModelVersion, actor: Any, request: dict[str, Any],
    klass: str, key: str, fingerprint: str,
) -> tuple[ServerWorkload, bool]:
    token = token_of(actor)
    name, namespace, runtime = request["name"], request["namespace"], request["runtime"]
    with transaction.atomic():
        # Deleting the deployment takes the same lock: it is never archived under a new server.
        if Deployment.objects.select_for_update().only("archived_at").get(
            pk=deployment.pk
        ).archived_at:
            raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
        if key:
            earlier = _replay(deployment, key, fingerprint)
            if earlier is not None:
                return earlier, False
        labels = kw.pod_labels(kw.ServerSpec(
            name=name, namespace=namespace, runtime=runtime, deployment=deployment.name,
            version=version.version, image="", replicas=0, node_selector={},
        ))
        _supersede(actor, deployment.cluster_id, namespace, name)
        server = _check_free(deployment.cluster_id, namespace, name, labels)
        server_fields = {
            "runtime": runtime, "source": InferenceServer.Source.MANAGED,
            "kube_namespace": namespace, "kube_name": name,
            "model_repository": request["model_repository"], "node": None,
            **service_urls(name, namespace, runtime),
        }
        if server is None:
            server = InferenceServer.objects.create(cluster=deployment.cluster, name=name,
                                                    **server_fields)
        else:
            # A retired server of this name (kept as the history its placements point to)
            # serves again: the deleted workload lets go of it.
            ServerWorkload.objects.filter(server=server).update(server=None)
            for field, value in server_fields.items():
                setattr(server, field, value)
            server.health = InferenceServer.Health.UNKNOWN
            server.reported_models = []
            server.save()
        now = timezone.now()
        workload = ServerWorkload.objects.create(
            tenant=deployment.tenant, deployment=deployment, cluster=deployment.cluster,
            version=version, server=server, name=name, namespace=namespace, runtime=runtime,
            image=request["image"], model_repository=request["model_repository"],
            volume_claim=request["volume_claim"], gpu_resource=request["gpu_resource"],
            gpus_per_replica=version.gpus, replicas=request["replicas"],
            min_replicas=request["min_replicas"], max_replicas=request["max_replicas"],
            node_selector=request["node_selector"], state=State.PENDING,
            deadline_at=now + timedelta(seconds=settings.SWITCHYARD_KUBE_ROLLOUT_DEADLINE_S),
            requested_by=None if token else actor, requested_by_token=token,
            requested_by_label=actor_label(actor),
        )
        # Refuses with the numbers when the quota is short: nothing above is kept.
        units, memory = demand(version, workload.quota_replicas)
        try:
            placement = quota.admit_on_class(deployment.tenant, server, version.pk, klass,
                                             units, memory, priority=deployment.priority)
        except QuotaExceeded as exc:
            if not workload.autoscaled:
                raise
            raise QuotaExceeded(
                f"up to {workload.max_replicas} replicas of {name} hold {held_text(units, klass)} "
                f"and {memory} MiB, admitted up front since the HPA may scale to them at any "
                f"time: {exc.message}", field="max_replicas",
            ) from None
        why = (f" for the HPA's maximum of {workload.max_replicas} replicas"
               if workload.autoscaled else "")
        ServerWorkload.objects.filter(pk=workload.pk).update(
            placement=placement,
            detail=f"admitted: holds {held_text(units, klass)} and {memory} MiB{why}; waiting to "
                   "apply",
        )
        workload.refresh_from_db()
        deployment.servers.add(server)
        audit.record(actor, CREATED, workload, tenant=deployment.tenant, after={
            **request, "version": version.version, "device_class": klass, "units": units,
            "memory_mib": memory, "idempotency_key": key, "fingerprint": fingerprint,
        })
        _enqueue_on_commit(workload.pk)
    return workload, True


def _lock_for_change(workload: ServerWorkload, what: str) -> ServerWorkload:
    """The row, locked, in a state a change may start from (ready, or failed with something
    running); a Conflict saying why not otherwise."""
    locked = ServerWorkload.objects.select_for_update(of=("self",)).select_related(
        "deployment", "version__model", "placement", "cluster", "server",
    ).get(pk=workload.pk)
    if locked.state not in (State.READY, State.FAILED):
        raise Conflict(
            f"{locked.name} is {locked.get_state_display().lower()}: wait for it to finish "
            f"before you {what}", field="state",
        )
    if not locked.applied_spec:
        raise Conflict(f"nothing of {locked.name} runs on the cluster (its creation failed): "
                       "delete it and create it again", field="state")
    return locked


def _start_change(workload: ServerWorkload, actor: Any, detail: str, **fields: Any) -> None:
    now = timezone.now()
    ServerWorkload.objects.filter(pk=workload.pk).update(
        state=State.APPLYING, previous_spec=workload.applied_spec, detail=detail, error="",
        attempts=0, next_attempt_at=None, phase_started_at=now, updated_at=now,
        deadline_at=now + timedelta(seconds=settings.SWITCHYARD_KUBE_ROLLOUT_DEADLINE_S),
        **fields,
    )
    workload.refresh_from_db()
    _enqueue_on_commit(workload.pk)


def scale(workload: ServerWorkload, replicas: Any, actor: Any) -> tuple[ServerWorkload, bool]:
    """Run ``replicas`` servers (0 to 100): (the workload, whether anything changes).

    More replicas are admitted against the quota first and refused with the numbers when it
    is short; fewer hold their quota until the extra pods are gone (the change is ready).
    An autoscaled workload is refused: its HPA owns the count (:func:`set_replica_range`)."""
    require_role(actor, workload.tenant, Membership.Role.DEPLOYER)
    if workload.autoscaled:
        raise DomainError(
            f"{workload.name} is autoscaled: its HPA owns the replica count; change "
            f"min_replicas and max_replicas instead (now {workload.min_replicas}-"
            f"{workload.max_replicas}). {NOT_SWITCHABLE[0].upper()}{NOT_SWITCHABLE[1:]}",
            field="replicas",
        )
    replicas = check_replicas(replicas, 0)
    with transaction.atomic():
        locked = _lock_for_change(workload, "scale it")
        before = locked.replicas
        if replicas == before and locked.state == State.READY:
            return locked, False
        units, memory = demand(locked.version, replicas)
        _grow_quota(locked, units, memory, "replicas", lambda held, now: (
            f"{replicas} replicas of {locked.name} hold {held} ({before} hold {now})"))
        label = actor_label(actor)
        _start_change(locked, actor, f"scaling from {before} to {replicas} replicas, asked by "
                                     f"{label}", replicas=replicas, previous_version=None)
        audit.record(actor, "scaled_workload", locked, tenant=locked.tenant,
                     before={"replicas": before}, after={"replicas": replicas})
    return locked, True


def _grow_quota(workload: ServerWorkload, units: int, memory: int, field: str,
                describe: Callable[[str, int], str]) -> None:
    """Admit what ``units`` and ``memory`` need beyond what the workload's placement holds
    (a smaller need keeps the quota until the change is ready); refused naming ``field``,
    ``describe(what the new count holds, units held now)`` saying why."""
    placement = workload.placement
    if placement is None or placement.state not in Placement.HOLDING:
        raise Conflict(f"{workload.name} holds no quota: delete it and create it again",
                       field="state")
    if units <= placement.units and memory <= placement.memory_mib:
        return
    try:
        quota.resize(placement, max(units, placement.units), max(memory, placement.memory_mib))
    except QuotaExceeded as exc:
        held = held_text(units, placement.device_class)
        raise QuotaExceeded(f"{describe(held, placement.units)}: {exc.message}",
                            field=field) from None


def set_replica_range(workload: ServerWorkload, min_replicas: Any, max_replicas: Any,
                      actor: Any) -> tuple[ServerWorkload, bool]:
    """Let an autoscaled workload's HPA scale between ``min_replicas`` and ``max_replicas``
    (1 <= min <= max <= 100): (the workload, whether anything changes).

    A higher maximum is admitted against the quota first (x the version's GPUs and memory)
    and refused with the numbers when it is short; a lower one holds its quota until the
    HPA's pods are within it (the change is ready). The HPA (and the range annotation on the
    Deployment) is applied again, then Switchyard waits for the Deployment to be within the
    range and available; when it is not by the deadline, the previous range comes back.
    A workload that is not autoscaled is refused: the mode is chosen at creation."""
    require_role(actor, workload.tenant, Membership.Role.DEPLOYER)
    if not workload.autoscaled:
        raise DomainError(f"{workload.name} runs a fixed replica count: scale it with "
                          f"replicas. {NOT_SWITCHABLE[0].upper()}{NOT_SWITCHABLE[1:]}; create "
                          "an autoscaled workload instead", field="min_replicas")
    low, high = check_range(min_replicas, max_replicas)
    with transaction.atomic():
        locked = _lock_for_change(workload, "change its replica range")
        before = (locked.min_replicas, locked.max_replicas)
        if (low, high) == before and locked.state == State.READY:
            return locked, False
        units, memory = demand(locked.version, high)
        _grow_quota(locked, units, memory, "max_replicas", lambda held, now: (
            f"up to {high} replicas of {locked.name} hold {held}, admitted up front since the "
            f"HPA may scale to them at any time (up to {before[1]} hold {now})"))
        _start_change(
            locked, actor, f"changing the HPA's range from {range_words(*before)} to "
                           f"{range_words(low, high)}, asked by {actor_label(actor)}",
            min_replicas=low, max_replicas=high, previous_version=None,
        )
        audit.record(actor, "scaled_workload", locked, tenant=locked.tenant,
                     before={"min_replicas": before[0], "max_replicas": before[1]},
                     after={"min_replicas": low, "max_replicas": high})
    return locked, True


def roll_version(workload: ServerWorkload, version: ModelVersion,
                 actor: Any) -> tuple[ServerWorkload, bool]:
    """Roll a vLLM server to another base-model version: its Deployment is updated in place
    (new ``--model`` arguments), Kubernetes replaces the pods one by one, and Switchyard
    waits for them through the API; the previous spec comes back when they fail. The new
    version's quota is admitted first and held beside the old one's until the roll is done.
    """
    require_role(actor, workload.tenant, Membership.Role.DEPLOYER)
    if workload.runtime != kw.VLLM:
        raise Conflict(
            "a Triton server keeps the version it started with: load other versions onto it "
            "(model-control-mode explicit), or run another server for a canary",
            field="version",
        )
    check_version(workload.deployment, version)
    with transaction.atomic():
        locked = _lock_for_change(workload, "roll it")
        before = locked.version
        if version.pk == before.pk and locked.state == State.READY:
            return locked, False
        namespaces.resolve(locked.tenant, locked.cluster, locked.namespace)
        check_runnable(version, locked.model_repository, locked.volume_claim)
        units, memory = demand(version, locked.quota_replicas)
        klass = device_class(locked.node_selector.get(kw.PRODUCT_LABEL, ""),
                             locked.gpu_resource, locked.cluster)
        try:
            placement = quota.admit_on_class(locked.tenant, locked.server, version.pk, klass,
                                             units, memory, priority=locked.deployment.priority)
        except QuotaExceeded as exc:
            raise QuotaExceeded(
                f"v{version.version} holds its quota beside v{before.version}'s until the new "
                f"pods are ready: {exc.message}", field="version",
            ) from None
        _start_change(
            locked, actor, f"rolling from v{before.version} to v{version.version}, asked by "
                           f"{actor_label(actor)}",
            version=version, previous_version=before, gpus_per_replica=version.gpus,
            placement=placement,
        )
        audit.record(actor, "rolled_workload", locked, tenant=locked.tenant,
                     before={"version": before.version}, after={"version": version.version})
    return locked, True


def delete_workload(workload: ServerWorkload, actor: Any) -> tuple[ServerWorkload, bool]:
    """Take the server off the cluster (Deployment and Service) and release its quota:
    (the workload, whether deletion starts now). Refused while the deployment's route sends
    the server traffic."""
    require_role(actor, workload.tenant, Membership.Role.DEPLOYER)
    with transaction.atomic():
        locked = ServerWorkload.objects.select_for_update(of=("self",)).select_related(
            "deployment", "server").get(pk=workload.pk)
        if locked.state in (State.DELETING, State.DELETED):
            return locked, False
        _check_no_traffic(locked)
        now = timezone.now()
        ServerWorkload.objects.filter(pk=locked.pk).update(
            state=State.DELETING, detail=f"deletion asked by {actor_label(actor)}", error="",
            attempts=0, next_attempt_at=None, phase_started_at=now, updated_at=now,
        )
        audit.record(actor, "deleted_workload", locked, tenant=locked.tenant,
                     before={"state": locked.state}, after={"state": State.DELETING})
        locked.refresh_from_db()
        _enqueue_on_commit(locked.pk)
    return locked, True


def _check_no_traffic(workload: ServerWorkload) -> None:
    if workload.server is None:
        return
    route = Route.objects.filter(pk=workload.deployment_id).first()
    if route is None:
        return
    version_ids = {m.get("version_id") for m in (route.variants or {}).values()
                   if isinstance(m, dict) and m.get("server_id") == workload.server_id}
    for version in ModelVersion.objects.filter(pk__in=version_ids):
        routes.check_unload(workload.deployment, version, [workload.server])


def _enqueue_on_commit(workload_id: int) -> None:
    """Hand the workload to a worker once its row is committed; with the broker down the
    request still succeeds and beat's next tick picks it up."""
    send_soon("rollouts.tasks.advance_workload", workload_id)
