"""The reconciler's reads through the real adapter, against what a real API server answered:
a Deployment no controller has taken up is still waiting, and a 403 is said on the row."""

# ruff: noqa: F811 (the fixtures imported from test_workload_world are redefined as arguments)
from __future__ import annotations

from django.utils import timezone

from fleet.models import Placement
from rollouts.models import ServerWorkload
from rollouts.workloads import reconciler as workload_reconciler
from rollouts.workloads import requests as workloads
from tests.kube.replay import RecordedApiServer, exchanges
from tests.kube.test_workload_world import (  # noqa: F401 (fixtures)
    TRITON_REQUEST,
    enqueued_workloads,
    fraud,
    kube_cluster,
)

State = ServerWorkload.State


def progressing(fraud, dave, url: str) -> ServerWorkload:
    """GIVEN triton-fraud-v1 (2 replicas) in namespace serving, applied, waiting for its pods,
    on a cluster whose API server is at ``url``."""
    deployment, (v1, _v2) = fraud
    deployment.cluster.api_url = url
    deployment.cluster.save()
    workload, _ = workloads.create_workload(deployment, v1, dave, **TRITON_REQUEST)
    ServerWorkload.objects.filter(pk=workload.pk).update(
        state=State.PROGRESSING, applied_spec={"kind": "Deployment"}, generation=1,
        phase_started_at=timezone.now())
    return workload


def test_a_deployment_no_controller_took_up_keeps_the_workload_waiting(fraud, dave):
    with RecordedApiServer(exchanges("03-deployments", 7)) as srv:
        workload = progressing(fraud, dave, srv.url)
        state = workload_reconciler.advance(workload.pk)

    srv.assert_all_matched()
    workload.refresh_from_db()
    assert state == State.PROGRESSING
    assert workload.observed["generation"] == 1
    assert workload.observed["desired"] == 2
    assert workload.observed["observed_generation"] == 0
    assert workload.detail == ("waiting for the Deployment controller to take up generation 1 "
                               "(it has seen 0)")
    assert workload.error == ""


def test_a_forbidden_read_is_said_on_the_workload_and_tried_again(fraud, dave):
    with RecordedApiServer(exchanges("06-auth-errors", 7)) as srv:
        workload = progressing(fraud, dave, srv.url)
        state = workload_reconciler.advance(workload.pk)

    srv.assert_all_matched()
    workload.refresh_from_db()
    # A refusal may be an API server starting up (07-apiserver-restart): tried again.
    assert state == State.PROGRESSING
    assert "trying again in 2 s" in workload.detail
    assert workload.error.startswith(
        "read Deployment serving/triton-fraud-v1: forbidden by RBAC (403): deployments.apps "
        '"triton-fraud-v1" is forbidden: User "gpu-node-reader" cannot get resource'
    )
    # The Deployment was applied and still asks for its GPUs: the quota stays held.
    assert workload.placement.state == Placement.State.LOADING
