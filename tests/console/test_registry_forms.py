"""Registering models and versions, setting aliases and creating deployments from the console:
one validation with the API (the same message on the same field), the production alias guarded
by a confirmation that says why, the lists a team works from (loads, approvals)."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from django.test import Client
from rest_framework.test import APIClient

from fleet.models import AuditEvent
from rollouts.models import Alias, Deployment, Model, ModelLoad, ModelVersion
from rollouts.registry import approvals
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

Status = ModelVersion.Status
State = ModelLoad.State


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def field_errors(response, name: str) -> list[str]:
    """The messages shown under the field ``name`` (console/partials/field.html)."""
    body = response.content.decode()
    return [unescape(m) for m in re.findall(rf'<p class="error" id="{name}-error">(.*?)</p>', body)]


@pytest.fixture
def model(tenant_a):
    return ModelFactory(tenant=tenant_a, name="scorer")


def version_data(**changes) -> dict[str, str]:
    data = {"version": "1", "artifact_uri": "s3://models/scorer/1", "sha256": "a" * 64,
            "size_bytes": "4096", "runtime": "triton", "backend": "python", "gpus": "1",
            "estimated_gpu_memory_mib": "0", "triton_config": "", "labels": ""}
    return data | changes


# --- models


def test_a_deployer_registers_a_model_and_is_led_to_its_first_version(dave, tenant_a):
    response = browser(dave).post("/registry/models/new/", {
        "tenant": tenant_a.slug, "name": "fraud", "description": "scores transactions"})
    model = Model.objects.get(tenant=tenant_a, name="fraud")
    assert response.status_code == 302
    assert response["Location"] == f"/registry/models/{model.pk}/versions/new/"
    assert model.description == "scores transactions"
    assert AuditEvent.objects.filter(object_type="rollouts.model", verb="created").count() == 1


def test_a_name_already_registered_leads_to_that_model_without_a_second(dave, model):
    response = browser(dave).post("/registry/models/new/", {"tenant": "tenant-a", "name": "scorer"})
    assert response.status_code == 302
    assert response["Location"] == f"/registry/models/{model.pk}/"
    assert Model.objects.filter(name="scorer").count() == 1


@pytest.mark.parametrize("name", ["Has Caps", "-dash-first", "x" * 65, "é"])
def test_a_bad_model_name_is_a_400_under_the_name_field(dave, tenant_a, name):
    response = browser(dave).post("/registry/models/new/", {"tenant": tenant_a.slug, "name": name})
    assert response.status_code == 400
    assert field_errors(response, "name")
    assert not Model.objects.exists()


def test_a_viewer_cannot_register_a_model(bob, tenant_a):
    response = browser(bob).post("/registry/models/new/", {"tenant": tenant_a.slug, "name": "fraud"})
    assert response.status_code == 403
    assert not Model.objects.exists()


# --- versions


def test_a_version_is_registered_with_its_config_labels_and_lineage(dave, model):
    config = {"max_batch_size": 8, "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    response = browser(dave).post(f"/registry/models/{model.pk}/versions/new/", version_data(
        triton_config=json.dumps(config), labels='{"team": "fraud"}', git_sha="abc123",
        training_run="run-42", request_approval="on"))
    version = model.versions.get(version=1)
    assert response.status_code == 302
    assert response["Location"] == f"/registry/versions/{version.pk}/"
    assert (version.triton_config, version.labels) == (config, {"team": "fraud"})
    assert (version.git_sha, version.training_run, version.registered_by) == ("abc123", "run-42", dave)
    assert version.status == Status.PENDING_APPROVAL


def test_json_that_does_not_parse_says_where_under_its_field(dave, model):
    response = browser(dave).post(f"/registry/models/{model.pk}/versions/new/",
                                  version_data(triton_config='{\n  "max_batch_size": 8,\n}'))
    assert response.status_code == 400
    assert field_errors(response, "triton_config") == [
        "not valid JSON: Expecting property name enclosed in double quotes at line 3, column 1"]
    assert 'id="form-alert"' in response.content.decode()


@pytest.mark.parametrize(
    ("config", "labels"),
    [
        ({"max_batch_size": "eight"}, {}),
        ({"name": "someone-else"}, {}),
        ({"instance_group": [{"count": 0}]}, {}),
        ({}, {"team": 7}),
    ],
    ids=["wrong-type", "other-name", "zero-instances", "label-not-a-string"],
)
def test_a_version_is_refused_on_the_field_with_the_apis_own_words(dave, model, config, labels):
    """The form and POST /api/v1/versions/ refuse the same input with the same message."""
    response = browser(dave).post(f"/registry/models/{model.pk}/versions/new/", version_data(
        triton_config=json.dumps(config), labels=json.dumps(labels)))
    api = APIClient()
    api.force_authenticate(dave)
    answer = api.post("/api/v1/versions/", {
        "model": model.pk, "version": 1, "artifact_uri": "s3://models/scorer/1",
        "sha256": "a" * 64, "size_bytes": 4096, "runtime": "triton", "backend": "python",
        "triton_config": config, "labels": labels}, format="json")
    assert (response.status_code, answer.status_code) == (400, 400)
    field = "labels" if labels else "triton_config"
    assert field_errors(response, field) == answer.json()[field]
    assert not model.versions.exists()


def test_the_same_number_with_another_digest_is_a_409_on_sha256(dave, model):
    ModelVersionFactory(model=model, version=1, sha256="b" * 64)
    response = browser(dave).post(f"/registry/models/{model.pk}/versions/new/", version_data())
    assert response.status_code == 409
    assert "Versions are immutable" in field_errors(response, "sha256")[0]


def test_the_form_starts_from_the_next_number_and_the_previous_shape(dave, model):
    ModelVersionFactory(model=model, version=4, gpus=2, triton_config={"max_batch_size": 4})
    form = browser(dave).get(f"/registry/models/{model.pk}/versions/new/").context["form"]
    assert form["version"].value() == 5
    assert form["gpus"].value() == 2
    assert json.loads(form["triton_config"].value()) == {"max_batch_size": 4}


@pytest.mark.parametrize("size", ["-1", str(2**63), "1e3", "12 bytes"])
def test_an_absurd_size_is_a_400_naming_size(dave, model, size):
    response = browser(dave).post(f"/registry/models/{model.pk}/versions/new/",
                                  version_data(size_bytes=size))
    assert response.status_code == 400
    assert field_errors(response, "size_bytes")


def test_deeply_nested_json_is_a_400_not_a_crash(dave, model):
    response = browser(dave).post(f"/registry/models/{model.pk}/versions/new/",
                                  version_data(labels="[" * 100_000))
    assert response.status_code == 400
    assert field_errors(response, "labels")


# --- aliases


@pytest.fixture
def served(model, tenant_a):
    """v1 approved and ready on a server; v2 registered only; v3 approved, its load failed."""
    server = InferenceServerFactory(cluster=ClusterFactory(name="c-alias"), name="triton-a")
    deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=server.cluster, name="d")
    versions = {n: ModelVersionFactory(model=model, version=n) for n in (1, 2, 3)}
    ModelVersion.objects.filter(pk__in=[versions[1].pk, versions[3].pk]).update(status=Status.APPROVED)
    for number, state, error in ((1, State.READY, ""), (3, State.FAILED, "sha256 mismatch")):
        ModelLoad.objects.create(tenant=tenant_a, deployment=deployment, server=server,
                                 version=versions[number], state=state, error=error,
                                 requested_by_label="seed")
    return {n: ModelVersion.objects.get(pk=v.pk) for n, v in versions.items()} | {"deployment": deployment}


def test_production_moves_to_an_approved_running_version_without_a_question(dave, model, served):
    response = browser(dave).post(f"/registry/models/{model.pk}/aliases/",
                                  {"name": "production", "version": served[1].pk})
    assert response.status_code == 302
    assert Alias.objects.get(model=model, name="production").version == served[1]


@pytest.mark.parametrize(
    ("number", "why"),
    [
        (3, ["its last load, on triton-a, failed: sha256 mismatch", "v3 is not loaded on any server"]),
    ],
    ids=["load-failed"],
)
def test_a_risky_production_move_asks_first_and_says_why(dave, model, served, number, why):
    client = browser(dave)
    url = f"/registry/models/{model.pk}/aliases/"
    response = client.post(url, {"name": "production", "version": served[number].pk})
    assert response.status_code == 400
    assert response.context["alias_form"].concerns == why
    assert "Tick to move it anyway" in field_errors(response, "confirm")[0]
    assert not Alias.objects.filter(model=model, name="production").exists()

    response = client.post(url, {"name": "production", "version": served[number].pk,
                                 "confirm": "on", "reason": "hotfix"})
    assert response.status_code == 302
    assert Alias.objects.get(model=model, name="production").version == served[number]
    event = AuditEvent.objects.get(object_type="rollouts.alias")
    assert event.reason == f"hotfix (moved despite: {'; '.join(why)})"


@pytest.mark.parametrize("confirm", [{}, {"confirm": "on"}], ids=["asked", "ticked"])
def test_production_never_moves_to_a_version_that_is_not_approved(dave, model, served, confirm):
    """The console refuses it on ``version``, as the API does, ticked box or not."""
    response = browser(dave).post(f"/registry/models/{model.pk}/aliases/",
                                  {"name": "production", "version": served[2].pk, **confirm})
    assert response.status_code == 400
    assert field_errors(response, "version") == [
        "@production names approved versions only; v2 is registered: have it approved first"]
    assert not Alias.objects.filter(model=model, name="production").exists()


def test_an_unloaded_version_is_named_as_unloaded(dave, model, served):
    ModelLoad.objects.filter(version=served[1]).update(state=State.UNLOADED)
    response = browser(dave).post(f"/registry/models/{model.pk}/aliases/",
                                  {"name": "production", "version": served[1].pk})
    assert response.context["alias_form"].concerns == ["v1 was unloaded and runs on no server"]


def test_other_aliases_move_without_a_question(dave, model, served):
    response = browser(dave).post(f"/registry/models/{model.pk}/aliases/",
                                  {"name": "staging", "version": served[2].pk})
    assert response.status_code == 302


def test_the_load_form_never_offers_a_failed_version_first(dave, served):
    """v3 is the newest, but its last load failed: the newest other one is offered, or the
    production alias's version when there is one."""
    url = f"/registry/deployments/{served['deployment'].pk}/"
    page = browser(dave).get(url)
    assert page.context["default_load"] == served[2]
    body = page.content.decode()
    assert f'<option value="{served[2].pk}" selected>' in body
    assert "v3 · Approved · last load failed" in body
    Alias.objects.create(model=served[1].model, name="production", version=served[1])
    assert browser(dave).get(url).context["default_load"] == served[1]


# --- deployments


@pytest.fixture
def fleet():
    cluster = ClusterFactory(name="gpu-east")
    other = ClusterFactory(name="gpu-west")
    return {"cluster": cluster, "other": other,
            "servers": [InferenceServerFactory(cluster=cluster, name=f"t{n}") for n in (1, 2)],
            "stranger": InferenceServerFactory(cluster=other, name="w1")}


def deployment_data(of, fleet, **changes) -> dict[str, object]:
    return {"name": "scorer-prod", "model": of.pk, "cluster": fleet["cluster"].pk,
            "slo_p99_ms": "250", "slo_error_rate": "0.50"} | changes


def test_a_new_deployment_carries_every_server_of_its_cluster_unless_told(dave, model, fleet):
    response = browser(dave).post("/registry/deployments/new/", deployment_data(model, fleet))
    deployment = Deployment.objects.get(name="scorer-prod")
    assert response.status_code == 302
    assert sorted(s.name for s in deployment.servers.all()) == ["t1", "t2"]
    assert (deployment.tenant, deployment.slo_p99_ms, str(deployment.slo_error_rate)) == (
        model.tenant, 250, "0.50")


def test_a_server_of_another_cluster_is_refused_on_servers(dave, model, fleet):
    response = browser(dave).post("/registry/deployments/new/", deployment_data(
        model, fleet, servers=[fleet["stranger"].pk]))
    assert response.status_code == 400  # a mistake in the form, not a conflict
    assert field_errors(response, "servers") == [
        "servers w1 are not in cluster gpu-east; its servers: t1, t2"]
    assert not Deployment.objects.exists()


def test_a_name_in_use_is_refused_on_name(dave, model, fleet):
    DeploymentFactory(tenant=model.tenant, model=model, cluster=fleet["cluster"], name="scorer-prod")
    response = browser(dave).post("/registry/deployments/new/", deployment_data(model, fleet))
    assert response.status_code == 400
    assert field_errors(response, "name")
    assert Deployment.objects.count() == 1


@pytest.mark.parametrize(("field", "value"), [("slo_p99_ms", "0"), ("slo_p99_ms", str(2**40)),
                                              ("slo_error_rate", "101"), ("slo_error_rate", "NaN")])
def test_an_slo_out_of_range_is_a_400_on_its_field(dave, model, fleet, field, value):
    response = browser(dave).post("/registry/deployments/new/",
                                  deployment_data(model, fleet, **{field: value}))
    assert response.status_code == 400
    assert field_errors(response, field)


def test_editing_changes_what_it_may_and_keeps_its_model(erin, model, fleet, tenant_a):
    # The production flag is an approver's to change (tests/api/test_production_gate.py).
    deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=fleet["cluster"], name="d1")
    other_model = ModelFactory(tenant=tenant_a, name="other")
    response = browser(erin).post(f"/registry/deployments/{deployment.pk}/edit/", deployment_data(
        model, fleet, name="d1", model=other_model.pk, servers=[fleet["servers"][0].pk],
        production="on", slo_p99_ms="120"))
    deployment.refresh_from_db()
    assert response.status_code == 302
    assert (deployment.model, deployment.production, deployment.slo_p99_ms) == (model, True, 120)
    assert [s.name for s in deployment.servers.all()] == ["t1"]
    event = AuditEvent.objects.get(object_type="rollouts.deployment", verb="updated")
    assert event.after["slo_p99_ms"] == 120 and event.after["servers"] == ["t1"]


def test_a_deployer_edits_a_deployment_but_not_its_production_flag(dave, model, fleet, tenant_a):
    """The box is shown as it is and cannot change: a forged "off" keeps it on."""
    deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=fleet["cluster"],
                                   name="d1", production=True)
    url = f"/registry/deployments/{deployment.pk}/edit/"
    form = browser(dave).get(url).context["form"]
    assert form.fields["production"].disabled
    assert "an approver changes this" in form.fields["production"].help_text

    response = browser(dave).post(url, deployment_data(model, fleet, name="d1", slo_p99_ms="120"))
    deployment.refresh_from_db()
    assert response.status_code == 302
    assert (deployment.production, deployment.slo_p99_ms) == (True, 120)


# --- the lists a team works from


def test_the_loads_list_narrows_by_state_deployment_version_and_server(dave, served, tenant_a):
    client = browser(dave)
    page = client.get("/registry/loads/", {"state": "failed"})
    assert [load.version.version for load in page.context["page"]] == [3]
    page = client.get("/registry/loads/", {"version": "1", "deployment": served["deployment"].pk})
    assert [load.state for load in page.context["page"]] == [State.READY]
    server = ModelLoad.objects.get(version=served[1]).server
    assert len(client.get("/registry/loads/", {"server": server.pk}).context["page"]) == 2
    assert len(client.get("/registry/loads/", {"server": "x", "version": "-1"}).context["page"]) == 2


def test_the_approvals_queue_is_oldest_first_with_who_asked_and_what_changed(dave, erin, model):
    v1 = ModelVersionFactory(model=model, version=1, triton_config={"max_batch_size": 4})
    v2 = ModelVersionFactory(model=model, version=2, triton_config={"max_batch_size": 8},
                             labels={"team": "fraud"})
    approvals.request_approval(dave, v2, "bigger batches")
    approvals.request_approval(dave, v1, "first")
    page = browser(erin).get("/registry/approvals/")
    queue = page.context["versions"]
    assert [v.version for v in queue] == [2, 1]
    assert queue[0].previous == v1
    changed = {row["field"]: (row["before"], row["after"]) for row in queue[0].changes}
    assert changed["triton_config.max_batch_size"] == (4, 8)
    assert changed["labels.team"] == (None, "fraud")
    assert changed["artifact_uri"] == (v1.artifact_uri, v2.artifact_uri)
    body = page.content.decode()
    assert "Asked by <strong>dave</strong>" in body
    assert f'action="/registry/versions/{v2.pk}/approve/"' in body


def test_the_requester_sees_the_queue_without_buttons(dave, model):
    version = approvals.request_approval(dave, ModelVersionFactory(model=model, version=1))
    body = browser(dave).get("/registry/approvals/").content.decode()
    assert f"/registry/versions/{version.pk}/approve/" not in body
    assert "You asked for this approval" in body
