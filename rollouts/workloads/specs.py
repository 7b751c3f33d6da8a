"""What a server workload runs: its device class, its ServerSpec, its HPA, what it holds.

Plain functions over a ServerWorkload row and its version, shared by the requests
(``rollouts.workloads.requests``) and the reconciler (``rollouts.workloads.reconciler``).
"""

from __future__ import annotations

import shlex
from typing import Any

from console.exceptions import DomainError
from fleet.adapters import kube_nodes
from fleet.adapters import kube_workloads as kw
from fleet.models import GPU, Cluster, Node
from rollouts.models import ModelVersion, ServerWorkload
from rollouts.registry import vllm_labels

# Version labels a vLLM base-model version carries to run on Kubernetes (rollouts.registry.vllm_labels).
VLLM_MODEL_LABEL = vllm_labels.MODEL
VLLM_ARGS_LABEL = vllm_labels.ARGS
VLLM_TOKEN_LABEL = vllm_labels.TOKEN_SECRET


# --------------------------------------------------------------------------------------------
# Device classes
# --------------------------------------------------------------------------------------------

def device_class(product: str, gpu_resource: str, cluster: Cluster | None = None) -> str:
    """The quota device class of ``gpu_resource`` on nodes of ``product`` (the
    ``nvidia.com/gpu.product`` label the workload selects).

    The class the node sync gave such GPUs on ``cluster`` when it has seen one (so a
    workload's quota and the synced inventory name the same class, memory included: an L4
    is ``nvidia-l4-24gb``); else the sync's own naming from the product alone
    (``NVIDIA-A100-SXM4-80GB`` → ``nvidia-a100-80gb``; a MIG slice
    ``nvidia.com/mig-3g.40gb`` of ``NVIDIA-H100-80GB-HBM3`` →
    ``nvidia-h100-80gb-mig-3g-40gb``)."""
    profile = kw.mig_profile(gpu_resource)
    if cluster is not None:
        nodes = [n.pk for n in Node.objects.filter(cluster=cluster, gone_at__isnull=True)
                 if (n.labels or {}).get(kw.PRODUCT_LABEL) == product]
        synced = GPU.objects.filter(node__in=nodes, mig_profile=profile)
        if not profile:
            synced = synced.filter(parent__isnull=True)
        found = synced.values_list("device_class", flat=True).first()
        if found:
            return found
    return kube_nodes.device_class(product, mig_profile=profile)


# --------------------------------------------------------------------------------------------
# What runs: the row as a ServerSpec
# --------------------------------------------------------------------------------------------


def vllm_model(version: ModelVersion, model_repository: str, volume_claim: str) -> str:
    labels = version.labels or {}
    if labels.get(VLLM_MODEL_LABEL):
        return labels[VLLM_MODEL_LABEL]
    if volume_claim and model_repository:
        return f"{model_repository.rstrip('/')}/{version.model.name}-v{version.version}"
    raise DomainError(
        f"v{version.version} names no weights vLLM can load: give it the label "
        f"{VLLM_MODEL_LABEL} (a Hugging Face model id, or a path), or run it with a volume "
        f"that holds {version.model.name}-v{version.version}/ at the model repository path",
        field="version",
    )


def vllm_args(version: ModelVersion) -> list[str]:
    """The version's ``vllm.args``, split; refused on ``version`` unless the platform allows
    every flag in them."""
    text = (version.labels or {}).get(VLLM_ARGS_LABEL, "")
    if problem := vllm_labels.args_problem(text):
        raise DomainError(f"v{version.version}'s label {VLLM_ARGS_LABEL}: {problem}",
                          field="version")
    return shlex.split(text)


def hf_token_secret(version: ModelVersion) -> str:
    """The Secret the version's ``vllm.hf_token_secret`` names ('' for none), in the server's
    own namespace; refused on ``version`` when it is no Secret name."""
    name = (version.labels or {}).get(VLLM_TOKEN_LABEL, "")
    if name and (problem := vllm_labels.secret_problem(name)):
        raise DomainError(f"v{version.version}'s label {VLLM_TOKEN_LABEL}: {problem}",
                          field="version")
    return name


def server_spec(workload: ServerWorkload, version: ModelVersion | None = None) -> kw.ServerSpec:
    """The adapter's ServerSpec of ``workload`` running ``version`` (default: its own)."""
    version = version or workload.version
    model = version.model
    env: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    if workload.runtime == kw.TRITON:
        region = workload.cluster.s3_region
        if workload.model_repository.startswith("s3://") and region:
            env.append({"name": "AWS_REGION", "value": region})
        extra["load_models"] = [model.name]
    else:
        secret = hf_token_secret(version)
        if secret:
            env.append({"name": "HF_TOKEN",
                        "valueFrom": {"secretKeyRef": {"key": "token", "name": secret}}})
        extra["model"] = vllm_model(version, workload.model_repository, workload.volume_claim)
        # Served under the model's name, as Switchyard's other vLLM servers are: routes pass
        # it through and the drift check finds it under that name.
        extra["extra_args"] = ["--served-model-name", model.name, *vllm_args(version)]
    return kw.ServerSpec(
        name=workload.name, namespace=workload.namespace, runtime=workload.runtime,
        deployment=workload.deployment.name, version=version.version, image=workload.image,
        replicas=workload.replicas, node_selector=dict(workload.node_selector),
        gpu_resource=workload.gpu_resource, gpus=version.gpus,
        model_repository=workload.model_repository, volume_claim=workload.volume_claim,
        env=env, min_replicas=workload.min_replicas, max_replicas=workload.max_replicas,
        **extra,
    )


def autoscaler_manifest(workload: ServerWorkload,
                        replica_range: tuple[int, int] | None = None) -> dict[str, Any]:
    """The HorizontalPodAutoscaler of an autoscaled ``workload`` (with ``replica_range``
    instead of its own: what a roll-back applies again); its p99 target is the deployment's
    SLO."""
    low, high = replica_range or (workload.min_replicas, workload.max_replicas)
    spec = kw.ServerSpec(
        name=workload.name, namespace=workload.namespace, runtime=workload.runtime,
        deployment=workload.deployment.name, version=workload.version.version, image="",
        replicas=0, node_selector={}, min_replicas=low, max_replicas=high,
    )
    return kw.autoscaler_manifest(spec, p99_target_ms=workload.deployment.slo_p99_ms)


def service_urls(name: str, namespace: str, runtime: str) -> dict[str, str]:
    host = f"{name}.{namespace}.svc"
    if runtime == kw.TRITON:
        return {"http_url": f"http://{host}:{kw.HTTP_PORT}", "grpc_url": f"{host}:{kw.GRPC_PORT}",
                "metrics_url": f"http://{host}:{kw.METRICS_PORT}/metrics"}
    return {"http_url": f"http://{host}:{kw.HTTP_PORT}", "grpc_url": "",
            "metrics_url": f"http://{host}:{kw.HTTP_PORT}/metrics"}


def held_text(units: int, klass: str) -> str:
    """``2 GPUs of nvidia-a100-80gb``, ``1 MIG slice of nvidia-h100-80gb-mig-3g-40gb``."""
    unit = "MIG slice" if "-mig-" in klass else "GPU"
    return f"{units} {unit}{'s' if units != 1 else ''} of {klass}"


def demand(version: ModelVersion, replicas: int) -> tuple[int, int]:
    """(GPUs or MIG slices, GPU memory MiB) ``replicas`` servers of ``version`` hold."""
    return version.gpus * replicas, version.estimated_gpu_memory_mib * replicas
