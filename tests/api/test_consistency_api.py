"""The consistency of a deployment across its servers in the API: the flag on deployments,
the per-server view and converging, by caller."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import AuditEvent
from rollouts.models import Deployment, ModelLoad
from tests.factories import (
    DeploymentFactory,
)
from tests.rollouts.deployments.split_world import H1, H2, split_deployment

State = ModelLoad.State


@pytest.fixture
def split(tenant_a):
    """Tenant A's deployment on two servers running v1 with two configs."""
    return split_deployment(tenant_a)


def test_deployments_say_whether_their_servers_agree(split, client_for, bob):
    agreeing = DeploymentFactory(model=split.model, cluster=split.cluster, name="empty")
    client = client_for(bob)
    rows = {r["name"]: r for r in client.get("/api/v1/deployments/").json()["results"]}
    assert (rows["scorer"]["consistency"], rows["scorer"]["consistent"]) == ("inconsistent", False)
    assert (rows["empty"]["consistency"], rows["empty"]["consistent"]) == ("consistent", True)
    assert rows["scorer"]["auto_converge"] is False and rows["scorer"]["converged_at"] is None
    one = client.get(f"/api/v1/deployments/{agreeing.pk}/").json()
    assert one["consistent"] is True


def test_the_list_judges_a_page_in_a_fixed_number_of_queries(split, client_for, bob):
    client = client_for(bob)
    client.get("/api/v1/deployments/")  # warm what a first request reads once
    with CaptureQueriesContext(connection) as few:
        client.get("/api/v1/deployments/")
    for i in range(5):
        d = DeploymentFactory(model=split.model, cluster=split.cluster, name=f"more-{i}")
        d.servers.set(split.servers.all())
    with CaptureQueriesContext(connection) as many:
        assert len(client.get("/api/v1/deployments/").json()["results"]) == 6
    assert len(many) == len(few)


def test_the_per_server_view_names_the_disagreement(split, client_for, bob):
    body = client_for(bob).get(f"/api/v1/deployments/{split.pk}/consistency/").json()
    assert body["state"] == "inconsistent" and body["consistent"] is False
    assert body["reasons"] == [f"v1 runs with 2 configs: triton-1 {H1[:12]}, triton-2 {H2[:12]}"]
    assert [(r["server"], r["version"], r["state"], r["config_hash"], r["disagrees"])
            for r in body["servers"]] == [("triton-1", 1, "ready", H1, True),
                                          ("triton-2", 1, "ready", H2, True)]
    assert body["blocker"] == ""


def test_a_deployer_converges_and_asking_again_is_a_409(split, client_for, dave):
    client = client_for(dave)
    answer = client.post(f"/api/v1/deployments/{split.pk}/converge/",
                         {"reason": "one config"}, format="json")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert body["loads"] == [] and len(body["reloads"]) == 2
    assert body["consistency"]["state"] == "converging"
    assert AuditEvent.objects.get(verb="converged").reason == "one config"

    again = client.post(f"/api/v1/deployments/{split.pk}/converge/", {}, format="json")
    assert again.status_code == 409
    assert "wait for it to finish" in again.json()["deployment"][0]
    assert AuditEvent.objects.filter(verb="converged").count() == 1


def test_converging_servers_that_agree_is_a_409_naming_it(split, client_for, dave):
    ModelLoad.objects.filter(deployment=split).update(config_hash=H1)
    answer = client_for(dave).post(f"/api/v1/deployments/{split.pk}/converge/", {}, format="json")
    assert answer.status_code == 409
    assert "nothing to converge" in answer.json()["deployment"][0]


def test_a_viewer_may_look_and_not_converge(split, client_for, bob):
    answer = client_for(bob).post(f"/api/v1/deployments/{split.pk}/converge/", {}, format="json")
    assert answer.status_code == 403
    assert not AuditEvent.objects.filter(verb="converged").exists()


def test_another_tenant_gets_404_and_anonymous_401(split, client_for, charlie, api):
    for method in ("get", "post"):
        path = "consistency" if method == "get" else "converge"
        url = f"/api/v1/deployments/{split.pk}/{path}/"
        assert getattr(client_for(charlie), method)(url, {}, format="json").status_code == 404
        assert getattr(api, method)(url, {}, format="json").status_code == 401
    assert ModelLoad.objects.filter(state=State.LOADING).count() == 0


def test_auto_converge_is_set_through_the_api_and_audited(split, client_for, dave):
    answer = client_for(dave).patch(f"/api/v1/deployments/{split.pk}/", {"auto_converge": True},
                                    format="json")
    assert answer.status_code == 200, answer.content
    assert Deployment.objects.get(pk=split.pk).auto_converge is True
    assert AuditEvent.objects.get(verb="updated", object_id=str(split.pk)).after == {
        "auto_converge": True}
