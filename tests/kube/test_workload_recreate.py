"""A creation that failed with nothing applied (nothing on the cluster, quota released) does
not keep its name or its pods' labels: the same server can be created again at once."""

# ruff: noqa: F811 (the fixtures imported from test_workload_world are redefined as arguments)
from __future__ import annotations

import pytest

from console.exceptions import Conflict
from fleet.adapters.kubernetes import KubeError
from fleet.models import AuditEvent, Placement
from rollouts.models import ServerWorkload
from rollouts.workloads import reconciler as workload_reconciler
from rollouts.workloads import requests as workloads
from tests.kube.test_workload_world import (  # noqa: F401 (fixtures)
    TRITON_REQUEST,
    enqueued_workloads,
    fake_kube,
    fraud,
    kube_cluster,
)

State = ServerWorkload.State
INVALID = KubeError("apply Deployment serving/triton-fraud-v1: Deployment.apps is invalid "
                    "(422 Invalid)", kind="invalid", status=422)


def failed_creation(fraud, dave, fake_kube, **changes) -> ServerWorkload:
    deployment, (v1, _v2) = fraud
    fake_kube.fail("apply-Deployment", INVALID)
    workload, _ = workloads.create_workload(deployment, v1, dave,
                                            **{**TRITON_REQUEST, **changes})
    for _ in range(2):
        workload_reconciler.advance(workload.pk)
    workload.refresh_from_db()
    assert workload.state == State.FAILED
    assert workload.placement.state == Placement.State.RELEASED
    return workload


def test_the_same_server_is_created_again_after_a_creation_that_left_nothing(
    fraud, dave, fake_kube
):
    deployment, (v1, _v2) = fraud
    failed = failed_creation(fraud, dave, fake_kube)

    again, made = workloads.create_workload(deployment, v1, dave, **TRITON_REQUEST)

    assert made and again.state == State.PENDING and again.pk != failed.pk
    assert again.server_id == failed.server_id  # its server row taken over
    assert again.placement.state == Placement.State.LOADING
    failed.refresh_from_db()
    assert failed.state == State.DELETED
    assert failed.error.startswith("the Deployment was refused")  # its history kept
    assert "Superseded by a new creation of triton-fraud-v1, asked by dave" in failed.detail
    assert AuditEvent.objects.filter(verb="superseded_workload").count() == 1
    assert list(deployment.servers.all()) == [again.server]


def test_its_pods_labels_do_not_refuse_the_same_version_under_another_name(
    fraud, dave, fake_kube
):
    deployment, (v1, _v2) = fraud
    failed_creation(fraud, dave, fake_kube)

    other, made = workloads.create_workload(deployment, v1, dave,
                                            **{**TRITON_REQUEST, "name": "triton-fraud"})

    assert made and other.state == State.PENDING


def test_a_failed_workload_that_still_runs_keeps_its_name(fraud, dave, fake_kube):
    """A failed change was rolled back: the previous spec runs, so the name stays taken."""
    deployment, (v1, _v2) = fraud
    failed = failed_creation(fraud, dave, fake_kube)
    ServerWorkload.objects.filter(pk=failed.pk).update(applied_spec={"kind": "Deployment"})

    with pytest.raises(Conflict, match="a server named triton-fraud-v1 already runs"):
        workloads.create_workload(deployment, v1, dave, **TRITON_REQUEST)
