"""What a workload request may ask for: the input checks of ``rollouts.workloads.requests``.

Each refuses with a DomainError naming the field at fault, so the API and the console show the
same message: the server's name and namespace (Kubernetes names), its replica count or its
HPA's range (1 to :data:`MAX_REPLICAS`), the version it runs (loadable, a base model, on GPUs;
for vLLM, the weights, flags and token Secret its labels name), the GPU resource, the node
selector (Kubernetes labels, the GPU product named), the model repository and its volume, and
the container image.
"""

from __future__ import annotations

import re
from typing import Any

from console.exceptions import DomainError
from fleet.adapters import kube_workloads as kw
from rollouts.loads.requests import check_loadable
from rollouts.models import Deployment, ModelVersion
from rollouts.workloads.specs import hf_token_secret, vllm_args, vllm_model

MAX_REPLICAS = 100

# Kubernetes names: a Service name is a DNS-1035 label, a namespace a DNS-1123 label, a
# PersistentVolumeClaim a DNS-1123 subdomain; label keys and values as the API validates them.
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_1123_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_S3_REPOSITORY = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/\S*)?$")
_IMAGE = re.compile(r"^[^\s\x00-\x1f]{1,300}$")


def check_replicas(replicas: Any, minimum: int) -> int:
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise DomainError("must be a whole number", field="replicas")
    if not minimum <= replicas <= MAX_REPLICAS:
        raise DomainError(f"must be between {minimum} and {MAX_REPLICAS}, got {replicas}",
                          field="replicas")
    return replicas


NOT_SWITCHABLE = (
    "autoscaling is chosen when a workload is created and cannot be switched: spec.replicas "
    "would have to change server-side-apply managers between Switchyard and the HPA, and "
    "that resets the Deployment's replica count (to 1) while it serves"
)


def _check_bound(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DomainError("must be a whole number", field=field)
    if not 1 <= value <= MAX_REPLICAS:
        raise DomainError(f"must be between 1 and {MAX_REPLICAS}, got {value}", field=field)
    return value


def check_range(low: Any, high: Any) -> tuple[int, int]:
    """An HPA's (min_replicas, max_replicas): both given, 1 <= min <= max <= 100."""
    if low is None or high is None:
        missing = "min_replicas" if low is None else "max_replicas"
        raise DomainError("give min_replicas and max_replicas together (an HPA scales within "
                          "them), or neither (a fixed replica count)", field=missing)
    low, high = _check_bound(low, "min_replicas"), _check_bound(high, "max_replicas")
    if low > high:
        raise DomainError(f"must be at least min_replicas ({low}), got {high}",
                          field="max_replicas")
    return low, high


def range_words(low: int, high: int) -> str:
    """An autoscaled workload's replica range as its events name it: "1-4 replicas (HPA)"."""
    return f"{low}-{high} replicas (HPA)"


def check_version(deployment: Deployment, version: ModelVersion) -> None:
    check_loadable(deployment, version)
    if version.runtime == ModelVersion.Runtime.VLLM and version.adapter_of:
        raise DomainError(
            f"v{version.version} is a LoRA adapter of {version.adapter_of}: a vLLM server runs "
            "a base model; load adapters onto it", field="version",
        )
    if version.gpus < 1:
        raise DomainError(
            f"v{version.version} asks for no GPU: Switchyard runs GPU servers on Kubernetes",
            field="version",
        )


def check_runnable(version: ModelVersion, repository: str, claim: str) -> None:
    """A vLLM version names the weights it runs, flags the platform allows and, for its
    Hugging Face token, a Secret of the server's own namespace."""
    if version.runtime == ModelVersion.Runtime.VLLM:
        vllm_model(version, repository, claim)
        vllm_args(version)
        hf_token_secret(version)


def check_names(name: Any, namespace: Any) -> None:
    """The server's name is a Kubernetes Service name; its namespace, when given, a namespace
    name."""
    if not isinstance(name, str) or not _DNS_1035.match(name):
        raise DomainError("a Kubernetes Service name: lowercase letters, digits and dashes, "
                          "starting with a letter (at most 63)", field="name")
    if not isinstance(namespace, str) or (namespace and not _DNS_1123_LABEL.match(namespace)):
        raise DomainError("a Kubernetes namespace name: lowercase letters, digits and dashes "
                          "(at most 63)", field="namespace")


def check_gpu_resource(gpu_resource: str) -> None:
    if not kw.is_gpu_resource(gpu_resource):
        raise DomainError("nvidia.com/gpu, or a MIG slice such as nvidia.com/mig-3g.40gb",
                          field="gpu_resource")


def check_image(image: str) -> None:
    if not _IMAGE.match(image):
        raise DomainError("a container image reference (no spaces, at most 300 characters)",
                          field="image")


def check_node_selector(selector: Any) -> dict[str, str]:
    if not isinstance(selector, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        raise DomainError("must be an object of label names and values", field="node_selector")
    if len(selector) > 20:
        raise DomainError("at most 20 labels", field="node_selector")
    for key, value in selector.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and not _DNS_1123_SUBDOMAIN.match(prefix)) or not _LABEL_NAME.match(name):
            raise DomainError(f"{key!r} is not a Kubernetes label name", field="node_selector")
        if not _LABEL_VALUE.match(value):
            raise DomainError(f"{key}: {value!r} is not a Kubernetes label value",
                              field="node_selector")
    if not selector.get(kw.PRODUCT_LABEL):
        raise DomainError(
            f"name the GPU product with {kw.PRODUCT_LABEL} (e.g. NVIDIA-A100-SXM4-80GB): it "
            "says which device class's quota the server uses", field="node_selector",
        )
    return dict(selector)


def check_storage(runtime: str, repository: str, claim: str) -> None:
    if len(repository) > 500 or any(c.isspace() or ord(c) < 32 for c in repository):
        raise DomainError("at most 500 characters, no spaces or control characters",
                          field="model_repository")
    if claim and not _DNS_1123_SUBDOMAIN.match(claim):
        raise DomainError(f"{claim!r} is not a PersistentVolumeClaim name", field="volume_claim")
    if repository.startswith("s3://"):
        if not _S3_REPOSITORY.match(repository):
            raise DomainError("an S3 repository is s3://bucket/prefix", field="model_repository")
        if claim:
            raise DomainError("an S3 repository needs no volume: leave volume_claim empty",
                              field="volume_claim")
    elif repository:
        if not repository.startswith("/"):
            raise DomainError("give s3://bucket/prefix, or the absolute path a volume is "
                              "mounted at", field="model_repository")
        if not claim:
            raise DomainError(f"a repository at {repository} is on a volume: name its "
                              "PersistentVolumeClaim", field="volume_claim")
    elif runtime == kw.TRITON:
        raise DomainError("a Triton server needs its model repository: s3://bucket/prefix, or "
                          "a path on a volume", field="model_repository")
    elif claim:
        raise DomainError("give the path the volume is mounted at", field="model_repository")
