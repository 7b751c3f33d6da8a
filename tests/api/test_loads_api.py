"""POST /api/v1/loads/: validation naming the field, 202/200, Idempotency-Key, 409 in flight.

The reconciler is not run here (tests/rollouts/loads/test_loads.py drives real loads); these tests
check what the API answers and writes.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from fleet.models import InferenceServer
from rollouts.models import ModelLoad, ModelVersion
from tests.factories import (
    AliasFactory,
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)


@pytest.fixture
def setup(tenant_a, dave):
    cluster = ClusterFactory(name="c-loads")
    server = InferenceServerFactory(cluster=cluster, name="triton-1")
    model = ModelFactory(tenant=tenant_a, name="scorer")
    v1 = ModelVersionFactory(model=model, version=1, status=ModelVersion.Status.APPROVED)
    v2 = ModelVersionFactory(model=model, version=2, status=ModelVersion.Status.REGISTERED)
    deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=cluster, name="scorer-prod",
                                   production=True)
    deployment.servers.set([server])
    return {"server": server, "model": model, "v1": v1, "v2": v2, "deployment": deployment}


def test_a_load_request_answers_202_with_pending_loads_and_enqueues_them(
    client_for, dave, setup, enqueued_loads, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(dave).post(
            "/api/v1/loads/", {"deployment": setup["deployment"].pk, "version": 1}
        )

    assert response.status_code == 202, response.content
    [body] = response.json()
    assert (body["state"], body["server"], body["version"], body["model"]) == (
        "pending", "triton-1", 1, "scorer")
    assert body["events"][0]["message"].startswith("load of v1 onto triton-1 requested by dave")
    assert enqueued_loads == [body["id"]]


def test_the_same_idempotency_key_answers_200_with_the_same_loads(client_for, dave, setup):
    client = client_for(dave)
    body = {"deployment": setup["deployment"].pk, "version": 1}
    first = client.post("/api/v1/loads/", body, HTTP_IDEMPOTENCY_KEY="release-7")
    again = client.post("/api/v1/loads/", body, HTTP_IDEMPOTENCY_KEY="release-7")

    assert (first.status_code, again.status_code) == (202, 200)
    assert [r["id"] for r in again.json()] == [r["id"] for r in first.json()]
    assert ModelLoad.objects.count() == 1


def test_a_key_reused_for_another_request_is_a_conflict(client_for, dave, setup):
    setup["v2"].status = ModelVersion.Status.APPROVED
    ModelVersion.objects.filter(pk=setup["v2"].pk).update(status="approved")
    client = client_for(dave)
    client.post("/api/v1/loads/", {"deployment": setup["deployment"].pk, "version": 1},
                HTTP_IDEMPOTENCY_KEY="k")
    # The first load is still in flight, but the key is checked first.
    response = client.post("/api/v1/loads/", {"deployment": setup["deployment"].pk, "version": 2},
                           HTTP_IDEMPOTENCY_KEY="k")

    assert response.status_code == 409
    assert "idempotency_key" in response.json()


def test_another_load_of_the_model_in_flight_is_a_409_naming_it(client_for, dave, setup):
    ModelVersion.objects.filter(pk=setup["v2"].pk).update(status="approved")
    client = client_for(dave)
    client.post("/api/v1/loads/", {"deployment": setup["deployment"].pk, "version": 1})
    response = client.post("/api/v1/loads/", {"deployment": setup["deployment"].pk, "version": 2})

    assert response.status_code == 409
    assert "in flight on triton-1" in response.json()["version"][0]


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        ({"version": 9}, "version", "scorer has no version 9"),
        ({"version": 2}, "version", "production deployments load approved versions only"),
        ({"alias": "nope"}, "alias", "scorer has no alias 'nope'"),
        ({}, "version", "give either version or alias"),
        ({"version": 1, "servers": ["ghost"]}, "servers", "has no server named ghost"),
        ({"version": 1, "action": "explode"}, "action", "is not a valid choice"),
    ],
)
def test_bad_requests_name_the_field(client_for, dave, setup, payload, field, message):
    response = client_for(dave).post(
        "/api/v1/loads/", {"deployment": setup["deployment"].pk, **payload}
    )

    assert response.status_code == 400, response.content
    assert message in str(response.json()[field])
    assert ModelLoad.objects.count() == 0


def test_an_alias_names_the_version_to_load(client_for, dave, setup):
    AliasFactory(model=setup["model"], name="production", version=setup["v1"])
    response = client_for(dave).post(
        "/api/v1/loads/", {"deployment": setup["deployment"].pk, "alias": "production"}
    )

    assert response.status_code == 202
    assert response.json()[0]["version"] == 1


def test_unloading_a_version_that_is_not_loaded_changes_nothing(client_for, dave, setup):
    response = client_for(dave).post(
        "/api/v1/loads/", {"deployment": setup["deployment"].pk, "version": 1, "action": "unload"}
    )

    assert response.status_code == 200 and response.json() == []


def test_unloading_a_ready_version_moves_its_load_to_unloading(client_for, dave, setup, tenant_a):
    load = ModelLoad.objects.create(
        tenant=tenant_a, deployment=setup["deployment"], server=setup["server"],
        version=setup["v1"], state=ModelLoad.State.READY, requested_by_label="dave",
    )
    response = client_for(dave).post(
        "/api/v1/loads/", {"deployment": setup["deployment"].pk, "version": 1, "action": "unload"}
    )

    assert response.status_code == 202
    load.refresh_from_db()
    assert (load.state, load.unload_requested_by_label) == ("unloading", "dave")
    assert response.json()[0]["id"] == load.pk


def test_a_viewer_cannot_load(client_for, bob, setup):
    response = client_for(bob).post("/api/v1/loads/", {"deployment": setup["deployment"].pk, "version": 1})

    assert response.status_code == 403
    assert "deployer" in response.json()["detail"]
    assert not InferenceServer.objects.filter(model_loads__isnull=False).exists()


RACERS = 24  # concurrent requests; PostgreSQL's default 100 connections are shared by the suite


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_make_one_load_and_the_rest_replay_it(dave, setup):
    """GIVEN many clients that send the same load request with the same Idempotency-Key at
    once (a CI job retried by several runners) THEN one load is made and answered 202, and
    every other request is a 200 replay of that load, never a 409."""
    body = {"deployment": setup["deployment"].pk, "version": 1}
    start = threading.Barrier(RACERS)

    def post(_: int) -> tuple[int, Any]:
        client = APIClient()
        client.force_authenticate(dave)
        try:
            start.wait(timeout=30)
            response = client.post("/api/v1/loads/", body, HTTP_IDEMPOTENCY_KEY="release-7")
            answer = response.json()
            ids = tuple(row["id"] for row in answer) if isinstance(answer, list) else answer
            return response.status_code, ids
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=RACERS) as pool:
        answers = list(pool.map(post, range(RACERS)))

    codes = Counter(code for code, _ids in answers)
    assert codes == {202: 1, 200: RACERS - 1}, answers
    [load] = ModelLoad.objects.all()
    assert {ids for _code, ids in answers} == {(load.pk,)}
