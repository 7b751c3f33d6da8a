"""Autoscaled server workloads: an HPA owns the replica count, the quota is held for its
maximum.

* Manifests: the autoscaled Deployment leaves ``spec.replicas`` out; the HorizontalPodAutoscaler
  is the one of deploy/prometheus-adapter/hpa-example.yaml, reads metrics /metrics exports
  and the adapter serves, and is valid against the official client's model.
* Requests: no HPA exchange was recorded from a real API server, so the HPA apply and delete
  are shown to be the recorded Deployment apply and delete on the autoscaling/v2 path, and
  the autoscaled Deployment apply the recorded one without ``spec.replicas``.
* Readiness against the replicas the HPA set, with statuses checked against the client's
  models (no recorded server ran controllers).
* The domain and the reconciler with :class:`HpaKube`, the in-memory stand-in of
  test_workload_world with what an API server and an HPA do to ``spec.replicas``.
"""

# ruff: noqa: F811 (the fixtures imported from test_workload_world are redefined as arguments)
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.utils import timezone
from kubernetes import client

from console.exceptions import DomainError, QuotaExceeded
from console.metrics import DEPLOYMENT_GAUGES
from fleet.adapters import kube_workloads as kw
from fleet.adapters.kubernetes import KubeAccess, KubeError
from fleet.models import AuditEvent, InferenceServer, Placement
from rollouts.models import ServerWorkload
from rollouts.workloads import autoscaling
from rollouts.workloads import reconciler as workload_reconciler
from rollouts.workloads import requests as workloads
from rollouts.workloads import specs as workload_specs
from tests.kube.replay import RecordedApiServer, exchanges
from tests.kube.schemas import validate_builtin
from tests.kube.test_workload_manifests import triton_spec, vllm_spec
from tests.kube.test_workload_readiness import condition
from tests.kube.test_workload_world import (  # noqa: F401 (fixtures)
    A100,
    A100_CLASS,
    H100,
    FakeKube,
    chat,
    enqueued_workloads,
    fraud,
    grant,
    kube_cluster,
)

State = ServerWorkload.State
ADAPTER = Path(__file__).resolve().parents[2] / "deploy" / "prometheus-adapter"
NS = "serving"


# --------------------------------------------------------------------------------------------
# The world: what the API server and the HPA do to spec.replicas
# --------------------------------------------------------------------------------------------


@dataclass
class HpaKube(FakeKube):
    """FakeKube, plus: an apply that leaves ``spec.replicas`` out keeps the Deployment's
    (the API server's default of 1 on creation, or what the HPA set since), as server-side
    apply keeps fields another manager owns; the HPA's own delete; and the HPA scaling."""

    def apply(self, access: Any, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] == "Deployment" and "replicas" not in manifest["spec"]:
            meta = manifest["metadata"]
            before = self.objects.get(("Deployment", meta["namespace"], meta["name"]))
            manifest = copy.deepcopy(manifest)
            manifest["spec"]["replicas"] = before["spec"]["replicas"] if before else 1
        return super().apply(access, manifest)

    def delete_autoscaler(self, access: Any, namespace: str, name: str) -> bool:
        self._call("delete-HorizontalPodAutoscaler", namespace, name)
        return self.objects.pop(("HorizontalPodAutoscaler", namespace, name), None) is not None

    def autoscaler(self, namespace: str, name: str) -> dict[str, Any]:
        return self.objects[("HorizontalPodAutoscaler", namespace, name)]

    def hpa_scales(self, namespace: str, name: str, replicas: int) -> None:
        """The HPA controller sets the Deployment's replicas (through /scale): a new
        generation of its spec."""
        self.deployment(namespace, name)["spec"]["replicas"] = replicas
        self.generations[(namespace, name)] += 1


@pytest.fixture
def hpa_kube(monkeypatch) -> HpaKube:
    fake = HpaKube()
    for name in ("apply", "scale", "read", "delete_deployment", "delete_service",
                 "delete_autoscaler"):
        monkeypatch.setattr(kw, name, getattr(fake, name))
    return fake


AUTOSCALED_TRITON = {"name": "triton-fraud-v1", "min_replicas": 1, "max_replicas": 3,
                     "node_selector": A100,
                     "model_repository": "s3://switchyard-models/fraud-scorer"}


def create(deployment, version, actor, **changes):
    return workloads.create_workload(deployment, version, actor,
                                     **{**AUTOSCALED_TRITON, **changes})


def step(workload, times: int = 1) -> ServerWorkload:
    for _ in range(times):
        workload_reconciler.advance(workload.pk)
    return ServerWorkload.objects.get(pk=workload.pk)


def again(workload) -> ServerWorkload:
    """Step once more now, not after the poll interval."""
    ServerWorkload.objects.filter(pk=workload.pk).update(next_attempt_at=None)
    return step(workload)


def ready(fraud, dave, hpa_kube, **changes) -> ServerWorkload:
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave, **changes)
    step(workload, 2)
    if workload.autoscaled and workload.min_replicas > 1:
        hpa_kube.hpa_scales(NS, workload.name, workload.min_replicas)
    hpa_kube.pods_ready(NS, workload.name)
    workload = step(workload)
    assert workload.state == State.READY, workload.detail
    return workload


def held(workload) -> list[tuple[int, int, int, str]]:
    return sorted((p.model_version.version, p.units, p.memory_mib, p.state)
                  for p in Placement.objects.filter(server_id=workload.server_id))


# --------------------------------------------------------------------------------------------
# Manifests
# --------------------------------------------------------------------------------------------


def test_the_autoscaled_deployment_is_the_fixed_one_without_replicas_and_with_its_range():
    fixed = kw.deployment_manifest(triton_spec(3, 1))
    scaled = kw.deployment_manifest(triton_spec(3, 1, min_replicas=2, max_replicas=8))

    assert "replicas" not in scaled["spec"]
    assert scaled["metadata"]["annotations"] == {"switchyard.io/model-version": "v3",
                                                 "switchyard.io/hpa-replicas": "2-8"}
    assert kw.replica_range_of(scaled) == (2, 8)
    assert kw.replica_range_of(fixed) is None
    del fixed["spec"]["replicas"]
    fixed["metadata"]["annotations"]["switchyard.io/hpa-replicas"] = "2-8"
    assert scaled == fixed


AUTOSCALED = {
    "triton": triton_spec(1, 1, min_replicas=1, max_replicas=8),
    "triton on a MIG slice": triton_spec(4, 3, gpu_resource="nvidia.com/mig-3g.40gb",
                                         node_selector=H100, min_replicas=2, max_replicas=6),
    "vllm": vllm_spec(min_replicas=1, max_replicas=1),
    "vllm tensor parallel": vllm_spec(gpus=4, model="/weights/llama-70b",
                                      model_repository="/weights", volume_claim="llama-weights",
                                      min_replicas=3, max_replicas=100),
}


@pytest.mark.parametrize("spec", AUTOSCALED.values(), ids=AUTOSCALED.keys())
def test_every_autoscaled_deployment_is_a_valid_v1_deployment(spec):
    built = kw.deployment_manifest(spec)

    validate_builtin(built, client.V1Deployment)
    assert "replicas" not in built["spec"]


@pytest.mark.parametrize("spec", AUTOSCALED.values(), ids=AUTOSCALED.keys())
@pytest.mark.parametrize("p99_ms", [250, 1500, 1])
def test_every_autoscaler_is_a_valid_v2_horizontal_pod_autoscaler(spec, p99_ms):
    built = kw.autoscaler_manifest(spec, p99_target_ms=p99_ms)

    validate_builtin(built, client.V2HorizontalPodAutoscaler)
    assert (built["spec"]["minReplicas"], built["spec"]["maxReplicas"]) == (
        spec.min_replicas, spec.max_replicas)
    [_external, guard] = built["spec"]["metrics"]
    assert guard["object"]["target"]["value"] == f"{p99_ms}m"


def test_the_autoscaler_is_the_published_example_for_the_examples_inputs():
    """deploy/prometheus-adapter/hpa-example.yaml: triton-fraud-v1 of fraud-scorer in
    serving, 1 to 8 replicas, a p99 SLO of 250 ms."""
    example = yaml.safe_load((ADAPTER / "hpa-example.yaml").read_text())

    built = kw.autoscaler_manifest(
        triton_spec(1, 1, min_replicas=1, max_replicas=8), p99_target_ms=250)

    assert built == example


def test_the_autoscaler_scales_the_deployment_of_the_same_name_and_namespace():
    spec = AUTOSCALED["vllm tensor parallel"]
    deployment = kw.deployment_manifest(spec)

    built = kw.autoscaler_manifest(spec, p99_target_ms=500)

    assert built["metadata"]["name"] == deployment["metadata"]["name"] == "vllm-llama"
    assert built["metadata"]["namespace"] == deployment["metadata"]["namespace"] == NS
    assert built["metadata"]["labels"] == {"switchyard.io/deployment": "llm-chat"}
    target = {"apiVersion": deployment["apiVersion"], "kind": "Deployment", "name": "vllm-llama"}
    assert built["spec"]["scaleTargetRef"] == target
    [external, guard] = built["spec"]["metrics"]
    assert external["external"]["metric"]["selector"] == {
        "matchLabels": {"kube_deployment": "vllm-llama"}}
    assert guard["object"]["describedObject"] == target


def test_the_autoscalers_metrics_are_exported_on_metrics_and_served_by_the_adapter():
    built = kw.autoscaler_manifest(AUTOSCALED["triton"], p99_target_ms=250)
    config = yaml.safe_load((ADAPTER / "config.yaml").read_text())
    [external, guard] = built["spec"]["metrics"]
    external_name = external["external"]["metric"]["name"]
    object_name = guard["object"]["metric"]["name"]

    def served(rules: list[dict], name: str) -> bool:
        """Whether a rule's series query (__name__=~"^...$") takes the metric."""
        patterns = [re.search(r'__name__=~"([^"]+)"', rule["seriesQuery"]).group(1)
                    for rule in rules]
        return any(re.fullmatch(pattern, name) for pattern in patterns)

    assert {external_name, object_name} <= set(DEPLOYMENT_GAUGES)
    assert served(config["externalRules"], external_name)
    assert served(config["rules"], object_name)
    # The External metric is selected by the label the adapter keeps for it.
    assert "kube_deployment" in config["externalRules"][0]["metricsQuery"]


def test_a_spec_that_is_not_autoscaled_has_no_autoscaler():
    with pytest.raises(ValueError, match="not autoscaled"):
        kw.autoscaler_manifest(triton_spec(1, 2), p99_target_ms=250)


# --------------------------------------------------------------------------------------------
# Requests (not recorded for an HPA: the same requests as the recorded Deployment's)
# --------------------------------------------------------------------------------------------


def access(srv: RecordedApiServer) -> KubeAccess:
    return KubeAccess(auth="token", url=srv.url, token="switchyard-test-token", timeout_s=5)


def test_the_autoscaler_apply_is_the_recorded_deployment_apply_on_the_autoscaling_v2_path():
    """Never recorded for an HPA: the request is checked against the recorded Deployment
    apply (03-deployments #34), the answer is the replay server's refusal."""
    manifest = kw.autoscaler_manifest(AUTOSCALED["triton"], p99_target_ms=250)
    recorded = exchanges("03-deployments", 34)[0]

    with RecordedApiServer([]) as srv, pytest.raises(KubeError):
        kw.apply(access(srv), manifest)

    [sent] = srv.received
    assert sent.method == recorded["method"] == "PATCH"
    assert sent.path == "/apis/autoscaling/v2/namespaces/serving/horizontalpodautoscalers/" \
                        "triton-fraud-v1"
    assert sent.query == {"fieldManager": ["switchyard"], "force": ["true"]}
    assert recorded["query"] == "fieldManager=switchyard&force=true"
    assert sent.content_type == recorded["request_headers"]["Content-Type"]
    assert sent.body == manifest


def test_the_autoscaled_deployment_apply_is_the_recorded_one_without_replicas():
    """The recorded apply (#34) with spec.replicas left out, and the range annotation."""
    recorded = exchanges("03-deployments", 34)[0]
    manifest = kw.deployment_manifest(triton_spec(3, 1, min_replicas=1, max_replicas=4))

    with RecordedApiServer([]) as srv, pytest.raises(KubeError):
        kw.apply(access(srv), manifest)

    [sent] = srv.received
    assert (sent.method, sent.path) == (recorded["method"], recorded["path"])
    assert sent.query == {"fieldManager": ["switchyard"], "force": ["true"]}
    assert sent.content_type == recorded["request_headers"]["Content-Type"]
    expected = copy.deepcopy(recorded["request_body"])
    del expected["spec"]["replicas"]
    expected["metadata"]["annotations"]["switchyard.io/hpa-replicas"] = "1-4"
    assert sent.body == expected


def test_the_autoscaler_delete_is_the_recorded_deployment_delete_on_its_own_path():
    recorded = exchanges("03-deployments", 35)[0]

    with RecordedApiServer([]) as srv, pytest.raises(KubeError) as failed:
        kw.delete_autoscaler(access(srv), NS, "triton-fraud-v1")

    [sent] = srv.received
    assert sent.method == recorded["method"] == "DELETE"
    assert sent.path == "/apis/autoscaling/v2/namespaces/serving/horizontalpodautoscalers/" \
                        "triton-fraud-v1"
    assert sent.query == {} and recorded["query"] == ""
    assert sent.body is None and recorded["request_body"] is None
    assert "delete HorizontalPodAutoscaler serving/triton-fraud-v1" in failed.value.message


# --------------------------------------------------------------------------------------------
# Readiness: against the replicas the HPA set
# --------------------------------------------------------------------------------------------


def deployment_object(spec: kw.ServerSpec, *, replicas: int, generation: int,
                      status: dict) -> dict:
    """The Deployment as a read answers it: Switchyard's manifest, the replicas the HPA set,
    and a status; checked against the client's V1Deployment."""
    found = kw.deployment_manifest(spec)
    found["metadata"]["generation"] = generation
    found["spec"]["replicas"] = replicas
    found["status"] = status
    validate_builtin(status, client.V1DeploymentStatus)
    validate_builtin(found, client.V1Deployment)
    return found


def available(generation: int, replicas: int, ready: int | None = None) -> dict:
    ready = replicas if ready is None else ready
    return {"observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
            "readyReplicas": ready, "availableReplicas": ready, "conditions": [
                condition("Available", "True", "MinimumReplicasAvailable"),
                condition("Progressing", "True", "NewReplicaSetAvailable")]}


SCALED = triton_spec(1, 1, min_replicas=2, max_replicas=6)


def test_an_autoscaled_deployment_is_ready_at_the_count_its_hpa_set():
    found = deployment_object(SCALED, replicas=5, generation=4, status=available(4, 5))

    judged = kw.readiness(found, (2, 6))

    assert judged.is_ready
    assert judged.detail == "5/5 replicas updated and available"
    assert (judged.observed["desired"], judged.observed["replica_range"]) == (5, [2, 6])


def test_the_api_servers_default_of_one_below_the_minimum_waits_for_the_hpa():
    found = deployment_object(SCALED, replicas=1, generation=1, status=available(1, 1))

    judged = kw.readiness(found, (2, 6))

    assert judged.state == kw.WAITING
    assert judged.detail == ("waiting for the HPA to bring the Deployment within 2-6 replicas "
                             "(it asks for 1)")
    assert kw.readiness(found).is_ready  # the same Deployment, not autoscaled


def test_pods_the_hpa_just_added_are_waited_for():
    found = deployment_object(SCALED, replicas=4, generation=3, status=available(3, 4, ready=2))

    judged = kw.readiness(found, (2, 6))

    assert judged.state == kw.WAITING
    assert judged.detail.startswith("4/4 updated, 2 available")


def test_an_autoscaled_deployment_past_its_progress_deadline_has_failed():
    status = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1,
              "availableReplicas": 2, "unavailableReplicas": 1, "conditions": [
                  condition("Progressing", "False", "ProgressDeadlineExceeded",
                            'ReplicaSet "triton-fraud-v1-5d8f" has timed out progressing.')]}
    found = deployment_object(SCALED, replicas=3, generation=2, status=status)

    assert kw.readiness(found, (2, 6)).has_failed


# --------------------------------------------------------------------------------------------
# Creation: checks and quota held for the maximum
# --------------------------------------------------------------------------------------------


def test_an_autoscaled_workload_is_admitted_for_its_maximum(fraud, dave, hpa_kube):
    deployment, (v1, _v2) = fraud

    workload, made = create(deployment, v1, dave, max_replicas=3)

    assert made and workload.autoscaled
    assert (workload.min_replicas, workload.max_replicas, workload.replicas) == (1, 3, 1)
    assert held(workload) == [(1, 3, 3 * 20480, "loading")]
    assert workload.placement.device_class == A100_CLASS
    assert workload.detail == (f"admitted: holds 3 GPUs of {A100_CLASS} and 61440 MiB for the "
                               "HPA's maximum of 3 replicas; waiting to apply")
    [event] = AuditEvent.objects.filter(verb="created_workload")
    assert (event.after["min_replicas"], event.after["max_replicas"]) == (1, 3)
    assert event.after["units"] == 3


def test_a_maximum_beyond_the_quota_is_refused_with_the_numbers(fraud, dave, hpa_kube):
    deployment, (v1, _v2) = fraud

    with pytest.raises(QuotaExceeded) as refused:
        create(deployment, v1, dave, min_replicas=1, max_replicas=5)

    assert refused.value.field == "max_replicas"
    assert refused.value.message == (
        f"up to 5 replicas of triton-fraud-v1 hold 5 GPUs of {A100_CLASS} and 102400 MiB, "
        "admitted up front since the HPA may scale to them at any time: GPUs quota of "
        f"tenant-a on {A100_CLASS} exceeded: asks 5, 4 left of 4 (short by 1)")
    assert not ServerWorkload.objects.exists()
    assert not InferenceServer.objects.exists()
    assert not Placement.objects.exists()


@pytest.mark.parametrize(("changes", "field", "text"), [
    ({"max_replicas": None}, "max_replicas", "together"),
    ({"min_replicas": None}, "min_replicas", "together"),
    ({"min_replicas": 0}, "min_replicas", "between 1 and 100, got 0"),
    ({"max_replicas": 101}, "max_replicas", "between 1 and 100, got 101"),
    ({"min_replicas": "2"}, "min_replicas", "whole number"),
    ({"max_replicas": True}, "max_replicas", "whole number"),
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas", "at least min_replicas (3), got 2"),
    ({"replicas": 2}, "replicas", "its HPA's: give min_replicas and max_replicas, not replicas"),
])
def test_a_bad_range_is_refused_naming_the_field(fraud, dave, hpa_kube, changes, field, text):
    deployment, (v1, _v2) = fraud

    with pytest.raises(DomainError) as refused:
        create(deployment, v1, dave, **changes)

    assert refused.value.field == field
    assert text in refused.value.message
    assert not ServerWorkload.objects.exists()


def test_a_fixed_count_stays_as_it_was(fraud, dave, hpa_kube):
    deployment, (v1, _v2) = fraud

    workload, _ = create(deployment, v1, dave, min_replicas=None, max_replicas=None)

    assert not workload.autoscaled
    assert (workload.replicas, workload.min_replicas, workload.max_replicas) == (1, None, None)
    assert held(workload) == [(1, 1, 20480, "loading")]
    step(workload, 2)
    assert hpa_kube.ops() == ["apply-Deployment", "apply-Service"]
    assert hpa_kube.deployment(NS, "triton-fraud-v1")["spec"]["replicas"] == 1


# --------------------------------------------------------------------------------------------
# The reconciler
# --------------------------------------------------------------------------------------------


def test_the_hpa_is_applied_after_the_deployment_and_readiness_follows_its_count(
    fraud, dave, hpa_kube
):
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave, min_replicas=2, max_replicas=4)

    workload = step(workload, 2)

    assert workload.state == State.PROGRESSING
    assert hpa_kube.ops() == ["apply-Deployment", "apply-Service",
                              "apply-HorizontalPodAutoscaler"]
    assert "replicas" not in workload.applied_spec["spec"]
    assert workload.detail == ("applied the Deployment, the Service and the HPA (2-4 "
                               "replicas); waiting for the pods")
    assert hpa_kube.autoscaler(NS, "triton-fraud-v1") == workload_specs.autoscaler_manifest(workload)
    assert hpa_kube.autoscaler(NS, "triton-fraud-v1")["spec"]["metrics"][1]["object"][
        "target"]["value"] == "500m"  # the deployment's SLO
    # The API server made it 1; its one pod is up, but the HPA has not raised it to 2 yet.
    hpa_kube.pods_ready(NS, "triton-fraud-v1")
    workload = again(workload)
    assert workload.state == State.PROGRESSING
    assert "within 2-4 replicas (it asks for 1)" in workload.detail

    hpa_kube.hpa_scales(NS, "triton-fraud-v1", 3)
    hpa_kube.pods_ready(NS, "triton-fraud-v1")
    workload = again(workload)

    assert workload.state == State.READY
    assert workload.detail == "3/3 replicas updated and available"
    assert workload.replicas == 3 and workload.observed["desired"] == 3
    # Ready holds the maximum, not the replicas that run now.
    assert held(workload) == [(1, 4, 4 * 20480, "active")]
    assert "scale" not in hpa_kube.ops()


def test_a_ready_autoscaled_workload_follows_what_its_hpa_does(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube, min_replicas=1, max_replicas=3)
    other = ServerWorkload.objects.filter(pk=workload.pk)

    assert workload.pk in workload_reconciler.due_workloads()
    hpa_kube.hpa_scales(NS, "triton-fraud-v1", 3)
    # The controller has taken it up: 3 pods, 2 of them still starting.
    hpa_kube.statuses[(NS, "triton-fraud-v1")] = {
        "observedGeneration": hpa_kube.generations[(NS, "triton-fraud-v1")], "replicas": 3,
        "updatedReplicas": 3, "readyReplicas": 1, "availableReplicas": 1,
        "unavailableReplicas": 2}
    validate_builtin(hpa_kube.statuses[(NS, "triton-fraud-v1")], client.V1DeploymentStatus)
    assert workload_reconciler.advance(workload.pk) == State.READY
    workload = other.get()

    assert workload.state == State.READY
    assert workload.replicas == 3 and workload.observed["desired"] == 3
    assert workload.detail == "autoscaled by its HPA: 3/3 updated, 1 available, 1 ready"
    assert workload.observed["available"] == 1
    assert workload.next_attempt_at > timezone.now() + timedelta(seconds=10)
    assert workload.pk not in workload_reconciler.due_workloads()  # until the next interval
    assert held(workload) == [(1, 3, 61440, "active")]  # the quota never moves

    hpa_kube.pods_ready(NS, "triton-fraud-v1")
    workload = again(workload)
    assert workload.detail == "autoscaled by its HPA: 3/3 replicas updated and available"
    assert hpa_kube.ops("apply-Deployment", "apply-HorizontalPodAutoscaler", "scale") == [
        "apply-Deployment", "apply-HorizontalPodAutoscaler"]  # reading only


def test_a_read_that_fails_while_ready_is_said_and_changes_nothing_else(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube)
    hpa_kube.fail("read", KubeError("deployments.apps \"triton-fraud-v1\" is forbidden (403)",
                                    kind="forbidden", status=403))

    workload = again(workload)

    assert workload.state == State.READY
    assert workload.detail == ("autoscaled by its HPA; the Deployment could not be read: "
                               "deployments.apps \"triton-fraud-v1\" is forbidden (403)")
    assert held(workload) == [(1, 3, 61440, "active")]
    assert again(workload).error == ""


def test_a_ready_workload_of_a_fixed_count_is_not_read_again(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube, min_replicas=None, max_replicas=None, replicas=2)

    assert workload.pk not in workload_reconciler.due_workloads()
    assert workload_reconciler.advance(workload.pk) is None


def test_a_refused_hpa_ends_the_creation_and_takes_everything_away(fraud, dave, hpa_kube,
                                                                   settings):
    settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = 0  # a refusal (403) is final at once
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    hpa_kube.fail("apply-HorizontalPodAutoscaler", KubeError(
        "apply HorizontalPodAutoscaler serving/triton-fraud-v1: forbidden by RBAC (403)",
        kind="forbidden", status=403))

    workload = step(workload, 2)

    assert workload.state == State.FAILED
    assert workload.detail.startswith("the HorizontalPodAutoscaler was refused: apply "
                                      "HorizontalPodAutoscaler")
    assert workload.detail.endswith("Nothing is left on the cluster; quota released")
    # Refused, so never made: no HPA to delete (nor, without RBAC for HPAs, the right to).
    assert hpa_kube.ops() == ["apply-Deployment", "apply-Service",
                              "apply-HorizontalPodAutoscaler", "delete-Deployment",
                              "delete-Service"]
    assert not hpa_kube.objects
    assert held(workload) == [(1, 3, 61440, "released")]

    workloads.delete_workload(workload, dave)
    assert step(workload).state == State.DELETED
    assert "delete-HorizontalPodAutoscaler" not in hpa_kube.ops()


def test_a_creation_given_up_while_applying_deletes_the_hpa_it_may_have_made(
    fraud, dave, hpa_kube
):
    """The HPA apply timed out (the server may have made it), and the deadline passed."""
    deployment, (v1, _v2) = fraud
    workload, _ = create(deployment, v1, dave)
    workload = step(workload)
    ServerWorkload.objects.filter(pk=workload.pk).update(
        deadline_at=timezone.now() - timedelta(seconds=1))
    hpa_kube.fail("apply-HorizontalPodAutoscaler", KubeError(
        "apply HorizontalPodAutoscaler serving/triton-fraud-v1: timed out", kind="unreachable"))

    workload = step(workload)

    assert workload.state == State.FAILED
    assert hpa_kube.ops()[-3:] == ["delete-HorizontalPodAutoscaler", "delete-Deployment",
                                   "delete-Service"]
    assert held(workload) == [(1, 3, 61440, "released")]


def test_deleting_takes_the_hpa_away_first_and_releases_the_maximum(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube)

    workloads.delete_workload(workload, dave)
    workload = step(workload)

    assert workload.state == State.DELETED
    assert hpa_kube.ops()[-3:] == ["delete-HorizontalPodAutoscaler", "delete-Deployment",
                                   "delete-Service"]
    assert not hpa_kube.objects
    assert held(workload) == [(1, 3, 61440, "released")]


def test_a_workload_of_a_fixed_count_has_no_hpa_to_delete(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube, min_replicas=None, max_replicas=None)

    workloads.delete_workload(workload, dave)
    step(workload)

    assert "delete-HorizontalPodAutoscaler" not in hpa_kube.ops()


# --------------------------------------------------------------------------------------------
# Changing the range; replicas refused
# --------------------------------------------------------------------------------------------


def test_replicas_are_refused_on_an_autoscaled_workload(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube)

    with pytest.raises(DomainError) as refused:
        workloads.scale(workload, 2, dave)

    assert refused.value.field == "replicas"
    assert refused.value.status_code == 400
    assert refused.value.message.startswith(
        "triton-fraud-v1 is autoscaled: its HPA owns the replica count; change min_replicas "
        "and max_replicas instead (now 1-3). Autoscaling is chosen when a workload is created "
        "and cannot be switched: spec.replicas would have to change server-side-apply managers")
    assert ServerWorkload.objects.get(pk=workload.pk).state == State.READY


def test_a_range_is_refused_on_a_workload_of_a_fixed_count(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube, min_replicas=None, max_replicas=None)

    with pytest.raises(DomainError) as refused:
        workloads.set_replica_range(workload, 1, 3, dave)

    assert refused.value.field == "min_replicas"
    assert "runs a fixed replica count: scale it with replicas" in refused.value.message
    assert "resets the Deployment's replica count (to 1)" in refused.value.message


def test_a_higher_maximum_is_admitted_first_and_applied_to_the_hpa(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube, min_replicas=1, max_replicas=2)
    generation = hpa_kube.generations[(NS, "triton-fraud-v1")]

    found, changed = workloads.set_replica_range(workload, 2, 4, dave)

    assert changed and found.state == State.APPLYING
    assert held(found) == [(1, 4, 81920, "active")]  # admitted before anything is applied
    assert found.detail == ("changing the HPA's range from 1-2 replicas (HPA) to 2-4 replicas "
                            "(HPA), asked by dave")
    workload = step(found)
    assert workload.state == State.PROGRESSING
    assert workload.detail == ("applied the Deployment and the HPA (2-4 replicas); waiting for "
                               "the pods")
    assert hpa_kube.autoscaler(NS, "triton-fraud-v1")["spec"]["minReplicas"] == 2
    assert hpa_kube.autoscaler(NS, "triton-fraud-v1")["spec"]["maxReplicas"] == 4
    assert hpa_kube.deployment(NS, "triton-fraud-v1")["metadata"]["annotations"][
        "switchyard.io/hpa-replicas"] == "2-4"
    # Only the Deployment's annotation changed: a new generation all the same (the API server
    # bumps it for metadata.annotations, 09-deployment-generation), but no pod is replaced.
    assert hpa_kube.generations[(NS, "triton-fraud-v1")] == generation + 1
    assert hpa_kube.deployment(NS, "triton-fraud-v1")["spec"]["replicas"] == 1

    hpa_kube.hpa_scales(NS, "triton-fraud-v1", 2)
    hpa_kube.pods_ready(NS, "triton-fraud-v1")
    workload = again(workload)
    assert workload.state == State.READY
    assert (workload.min_replicas, workload.max_replicas, workload.replicas) == (2, 4, 2)
    [event] = AuditEvent.objects.filter(verb="scaled_workload")
    assert event.before == {"min_replicas": 1, "max_replicas": 2}
    assert event.after == {"min_replicas": 2, "max_replicas": 4}


def test_a_maximum_beyond_the_quota_is_refused_and_changes_nothing(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube, min_replicas=1, max_replicas=2)

    with pytest.raises(QuotaExceeded) as refused:
        workloads.set_replica_range(workload, 1, 5, dave)

    assert refused.value.field == "max_replicas"
    assert refused.value.message == (
        f"up to 5 replicas of triton-fraud-v1 hold 5 GPUs of {A100_CLASS}, admitted up front "
        "since the HPA may scale to them at any time (up to 2 hold 2): GPUs quota of tenant-a "
        f"on {A100_CLASS} exceeded: asks 3 more, 2 left of 4 (short by 1)")
    workload.refresh_from_db()
    assert (workload.state, workload.min_replicas, workload.max_replicas) == (State.READY, 1, 2)
    assert held(workload) == [(1, 2, 40960, "active")]


def test_a_lower_maximum_holds_its_quota_until_the_hpa_is_within_it(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube, min_replicas=1, max_replicas=4)
    hpa_kube.hpa_scales(NS, "triton-fraud-v1", 4)
    hpa_kube.pods_ready(NS, "triton-fraud-v1")

    found, _ = workloads.set_replica_range(workload, 1, 2, dave)
    assert held(found) == [(1, 4, 81920, "active")]
    workload = step(found)
    hpa_kube.pods_ready(NS, "triton-fraud-v1")  # the new generation observed: no pod replaced
    workload = step(workload)
    assert "within 1-2 replicas (it asks for 4)" in workload.detail
    assert held(workload) == [(1, 4, 81920, "active")]

    hpa_kube.hpa_scales(NS, "triton-fraud-v1", 2)
    hpa_kube.pods_ready(NS, "triton-fraud-v1")
    workload = again(workload)

    assert workload.state == State.READY
    assert held(workload) == [(1, 2, 40960, "active")]


def test_the_same_range_while_ready_changes_nothing(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube)

    found, changed = workloads.set_replica_range(workload, 1, 3, dave)

    assert not changed and found.state == State.READY
    assert not AuditEvent.objects.filter(verb="scaled_workload").exists()


def test_a_range_change_that_does_not_come_up_puts_the_previous_range_back(
    fraud, dave, hpa_kube
):
    workload = ready(fraud, dave, hpa_kube, min_replicas=1, max_replicas=2)
    found, _ = workloads.set_replica_range(workload, 3, 4, dave)
    workload = step(found)
    hpa_kube.pods_ready(NS, "triton-fraud-v1")  # the new generation observed: no pod replaced
    workload = step(workload)
    assert "within 3-4 replicas" in workload.detail
    ServerWorkload.objects.filter(pk=workload.pk).update(
        deadline_at=timezone.now() - timedelta(seconds=1), next_attempt_at=None)

    workload = step(workload)
    assert workload.state == State.ROLLING_BACK
    workload = step(workload)

    assert workload.state == State.FAILED
    assert workload.detail.startswith("scale rolled back to 1-2 replicas (HPA): not ready within")
    assert (workload.min_replicas, workload.max_replicas) == (1, 2)
    hpa = hpa_kube.autoscaler(NS, "triton-fraud-v1")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 2)
    assert kw.replica_range_of(hpa_kube.deployment(NS, "triton-fraud-v1")) == (1, 2)
    assert workload.applied_spec == workload.previous_spec
    assert held(workload) == [(1, 2, 40960, "active")]  # the 4 admitted for the change: back to 2


def test_a_vllm_roll_of_an_autoscaled_server_admits_the_new_version_for_the_maximum(
    chat, dave, hpa_kube
):
    deployment, (v1, v2) = chat
    workload, _ = workloads.create_workload(deployment, v1, dave, name="vllm-llama",
                                            node_selector=H100, min_replicas=1, max_replicas=2)
    step(workload, 2)
    hpa_kube.pods_ready(NS, "vllm-llama")
    workload = step(workload)
    assert workload.state == State.READY

    found, changed = workloads.roll_version(workload, v2, dave)
    assert changed
    assert held(found) == [(1, 2, 81920, "active"), (2, 2, 81920, "loading")]
    workload = step(found)

    assert hpa_kube.ops()[-2:] == ["apply-Deployment", "apply-HorizontalPodAutoscaler"]
    applied = hpa_kube.deployment(NS, "vllm-llama")
    assert "Llama-3.2-8B-Instruct" in applied["spec"]["template"]["spec"]["containers"][0][
        "args"][1]
    assert applied["spec"]["replicas"] == 1  # what the HPA had: the apply did not touch it
    assert "replicas" not in workload.applied_spec["spec"]

    grant(deployment.tenant, deployment.cluster, "other")
    with pytest.raises(QuotaExceeded, match="asks 2, 0 left of 4"):
        # Both versions hold the maximum of 2 H100s each: nothing is left for a third.
        workloads.create_workload(deployment, v1, dave, name="vllm-other", namespace="other",
                                  node_selector=H100,
                                  min_replicas=1, max_replicas=2)


# --------------------------------------------------------------------------------------------
# The replica recommendation's current replicas
# --------------------------------------------------------------------------------------------


def test_the_recommendation_counts_the_replicas_the_hpa_set(fraud, dave, hpa_kube):
    workload = ready(fraud, dave, hpa_kube, min_replicas=1, max_replicas=3)
    deployment = workload.deployment
    signal = autoscaling.Signal(deployment.pk, autoscaling.WINDOW_S)

    before = autoscaling.recommend_replicas(deployment, sig=signal)
    hpa_kube.hpa_scales(NS, "triton-fraud-v1", 3)
    again(workload)
    after = autoscaling.recommend_replicas(deployment, sig=signal)

    assert (before.current, before.replicas_from) == (1, "workloads")
    assert after.current == 3
    assert after.kube_deployment == "triton-fraud-v1"


def test_before_any_read_the_recommendation_counts_the_minimum(fraud, dave, hpa_kube):
    deployment, (v1, _v2) = fraud
    create(deployment, v1, dave, min_replicas=2, max_replicas=3)
    ServerWorkload.objects.update(replicas=0)  # whatever the row says, the HPA's floor counts

    rec = autoscaling.recommend_replicas(
        deployment, sig=autoscaling.Signal(deployment.pk, autoscaling.WINDOW_S))

    assert rec.current == 2
