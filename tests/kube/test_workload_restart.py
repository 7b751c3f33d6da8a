"""A workload's calls while the API server restarts, as a real one answered them (recording
07): for a moment after it starts serving it refuses (403) every call of a correctly bound
user, exactly as RBAC refuses one, then the same calls succeed. A refusal is said on the row
and tried again; only one that lasts ``SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S`` is final.

No Service apply was ever recorded, so a creation is not replayed to its end here: its
refused Deployment apply is (and the domain tests drive a creation through refusals with the
in-memory stand-in)."""

# ruff: noqa: F811 (the fixtures imported from test_workload_world are redefined as arguments)
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from fleet.adapters import kube_workloads as kw
from fleet.models import Placement
from rollouts.models import ServerWorkload
from rollouts.workloads import reconciler as workload_reconciler
from rollouts.workloads import requests as workloads
from rollouts.workloads.specs import server_spec
from tests.kube.replay import RecordedApiServer, exchanges
from tests.kube.test_workload_world import (  # noqa: F401 (fixtures)
    TRITON_REQUEST,
    enqueued_workloads,
    fraud,
    kube_cluster,
)

State = ServerWorkload.State
RESTART = "07-apiserver-restart"
# 07: the server-side apply of triton-fraud-v1 refused (#2, #7) then taken (#12); the same for
# a GET of it (#5, #9, #14) and for a merge patch of its /scale to 3 replicas (#4, #10, #15).
APPLY, GET, SCALE = (2, 7, 12), (5, 9, 14), (4, 10, 15)


def recorded_workload(fraud, dave, url: str) -> ServerWorkload:
    """GIVEN triton-fraud-v1 (2 replicas) as the recording's Deployment was written (its model
    loads ``fraud_scorer`` from ``s3://switchyard-models/fraud-scorer/v1``), pending, on a
    cluster whose API server is at ``url``."""
    deployment, (v1, _v2) = fraud
    v1.model.name = "fraud_scorer"
    v1.model.save()
    deployment.cluster.api_url = url
    deployment.cluster.save()
    workload, _ = workloads.create_workload(
        deployment, v1, dave,
        **{**TRITON_REQUEST, "model_repository": "s3://switchyard-models/fraud-scorer/v1"})
    return workload


def advance_now(workload: ServerWorkload) -> ServerWorkload:
    """The next tick, without waiting for the backoff."""
    ServerWorkload.objects.filter(pk=workload.pk).update(next_attempt_at=None)
    workload_reconciler.advance(workload.pk)
    return ServerWorkload.objects.get(pk=workload.pk)


def test_a_scale_refused_while_the_api_server_starts_is_done_once_it_serves(fraud, dave):
    with RecordedApiServer(exchanges(RESTART, *SCALE)) as srv:
        workload = recorded_workload(fraud, dave, srv.url)
        manifest = kw.deployment_manifest(server_spec(workload))
        assert manifest == exchanges(RESTART, APPLY[0])[0]["request_body"]
        ServerWorkload.objects.filter(pk=workload.pk).update(
            state=State.READY, applied_spec=manifest, generation=1)
        workload, _ = workloads.scale(workload, 3, dave)

        workload = advance_now(workload)  # 403
        assert workload.state == State.APPLYING
        assert workload.error.startswith(
            "scale Deployment serving/triton-fraud-v1: forbidden by RBAC (403): "
            'deployments.apps "triton-fraud-v1" is forbidden: User "switchyard" cannot patch '
            'resource "deployments/scale"')
        assert "has just started refuses everything for a moment: trying again in 2 s" in (
            workload.detail)
        assert workload.forbidden_since is not None
        assert workload.next_attempt_at > timezone.now()

        workload = advance_now(workload)  # 403 again
        assert (workload.state, workload.attempts) == (State.APPLYING, 2)
        assert "trying again in 4 s" in workload.detail

        workload = advance_now(workload)  # 200

    srv.assert_all_matched()
    assert srv.unused == []
    assert workload.state == State.PROGRESSING
    assert workload.detail == "scaled to 3 replicas; waiting for the pods"
    assert (workload.error, workload.forbidden_since, workload.attempts) == ("", None, 0)
    assert workload.placement.state == Placement.State.LOADING  # held: nothing failed


def test_a_read_refused_while_the_api_server_starts_keeps_the_workload_waiting(fraud, dave):
    with RecordedApiServer(exchanges(RESTART, *GET)) as srv:
        workload = recorded_workload(fraud, dave, srv.url)
        ServerWorkload.objects.filter(pk=workload.pk).update(
            state=State.PROGRESSING, applied_spec={"kind": "Deployment"}, generation=1)

        workload = advance_now(workload)
        assert (workload.state, workload.attempts) == (State.PROGRESSING, 1)
        assert "cannot get resource" in workload.error
        workload = advance_now(workload)
        assert (workload.state, workload.attempts) == (State.PROGRESSING, 2)
        workload = advance_now(workload)

    srv.assert_all_matched()
    assert workload.state == State.PROGRESSING
    assert workload.detail == ("waiting for the Deployment controller to take up generation 1 "
                               "(it has seen 0)")
    assert (workload.error, workload.forbidden_since) == ("", None)
    assert workload.placement.state == Placement.State.LOADING


def test_a_creation_refused_past_the_window_fails_and_releases_its_quota(fraud, dave, settings):
    settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = 30
    with RecordedApiServer(exchanges(RESTART, APPLY[0], APPLY[1])) as srv:
        workload = recorded_workload(fraud, dave, srv.url)
        workload = advance_now(workload)  # pending -> applying: no call
        workload = advance_now(workload)  # 403
        assert workload.state == State.APPLYING
        assert workload.placement.state == Placement.State.LOADING

        # Refused ever since, for longer than the window.
        ServerWorkload.objects.filter(pk=workload.pk).update(
            forbidden_since=timezone.now() - timedelta(seconds=31))
        workload = advance_now(workload)  # 403 again: final

    srv.assert_all_matched()
    assert workload.state == State.FAILED
    assert workload.error.startswith("the Deployment was refused: apply Deployment "
                                     "serving/triton-fraud-v1: forbidden by RBAC (403)")
    assert workload.detail.endswith("Nothing is left on the cluster; quota released")
    assert workload.placement.state == Placement.State.RELEASED
    assert workload.applied_spec == {}
    assert workload.forbidden_since is None
