"""Server workloads on Kubernetes: requests, quota, and the reconciler through every state."""

# ruff: noqa: F811 (the fixtures imported from test_workload_world are redefined as arguments)
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from console.exceptions import Conflict, DomainError, QuotaExceeded
from fleet.adapters import kube_workloads as kw
from fleet.adapters.kubernetes import KubeError
from fleet.models import AuditEvent, InferenceServer, Placement
from rollouts import tasks
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, ModelVersion, Route, ServerWorkload
from rollouts.traffic import routes
from rollouts.workloads import reconciler as workload_reconciler
from rollouts.workloads import requests as workloads
from rollouts.workloads import specs as workload_specs
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    GPUFactory,
    ModelVersionFactory,
    NodeFactory,
)
from tests.kube.test_workload_world import (  # noqa: F401 (fixtures)
    A100,
    A100_CLASS,
    H100,
    H100_CLASS,
    TRITON_REQUEST,
    VLLM_REQUEST,
    chat,
    enqueued_workloads,
    fake_kube,
    fraud,
    grant,
    kube_cluster,
)

State = ServerWorkload.State


def create(deployment, version, actor, **changes):
    request = {**(TRITON_REQUEST if version.runtime == "triton" else VLLM_REQUEST), **changes}
    return workloads.create_workload(deployment, version, actor, **request)


def held(workload) -> list[tuple[int, int, int, str]]:
    """(version, units, memory, state) of every placement on the workload's server."""
    return sorted(
        (p.model_version.version, p.units, p.memory_mib, p.state)
        for p in Placement.objects.filter(server_id=workload.server_id)
    )


def step(workload, times: int = 1) -> ServerWorkload:
    for _ in range(times):
        workload_reconciler.advance(workload.pk)
    return ServerWorkload.objects.get(pk=workload.pk)


def ready_triton(fraud, dave, fake_kube, **changes) -> ServerWorkload:
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave, **changes)
    step(workload, 2)
    fake_kube.pods_ready("serving", workload.name)
    return step(workload)


def ready_vllm(chat, dave, fake_kube) -> ServerWorkload:
    deployment, (v1, _v2) = chat
    workload, _ = create(deployment, v1, dave)
    step(workload, 2)
    fake_kube.pods_ready("serving", "vllm-llama")
    return step(workload)


def past_deadline(workload) -> None:
    ServerWorkload.objects.filter(pk=workload.pk).update(
        deadline_at=timezone.now() - timedelta(seconds=1), next_attempt_at=None)


# --- creation -------------------------------------------------------------------------------


def test_creating_admits_the_quota_and_makes_a_managed_server_of_the_deployment(
    fraud, dave, fake_kube, enqueued_workloads
):
    deployment, (v1, _v2) = fraud

    workload, made = create(deployment, v1, dave)

    assert made
    assert workload.state == State.PENDING
    assert (workload.namespace, workload.runtime, workload.replicas) == ("serving", "triton", 2)
    assert workload.image == "nvcr.io/nvidia/tritonserver:24.08-py3"
    assert held(workload) == [(1, 2, 40960, "loading")]
    assert workload.placement.device_class == A100_CLASS
    server = workload.server
    assert server.source == InferenceServer.Source.MANAGED
    assert server.http_url == "http://triton-fraud-v1.serving.svc:8000"
    assert server.grpc_url == "triton-fraud-v1.serving.svc:8001"
    assert server.metrics_url == "http://triton-fraud-v1.serving.svc:8002/metrics"
    assert (server.kube_namespace, server.kube_name) == ("serving", "triton-fraud-v1")
    assert list(deployment.servers.all()) == [server]
    assert fake_kube.calls == []  # the reconciler applies, not the request
    assert enqueued_workloads == []  # sent once the transaction commits
    [event] = AuditEvent.objects.filter(verb="created_workload")
    assert event.actor_label == "dave" and event.after["units"] == 2


def test_a_triton_workload_runs_through_apply_and_progress_to_ready(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)

    assert step(workload).state == State.APPLYING
    workload = step(workload)

    assert workload.state == State.PROGRESSING
    assert fake_kube.ops() == ["apply-Deployment", "apply-Service"]
    applied = fake_kube.deployment("serving", "triton-fraud-v1")
    assert applied == workload.applied_spec == kw.deployment_manifest(workload_specs.server_spec(workload))
    [container] = applied["spec"]["template"]["spec"]["containers"]
    assert container["args"][:3] == ["--model-repository=s3://switchyard-models/fraud-scorer",
                                     "--model-control-mode=explicit", "--load-model=fraud-scorer"]
    assert container["env"] == [{"name": "AWS_REGION", "value": "us-east-1"}]
    assert applied["metadata"]["labels"] == {"app": "triton", "switchyard.io/deployment":
                                             "fraud-scorer", "switchyard.io/revision": "v1"}
    assert workload.generation == 1

    workload = step(workload)  # no controller has looked yet
    assert workload.state == State.PROGRESSING
    assert "generation 1" in workload.detail
    assert workload.next_attempt_at is not None

    fake_kube.pods_ready("serving", "triton-fraud-v1")
    ServerWorkload.objects.filter(pk=workload.pk).update(next_attempt_at=None)
    workload = step(workload)

    assert workload.state == State.READY
    assert workload.detail == "2/2 replicas updated and available"
    assert workload.observed["available"] == 2
    assert held(workload) == [(1, 2, 40960, "active")]
    assert workload_reconciler.advance(workload.pk) is None  # nothing left to do: nothing is called
    assert fake_kube.ops("apply-Deployment", "apply-Service") == ["apply-Deployment",
                                                                  "apply-Service"]


def test_a_refused_quota_names_the_numbers_and_writes_nothing(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud

    with pytest.raises(QuotaExceeded) as refused:
        create(deployment, v1, dave, replicas=5)

    assert refused.value.field == "quota"
    assert "asks 5, 4 left of 4 (short by 1)" in refused.value.message
    assert not ServerWorkload.objects.exists()
    assert not InferenceServer.objects.exists()
    assert not Placement.objects.exists()


def test_gpu_memory_is_admitted_too(fraud, dave, fake_kube):
    deployment, _versions = fraud
    v3 = ModelVersionFactory(model=deployment.model, version=3, gpus=1,
                             estimated_gpu_memory_mib=50000)

    with pytest.raises(QuotaExceeded, match="asks 100000 MiB, 81920 MiB left"):
        create(deployment, v3, dave, name="triton-fraud-v3")


def test_a_mig_slice_is_admitted_on_the_mig_device_class(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud

    workload, _ = create(deployment, v1, dave, gpu_resource="nvidia.com/mig-3g.40gb",
                         node_selector=H100)

    assert workload.placement.device_class == f"{H100_CLASS}-mig-3g-40gb"
    step(workload, 2)
    [container] = fake_kube.deployment("serving", workload.name)["spec"]["template"]["spec"][
        "containers"]
    assert container["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "1"


@pytest.mark.parametrize(("product", "resource", "klass"), [
    ("NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu", "nvidia-a100-80gb"),
    ("NVIDIA-A100-PCIE-40GB", "nvidia.com/gpu", "nvidia-a100-40gb"),
    ("NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", "nvidia-h100-80gb"),
    ("NVIDIA-H100-80GB-HBM3", "nvidia.com/mig-3g.40gb", "nvidia-h100-80gb-mig-3g-40gb"),
    ("NVIDIA-H100-80GB-HBM3", "nvidia.com/mig-1g.10gb", "nvidia-h100-80gb-mig-1g-10gb"),
    ("NVIDIA-L4", "nvidia.com/gpu", "nvidia-l4"),
])
def test_the_device_class_comes_from_the_product_and_the_gpu_resource(product, resource, klass):
    assert workload_specs.device_class(product, resource) == klass


@pytest.mark.django_db
def test_the_device_class_is_the_synced_gpus_where_the_cluster_has_such_nodes():
    """The sync knows an L4's memory from its labels: a workload on L4 nodes is charged on
    the class its GPUs were synced with, not the product's bare name."""
    cluster = ClusterFactory(name="kube-l4", kind="kubernetes", kube_auth="in-cluster")
    node = NodeFactory(cluster=cluster, name="gpu-l4-01", synced=True,
                       labels={"nvidia.com/gpu.product": "NVIDIA-L4"})
    GPUFactory(node=node, index=0, uuid="k8s-l4-0", device_class="nvidia-l4-24gb")

    assert workload_specs.device_class("NVIDIA-L4", "nvidia.com/gpu", cluster) == "nvidia-l4-24gb"
    assert workload_specs.device_class("NVIDIA-L4", "nvidia.com/gpu") == "nvidia-l4"
    node.gone_at = node.created_at
    node.save()
    assert workload_specs.device_class("NVIDIA-L4", "nvidia.com/gpu", cluster) == "nvidia-l4"


@pytest.mark.parametrize(("changes", "field", "text"), [
    ({"name": "Triton_1"}, "name", "Service name"),
    ({"name": "1triton"}, "name", "starting with a letter"),
    ({"namespace": "Serving"}, "namespace", "namespace name"),
    ({"replicas": 0}, "replicas", "between 1 and 100"),
    ({"replicas": 101}, "replicas", "between 1 and 100"),
    ({"replicas": True}, "replicas", "whole number"),
    ({"gpu_resource": "amd.com/gpu"}, "gpu_resource", "MIG slice"),
    ({"node_selector": {}}, "node_selector", "nvidia.com/gpu.product"),
    ({"node_selector": {"nvidia.com/gpu.product": "A100 80GB"}}, "node_selector",
     "not a Kubernetes label value"),
    ({"node_selector": {**A100, "bad key!": "x"}}, "node_selector", "not a Kubernetes label"),
    ({"node_selector": ["a"]}, "node_selector", "an object"),
    ({"model_repository": ""}, "model_repository", "needs its model repository"),
    ({"model_repository": "models/fraud"}, "model_repository", "absolute path"),
    ({"model_repository": "/models"}, "volume_claim", "PersistentVolumeClaim"),
    ({"model_repository": "s3://Bad_Bucket/x"}, "model_repository", "s3://bucket/prefix"),
    ({"volume_claim": "models"}, "volume_claim", "needs no volume"),
    ({"image": "nvcr.io/triton latest"}, "image", "container image"),
])
def test_bad_input_is_refused_naming_the_field(fraud, dave, fake_kube, changes, field, text):
    deployment, (v1, _v2) = fraud

    with pytest.raises(DomainError) as refused:
        create(deployment, v1, dave, **changes)

    assert refused.value.field == field
    assert text in refused.value.message
    assert not ServerWorkload.objects.exists()


def test_only_deployments_on_kubernetes_clusters_get_workloads(fraud, dave, tenant_a):
    deployment, (v1, _v2) = fraud
    static = DeploymentFactory(model=deployment.model, tenant=tenant_a, name="static-one",
                               cluster=ClusterFactory(name="static-1"))

    with pytest.raises(Conflict, match="Kubernetes clusters only") as refused:
        create(static, v1, dave)
    assert refused.value.field == "deployment"


def test_a_viewer_cannot_create_a_workload(fraud, bob):
    deployment, (v1, _v2) = fraud

    with pytest.raises(PermissionDenied):
        create(deployment, v1, bob)


def test_a_vllm_version_must_name_the_weights_it_runs(chat, dave, fake_kube):
    deployment, _versions = chat
    bare = ModelVersionFactory(model=deployment.model, version=7, runtime="vllm", backend="")

    with pytest.raises(DomainError, match=r"vllm\.model") as refused:
        create(deployment, bare, dave)
    assert refused.value.field == "version"

    workload, _ = create(deployment, bare, dave, model_repository="/weights",
                         volume_claim="llm-weights")
    assert workload_specs.server_spec(workload).model == "/weights/llm-chat-v7"


def test_a_lora_adapter_version_is_no_base_model_to_run(chat, dave):
    deployment, _versions = chat
    adapter = ModelVersionFactory(model=deployment.model, version=9, runtime="vllm",
                                  backend="", adapter_of="llm-chat")

    with pytest.raises(DomainError, match="LoRA adapter"):
        create(deployment, adapter, dave)


def test_the_same_idempotency_key_and_request_answer_the_first_workload(fraud, dave):
    deployment, (v1, _v2) = fraud

    first, made = create(deployment, v1, dave, idempotency_key="k-1")
    again, made_again = create(deployment, v1, dave, idempotency_key="k-1")

    assert (made, made_again) == (True, False)
    assert again.pk == first.pk
    assert held(first) == [(1, 2, 40960, "loading")]
    with pytest.raises(Conflict) as other:
        create(deployment, v1, dave, replicas=1, idempotency_key="k-1")
    assert other.value.field == "idempotency_key"
    with pytest.raises(Conflict) as taken:
        create(deployment, v1, dave)
    assert taken.value.field == "name"


def test_two_servers_whose_pods_would_carry_the_same_labels_are_refused(fraud, dave):
    deployment, (v1, v2) = fraud
    create(deployment, v1, dave)

    with pytest.raises(Conflict, match="select each other's pods") as refused:
        create(deployment, v1, dave, name="triton-fraud-again", replicas=1)

    assert refused.value.field == "namespace"
    create(deployment, v2, dave, name="triton-fraud-v2", replicas=1)  # another revision
    grant(deployment.tenant, deployment.cluster, "canary")
    create(deployment, v1, dave, name="triton-fraud-canary", namespace="canary", replicas=1)


def test_a_server_name_the_cluster_has_already_is_refused(fraud, dave, kube_cluster):
    deployment, (v1, _v2) = fraud
    InferenceServer.objects.create(cluster=kube_cluster, name="triton-fraud-v1",
                                   runtime="triton", http_url="http://elsewhere:8000")

    with pytest.raises(Conflict, match="already has a server named") as refused:
        create(deployment, v1, dave)
    assert refused.value.field == "name"


# --- failures while creating ----------------------------------------------------------------


def test_a_refused_deployment_leaves_nothing_and_releases_the_quota(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    fake_kube.fail("apply-Deployment", KubeError(
        "apply Deployment serving/triton-fraud-v1: Deployment.apps is invalid (422 Invalid)",
        kind="invalid", status=422))

    workload = step(workload, 2)

    assert workload.state == State.FAILED
    assert workload.error.startswith("the Deployment was refused: apply Deployment")
    assert "Nothing is left on the cluster; quota released" in workload.detail
    assert held(workload) == [(1, 2, 40960, "released")]
    assert fake_kube.ops() == ["apply-Deployment"]  # nothing was made: nothing to remove
    assert workload_reconciler.advance(workload.pk) is None


def test_a_refused_service_takes_the_applied_deployment_away_again(fraud, dave, fake_kube,
                                                                   settings):
    settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = 0  # a refusal (403) is final at once
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    fake_kube.fail("apply-Service", KubeError("forbidden by RBAC (403): services is forbidden",
                                              kind="forbidden", status=403))

    workload = step(workload, 2)

    assert workload.state == State.FAILED
    assert "the Service was refused: forbidden by RBAC (403)" in workload.detail
    assert fake_kube.ops() == ["apply-Deployment", "apply-Service", "delete-Deployment",
                               "delete-Service"]
    assert fake_kube.objects == {}
    assert held(workload) == [(1, 2, 40960, "released")]


def test_when_the_cleanup_fails_too_the_workload_keeps_deleting_holding_its_quota(
    fraud, dave, fake_kube, settings
):
    settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = 0  # a refusal (403) is final at once
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    fake_kube.fail("apply-Service", KubeError("forbidden (403)", kind="forbidden"))
    fake_kube.fail("delete-Deployment", KubeError("API server unreachable", kind="unreachable"))

    workload = step(workload, 2)

    # Not failed: what was applied may run, so it holds its quota until it is gone.
    assert workload.state == State.DELETING
    assert workload.error == "the Service was refused: forbidden (403)"
    assert ("could not be removed yet (API server unreachable): removing it again; its quota "
            "stays held until it is gone") in workload.detail
    assert held(workload) == [(1, 2, 40960, "loading")]

    workload = step(workload)

    assert workload.state == State.DELETED
    assert fake_kube.objects == {}
    assert held(workload) == [(1, 2, 40960, "released")]


def test_an_unreachable_api_server_is_retried_with_backoff_until_the_deadline(
    fraud, dave, fake_kube
):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    down = KubeError("apply Deployment serving/triton-fraud-v1: API server unreachable: "
                     "connection refused", kind="unreachable")
    fake_kube.fail("apply-Deployment", down, down)

    workload = step(workload, 2)

    assert workload.state == State.APPLYING
    assert workload.attempts == 1
    assert workload.error == down.message
    assert "trying again in 2 s" in workload.detail
    assert workload_reconciler.advance(workload.pk) is None  # backing off: not before its time

    past_deadline(workload)
    workload = step(workload)

    assert workload.state == State.FAILED
    assert "gave up after 2 attempts" in workload.error
    assert fake_kube.ops()[-2:] == ["delete-Deployment", "delete-Service"]
    assert held(workload) == [(1, 2, 40960, "released")]


def test_pods_that_never_become_ready_fail_the_creation_and_release_its_quota(
    fraud, dave, fake_kube
):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    workload = step(workload, 3)
    assert workload.state == State.PROGRESSING

    past_deadline(workload)
    workload = step(workload)

    # A failed workload keeps no quota: what it applied is taken away first.
    assert workload.state == State.FAILED
    assert workload.error.startswith("not ready within 600 s: waiting for the Deployment")
    assert workload.detail.endswith("Nothing is left on the cluster; quota released")
    assert fake_kube.objects == {}
    assert fake_kube.ops()[-2:] == ["delete-Deployment", "delete-Service"]
    assert held(workload) == [(1, 2, 40960, "released")]
    assert workload.applied_spec == {}


def test_a_refusal_that_outlasts_the_window_while_waiting_ends_the_creation(
    fraud, dave, fake_kube, settings
):
    settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = 30
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    workload = step(workload, 2)
    refused = KubeError("read Deployment serving/triton-fraud-v1: forbidden by RBAC (403): "
                        "cannot get", kind="forbidden", status=403)
    fake_kube.fail("read", refused, refused)

    workload = step(workload)

    assert (workload.state, workload.error) == (State.PROGRESSING, refused.message)
    assert held(workload) == [(1, 2, 40960, "loading")]

    ServerWorkload.objects.filter(pk=workload.pk).update(
        next_attempt_at=None, forbidden_since=timezone.now() - timedelta(seconds=30))
    workload = step(workload)

    assert workload.state == State.FAILED
    assert workload.error == f"{refused.message} (refused for 30 s in a row)"
    assert fake_kube.objects == {}
    assert held(workload) == [(1, 2, 40960, "released")]


def test_a_creation_refused_for_a_moment_is_applied_and_becomes_ready(fraud, dave, fake_kube):
    """An API server that has just started refuses a correctly bound user for a moment."""
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    refused = KubeError("apply Deployment serving/triton-fraud-v1: forbidden by RBAC (403)",
                        kind="forbidden", status=403)
    fake_kube.fail("apply-Deployment", refused, refused)

    workload = step(workload, 2)
    assert (workload.state, workload.attempts) == (State.APPLYING, 1)
    for _ in range(2):
        ServerWorkload.objects.filter(pk=workload.pk).update(next_attempt_at=None)
        workload = step(workload)
    assert workload.state == State.PROGRESSING
    fake_kube.pods_ready("serving", workload.name)
    workload = step(workload)

    assert workload.state == State.READY
    assert held(workload) == [(1, 2, 40960, "active")]


def test_a_deployment_someone_deleted_while_progressing_ends_the_creation(
    fraud, dave, fake_kube
):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    step(workload, 2)
    fake_kube.objects.pop(("Deployment", "serving", "triton-fraud-v1"))

    workload = step(workload)

    assert workload.state == State.FAILED
    assert "not found" in workload.error


# --- scaling --------------------------------------------------------------------------------


def test_scaling_up_admits_the_extra_gpus_first_and_goes_through_the_scale_subresource(
    fraud, dave, fake_kube
):
    workload = ready_triton(fraud, dave, fake_kube)

    workload, changed = workloads.scale(workload, 3, dave)

    assert changed
    assert workload.state == State.APPLYING
    assert held(workload) == [(1, 3, 61440, "active")]
    assert workload.previous_spec["spec"]["replicas"] == 2
    workload = step(workload)
    assert fake_kube.ops()[-1] == "scale"
    assert workload.state == State.PROGRESSING
    assert workload.applied_spec["spec"]["replicas"] == 3
    fake_kube.pods_ready("serving", "triton-fraud-v1")
    workload = step(workload)
    assert workload.state == State.READY
    assert fake_kube.ops("apply-Deployment") == ["apply-Deployment"]  # no re-apply


def test_scaling_beyond_the_quota_is_refused_with_the_numbers_and_changes_nothing(
    fraud, dave, fake_kube
):
    workload = ready_triton(fraud, dave, fake_kube)

    with pytest.raises(QuotaExceeded) as refused:
        workloads.scale(workload, 5, dave)

    assert refused.value.field == "replicas"
    assert refused.value.message == (
        "5 replicas of triton-fraud-v1 hold 5 GPUs of nvidia-a100-80gb (2 hold 2): GPUs quota "
        "of tenant-a on nvidia-a100-80gb exceeded: asks 3 more, 2 left of 4 (short by 1)"
    )
    workload.refresh_from_db()
    assert (workload.state, workload.replicas) == (State.READY, 2)
    assert held(workload) == [(1, 2, 40960, "active")]


def test_scaling_down_gives_the_quota_back_once_the_pods_are_gone(fraud, dave, fake_kube):
    workload = ready_triton(fraud, dave, fake_kube)

    workload, _ = workloads.scale(workload, 0, dave)
    assert held(workload) == [(1, 2, 40960, "active")]  # the pods still run
    workload = step(workload, 2)
    assert workload.state == State.PROGRESSING
    fake_kube.pods_ready("serving", "triton-fraud-v1")
    ServerWorkload.objects.filter(pk=workload.pk).update(next_attempt_at=None)
    workload = step(workload)

    assert workload.state == State.READY
    assert held(workload) == [(1, 0, 0, "active")]


def test_scaling_to_the_same_count_changes_nothing(fraud, dave, fake_kube):
    workload = ready_triton(fraud, dave, fake_kube)

    same, changed = workloads.scale(workload, 2, dave)

    assert not changed
    assert same.state == State.READY


def test_a_workload_in_flight_cannot_be_scaled(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)

    with pytest.raises(Conflict, match="wait for it to finish") as refused:
        workloads.scale(workload, 3, dave)
    assert refused.value.field == "state"


def test_a_scale_whose_pods_do_not_come_up_is_rolled_back(fraud, dave, fake_kube):
    workload = ready_triton(fraud, dave, fake_kube)
    workloads.scale(workload, 4, dave)
    workload = step(workload, 2)

    past_deadline(workload)
    workload = step(workload)
    assert workload.state == State.ROLLING_BACK
    workload = step(workload)

    assert workload.state == State.FAILED
    assert workload.replicas == 2
    assert fake_kube.deployment("serving", "triton-fraud-v1")["spec"]["replicas"] == 2
    assert workload.detail.startswith("scale rolled back to 2 replicas: not ready within 600 s")
    assert held(workload) == [(1, 2, 40960, "active")]

    again, _ = workloads.scale(workload, 3, dave)  # a failed change can be tried again
    assert again.state == State.APPLYING


# --- rolling a vLLM base model --------------------------------------------------------------


def test_a_vllm_workload_writes_its_version_labels_into_the_deployment(chat, dave, fake_kube):
    workload = ready_vllm(chat, dave, fake_kube)

    [container] = workload.applied_spec["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llm-chat",
        "--enable-lora", "--max-loras", "4", "--gpu-memory-utilization", "0.90",
        "--port", "8000",
    ]
    assert container["env"] == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "key": "token", "name": "hf-token"}}}]
    assert workload.server.grpc_url == ""
    assert workload.server.metrics_url == "http://vllm-llama.serving.svc:8000/metrics"
    assert workload.placement.device_class == H100_CLASS


def test_a_vllm_roll_updates_the_deployment_in_place_and_holds_both_quotas_until_ready(
    chat, dave, fake_kube
):
    workload = ready_vllm(chat, dave, fake_kube)
    _deployment, (_v1, v2) = chat

    workload, changed = workloads.roll_version(workload, v2, dave)

    assert changed
    assert (workload.version.version, workload.previous_version.version) == (2, 1)
    assert held(workload) == [(1, 1, 40960, "active"), (2, 1, 40960, "loading")]
    workload = step(workload)
    assert workload.state == State.PROGRESSING
    [container] = fake_kube.deployment("serving", "vllm-llama")["spec"]["template"]["spec"][
        "containers"]
    assert container["args"][1] == "meta-llama/Llama-3.2-8B-Instruct"
    assert fake_kube.generations[("serving", "vllm-llama")] == 2
    assert fake_kube.ops("apply-Service") == ["apply-Service"]  # the Service stays as it is

    fake_kube.pods_ready("serving", "vllm-llama")
    workload = step(workload)

    assert workload.state == State.READY
    assert workload.previous_version is None
    assert held(workload) == [(1, 1, 40960, "released"), (2, 1, 40960, "active")]


def test_a_roll_the_controller_gives_up_on_rolls_back_to_the_previous_spec(
    chat, dave, fake_kube
):
    workload = ready_vllm(chat, dave, fake_kube)
    before = workload.applied_spec
    _deployment, (v1, v2) = chat
    workloads.roll_version(workload, v2, dave)
    workload = step(workload)
    fake_kube.pods_stuck("serving", "vllm-llama")

    workload = step(workload)
    assert workload.state == State.ROLLING_BACK
    assert workload.error.startswith("ProgressDeadlineExceeded: ReplicaSet")
    workload = step(workload)

    assert workload.state == State.FAILED
    assert workload.detail.startswith("v2 rolled back to v1: ProgressDeadlineExceeded")
    assert fake_kube.deployment("serving", "vllm-llama") == before == workload.applied_spec
    assert workload.version == v1
    assert held(workload) == [(1, 1, 40960, "active"), (2, 1, 40960, "released")]
    assert AuditEvent.objects.filter(verb="workload_rolled_back").count() == 1


def test_a_stale_write_during_a_roll_is_retried_not_failed(chat, dave, fake_kube):
    workload = ready_vllm(chat, dave, fake_kube)
    _deployment, (_v1, v2) = chat
    workloads.roll_version(workload, v2, dave)
    fake_kube.fail("apply-Deployment", KubeError(
        "Operation cannot be fulfilled on deployments.apps \"vllm-llama\": the object has been "
        "modified (409 Conflict)", kind="conflict", status=409))

    workload = step(workload)

    assert workload.state == State.APPLYING
    assert "(409 Conflict); trying again in 2 s" in workload.detail
    ServerWorkload.objects.filter(pk=workload.pk).update(next_attempt_at=None)
    assert step(workload).state == State.PROGRESSING


def test_a_roll_refused_by_the_api_server_rolls_back_at_once(chat, dave, fake_kube, settings):
    settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = 0  # a refusal (403) is final at once
    workload = ready_vllm(chat, dave, fake_kube)
    _deployment, (_v1, v2) = chat
    workloads.roll_version(workload, v2, dave)
    fake_kube.fail("apply-Deployment", KubeError("forbidden by RBAC (403): patch",
                                                 kind="forbidden", status=403))

    workload = step(workload, 2)

    assert workload.state == State.FAILED
    assert workload.detail == "v2 rolled back to v1: forbidden by RBAC (403): patch"


def test_a_roll_is_admitted_against_the_quota_first(chat, dave, fake_kube):
    workload = ready_vllm(chat, dave, fake_kube)
    deployment, _versions = chat
    big = ModelVersionFactory(model=deployment.model, version=3, runtime="vllm", backend="",
                              gpus=4, labels={"vllm.model": "meta-llama/Llama-3.1-70B"})

    with pytest.raises(QuotaExceeded, match="holds its quota beside v1's") as refused:
        workloads.roll_version(workload, big, dave)

    assert refused.value.field == "version"
    assert "asks 4, 3 left of 4" in refused.value.message
    workload.refresh_from_db()
    assert (workload.state, workload.version.version) == (State.READY, 1)


def test_only_vllm_servers_roll_their_version(fraud, dave, fake_kube):
    workload = ready_triton(fraud, dave, fake_kube)
    _deployment, (_v1, v2) = fraud

    with pytest.raises(Conflict, match="keeps the version it started with"):
        workloads.roll_version(workload, v2, dave)


def test_a_rollback_that_cannot_be_applied_keeps_trying_holding_both_versions_quota(
        chat, dave, fake_kube, settings):
    settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = 0  # a refusal (403) is final at once
    workload = ready_vllm(chat, dave, fake_kube)
    _deployment, (_v1, v2) = chat
    workloads.roll_version(workload, v2, dave)
    workload = step(workload)
    fake_kube.pods_stuck("serving", "vllm-llama")
    workload = step(workload)
    fake_kube.fail("apply-Deployment", KubeError("forbidden by RBAC (403)", kind="forbidden"))

    workload = step(workload)

    # Not failed: what runs may be either spec, so both versions' quota stays held.
    assert workload.state == State.ROLLING_BACK
    assert "roll-back could not be applied: forbidden by RBAC (403)" in workload.detail
    assert "both versions' quota stays held" in workload.detail
    assert held(workload) == [(1, 1, 40960, "active"), (2, 1, 40960, "loading")]

    # Once the API server takes it, the roll-back applies: failed, only v1's quota held.
    ServerWorkload.objects.filter(pk=workload.pk).update(next_attempt_at=None)
    workload = step(workload)
    assert (workload.state, workload.version.version) == (State.FAILED, 1)
    assert [h[0] for h in held(workload) if h[3] != "released"] == [1]


# --- deleting -------------------------------------------------------------------------------


def test_deleting_removes_both_objects_releases_the_quota_and_frees_the_name(
    fraud, dave, fake_kube
):
    workload = ready_triton(fraud, dave, fake_kube)
    deployment, (v1, _v2) = fraud

    workload, started = workloads.delete_workload(workload, dave)
    assert (started, workload.state) == (True, State.DELETING)
    workload = step(workload)

    assert workload.state == State.DELETED
    assert fake_kube.objects == {}
    assert held(workload) == [(1, 2, 40960, "released")]
    assert not deployment.servers.exists()
    assert workloads.delete_workload(workload, dave)[1] is False

    again, _ = create(deployment, v1, dave)  # the name is free, its server row reused
    assert again.server_id == workload.server_id
    assert list(deployment.servers.all()) == [again.server]


def test_deleting_what_is_gone_already_is_done_all_the_same(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)

    workloads.delete_workload(workload, dave)
    workload = step(workload)

    assert workload.state == State.DELETED
    assert held(workload) == [(1, 2, 40960, "released")]


def test_a_forbidden_delete_keeps_deleting_holding_the_quota_until_it_is_gone(
    fraud, dave, fake_kube, settings
):
    settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = 0  # a refusal (403) is final at once
    workload = ready_triton(fraud, dave, fake_kube)
    workloads.delete_workload(workload, dave)
    fake_kube.fail("delete-Deployment", KubeError("forbidden by RBAC (403): delete",
                                                  kind="forbidden"))

    workload = step(workload)

    # Never failed: the Deployment still runs, so the quota stays held while it is retried.
    assert workload.state == State.DELETING
    assert workload.detail == ("could not delete: forbidden by RBAC (403): delete; its quota "
                               "stays held until it is gone (tried again every 30 s)")
    assert held(workload) == [(1, 2, 40960, "active")]
    assert workload_reconciler.advance(workload.pk) is None  # not before its time
    ServerWorkload.objects.filter(pk=workload.pk).update(next_attempt_at=None)
    assert step(workload).state == State.DELETED
    assert held(workload) == [(1, 2, 40960, "released")]


def test_a_server_the_route_sends_traffic_to_is_not_deleted(fraud, dave, fake_kube):
    workload = ready_triton(fraud, dave, fake_kube)
    deployment, (v1, _v2) = fraud
    Route.objects.create(
        deployment=deployment, name=f"dep-{deployment.pk}", state=Route.State.IN_FORCE,
        spec={"variants": [{"name": "v1-triton-fraud-v1", "weight": 100,
                            "upstream": workload.server.http_url}]},
        variants={"v1-triton-fraud-v1": {"version_id": v1.pk, "version": 1,
                                         "server_id": workload.server_id,
                                         "server": workload.server.name}},
    )

    with pytest.raises(Conflict, match="carries 100% of deployment fraud-scorer's traffic"):
        workloads.delete_workload(workload, dave)


def test_a_deletion_asked_for_while_a_worker_applies_wins(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    step(workload)
    fake_kube.hooks["apply-Deployment"] = lambda: workloads.delete_workload(workload, dave)

    assert workload_reconciler.advance(workload.pk) is None  # the worker's write is refused

    workload.refresh_from_db()
    assert (workload.state, workload.lease_owner) == (State.DELETING, "")
    assert step(workload).state == State.DELETED
    assert fake_kube.objects == {}


# --- the reconciler and its tasks -----------------------------------------------------------


def test_a_leased_workload_is_left_to_its_worker(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    ServerWorkload.objects.filter(pk=workload.pk).update(
        lease_owner="other", lease_expires_at=timezone.now() + timedelta(seconds=30))

    assert workload_reconciler.advance(workload.pk) is None
    assert workload_reconciler.due_workloads() == []


def test_the_beat_tick_advances_what_is_due(fraud, dave, fake_kube, enqueued_workloads):
    deployment, (v1, v2) = fraud
    due, _ = create(deployment, v1, dave)
    later, _ = create(deployment, v2, dave, name="triton-fraud-v2", replicas=1)
    ServerWorkload.objects.filter(pk=later.pk).update(
        next_attempt_at=timezone.now() + timedelta(seconds=30))

    assert tasks.reconcile_workloads() == 1
    assert enqueued_workloads == [due.pk]


def test_the_advance_task_sends_the_next_step_while_applying(fraud, dave, fake_kube,
                                                            monkeypatch):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    sent = []
    monkeypatch.setattr(tasks.advance_workload, "apply_async",
                        lambda args, queue=None: sent.append(args))

    tasks.advance_workload(workload.pk)  # pending -> applying: the next step follows
    tasks.advance_workload(workload.pk)  # applying -> progressing: beat looks at it

    assert sent == [(workload.pk,)]
    assert ServerWorkload.objects.get(pk=workload.pk).state == State.PROGRESSING


def test_an_unexpected_error_in_a_step_fails_readably(fraud, dave, fake_kube, monkeypatch):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    step(workload)

    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(kw, "apply", broken)
    workload = step(workload)

    assert workload.state == State.FAILED
    assert workload.error == "Switchyard failed unexpectedly (ZeroDivisionError: division by zero)"
    assert held(workload) == [(1, 2, 40960, "released")]


# --- what the server serves, as loads see it ----------------------------------------------


def served(workload) -> list[tuple[int, str]]:
    """(version, state) of every load on the workload's server."""
    return sorted((load.version.version, load.state)
                  for load in ModelLoad.objects.filter(server_id=workload.server_id))


def test_a_ready_workload_serves_its_version_as_a_ready_load_holding_its_quota(
    fraud, dave, fake_kube
):
    """Routes, rollouts and the pages find what a server serves in its ready loads: a
    workload that becomes ready says so the same way, with the workload's placement."""
    workload = ready_triton(fraud, dave, fake_kube)

    [load] = ModelLoad.objects.filter(server_id=workload.server_id)
    assert (load.version.version, load.state) == (1, ModelLoad.State.READY)
    assert load.placement_id == workload.placement_id
    assert load.deployment_id == workload.deployment_id and load.requested_by_label == "dave"
    assert routes.ready_loads(workload.deployment) == [load]

    workloads.delete_workload(workload, dave)
    step(workload)
    assert served(workload) == [(1, ModelLoad.State.UNLOADED)]


def test_a_rolled_vllm_workload_serves_the_new_version_once_ready_and_the_old_until_then(
    chat, dave, fake_kube
):
    workload = ready_vllm(chat, dave, fake_kube)
    _deployment, (_v1, v2) = chat
    workloads.roll_version(workload, v2, dave)
    workload = step(workload)
    assert served(workload) == [(1, ModelLoad.State.READY)]  # the old pods still answer

    fake_kube.pods_ready("serving", "vllm-llama")
    workload = step(workload)

    assert served(workload) == [(1, ModelLoad.State.UNLOADED), (2, ModelLoad.State.READY)]


def test_loads_cannot_change_what_a_workload_server_runs(fraud, dave, fake_kube):
    """A workload's server runs the version it was started with: loading another version
    onto it, or unloading its own, is refused naming the workload; asking for the version
    it runs is the load that says so."""
    workload = ready_triton(fraud, dave, fake_kube)
    deployment, (v1, v2) = fraud
    ModelVersion.objects.filter(pk=v2.pk).update(status=ModelVersion.Status.APPROVED)

    with pytest.raises(Conflict) as refused:
        loads.request_load(dave, deployment, v2, server_names=[workload.server.name])
    assert refused.value.field == "servers"
    assert "run by the Kubernetes workload serving/triton-fraud-v1" in refused.value.message

    with pytest.raises(Conflict) as refused:
        loads.request_unload(dave, deployment, v1, server_names=[workload.server.name])
    assert "cannot unload v1 from it" in refused.value.message
    assert served(workload) == [(1, ModelLoad.State.READY)]

    [same], created = loads.request_load(dave, deployment, v1,
                                         server_names=[workload.server.name])
    assert not created
    assert same.state == ModelLoad.State.READY and same.server_id == workload.server_id
