"""Triton and vLLM servers run as apps/v1 Deployments and Services: manifests and API calls.

Switchyard owns what it writes through server-side apply with the field manager
``switchyard`` (``force=true``): the fields in its manifest are Switchyard's, and whatever
people set on other fields (an extra annotation, a sidecar's resources) survives every
apply. Plain Python: no Django, no settings.

* :func:`deployment_manifest` and :func:`service_manifest` build what is applied, from a
  :class:`ServerSpec`. For the inputs of the recorded exchanges (``tests/kube/recorded``)
  the Deployment is byte for byte what the recording sent; the Service selects the pods by
  the Deployment's own labels (see :func:`service_manifest`).
* An autoscaled server (``ServerSpec.min_replicas``/``max_replicas``): its Deployment leaves
  ``spec.replicas`` out, so the field is not Switchyard's and the HorizontalPodAutoscaler
  :func:`autoscaler_manifest` builds (``autoscaling/v2``, applied the same way) owns it.
  No HPA exchange was recorded from a real server: the HPA is checked against the official
  client's ``V2HorizontalPodAutoscaler`` model, and its apply is the same request as the
  recorded Deployment apply on the ``/apis/autoscaling/v2/`` path.
* :func:`apply` (server-side apply), :func:`scale` (the ``/scale`` subresource),
  :func:`read` and :func:`delete_deployment` / :func:`delete_service` /
  :func:`delete_autoscaler` make one API call each and answer the server's JSON; failures
  are :class:`fleet.adapters.kubernetes.KubeError`.
* :func:`readiness` judges a Deployment's status: ready, still waiting, or failed.

RBAC the service account needs in the namespace: ``deployments`` get, create, patch,
delete; ``deployments/scale`` patch; ``services`` create, patch, delete; for autoscaled
servers ``horizontalpodautoscalers`` (group ``autoscaling``) create, patch, delete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from fleet.adapters.kubernetes import (
    FIELD_MANAGER,
    KubeAccess,
    KubeError,
    api_client,
    call,
    request_timeout,
)

TRITON = "triton"
VLLM = "vllm"
RUNTIMES = (TRITON, VLLM)

GPU_RESOURCE = "nvidia.com/gpu"
# A MIG slice as the NVIDIA device plugin's mixed strategy names it: nvidia.com/mig-3g.40gb.
MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-([1-7])g\.([0-9]{1,3})gb$")
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_TAINT = "nvidia.com/gpu"

APP_LABEL = "app"
DEPLOYMENT_LABEL = "switchyard.io/deployment"
REVISION_LABEL = "switchyard.io/revision"
VERSION_ANNOTATION = "switchyard.io/model-version"

# On an autoscaled server's Deployment: "min-max", the range its HPA scales within (what a
# roll-back of a range change applies again).
REPLICA_RANGE_ANNOTATION = "switchyard.io/hpa-replicas"

# The metrics an autoscaled server's HPA reads (deploy/prometheus-adapter/hpa-example.yaml):
# Switchyard's recommendation, an External metric selected by the Deployment's name, and the
# p99 latency as an Object metric of the Deployment, both served by prometheus-adapter from
# Switchyard's /metrics (console.metrics).
RECOMMENDED_METRIC = "switchyard_deployment_replicas_recommended"
P99_METRIC = "switchyard_deployment_p99_latency_seconds"
KUBE_DEPLOYMENT_LABEL = "kube_deployment"

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
MODELS_VOLUME = "models"
# What a Triton container asks for besides its GPUs; a vLLM container asks for GPUs only.
TRITON_RESOURCES: dict[str, dict[str, str]] = {
    "limits": {"cpu": "8", "memory": "32Gi"},
    "requests": {"cpu": "4", "memory": "16Gi"},
}
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"

# Deployment conditions (apps/v1): the reason the controller gives when the progress deadline
# (spec.progressDeadlineSeconds) passed without the new pods becoming available.
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
READY, WAITING, FAILED = "ready", "waiting", "failed"


@dataclass(frozen=True)
class ServerSpec:
    """One server as Switchyard runs it.

    ``deployment`` is the Switchyard deployment the server belongs to (a label), ``version``
    the model version it starts with (a Triton Deployment's revision label). Triton:
    ``model_repository`` (``s3://bucket/prefix``, or the path a ``volume_claim`` is mounted
    at) and ``load_models`` (loaded at start; model-control-mode explicit). vLLM: ``model``
    (``--model``) and ``extra_args`` (placed between ``--model`` and ``--port``). ``env`` is
    the container's env list as Kubernetes writes it; ``resources`` overrides the CPU and
    memory the runtime asks for by default. ``min_replicas`` and ``max_replicas`` (both or
    neither) make it autoscaled: ``replicas`` is then not written, an HPA owns it.
    """

    name: str
    namespace: str
    runtime: str
    deployment: str
    version: int
    image: str
    replicas: int
    node_selector: Mapping[str, str]
    gpu_resource: str = GPU_RESOURCE
    gpus: int = 1
    model_repository: str = ""
    volume_claim: str = ""
    load_models: Sequence[str] = ()
    model: str = ""
    extra_args: Sequence[str] = ()
    env: Sequence[Mapping[str, Any]] = ()
    resources: Mapping[str, Mapping[str, str]] | None = field(default=None)
    min_replicas: int | None = None
    max_replicas: int | None = None

    @property
    def revision(self) -> str:
        return f"v{self.version}"

    @property
    def autoscaled(self) -> bool:
        return self.min_replicas is not None and self.max_replicas is not None


def is_gpu_resource(resource: str) -> bool:
    """``nvidia.com/gpu`` or a MIG slice resource such as ``nvidia.com/mig-3g.40gb``."""
    return resource == GPU_RESOURCE or MIG_RESOURCE.match(resource) is not None


def mig_profile(resource: str) -> str:
    """The MIG profile a resource names (``3g.40gb``), or '' for whole GPUs."""
    match = MIG_RESOURCE.match(resource)
    return f"{match.group(1)}g.{match.group(2)}gb" if match else ""


# ------------------------------------------------------------------------------------------
# Manifests
# ------------------------------------------------------------------------------------------


def pod_labels(spec: ServerSpec) -> dict[str, str]:
    """The labels of the pods, the Deployment's selector and the Service's selector.

    A Triton Deployment is one per start version (``triton-fraud-v1``, ``-v2`` side by side
    for a canary), so its revision is part of the selector. A vLLM Deployment rolls from one
    base model to the next in place, and a selector cannot change: it has none.
    """
    labels = {APP_LABEL: spec.runtime, DEPLOYMENT_LABEL: spec.deployment}
    if spec.runtime == TRITON:
        labels[REVISION_LABEL] = spec.revision
    return labels


def _resources(spec: ServerSpec) -> dict[str, dict[str, str]]:
    base = spec.resources if spec.resources is not None else (
        TRITON_RESOURCES if spec.runtime == TRITON else {}
    )
    limits = {spec.gpu_resource: str(spec.gpus), **dict(base.get("limits") or {})}
    resources: dict[str, dict[str, str]] = {"limits": limits}
    if base.get("requests"):
        resources["requests"] = dict(base["requests"])
    return resources


def _probe(path: str, period_s: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s}


def _triton_container(spec: ServerSpec) -> dict[str, Any]:
    args = [
        f"--model-repository={spec.model_repository}",
        "--model-control-mode=explicit",
        *[f"--load-model={name}" for name in spec.load_models],
        "--strict-readiness=true",
        "--log-verbose=0",
    ]
    container: dict[str, Any] = {
        "name": TRITON,
        "image": spec.image,
        "command": ["tritonserver"],
        "args": args,
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT},
            {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
    }
    if spec.env:
        container["env"] = [dict(e) for e in spec.env]
    container["resources"] = _resources(spec)
    container["readinessProbe"] = _probe("/v2/health/ready", 5)
    container["livenessProbe"] = _probe("/v2/health/live", 10)
    return container


def _vllm_container(spec: ServerSpec) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": VLLM,
        "image": spec.image,
        "args": ["--model", spec.model, *spec.extra_args, "--port", str(HTTP_PORT)],
        "ports": [{"name": "http", "containerPort": HTTP_PORT}],
    }
    if spec.env:
        container["env"] = [dict(e) for e in spec.env]
    container["resources"] = _resources(spec)
    # vLLM answers /health once the model is loaded. Without this probe a new pod counts as
    # available as soon as its process starts: a roll would retire the old pod while the new
    # one is still loading weights. No liveness probe: loading takes minutes.
    container["readinessProbe"] = _probe("/health", 5)
    return container


def deployment_manifest(spec: ServerSpec) -> dict[str, Any]:
    """The apps/v1 Deployment that runs ``spec`` (what server-side apply sends).

    Autoscaled: no ``spec.replicas`` (the API server makes it 1 on creation, then the HPA
    sets it; an apply that does not name the field never takes it back) and the range as the
    annotation ``switchyard.io/hpa-replicas``."""
    labels = pod_labels(spec)
    metadata: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace,
                                "labels": dict(labels)}
    container = _triton_container(spec) if spec.runtime == TRITON else _vllm_container(spec)
    pod: dict[str, Any] = {"containers": [container]}
    if spec.volume_claim:
        container["volumeMounts"] = [{
            "name": MODELS_VOLUME, "mountPath": spec.model_repository, "readOnly": True,
        }]
        pod["volumes"] = [{
            "name": MODELS_VOLUME,
            "persistentVolumeClaim": {"claimName": spec.volume_claim, "readOnly": True},
        }]
    pod["nodeSelector"] = dict(spec.node_selector)
    pod["tolerations"] = [{"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    body: dict[str, Any] = {"replicas": spec.replicas, "selector": {"matchLabels": dict(labels)}}
    annotations: dict[str, str] = {}
    if spec.runtime == TRITON:
        annotations[VERSION_ANNOTATION] = spec.revision
    if spec.autoscaled:
        del body["replicas"]
        annotations[REPLICA_RANGE_ANNOTATION] = f"{spec.min_replicas}-{spec.max_replicas}"
    if annotations:
        metadata["annotations"] = annotations
    if spec.runtime == TRITON:
        # One new pod at a time, and none taken away before its successor is available.
        body["strategy"] = {"type": "RollingUpdate",
                            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    body["template"] = {"metadata": {"labels": dict(labels)}, "spec": pod}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": body}


def service_manifest(spec: ServerSpec) -> dict[str, Any]:
    """The ClusterIP Service in front of ``spec``'s pods (``<name>.<namespace>.svc``).

    It selects exactly the Deployment's pods: by the same labels, the Switchyard deployment
    among them (a selector of ``app`` and revision alone, as in the recorded Service, would
    also pick another model's Triton pods of the same revision in the namespace).
    """
    labels = pod_labels(spec)
    names = [("http", HTTP_PORT), ("grpc", GRPC_PORT), ("metrics", METRICS_PORT)]
    if spec.runtime == VLLM:
        names = names[:1]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"labels": dict(labels), "name": spec.name, "namespace": spec.namespace},
        "spec": {
            "ports": [{"name": n, "port": p, "targetPort": n} for n, p in names],
            "selector": dict(labels),
            "type": "ClusterIP",
        },
    }


def autoscaler_manifest(spec: ServerSpec, *, p99_target_ms: int) -> dict[str, Any]:
    """The autoscaling/v2 HorizontalPodAutoscaler of an autoscaled ``spec``: the same name and
    namespace as its Deployment, which it scales between ``min_replicas`` and ``max_replicas``.

    Its metrics are those of ``deploy/prometheus-adapter/hpa-example.yaml``: Switchyard's
    replica recommendation (External, ``AverageValue`` 1: desired = the recommended count) and
    a latency guard (Object metric of the Deployment, ``Value`` = the deployment's p99 SLO,
    ``p99_target_ms``: over it, desired = current x p99 / SLO). The HPA takes the larger; a
    metric that is absent (no benchmark, nothing measured) holds the replicas. Up at once,
    down one pod a minute after five quiet minutes.

    Never recorded from a real API server: valid against the official client's
    ``V2HorizontalPodAutoscaler`` and the same as the example (tests/kube).
    """
    if not spec.autoscaled:
        raise ValueError(f"{spec.name} is not autoscaled: it has no replica range")
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": spec.name}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": spec.name, "namespace": spec.namespace,
                     "labels": {DEPLOYMENT_LABEL: spec.deployment}},
        "spec": {
            "scaleTargetRef": dict(target),
            "minReplicas": spec.min_replicas,
            "maxReplicas": spec.max_replicas,
            "metrics": [
                {"type": "External", "external": {
                    "metric": {"name": RECOMMENDED_METRIC, "selector": {
                        "matchLabels": {KUBE_DEPLOYMENT_LABEL: spec.name}}},
                    "target": {"type": "AverageValue", "averageValue": "1"},
                }},
                {"type": "Object", "object": {
                    "describedObject": dict(target),
                    "metric": {"name": P99_METRIC},
                    # A quantity in seconds: 250m is 250 ms.
                    "target": {"type": "Value", "value": f"{int(p99_target_ms)}m"},
                }},
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [
                    {"type": "Percent", "value": 100, "periodSeconds": 30}]},
                "scaleDown": {"stabilizationWindowSeconds": 300, "policies": [
                    {"type": "Pods", "value": 1, "periodSeconds": 60}]},
            },
        },
    }


def replica_range_of(manifest: Mapping[str, Any]) -> tuple[int, int] | None:
    """(min, max) an autoscaled Deployment manifest carries in its annotation; None when it
    is not autoscaled (or the annotation cannot be read)."""
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    low, sep, high = str(annotations.get(REPLICA_RANGE_ANNOTATION, "")).partition("-")
    if not sep or not low.isdigit() or not high.isdigit():
        return None
    return int(low), int(high)


def replicas_of(manifest: Mapping[str, Any]) -> int:
    """spec.replicas of a Deployment manifest (1, Kubernetes' default, when left out)."""
    return int((manifest.get("spec") or {}).get("replicas", 1))


def differs_only_in_replicas(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two Deployment manifests are the same but for spec.replicas."""

    def without(manifest: Mapping[str, Any]) -> str:
        copy = json.loads(json.dumps(manifest))
        (copy.get("spec") or {}).pop("replicas", None)
        return json.dumps(copy, sort_keys=True)

    return without(a) == without(b)


# ------------------------------------------------------------------------------------------
# API calls
# ------------------------------------------------------------------------------------------


def _json(response: Any) -> dict[str, Any]:
    data = json.loads(response.data or b"{}")
    return data if isinstance(data, dict) else {}


def _apis(api: client.ApiClient) -> tuple[client.AppsV1Api, client.CoreV1Api]:
    # Changes made through plain writes (the /scale patch) are recorded under the same
    # manager name as the applies: managedFields name Switchyard, not the client library.
    api.user_agent = FIELD_MANAGER
    return client.AppsV1Api(api), client.CoreV1Api(api)


def _autoscaling(api: client.ApiClient) -> client.AutoscalingV2Api:
    api.user_agent = FIELD_MANAGER
    return client.AutoscalingV2Api(api)


def apply(access: KubeAccess, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Server-side apply of a Deployment, Service or HorizontalPodAutoscaler manifest
    (created when missing); the object as the server now has it."""
    kind = manifest.get("kind")
    meta = manifest.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    with api_client(access) as api:
        apps, core = _apis(api)
        if kind == "Deployment":
            fn = apps.patch_namespaced_deployment
        elif kind == "Service":
            fn = core.patch_namespaced_service
        elif kind == "HorizontalPodAutoscaler":
            fn = _autoscaling(api).patch_namespaced_horizontal_pod_autoscaler
        else:
            raise KubeError(f"cannot apply a {kind!r}", kind="bad_request")
        response = call(
            fn, name, namespace, dict(manifest), field_manager=FIELD_MANAGER, force=True,
            _content_type=APPLY_PATCH, _preload_content=False,
            _request_timeout=request_timeout(access),
            what=f"apply {kind} {namespace}/{name}",
        )
    return _json(response)


def scale(access: KubeAccess, namespace: str, name: str, replicas: int) -> dict[str, Any]:
    """Set a Deployment's replicas through its ``/scale`` subresource (JSON merge patch:
    nothing but the count changes); the Scale object."""
    with api_client(access) as api:
        apps, _core = _apis(api)
        response = call(
            apps.patch_namespaced_deployment_scale, name, namespace,
            {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH,
            _preload_content=False, _request_timeout=request_timeout(access),
            what=f"scale Deployment {namespace}/{name}",
        )
    return _json(response)


def read(access: KubeAccess, namespace: str, name: str) -> dict[str, Any]:
    """The Deployment as the server has it: its spec, metadata.generation and status.

    A plain GET (``get deployments``), not ``/status``: it holds the same status and asks
    no RBAC rule for the subresource."""
    with api_client(access) as api:
        apps, _core = _apis(api)
        response = call(
            apps.read_namespaced_deployment, name, namespace, _preload_content=False,
            _request_timeout=request_timeout(access), what=f"read Deployment {namespace}/{name}",
        )
    return _json(response)


def delete_deployment(access: KubeAccess, namespace: str, name: str) -> bool:
    """Delete the Deployment (its ReplicaSets and pods follow: apps/v1 deletes dependents in
    the background by default). False when it was gone already."""
    with api_client(access) as api:
        apps, _core = _apis(api)
        return _delete(access, apps.delete_namespaced_deployment, namespace, name, "Deployment")


def delete_service(access: KubeAccess, namespace: str, name: str) -> bool:
    """Delete the Service; False when it was gone already."""
    with api_client(access) as api:
        _apps, core = _apis(api)
        return _delete(access, core.delete_namespaced_service, namespace, name, "Service")


def delete_autoscaler(access: KubeAccess, namespace: str, name: str) -> bool:
    """Delete an autoscaled server's HorizontalPodAutoscaler; False when it was gone already.
    (Never recorded: the same DELETE as the Deployment's, on the autoscaling/v2 path.)"""
    with api_client(access) as api:
        return _delete(access, _autoscaling(api).delete_namespaced_horizontal_pod_autoscaler,
                       namespace, name, "HorizontalPodAutoscaler")


def _delete(access: KubeAccess, fn: Any, namespace: str, name: str, kind: str) -> bool:
    try:
        call(fn, name, namespace, _preload_content=False,
             _request_timeout=request_timeout(access), what=f"delete {kind} {namespace}/{name}")
    except KubeError as exc:
        if exc.kind == "not_found" and not exc.missing_api:
            return False
        raise
    return True


# ------------------------------------------------------------------------------------------
# Readiness
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Readiness:
    """What a Deployment's status says: ``ready`` (every replica updated and available),
    ``waiting`` or ``failed`` (the controller gave up: progress deadline exceeded), with a
    readable ``detail`` and the counts as ``observed``."""

    state: str
    detail: str
    observed: dict[str, Any]

    @property
    def is_ready(self) -> bool:
        return self.state == READY

    @property
    def has_failed(self) -> bool:
        return self.state == FAILED


def evaluate(status: Mapping[str, Any], *, generation: int, replicas: int,
             replica_range: tuple[int, int] | None = None) -> Readiness:
    """Judge a Deployment ``status`` (the apps/v1 DeploymentStatus as JSON) against the
    ``generation`` and ``replicas`` of its spec.

    Ready: the controller has seen this generation (observedGeneration >= generation), and
    every replica runs the new template and is available, with no old pod left
    (replicas == updatedReplicas == availableReplicas == spec.replicas). Failed: the
    Progressing condition is False for ProgressDeadlineExceeded. Anything else: waiting.
    Counts left out of the status are 0 (Kubernetes omits them).

    Autoscaled (``replica_range``, the HPA's min and max): ``replicas`` is the Deployment's
    own spec.replicas, what the HPA set, never the workload's; while it is outside the range
    (1, the API server's default, before the HPA has raised it to a higher minimum) the
    HPA has not taken the Deployment up yet: waiting.
    """
    seen = int(status.get("observedGeneration") or 0)
    total = int(status.get("replicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    ready = int(status.get("readyReplicas") or 0)
    available = int(status.get("availableReplicas") or 0)
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    observed = {
        "generation": generation,
        "observed_generation": seen,
        "desired": replicas,
        "replicas": total,
        "updated": updated,
        "ready": ready,
        "available": available,
        "conditions": [
            {key: c.get(key, "") for key in ("type", "status", "reason", "message")}
            for c in conditions
        ],
    }
    if seen < generation:
        return Readiness(WAITING, f"waiting for the Deployment controller to take up "
                                  f"generation {generation} (it has seen {seen})", observed)
    by_type = {c.get("type"): c for c in conditions}
    progressing = by_type.get("Progressing") or {}
    if progressing.get("status") == "False" and (
        progressing.get("reason") == PROGRESS_DEADLINE_EXCEEDED
    ):
        message = progressing.get("message") or "the new pods did not become available in time"
        return Readiness(FAILED, f"{PROGRESS_DEADLINE_EXCEEDED}: {message}", observed)
    if replica_range is not None:
        observed["replica_range"] = list(replica_range)
        low, high = replica_range
        if not low <= replicas <= high:
            return Readiness(WAITING, f"waiting for the HPA to bring the Deployment within "
                                      f"{low}-{high} replicas (it asks for {replicas})", observed)
    if total == updated == available == replicas:
        return Readiness(READY, f"{available}/{replicas} replicas updated and available",
                         observed)
    detail = f"{updated}/{replicas} updated, {available} available, {ready} ready"
    if total > updated:
        detail += f", {total - updated} old still running"
    failure = by_type.get("ReplicaFailure") or {}
    if failure.get("status") == "True":
        detail += f"; {failure.get('reason') or 'ReplicaFailure'}: {failure.get('message', '')}"
    return Readiness(WAITING, detail, observed)


def readiness(deployment: Mapping[str, Any],
              replica_range: tuple[int, int] | None = None) -> Readiness:
    """:func:`evaluate` for a whole Deployment object as :func:`read` answers it, against
    its own spec.replicas (for an autoscaled one: what its HPA set) and, when autoscaled, the
    HPA's ``replica_range``."""
    metadata = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    return evaluate(
        deployment.get("status") or {},
        generation=int(metadata.get("generation") or 0),
        replicas=int(spec.get("replicas", 1)),
        replica_range=replica_range,
    )
