"""Readiness of a server Deployment, judged from its status.

No recorded server ran controllers (status stays {}), so the statuses here are written by
hand, each checked against the official client's V1DeploymentStatus first: they are shapes a
real Deployment controller can write.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from fleet.adapters import kube_workloads as kw
from tests.kube.schemas import validate_builtin

WHEN = "2026-11-22T21:40:00+00:00"


def condition(kind: str, status: str, reason: str, message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastUpdateTime": WHEN, "lastTransitionTime": WHEN}


def judged(status: dict, *, generation: int, replicas: int) -> kw.Readiness:
    validate_builtin(status, client.V1DeploymentStatus)
    return kw.evaluate(status, generation=generation, replicas=replicas)


def settled(generation: int, replicas: int) -> dict:
    counts = {"replicas": replicas, "updatedReplicas": replicas, "readyReplicas": replicas,
              "availableReplicas": replicas} if replicas else {}
    return {"observedGeneration": generation, **counts, "conditions": [
        condition("Available", "True", "MinimumReplicasAvailable"),
        condition("Progressing", "True", "NewReplicaSetAvailable"),
    ]}


def test_every_replica_updated_and_available_in_the_current_generation_is_ready():
    result = judged(settled(4, 3), generation=4, replicas=3)

    assert result.is_ready
    assert result.detail == "3/3 replicas updated and available"
    assert result.observed["available"] == 3
    assert [c["type"] for c in result.observed["conditions"]] == ["Available", "Progressing"]


def test_a_status_no_controller_wrote_is_waiting():
    result = judged({}, generation=1, replicas=2)

    assert result.state == kw.WAITING
    assert "generation 1 (it has seen 0)" in result.detail


def test_the_counts_of_an_older_generation_do_not_make_a_change_ready():
    """Just after a change (a roll, a scale) the status still holds the previous
    generation's counts, which are all complete."""
    result = judged(settled(4, 3), generation=5, replicas=3)

    assert result.state == kw.WAITING


def test_a_roll_with_an_old_pod_left_is_waiting():
    status = {"observedGeneration": 5, "replicas": 3, "updatedReplicas": 2,
              "readyReplicas": 3, "availableReplicas": 3, "unavailableReplicas": 0,
              "conditions": [condition("Progressing", "True", "ReplicaSetUpdated")]}

    result = judged(status, generation=5, replicas=2)

    assert result.state == kw.WAITING
    assert result.detail == "2/2 updated, 3 available, 3 ready, 1 old still running"


def test_updated_pods_that_are_not_available_yet_are_waiting():
    status = {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2,
              "readyReplicas": 1, "availableReplicas": 1, "unavailableReplicas": 1}

    result = judged(status, generation=2, replicas=2)

    assert result.state == kw.WAITING
    assert result.detail.startswith("2/2 updated, 1 available")


def test_a_progress_deadline_exceeded_is_failed_with_the_controllers_message():
    message = 'ReplicaSet "vllm-llama-6d4f" has timed out progressing.'
    status = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 1,
              "availableReplicas": 1, "unavailableReplicas": 1, "conditions": [
                  condition("Available", "True", "MinimumReplicasAvailable"),
                  condition("Progressing", "False", "ProgressDeadlineExceeded", message)]}

    result = judged(status, generation=3, replicas=1)

    assert result.has_failed
    assert result.detail == f"ProgressDeadlineExceeded: {message}"


def test_an_exceeded_deadline_of_the_previous_generation_is_not_this_changes_failure():
    status = {"observedGeneration": 3, "conditions": [
        condition("Progressing", "False", "ProgressDeadlineExceeded", "timed out")]}

    assert judged(status, generation=4, replicas=1).state == kw.WAITING


def test_a_replica_failure_is_told_while_waiting():
    message = 'pods "triton-fraud-v1-7c9" is forbidden: exceeded quota: gpu, requested: ' \
              'requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: ' \
              'requests.nvidia.com/gpu=8'
    status = {"observedGeneration": 1, "unavailableReplicas": 1, "conditions": [
        condition("Progressing", "True", "NewReplicaSetCreated"),
        condition("ReplicaFailure", "True", "FailedCreate", message)]}

    result = judged(status, generation=1, replicas=1)

    assert result.state == kw.WAITING
    assert result.detail.endswith(f"; FailedCreate: {message}")


def test_scaled_to_zero_with_every_pod_gone_is_ready():
    result = judged(settled(7, 0), generation=7, replicas=0)

    assert result.is_ready
    assert result.detail == "0/0 replicas updated and available"


@pytest.mark.parametrize(("spec", "replicas"), [({"replicas": 2}, 2), ({}, 1)])
def test_readiness_of_a_whole_deployment_reads_generation_and_replicas_from_it(spec, replicas):
    deployment = {"metadata": {"name": "x", "generation": 2}, "spec": spec,
                  "status": settled(2, replicas)}

    result = kw.readiness(deployment)

    assert result.is_ready
    assert result.observed["desired"] == replicas
