"""Node objects recorded from a real kube-apiserver, read into plain values: readiness,
taints, sizes, GPUs, MIG slices and device classes (fleet.adapters.kube_nodes)."""

from __future__ import annotations

import copy
import json
from collections import Counter
from decimal import Decimal

import pytest
from kubernetes import client

from fleet.adapters import kube_nodes as kn
from tests.kube.replay import exchanges
from tests.kube.schemas import validate_builtin


def _recorded_nodes() -> list[tuple[str, dict]]:
    """Every Node object in the node recordings: created, listed, read, patched, watched."""
    found = []
    for name in ("02-nodes", "02b-nodes-410-gone", "06-auth-errors"):
        for i, exchange in enumerate(exchanges(name)):
            body = exchange["response_body"]
            objects = []
            if isinstance(body, dict) and body.get("kind") == "Node":
                objects.append(body)
            elif isinstance(body, dict) and body.get("kind") == "NodeList":
                objects.extend(body["items"])
            elif isinstance(body, list):
                objects.extend(json.loads(line)["object"] for line in body)
            objects = [o for o in objects if o.get("kind", "Node") == "Node"]
            found.extend((f"{name}#{i}", o) for o in objects)
    return found


RECORDED = _recorded_nodes()


def _listed() -> dict[str, dict]:
    items = exchanges("02-nodes", 4)[0]["response_body"]["items"]
    return {item["metadata"]["name"]: item for item in items}


def _gpus(info: kn.NodeInfo) -> tuple[list[kn.GpuInfo], list[kn.GpuInfo]]:
    return [g for g in info.gpus if not g.is_mig], [g for g in info.gpus if g.is_mig]


def test_the_recordings_hold_nodes_of_each_kind():
    names = {obj["metadata"]["name"] for _, obj in RECORDED}
    assert {"gpu-a100-01", "gpu-h100-01", "gpu-l4-01", "cpu-01", "gpu-l4-02"} <= names
    assert len(RECORDED) > 40


@pytest.mark.parametrize(("where", "obj"), RECORDED, ids=[w for w, _ in RECORDED])
def test_every_recorded_node_parses_consistently(where, obj):
    info = kn.parse_node(obj)
    assert info.name == obj["metadata"]["name"]
    assert info.resource_version == obj["metadata"]["resourceVersion"]
    assert info.ready in (True, False, None)
    assert info.cpu_cores > 0 and info.memory_mib > 0
    capacity = obj["status"]["capacity"]
    physical, slices = _gpus(info)
    # Every slice the device plugin advertises is a row, on a physical GPU of the node.
    advertised = {k[len("nvidia.com/mig-"):]: int(v) for k, v in capacity.items()
                  if k.startswith("nvidia.com/mig-") and int(v)}
    assert Counter(s.mig_profile for s in slices) == Counter(advertised)
    keys = {g.key for g in physical}
    assert all(s.parent_key in keys for s in slices)
    whole = int(capacity.get("nvidia.com/gpu", 0))
    assert len(physical) >= whole
    if "nvidia.com/gpu.count" in obj["metadata"].get("labels", {}):
        assert len(physical) == int(obj["metadata"]["labels"]["nvidia.com/gpu.count"])
    assert [g.index for g in physical] == list(range(len(physical)))
    uuids = [kn.gpu_uuid(7, info.name, g.key) for g in info.gpus]
    assert len(set(uuids)) == len(uuids)


def test_a100_node_with_the_single_strategy_and_mig_off_has_eight_whole_gpus():
    info = kn.parse_node(_listed()["gpu-a100-01"])
    physical, slices = _gpus(info)
    assert (info.ready, info.ready_detail, info.unschedulable) == (True, "", False)
    assert info.mig_strategy == "single" and not slices
    assert len(physical) == 8
    assert {(g.model, g.device_class, g.memory_mib) for g in physical} == {
        ("NVIDIA-A100-SXM4-80GB", "nvidia-a100-80gb", 81920)
    }
    assert info.device_class == "nvidia-a100-80gb"
    assert info.zone == "us-east-1a"
    assert info.taints == ["nvidia.com/gpu=present:NoSchedule",
                           "node.kubernetes.io/not-ready:NoSchedule"]
    assert (info.cpu_cores, info.memory_mib) == (96, 1152 * 1024)  # capacity "96", "1152Gi"
    assert info.allocatable["cpu"] == "95500m"
    assert info.hostname == "gpu-a100-01"
    assert info.labels["node.kubernetes.io/instance-type"] == "p4de.24xlarge"


def test_h100_node_with_the_mixed_strategy_has_whole_gpus_and_two_partitioned_ones():
    """nvidia.com/gpu: 6, mig-3g.40gb: 2, mig-1g.10gb: 7, gpu.count 8: six whole GPUs, one GPU
    holding the two 3g.40gb slices (4 of 8 memory slices each), one holding the seven 1g.10gb."""
    info = kn.parse_node(_listed()["gpu-h100-01"])
    physical, slices = _gpus(info)
    assert len(physical) == 8
    assert {g.device_class for g in physical} == {"nvidia-h100-80gb"}
    assert {g.memory_mib for g in physical} == {81559}
    by_parent: dict[str, list[str]] = {}
    for s in slices:
        by_parent.setdefault(s.parent_key, []).append(s.mig_profile)
    assert by_parent == {"gpu6": ["3g.40gb"] * 2, "gpu7": ["1g.10gb"] * 7}
    big = next(s for s in slices if s.mig_profile == "3g.40gb")
    small = next(s for s in slices if s.mig_profile == "1g.10gb")
    assert (big.device_class, big.memory_mib, big.model, big.index) == (
        "nvidia-h100-80gb-mig-3g-40gb", 40192, "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", 6)
    assert (small.device_class, small.memory_mib) == ("nvidia-h100-80gb-mig-1g-10gb", 9984)
    assert sorted(s.key for s in slices if s.mig_profile == "1g.10gb") == [
        f"mig-1g.10gb-{n}" for n in range(7)]
    assert info.memory_mib == 2 * 1024 * 1024  # "2Ti"
    assert info.cpu_cores == 192


def test_mig_reconfiguration_changes_the_slices_from_the_capacity_not_the_stale_labels():
    """02-nodes #25: the capacity becomes gpu 7, 3g.40gb 2, 1g.10gb 0 while GFD's labels still
    say 7 x 1g.10gb: seven whole GPUs and one holding the two 3g.40gb slices."""
    line = exchanges("02-nodes", 21)[0]["response_body"][3]
    obj = json.loads(line)["object"]
    assert obj["metadata"]["labels"]["nvidia.com/mig-1g.10gb.count"] == "7"
    physical, slices = _gpus(kn.parse_node(obj))
    assert len(physical) == 8
    assert [(s.mig_profile, s.parent_key) for s in slices] == [("3g.40gb", "gpu7")] * 2


def test_l4_node_not_ready_says_why_and_its_class_rounds_to_the_marketed_size():
    info = kn.parse_node(_listed()["gpu-l4-01"])
    assert info.ready is False
    assert info.ready_detail.startswith(
        "KubeletNotReady: container runtime network not ready: NetworkReady=false")
    physical, slices = _gpus(info)
    assert [(g.device_class, g.memory_mib) for g in physical] == [("nvidia-l4-24gb", 23034)]
    assert info.mig_strategy == "none" and not slices
    assert info.zone == "us-east-1b"


def test_cpu_node_has_no_gpus_and_a_cordoned_one_is_unschedulable():
    info = kn.parse_node(_listed()["cpu-01"])
    assert info.gpus == [] and info.device_class == ""
    assert (info.cpu_cores, info.memory_mib) == (32, 128 * 1024)
    assert info.unschedulable is False
    cordoned = kn.parse_node(exchanges("02-nodes", 15)[0]["response_body"])
    assert cordoned.name == "cpu-01" and cordoned.unschedulable is True


def _validate_node(obj: dict) -> None:
    """The client's V1Node model accepts ``obj`` (timestamps left out: the model writes them
    back as +00:00 where the server wrote Z)."""
    bare = copy.deepcopy(obj)
    bare["metadata"].pop("managedFields", None)
    bare["metadata"].pop("creationTimestamp", None)
    for condition in bare["status"]["conditions"]:
        condition.pop("lastHeartbeatTime", None)
        condition.pop("lastTransitionTime", None)
    validate_builtin(bare, client.V1Node)


def _single_mig_a100() -> dict:
    """The recorded A100 node as GPU feature discovery labels it with the single strategy and
    MIG on (every GPU split into seven 1g.10gb slices, advertised as nvidia.com/gpu)."""
    obj = copy.deepcopy(_listed()["gpu-a100-01"])
    labels = obj["metadata"]["labels"]
    labels.update({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
                   "nvidia.com/gpu.count": "56", "nvidia.com/gpu.memory": "9728",
                   "nvidia.com/mig.strategy": "single"})
    for section in ("capacity", "allocatable"):
        obj["status"][section]["nvidia.com/gpu"] = "56"
    return obj


def test_single_strategy_with_mig_on_gives_slices_on_their_physical_gpus():
    obj = _single_mig_a100()
    _validate_node(obj)
    physical, slices = _gpus(kn.parse_node(obj))
    assert len(physical) == 8 and len(slices) == 56
    assert {(g.model, g.device_class, g.memory_mib) for g in physical} == {
        ("NVIDIA-A100-SXM4-80GB", "nvidia-a100-80gb", 81920)}
    assert {(s.mig_profile, s.device_class, s.memory_mib) for s in slices} == {
        ("1g.10gb", "nvidia-a100-80gb-mig-1g-10gb", 9728)}
    assert Counter(s.parent_key for s in slices) == {f"gpu{i}": 7 for i in range(8)}


def test_mixed_profiles_pack_by_compute_and_memory_slices():
    """A 4g.40gb and a 3g.40gb fill one 80 GB GPU (7 compute, 8 memory slices); a 7g.80gb
    needs a GPU of its own; a node object the client's model accepts."""
    obj = copy.deepcopy(_listed()["gpu-h100-01"])
    capacity = {"nvidia.com/gpu": "5", "nvidia.com/mig-4g.40gb": "1",
                "nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-7g.80gb": "1",
                "nvidia.com/mig-1g.10gb": "0"}
    for section in ("capacity", "allocatable"):
        obj["status"][section].update(capacity)
    _validate_node(obj)
    physical, slices = _gpus(kn.parse_node(obj))
    assert len(physical) == 8  # 5 whole + 2 partitioned, and gpu.count says 8
    assert sorted((s.mig_profile, s.parent_key) for s in slices) == [
        ("3g.40gb", "gpu6"), ("4g.40gb", "gpu6"), ("7g.80gb", "gpu5")]


def test_a_gpu_node_without_feature_discovery_labels_still_counts_its_gpus():
    obj = copy.deepcopy(_listed()["gpu-a100-01"])
    obj["metadata"]["labels"] = {"kubernetes.io/hostname": "bare"}
    physical, _ = _gpus(kn.parse_node(obj))
    assert [(g.model, g.device_class, g.memory_mib) for g in physical][:1] == [
        ("NVIDIA GPU", "nvidia-gpu", 0)]
    assert len(physical) == 8


@pytest.mark.parametrize(("conditions", "ready", "detail"), [
    ([], None, "the node reports no Ready condition"),
    ([{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
       "message": "Kubelet stopped posting node status."}],
     None, "NodeStatusUnknown: Kubelet stopped posting node status."),
    ([{"type": "Ready", "status": "False"}], False, "Ready is False"),
    ([{"type": "MemoryPressure", "status": "True"}, {"type": "Ready", "status": "True"}],
     True, ""),
])
def test_readiness_comes_from_the_ready_condition(conditions, ready, detail):
    obj = copy.deepcopy(_listed()["cpu-01"])
    obj["status"]["conditions"] = conditions
    info = kn.parse_node(obj)
    assert (info.ready, info.ready_detail) == (ready, detail)


@pytest.mark.parametrize(("product", "memory", "profile", "expected"), [
    ("NVIDIA-H100-80GB-HBM3", 81559, "", "nvidia-h100-80gb"),
    ("NVIDIA-A100-SXM4-80GB", 81920, "", "nvidia-a100-80gb"),
    ("NVIDIA-A100-PCIE-40GB", 40960, "", "nvidia-a100-40gb"),
    ("NVIDIA-L4", 23034, "", "nvidia-l4-24gb"),
    ("NVIDIA-A10G", 23028, "", "nvidia-a10g-24gb"),
    ("NVIDIA-L40S", 46068, "", "nvidia-l40s-48gb"),
    ("Tesla-T4", 15360, "", "nvidia-t4-16gb"),
    ("NVIDIA-H100-NVL", 95830, "", "nvidia-h100-94gb"),
    ("NVIDIA-H200", 143771, "", "nvidia-h200-141gb"),
    ("NVIDIA-GeForce-RTX-4090", 24564, "", "nvidia-rtx-4090-24gb"),
    ("NVIDIA-H100-80GB-HBM3", 81559, "3g.40gb", "nvidia-h100-80gb-mig-3g-40gb"),
    ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 81559, "", "nvidia-h100-80gb-mig-1g-10gb"),
    ("NVIDIA A100-SXM4-80GB", None, "", "nvidia-a100-80gb"),
    ("NVIDIA-L4", None, "", "nvidia-l4"),
    ("", None, "", "nvidia-gpu"),
])
def test_device_class_from_the_product_label(product, memory, profile, expected):
    klass = kn.device_class(product, memory, mig_profile=profile)
    assert klass == expected
    from fleet.models.tenancy import slug_validator

    slug_validator(klass)


@pytest.mark.parametrize(("text", "value"), [
    ("2Ti", Decimal(2 * 1024**4)), ("2046Gi", Decimal(2046 * 1024**3)),
    ("191500m", Decimal("191.5")), ("1770661576846", Decimal(1770661576846)),
    ("1921300000Ki", Decimal(1921300000 * 1024)), ("", None), ("lots", None), (None, None),
])
def test_kubernetes_quantities(text, value):
    assert kn.quantity(text) == value


def test_gpu_uuids_are_stable_and_fit_the_column():
    assert kn.gpu_uuid(3, "gpu-h100-01", "gpu0") == "k8s-3-gpu-h100-01-gpu0"
    assert kn.gpu_uuid(3, "gpu-h100-01", "mig-3g.40gb-1") == "k8s-3-gpu-h100-01-mig-3g.40gb-1"
    long_name = "ip-10-0-0-1." + "x" * 120 + ".compute.internal"
    first = kn.gpu_uuid(3, long_name, "mig-1g.10gb-6")
    assert len(first) <= 64 and first.endswith("mig-1g.10gb-6")
    assert first == kn.gpu_uuid(3, long_name, "mig-1g.10gb-6")
    assert first != kn.gpu_uuid(4, long_name, "mig-1g.10gb-6")


def test_labelled_deployments_become_servers_reached_through_their_service():
    items = exchanges("03-deployments", 11)[0]["response_body"]["items"]
    found = {d.name: d for d in (kn.parse_deployment(item) for item in items)}
    triton = found["triton-fraud-v1"]
    assert (triton.namespace, triton.deployment, triton.runtime) == (
        "serving", "fraud-scorer", "triton")
    assert triton.http_url == "http://triton-fraud-v1.serving.svc:8000"
    assert triton.grpc_url == "triton-fraud-v1.serving.svc:8001"
    assert triton.metrics_url == "http://triton-fraud-v1.serving.svc:8002/metrics"
    assert triton.node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    vllm = found["vllm-llama"]
    assert (vllm.runtime, vllm.deployment, vllm.grpc_url) == ("vllm", "llm-chat", "")
    assert vllm.metrics_url == "http://vllm-llama.serving.svc:8000/metrics"
    # The recorded Services answer on the same ports as the containers (03 #4-#6).
    services = {e["response_body"]["metadata"]["name"]: e["response_body"]
                for e in exchanges("03-deployments", 4, 5, 6)}
    for name, server in found.items():
        ports = {p["name"]: p["port"] for p in services[name]["spec"]["ports"]}
        assert ports["http"] == server.http_port
        assert ports.get("metrics") == server.metrics_port


def test_runtime_from_the_image_when_the_app_label_does_not_say():
    item = copy.deepcopy(exchanges("03-deployments", 11)[0]["response_body"]["items"][0])
    item["metadata"]["labels"].pop("app")
    assert kn.parse_deployment(item).runtime == "triton"
    item["spec"]["template"]["spec"]["containers"][0]["image"] = "example/server:1"
    assert kn.parse_deployment(item).runtime == ""
