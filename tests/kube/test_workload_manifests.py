"""The Deployments and Services Switchyard writes: what the recorded server accepted, and
valid against the official client's models for other inputs (MIG, vLLM, volume repos)."""

from __future__ import annotations

import copy

import pytest
from kubernetes import client

from fleet.adapters import kube_workloads as kw
from tests.kube.replay import exchanges
from tests.kube.schemas import validate_builtin

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.08-py3"


def recorded_body(index: int) -> dict:
    return exchanges("03-deployments", index)[0]["request_body"]


def triton_spec(version: int, replicas: int, **changes) -> kw.ServerSpec:
    """The inputs the recording's Triton Deployments were written from."""
    values = dict(
        name=f"triton-fraud-v{version}", namespace="serving", runtime=kw.TRITON,
        deployment="fraud-scorer", version=version, image=TRITON_IMAGE, replicas=replicas,
        node_selector=A100, model_repository=f"s3://switchyard-models/fraud-scorer/v{version}",
        load_models=["fraud_scorer"], env=[{"name": "AWS_REGION", "value": "us-east-1"}],
    )
    values.update(changes)
    return kw.ServerSpec(**values)


def vllm_spec(**changes) -> kw.ServerSpec:
    """The inputs of the recording's vLLM Deployment."""
    values = dict(
        name="vllm-llama", namespace="serving", runtime=kw.VLLM, deployment="llm-chat",
        version=1, image="vllm/vllm-openai:v0.6.3", replicas=1, node_selector=H100,
        model="meta-llama/Llama-3.1-8B-Instruct",
        extra_args=["--enable-lora", "--max-loras", "4", "--lora-modules",
                    "fraud-explainer=s3://switchyard-models/lora/fraud-explainer",
                    "--gpu-memory-utilization", "0.90"],
        env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"key": "token",
                                                                  "name": "hf-token"}}}],
    )
    values.update(changes)
    return kw.ServerSpec(**values)


# --- exactly what the recorded server accepted ---------------------------------------------


def test_the_triton_deployment_is_the_server_side_apply_body_the_server_accepted():
    assert kw.deployment_manifest(triton_spec(3, 1)) == recorded_body(34)


@pytest.mark.parametrize(("index", "version", "replicas"), [(1, 1, 2), (2, 2, 1), (33, 3, 1)])
def test_the_triton_deployment_is_each_recorded_create_body(index, version, replicas):
    assert kw.deployment_manifest(triton_spec(version, replicas)) == recorded_body(index)


def test_the_vllm_deployment_is_the_recorded_one_plus_a_readiness_probe_on_health():
    """The recorded vLLM Deployment had no readiness probe: its pod would count as available
    as soon as the process started, long before the model is loaded. Everything else is as
    recorded."""
    built = kw.deployment_manifest(vllm_spec())
    [container] = built["spec"]["template"]["spec"]["containers"]

    assert container.pop("readinessProbe") == {
        "httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5,
    }
    assert built == recorded_body(3)


@pytest.mark.parametrize(("index", "spec"), [
    (4, triton_spec(1, 2)), (5, triton_spec(2, 1)), (6, vllm_spec()),
])
def test_the_service_is_the_recorded_one_selecting_by_the_deployment_label_too(index, spec):
    """The recorded Services select by app (and revision): in a namespace shared by several
    models they would pick each other's pods. Switchyard's select exactly the Deployment's
    pods; the rest is as recorded."""
    built = kw.service_manifest(spec)
    recorded = copy.deepcopy(recorded_body(index))
    for labels in (recorded["metadata"]["labels"], recorded["spec"]["selector"]):
        labels[kw.DEPLOYMENT_LABEL] = spec.deployment

    assert built == recorded
    assert built["spec"]["selector"] == kw.deployment_manifest(spec)["spec"]["selector"][
        "matchLabels"
    ]


# --- valid for the inputs that were not recorded -------------------------------------------


VARIANTS = {
    "recorded triton": triton_spec(3, 1),
    "triton on a MIG slice": triton_spec(
        4, 3, gpu_resource="nvidia.com/mig-3g.40gb", node_selector=H100,
    ),
    "triton with two GPUs and no region": triton_spec(5, 2, gpus=2, env=()),
    "triton on a volume": triton_spec(
        6, 1, model_repository="/models", volume_claim="fraud-models", env=(),
    ),
    "vllm recorded": vllm_spec(),
    "vllm on a MIG slice": vllm_spec(gpu_resource="nvidia.com/mig-1g.10gb", env=(),
                                     extra_args=()),
    "vllm tensor parallel with weights on a volume": vllm_spec(
        gpus=4, replicas=2, model="/weights/llama-70b", model_repository="/weights",
        volume_claim="llama-weights", extra_args=["--tensor-parallel-size", "4"],
    ),
    "vllm scaled to zero": vllm_spec(replicas=0),
}


@pytest.mark.parametrize("spec", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_deployment_is_a_valid_v1_deployment(spec):
    validate_builtin(kw.deployment_manifest(spec), client.V1Deployment)


@pytest.mark.parametrize("spec", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_service_is_a_valid_v1_service(spec):
    validate_builtin(kw.service_manifest(spec), client.V1Service)


def test_a_mig_slice_is_asked_for_by_its_own_resource_and_not_as_a_whole_gpu():
    built = kw.deployment_manifest(VARIANTS["triton on a MIG slice"])
    [container] = built["spec"]["template"]["spec"]["containers"]

    assert container["resources"]["limits"] == {
        "nvidia.com/mig-3g.40gb": "1", "cpu": "8", "memory": "32Gi",
    }
    assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
    # The slice's node still carries the GPU taint.
    assert built["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_a_volume_repository_is_the_claim_mounted_read_only_where_triton_reads_it():
    built = kw.deployment_manifest(VARIANTS["triton on a volume"])
    pod = built["spec"]["template"]["spec"]
    [container] = pod["containers"]

    assert "--model-repository=/models" in container["args"]
    assert container["volumeMounts"] == [{"name": "models", "mountPath": "/models",
                                          "readOnly": True}]
    assert pod["volumes"] == [{"name": "models", "persistentVolumeClaim": {
        "claimName": "fraud-models", "readOnly": True}}]
    assert "env" not in container


def test_the_vllm_arguments_keep_their_order_and_end_with_the_port():
    built = kw.deployment_manifest(VARIANTS["vllm tensor parallel with weights on a volume"])
    [container] = built["spec"]["template"]["spec"]["containers"]

    assert container["args"] == ["--model", "/weights/llama-70b", "--tensor-parallel-size",
                                 "4", "--port", "8000"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "4"}}


def test_a_vllm_selector_leaves_the_version_out_so_a_roll_can_change_it():
    one = kw.deployment_manifest(vllm_spec(version=1, model="org/base-1"))
    two = kw.deployment_manifest(vllm_spec(version=2, model="org/base-2"))

    assert one["spec"]["selector"] == two["spec"]["selector"]
    assert one != two
    assert not kw.differs_only_in_replicas(one, two)
    assert kw.differs_only_in_replicas(one, kw.deployment_manifest(
        vllm_spec(version=1, model="org/base-1", replicas=5)))


@pytest.mark.parametrize(("resource", "profile"), [
    ("nvidia.com/gpu", ""), ("nvidia.com/mig-3g.40gb", "3g.40gb"),
    ("nvidia.com/mig-1g.10gb", "1g.10gb"),
])
def test_gpu_resources_are_whole_gpus_or_mig_slices(resource, profile):
    assert kw.is_gpu_resource(resource)
    assert kw.mig_profile(resource) == profile


@pytest.mark.parametrize("resource", ["cpu", "nvidia.com/mig-9g.40gb", "amd.com/gpu",
                                      "nvidia.com/gpu ", "nvidia.com/mig-3g.40gb.count"])
def test_other_resources_are_not_gpu_resources(resource):
    assert not kw.is_gpu_resource(resource)
