"""Kubernetes Nodes and labelled Deployments, read into plain values.

Plain Python: no Django. :func:`parse_node` turns one Node object (a dict as the API returns
it) into a :class:`NodeInfo`; :func:`list_nodes` lists them page by page; :func:`watch_nodes`
streams the changes from a resourceVersion; :func:`list_labelled_deployments` finds the
servers labelled for Switchyard. ``fleet.inventory.kube_sync`` applies the results to the inventory.

GPUs and MIG slices
-------------------
The NVIDIA device plugin advertises whole GPUs as ``nvidia.com/gpu`` and, with the ``mixed``
MIG strategy, each MIG profile as ``nvidia.com/mig-<profile>`` (``nvidia.com/mig-3g.40gb``).
GPU feature discovery (GFD) labels the node with the product, the memory (MiB) and the number
of physical GPUs (``nvidia.com/gpu.product``, ``.memory``, ``.count``), and each profile's
memory and product (``nvidia.com/mig-<profile>.memory``, ``.product``). The counts come from
``status.capacity`` (what the device plugin advertises now; GFD labels can lag behind a MIG
reconfiguration), the product and memory from the labels.

A node's GPUs are described as rows (:class:`GpuInfo`):

* physical GPUs, indexes ``0 .. n-1``, key ``gpu<i>``: first the whole GPUs (the
  ``nvidia.com/gpu`` capacity), then the GPUs partitioned into MIG slices. On a node with
  MIG slices there are as many partitioned GPUs as the ``nvidia.com/gpu.count`` label leaves
  beside the whole ones, or more if the slices need more.
* MIG slices, key ``mig-<profile>-<n>`` (``n`` counts the slices of one profile from 0), with
  ``parent_key`` naming the physical GPU they live on and ``index`` equal to its index. The
  device plugin does not say which physical GPU holds which slice, so slices are packed onto
  the partitioned GPUs first-fit, largest profile first, 7 compute and 8 memory slices per
  GPU (the A100 and H100 geometry): a stable, plausible layout, not an observed one. Counting and quotas
  only rely on the slice counts and classes, which are observed.
* With the ``single`` MIG strategy and MIG enabled, GFD names the slice in the product
  (``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``) and ``nvidia.com/gpu`` counts slices: they become
  slices of that profile, on as many physical GPUs as packing needs.

:func:`gpu_uuid` makes the stable identifiers stored in ``GPU.uuid``
(``k8s-<cluster>-<node>-gpu3``, ``k8s-<cluster>-<node>-mig-3g.40gb-1``).

Device classes
--------------
:func:`device_class` derives the slug quotas are written against from the product label and
the memory: ``NVIDIA-H100-80GB-HBM3`` is ``nvidia-h100-80gb``, ``NVIDIA-A100-SXM4-80GB`` is
``nvidia-a100-80gb``, ``NVIDIA-L4`` with 23034 MiB is ``nvidia-l4-24gb`` (the memory rounded
to the marketed size), a MIG slice adds its profile: ``nvidia-h100-80gb-mig-3g-40gb``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.utils.quantity import parse_quantity
from kubernetes.watch.watch import iter_resp_lines

from fleet.adapters.kubernetes import KubeError, call, error_from

PAGE_SIZE = 500
DISCOVERY_LABEL = "switchyard.io/deployment"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
RUNTIMES = ("triton", "vllm")
_MIB = 1024 * 1024
_COMPUTE_SLICES = 7
_MEMORY_SLICES = 8
_MARKETED_GB = (1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128,
                141, 144, 180, 186, 192, 256, 288)
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}
_GB_TOKEN = re.compile(r"^(\d+)gb$", re.IGNORECASE)
_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb(\+\w+)?$", re.IGNORECASE)
_UUID_MAX = 64


# --- values -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU (``mig_profile`` empty) or one MIG slice of one (see the module doc)."""

    key: str
    index: int
    model: str
    device_class: str
    memory_mib: int
    mig_profile: str = ""
    parent_key: str = ""

    @property
    def is_mig(self) -> bool:
        return bool(self.mig_profile)


@dataclass(frozen=True)
class NodeInfo:
    """What Switchyard keeps of one Node object."""

    name: str
    hostname: str
    ready: bool | None
    ready_detail: str
    unschedulable: bool
    taints: list[str]
    zone: str
    cpu_cores: int
    memory_mib: int
    labels: dict[str, str]
    capacity: dict[str, str]
    allocatable: dict[str, str]
    resource_version: str
    gpu_product: str = ""
    gpu_memory_mib: int | None = None
    gpu_count: int | None = None
    mig_strategy: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)

    @property
    def device_class(self) -> str:
        """The class of the node's physical GPUs ("" for a node without GPUs)."""
        physical = [g for g in self.gpus if not g.is_mig]
        return physical[0].device_class if physical else ""


@dataclass(frozen=True)
class NodeList:
    nodes: list[NodeInfo]
    resource_version: str
    relisted: bool = False  # a continue token expired (410) and the list was taken again


@dataclass(frozen=True)
class NodeEvent:
    """One watch event: ADDED, MODIFIED, DELETED (``node`` set) or BOOKMARK."""

    type: str
    resource_version: str
    node: NodeInfo | None = None


@dataclass(frozen=True)
class DiscoveredServer:
    """A Deployment labelled ``switchyard.io/deployment``, reached through the Service of the
    same name in its namespace (as Switchyard's own server workloads are)."""

    namespace: str
    name: str
    deployment: str
    runtime: str
    http_port: int
    grpc_port: int | None = None
    metrics_port: int | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return f"{self.name}.{self.namespace}.svc"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}" if self.grpc_port else ""

    @property
    def metrics_url(self) -> str:
        """Triton: its metrics port when one is named ``metrics``; vLLM: ``/metrics`` on its
        HTTP port."""
        if self.metrics_port:
            return f"http://{self.host}:{self.metrics_port}/metrics"
        if self.runtime == "vllm":
            return f"{self.http_url}/metrics"
        return ""


# --- quantities and classes ------------------------------------------------------------------


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity (``"2Ti"``, ``"191500m"``, ``"1770661576846"``) as a number;
    None when it is missing or malformed."""
    if value is None or value == "":
        return None
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, TypeError, InvalidOperation):
        return None


def _count(value: Any) -> int:
    number = quantity(value)
    return max(int(number), 0) if number is not None else 0


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    try:
        number = int(str(labels.get(key, "")).strip())
    except ValueError:
        return None
    return number if number >= 0 else None


def marketed_gb(memory_mib: int) -> int:
    """The marketed memory size (GB) of a GPU that reports ``memory_mib`` usable MiB."""
    gib = memory_mib / 1024
    for size in _MARKETED_GB:
        if size >= gib - 0.5:
            return size
    return round(gib)


def _slug(text: str) -> str:
    text = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return text[:64].strip("-")


def _profile_gb(profile: str) -> int | None:
    match = _PROFILE.match(profile)
    return int(match.group(2)) if match else None


def device_class(product: str, memory_mib: int | None = None, mig_profile: str = "") -> str:
    """The device-class slug of a GPU product (see the module doc); ``nvidia-gpu`` when the
    product is unknown. ``memory_mib`` is the physical GPU's memory (used when the product
    does not name it). A product naming a MIG slice (``...-MIG-3g.40gb``) gives the slice's
    class, as does ``mig_profile``."""
    tokens = [t for t in re.split(r"[-_\s]+", product.strip()) if t]
    while tokens and tokens[0].lower() in _VENDOR_WORDS:
        tokens.pop(0)
    upper = [t.upper() for t in tokens]
    if "MIG" in upper:
        cut = upper.index("MIG")
        mig_profile = mig_profile or "-".join(tokens[cut + 1:])
        tokens = tokens[:cut]
    if not tokens:
        base = "nvidia-gpu"
    else:
        family_end = next((i for i, t in enumerate(tokens) if re.search(r"\d", t)), 0)
        family = [t for t in tokens[: family_end + 1] if not _GB_TOKEN.match(t)]
        gb = next((int(m.group(1)) for t in tokens if (m := _GB_TOKEN.match(t))), None)
        if gb is None and memory_mib:
            gb = marketed_gb(memory_mib)
        parts = ["nvidia", *family] + ([f"{gb}gb"] if gb else [])
        base = "-".join(parts)
    if mig_profile:
        base = f"{base}-mig-{mig_profile}"
    return _slug(base)


def gpu_uuid(cluster_key: str | int, node_name: str, key: str) -> str:
    """The stable ``GPU.uuid`` of a synced GPU row: ``k8s-<cluster>-<node>-<key>``, with the
    cluster and node replaced by a digest when that would be longer than 64 characters."""
    uuid = f"k8s-{cluster_key}-{node_name}-{key}"
    if len(uuid) <= _UUID_MAX:
        return uuid
    digest = hashlib.sha256(f"{cluster_key}/{node_name}".encode()).hexdigest()[:20]
    return f"k8s-{digest}-{key}"[:_UUID_MAX]


# --- nodes ---------------------------------------------------------------------------------


def _taint(taint: Mapping[str, Any]) -> str:
    key = str(taint.get("key", ""))
    value = taint.get("value")
    effect = taint.get("effect") or ""
    text = f"{key}={value}" if value not in (None, "") else key
    return f"{text}:{effect}" if effect else text


def _ready(conditions: list[Mapping[str, Any]]) -> tuple[bool | None, str]:
    for condition in conditions:
        if condition.get("type") != "Ready":
            continue
        status = condition.get("status")
        if status == "True":
            return True, ""
        reason = condition.get("reason") or ""
        message = condition.get("message") or ""
        detail = f"{reason}: {message}" if reason and message else (reason or message)
        if status == "False":
            return False, (detail or "Ready is False")[:500]
        return None, (detail or "the node's Ready condition is Unknown")[:500]
    return None, "the node reports no Ready condition"


def _hostname(obj: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    for address in (obj.get("status") or {}).get("addresses") or []:
        if address.get("type") == "Hostname" and address.get("address"):
            return str(address["address"])
    return labels.get("kubernetes.io/hostname") or (obj.get("metadata") or {}).get("name", "")


def _marketed_mib(product: str) -> int | None:
    match = next((m for t in re.split(r"[-_\s]+", product) if (m := _GB_TOKEN.match(t))), None)
    return int(match.group(1)) * 1024 if match else None


def gpus_of(labels: Mapping[str, str], capacity: Mapping[str, Any]) -> list[GpuInfo]:
    """The GPU and MIG-slice rows of a node with these labels and capacity (module doc)."""
    product = labels.get("nvidia.com/gpu.product", "")
    memory = _int_label(labels, "nvidia.com/gpu.memory")
    count_label = _int_label(labels, "nvidia.com/gpu.count") or 0
    whole = _count(capacity.get(GPU_RESOURCE))
    slices: dict[str, int] = {}
    for resource, value in capacity.items():
        if resource.startswith(MIG_RESOURCE_PREFIX) and _count(value) > 0:
            slices[resource[len(MIG_RESOURCE_PREFIX):]] = _count(value)
    slice_product: dict[str, str] = {}
    slice_memory: dict[str, int | None] = {}
    parent_product, parent_memory = product, memory
    mig_in_product = re.search(r"-MIG-(.+)$", product, re.IGNORECASE)
    if mig_in_product and whole:
        # Single strategy with MIG on: nvidia.com/gpu counts slices of one profile.
        profile = mig_in_product.group(1)
        slices = {profile: whole}
        slice_product[profile] = product
        slice_memory[profile] = memory
        whole, count_label = 0, 0
        parent_product = product[: mig_in_product.start()]
        parent_memory = _marketed_mib(parent_product)
    if not (whole or slices):
        return []
    for profile in slices:
        slice_product.setdefault(
            profile, labels.get(f"nvidia.com/mig-{profile}.product") or
            f"{parent_product}-MIG-{profile}",
        )
        gb = _profile_gb(profile)
        slice_memory.setdefault(
            profile, _int_label(labels, f"nvidia.com/mig-{profile}.memory") or
            (gb * 1024 if gb else None),
        )
    # Pack the slices onto partitioned GPUs: first fit, largest profile first; a GPU holds
    # 7 compute slices and 8 memory slices.
    parent_gb = marketed_gb(parent_memory) if parent_memory else None
    ordered = sorted(
        ((p, n) for p, count in slices.items() for n in range(count)),
        key=lambda item: (-_compute(item[0]), item[0], item[1]),
    )
    bins: list[tuple[int, int]] = [(0, 0)] * max(count_label - whole, 0) if slices else []
    placed: list[tuple[str, int, int]] = []
    for profile, n in ordered:
        compute, eighths = _compute(profile), _eighths(profile, parent_gb)
        target = next((i for i, (c, m) in enumerate(bins)
                       if c + compute <= _COMPUTE_SLICES and m + eighths <= _MEMORY_SLICES),
                      None)
        if target is None:
            bins.append((0, 0))
            target = len(bins) - 1
        used_compute, used_memory = bins[target]
        bins[target] = (used_compute + compute, used_memory + eighths)
        placed.append((profile, n, target))
    model = parent_product or "NVIDIA GPU"
    klass = device_class(parent_product, parent_memory)
    rows = [
        GpuInfo(key=f"gpu{i}", index=i, model=model, device_class=klass,
                memory_mib=parent_memory or 0)
        for i in range(whole + len(bins))
    ]
    for profile, n, target in sorted(placed, key=lambda p: (p[2], p[0], p[1])):
        parent = whole + target
        rows.append(GpuInfo(
            key=f"mig-{profile}-{n}", index=parent, model=slice_product[profile],
            device_class=device_class(parent_product, parent_memory, mig_profile=profile),
            memory_mib=slice_memory[profile] or 0, mig_profile=profile,
            parent_key=f"gpu{parent}",
        ))
    return rows


def _compute(profile: str) -> int:
    """Compute slices of a MIG profile: ``3g.40gb`` takes 3 of 7."""
    match = _PROFILE.match(profile)
    return min(max(int(match.group(1)), 1), _COMPUTE_SLICES) if match else 1


def _eighths(profile: str, parent_gb: int | None) -> int:
    """Memory slices of a MIG profile on a GPU of ``parent_gb``: ``3g.40gb`` takes 4 of 8 on
    an 80 GB GPU."""
    gb = _profile_gb(profile)
    if not gb or not parent_gb:
        return 1
    return min(max(round(gb * _MEMORY_SLICES / parent_gb), 1), _MEMORY_SLICES)


def parse_node(obj: Mapping[str, Any]) -> NodeInfo:
    """One Node object (a dict as the API returns it) as a :class:`NodeInfo`."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    capacity = {str(k): str(v) for k, v in (status.get("capacity") or {}).items()}
    allocatable = {str(k): str(v) for k, v in (status.get("allocatable") or {}).items()}
    # The host's size (kubectl's "Capacity"); what pods may use is kept in ``allocatable``.
    size = capacity or allocatable
    cpu = quantity(size.get("cpu"))
    memory = quantity(size.get("memory"))
    ready, ready_detail = _ready(status.get("conditions") or [])
    return NodeInfo(
        name=str(metadata.get("name", "")),
        hostname=_hostname(obj, labels),
        ready=ready,
        ready_detail=ready_detail,
        unschedulable=bool(spec.get("unschedulable")),
        taints=[_taint(t) for t in spec.get("taints") or []],
        zone=labels.get("topology.kubernetes.io/zone")
        or labels.get("failure-domain.beta.kubernetes.io/zone", ""),
        cpu_cores=max(int(cpu), 0) if cpu is not None else 0,
        memory_mib=max(int(memory / _MIB), 0) if memory is not None else 0,
        labels=labels,
        capacity=capacity,
        allocatable=allocatable,
        resource_version=str(metadata.get("resourceVersion", "")),
        gpu_product=labels.get("nvidia.com/gpu.product", ""),
        gpu_memory_mib=_int_label(labels, "nvidia.com/gpu.memory"),
        gpu_count=_int_label(labels, "nvidia.com/gpu.count"),
        mig_strategy=labels.get("nvidia.com/mig.strategy", ""),
        gpus=gpus_of(labels, capacity),
    )


# --- list and watch ------------------------------------------------------------------------


def _json(response: Any) -> dict[str, Any]:
    try:
        body = json.loads(response.data)
    finally:
        response.release_conn()
    if not isinstance(body, dict):
        raise KubeError("the API server answered something that is not a JSON object",
                        kind="server")
    return body


def list_nodes(
    api: client.ApiClient,
    *,
    page_size: int | None = PAGE_SIZE,
    request_timeout: tuple[float, float] | float | None = None,
) -> NodeList:
    """Every Node, following ``metadata.continue`` pages of ``page_size`` (0 or None: one
    request).

    When a continue token has expired (410: the pages took longer than the server keeps a
    snapshot), the list is taken again from the start in one request, so the result is one
    consistent snapshot. KubeError for anything else.
    """
    core = client.CoreV1Api(api)
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"_preload_content": False, "_request_timeout": request_timeout}
        if page_size:
            kwargs["limit"] = page_size
        if token:
            kwargs["_continue"] = token
        try:
            body = _json(call(core.list_node, what="list nodes", **kwargs))
        except KubeError as exc:
            if exc.kind != "gone" or not token:
                raise
            whole = _json(call(core.list_node, what="list nodes", _preload_content=False,
                               _request_timeout=request_timeout))
            return NodeList(
                nodes=[parse_node(i) for i in whole.get("items") or []],
                resource_version=str((whole.get("metadata") or {}).get("resourceVersion", "")),
                relisted=True,
            )
        items.extend(body.get("items") or [])
        metadata = body.get("metadata") or {}
        token = metadata.get("continue") or None
        if not token:
            return NodeList(nodes=[parse_node(i) for i in items],
                            resource_version=str(metadata.get("resourceVersion", "")))


def watch_nodes(
    api: client.ApiClient,
    resource_version: str,
    *,
    timeout_s: int,
    bookmarks: bool = False,
    request_timeout: tuple[float, float] | float | None = None,
) -> Iterator[NodeEvent]:
    """The Node events after ``resource_version``, for at most ``timeout_s`` seconds (the
    server ends the stream then).

    Raises KubeError: kind ``gone`` when the resourceVersion is too old (the in-band ERROR
    event carrying a 410 Status: list again and watch from the list's resourceVersion),
    ``unreachable`` when the stream drops. Events already yielded stand.
    """
    core = client.CoreV1Api(api)
    kwargs: dict[str, Any] = {
        "watch": True,
        "resource_version": resource_version,
        "timeout_seconds": int(timeout_s),
        "_preload_content": False,
        "_request_timeout": request_timeout,
    }
    if bookmarks:
        kwargs["allow_watch_bookmarks"] = True
    response = call(core.list_node, what="watch nodes", **kwargs)
    try:
        for line in iter_resp_lines(response):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError as exc:
                raise KubeError(f"watch nodes: unreadable event {line[:200]!r}",
                                kind="server") from exc
            yield _event(event)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise error_from(exc, "watch nodes (the stream dropped)") from exc
    finally:
        response.release_conn()


def _event(event: Mapping[str, Any]) -> NodeEvent:
    kind = str(event.get("type", ""))
    obj = event.get("object") or {}
    if kind == "ERROR":
        code = int(obj.get("code") or 0)
        message = obj.get("message") or "the watch failed"
        reason = obj.get("reason") or ""
        kinds = {401: "unauthorized", 403: "forbidden", 410: "gone"}
        text = f"{message} ({code} {reason})".replace(" )", ")")
        raise KubeError(f"watch nodes: {text}", kind=kinds.get(code, "server"), status=code,
                        reason=reason)
    rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
    if kind == "BOOKMARK":
        return NodeEvent(type=kind, resource_version=rv)
    return NodeEvent(type=kind, resource_version=rv, node=parse_node(obj))


# --- discovered servers --------------------------------------------------------------------


def _runtime(labels: Mapping[str, str], images: list[str]) -> str:
    for key in ("app", "app.kubernetes.io/name"):
        if labels.get(key) in RUNTIMES:
            return labels[key]
    for image in images:
        if "tritonserver" in image:
            return "triton"
        if "vllm" in image:
            return "vllm"
    return ""


def parse_deployment(obj: Mapping[str, Any]) -> DiscoveredServer:
    """A labelled Deployment as a :class:`DiscoveredServer` (``runtime`` empty when neither
    its ``app`` label nor its image says Triton or vLLM)."""
    metadata = obj.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = pod.get("containers") or []
    runtime = _runtime(labels, [str(c.get("image", "")) for c in containers])
    ports: dict[str, int] = {}
    first: int | None = None
    for container in containers:
        for port in container.get("ports") or []:
            number = port.get("containerPort")
            if not isinstance(number, int):
                continue
            first = first or number
            if port.get("name"):
                ports.setdefault(str(port["name"]), number)
    return DiscoveredServer(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        deployment=labels.get(DISCOVERY_LABEL, ""),
        runtime=runtime,
        http_port=ports.get("http") or first or 8000,
        grpc_port=ports.get("grpc"),
        metrics_port=ports.get("metrics"),
        node_selector={str(k): str(v) for k, v in (pod.get("nodeSelector") or {}).items()},
        labels=labels,
    )


def list_labelled_deployments(
    api: client.ApiClient, *, request_timeout: tuple[float, float] | float | None = None
) -> list[DiscoveredServer]:
    """The Deployments of every namespace that carry the ``switchyard.io/deployment`` label."""
    apps = client.AppsV1Api(api)
    body = _json(call(apps.list_deployment_for_all_namespaces, what="list deployments",
                      label_selector=DISCOVERY_LABEL, _preload_content=False,
                      _request_timeout=request_timeout))
    return [parse_deployment(item) for item in body.get("items") or []]
