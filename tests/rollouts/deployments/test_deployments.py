"""Deployment lifecycle: what deleting does, through the domain, the API and the console.

Nothing loaded or in flight → a deployment that never loaded is deleted; one with load
history is archived (kept read-only as that history, hidden from lists, unable to load, its
name free). Anything loaded or in flight → 409 naming what to unload first.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client

from console.exceptions import Conflict
from fleet.models import AuditEvent, Placement
from rollouts.deployments import lifecycle as deployments
from rollouts.loads import requests as loads
from rollouts.models import Deployment, ModelLoad, ModelVersion
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

State = ModelLoad.State


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def dep(tenant_a):
    cluster = ClusterFactory(name="c-life")
    server = InferenceServerFactory(cluster=cluster, name="triton-1")
    model = ModelFactory(tenant=tenant_a, name="scorer")
    ModelVersionFactory(model=model, version=1, status=ModelVersion.Status.APPROVED)
    deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=cluster, name="scorer-prod")
    deployment.servers.set([server])
    return deployment


def a_load(deployment: Deployment, state: str) -> ModelLoad:
    return ModelLoad.objects.create(
        tenant=deployment.tenant, deployment=deployment, server=deployment.servers.get(),
        version=deployment.model.versions.get(version=1), state=state, requested_by_label="dave",
    )


def test_a_deployment_that_never_loaded_is_deleted_and_audited(alice, dep):
    assert deployments.delete_deployment(alice, dep, "typo in the name") == "deleted"

    assert not Deployment.objects.filter(pk=dep.pk).exists()
    event = AuditEvent.objects.get(verb="deleted", object_type="rollouts.deployment")
    assert (event.reason, event.before["name"], event.before["servers"]) == (
        "typo in the name", "scorer-prod", ["triton-1"])


@pytest.mark.parametrize("final", [State.UNLOADED, State.FAILED])
def test_a_deployment_with_load_history_is_archived_and_keeps_it(alice, dep, final):
    load = a_load(dep, final)

    assert deployments.delete_deployment(alice, dep) == "archived"

    dep.refresh_from_db()
    assert dep.archived_at is not None
    assert list(dep.servers.all()) == []
    assert ModelLoad.objects.get().deployment == dep == load.deployment
    event = AuditEvent.objects.get(verb="archived")
    assert event.after["loads"] == {final: 1}
    assert event.before["servers"] == ["triton-1"]


@pytest.mark.parametrize("state", [State.READY, State.PENDING, State.LOADING, State.UNLOADING])
def test_anything_loaded_or_in_flight_is_a_conflict_naming_it(alice, dep, state):
    a_load(dep, state)

    with pytest.raises(Conflict, match=rf"unload it first: v1 {state} on triton-1"):
        deployments.delete_deployment(alice, dep)

    dep.refresh_from_db()
    assert dep.archived_at is None
    assert not AuditEvent.objects.filter(object_type="rollouts.deployment").exists()


def test_a_failed_unload_whose_placement_still_holds_quota_blocks_it(alice, dep):
    load = a_load(dep, State.FAILED)
    load.placement = Placement.objects.create(
        tenant=dep.tenant, server=load.server, model_version=load.version, device_class="cpu",
        units=1, memory_mib=512, state=Placement.State.ACTIVE,
    )
    load.save()

    with pytest.raises(Conflict, match="v1 failed on triton-1"):
        deployments.delete_deployment(alice, dep)


def test_deleting_needs_the_admin_role(erin, dep):
    with pytest.raises(PermissionDenied, match="this needs the admin role"):
        deployments.delete_deployment(erin, dep)
    assert Deployment.objects.filter(pk=dep.pk, archived_at__isnull=True).exists()


def test_an_archived_deployment_cannot_load_or_change_and_its_name_is_free(alice, dave, dep):
    a_load(dep, State.UNLOADED)
    deployments.delete_deployment(alice, dep)
    dep.refresh_from_db()

    with pytest.raises(Conflict, match="deployment scorer-prod is archived") as refused:
        loads.request_load(dave, dep, dep.model.versions.get())
    assert refused.value.field == "deployment"
    dep.description = "changed"
    with pytest.raises(Conflict, match="archived and cannot change"):
        deployments.save_deployment(dave, dep)
    again = Deployment(tenant=dep.tenant, model=dep.model, cluster=dep.cluster, name="scorer-prod")
    deployments.save_deployment(dave, again)
    assert Deployment.objects.filter(name="scorer-prod").count() == 2
    # Deleting it again changes nothing.
    assert deployments.delete_deployment(alice, dep) == "archived"
    assert AuditEvent.objects.filter(verb="archived").count() == 1


def test_a_load_request_checks_archiving_under_the_deployment_lock(alice, dave, dep):
    """A deployment archived after the request read it (a stale object) still refuses the load."""
    stale = Deployment.objects.get(pk=dep.pk)
    a_load(dep, State.UNLOADED)
    deployments.delete_deployment(alice, dep)
    stale.servers.set([dep.cluster.servers.get()])  # as the stale request saw it

    with pytest.raises(Conflict, match="is archived"):
        loads.request_load(dave, stale, stale.model.versions.get())
    assert ModelLoad.objects.count() == 1


# --- the API


def test_api_delete_answers_409_naming_what_to_unload(client_for, alice, dep):
    a_load(dep, State.READY)

    response = client_for(alice).delete(f"/api/v1/deployments/{dep.pk}/")

    assert response.status_code == 409
    assert response.json() == {"detail": "unload it first: v1 ready on triton-1"}


def test_api_delete_archives_and_lists_hide_archived_unless_asked(client_for, alice, dep):
    a_load(dep, State.UNLOADED)
    client = client_for(alice)

    assert client.delete(f"/api/v1/deployments/{dep.pk}/").status_code == 204

    assert client.get("/api/v1/deployments/").json()["count"] == 0
    listed = client.get("/api/v1/deployments/?archived=true").json()
    assert [d["id"] for d in listed["results"]] == [dep.pk]
    assert listed["results"][0]["archived_at"] is not None
    assert client.get("/api/v1/deployments/?archived=false").json()["count"] == 0
    # Still reachable by id: its loads point at it.
    detail = client.get(f"/api/v1/deployments/{dep.pk}/")
    assert detail.status_code == 200
    assert detail.json()["archived_at"] is not None
    assert len(client.get(f"/api/v1/loads/?deployment={dep.pk}").json()["results"]) == 1
    assert client.get("/api/v1/deployments/?archived=maybe").status_code == 400


def test_api_patch_and_load_on_an_archived_deployment_are_409(client_for, alice, dave, dep):
    a_load(dep, State.UNLOADED)
    client_for(alice).delete(f"/api/v1/deployments/{dep.pk}/")

    patched = client_for(dave).patch(f"/api/v1/deployments/{dep.pk}/", {"description": "x"})
    loaded = client_for(dave).post("/api/v1/loads/", {"deployment": dep.pk, "version": 1})

    assert patched.status_code == 409
    assert patched.json() == {"detail": "deployment scorer-prod is archived and cannot change"}
    assert loaded.status_code == 409
    assert loaded.json() == {"deployment": ["deployment scorer-prod is archived"]}


# --- the console


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_console_delete_page_says_what_will_happen(alice, dep):
    client = browser(alice)
    url = f"/registry/deployments/{dep.pk}/delete/"

    assert "it is <strong>deleted</strong>" in client.get(url).content.decode()
    a_load(dep, State.UNLOADED)
    assert "it is <strong>archived</strong>" in client.get(url).content.decode()
    ModelLoad.objects.update(state=State.READY)
    page = client.get(url).content.decode()
    assert "<li>v1 ready on triton-1</li>" in page
    assert 'id="confirm-delete"' not in page


def test_console_delete_while_loaded_is_a_409_naming_what_to_unload(alice, dep):
    a_load(dep, State.READY)

    response = browser(alice).post(f"/registry/deployments/{dep.pk}/delete/", {"reason": ""})

    assert response.status_code == 409
    assert "unload it first: v1 ready on triton-1" in response.content.decode()
    dep.refresh_from_db()
    assert dep.archived_at is None


def test_console_archive_then_the_lists_and_page_show_it(alice, dep):
    a_load(dep, State.UNLOADED)
    client = browser(alice)

    response = client.post(f"/registry/deployments/{dep.pk}/delete/", {"reason": "retired"},
                           follow=True)

    page = response.content.decode()
    assert response.redirect_chain == [(f"/registry/deployments/{dep.pk}/", 302)]
    assert "Deployment scorer-prod archived." in page
    assert 'id="archived-note"' in page
    assert 'id="delete-deployment"' not in page
    assert "Load a version" not in page
    assert "scorer-prod" not in client.get("/registry/deployments/").content.decode()
    archived = client.get("/registry/deployments/?archived=true").content.decode()
    assert "scorer-prod" in archived
    assert AuditEvent.objects.get(verb="archived").reason == "retired"


def test_console_delete_button_shows_for_admins_only(alice, erin, dep):
    url = f"/registry/deployments/{dep.pk}/"
    assert 'id="delete-deployment"' in browser(alice).get(url).content.decode()
    assert 'id="delete-deployment"' not in browser(erin).get(url).content.decode()
