"""Registry and deployment API: idempotent registration, validation naming the field,
immutable versions, aliases, deployments, and the audit trail each write leaves."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.core.paginator import UnorderedObjectListWarning

from console.exceptions import Conflict
from fleet.models import AuditEvent, Cluster
from rollouts.deployments import lifecycle as deployments
from rollouts.models import Alias, Deployment, Model, ModelVersion
from rollouts.registry import approvals
from rollouts.registry import versions as registry
from tests.factories import (
    AliasFactory,
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    MembershipFactory,
    ModelFactory,
    ModelVersionFactory,
)

SHA_1 = "1" * 64
SHA_2 = "2" * 64


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def model_a(tenant_a):
    return ModelFactory(tenant=tenant_a, name="model-a")


@pytest.fixture
def model_b(tenant_b):
    return ModelFactory(tenant=tenant_b, name="model-b")


def version_data(number: int = 1, sha256: str = SHA_1, **extra) -> dict:
    return {
        "version": number, "artifact_uri": f"s3://models/model-a/{number}.tar.gz",
        "sha256": sha256, "size_bytes": 2048, "runtime": "triton", "backend": "python",
        "labels": {"team": "vision"}, **extra,
    }


def fresh_alias(alias: Alias) -> Alias:
    return Alias.objects.select_related("version").get(pk=alias.pk)


def events(**filters) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(**filters).order_by("id"))


# --- models ----------------------------------------------------------------------------------


def test_creating_a_model_twice_answers_201_then_200_with_the_same_model(client_for, dave):
    client = client_for(dave)

    first = client.post("/api/v1/models/", {"name": "resnet", "description": "image classifier"})
    second = client.post("/api/v1/models/", {"name": "resnet"})

    assert first.status_code == 201, first.json()
    assert second.status_code == 200, second.json()
    assert first.json()["id"] == second.json()["id"]
    assert first.json()["tenant"] == "tenant-a"
    assert Model.objects.count() == 1
    [created] = events(verb="created", object_type="rollouts.model")
    assert created.actor_label == "dave"
    assert created.after == {"name": "resnet"}
    assert created.tenant.slug == "tenant-a"


def test_a_user_in_two_tenants_must_name_the_tenant(client_for, dave, tenant_b):
    MembershipFactory(user=dave, tenant=tenant_b, role="deployer")
    client = client_for(dave)

    unnamed = client.post("/api/v1/models/", {"name": "resnet"})
    named = client.post("/api/v1/models/", {"name": "resnet", "tenant": "tenant-b"})

    assert unnamed.status_code == 400
    assert unnamed.json() == {"tenant": ["name the tenant (you belong to several)"]}
    assert named.status_code == 201
    assert named.json()["tenant"] == "tenant-b"


def test_a_model_cannot_be_renamed(client_for, dave, model_a):
    response = client_for(dave).patch(f"/api/v1/models/{model_a.pk}/", {"name": "other"})

    assert response.status_code == 400
    assert response.json() == {"name": ["a model cannot be renamed"]}
    model_a.refresh_from_db()
    assert model_a.name == "model-a"


def test_the_model_list_is_paginated_in_a_stable_order(client_for, bob, tenant_a):
    for name in ("zeta", "alpha", "mid"):
        ModelFactory(tenant=tenant_a, name=name)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        response = client_for(bob).get("/api/v1/models/")

    assert not [w for w in caught if issubclass(w.category, UnorderedObjectListWarning)]
    assert [row["name"] for row in response.json()["results"]] == ["alpha", "mid", "zeta"]


# --- versions: idempotent registration ---------------------------------------------------------


def test_registering_the_same_version_and_digest_again_answers_200_with_the_same_row(
    client_for, dave, model_a
):
    client = client_for(dave)
    payload = {"model": model_a.pk, **version_data()}

    first = client.post("/api/v1/versions/", payload)
    second = client.post("/api/v1/versions/", payload)

    assert first.status_code == 201, first.json()
    assert second.status_code == 200, second.json()
    assert first.json()["id"] == second.json()["id"]
    assert first.json()["status"] == "registered"
    assert first.json()["registered_by"] == "dave"
    [registered] = events(verb="registered")
    assert registered.actor_label == "dave"
    assert registered.after["sha256"] == SHA_1
    assert registered.after["artifact_uri"] == "s3://models/model-a/1.tar.gz"
    assert registered.before == {}


def test_the_same_version_with_another_digest_is_a_conflict_naming_both(client_for, dave,
                                                                        model_a):
    client = client_for(dave)
    client.post("/api/v1/versions/", {"model": model_a.pk, **version_data(sha256=SHA_1)})

    response = client.post("/api/v1/versions/", {"model": model_a.pk, **version_data(sha256=SHA_2)})

    assert response.status_code == 409
    body = response.json()
    assert list(body) == ["sha256"]
    assert SHA_1 in body["sha256"][0]
    assert SHA_2 in body["sha256"][0]
    assert ModelVersion.objects.get().sha256 == SHA_1


def test_register_version_called_twice_returns_the_first_row(dave, model_a):
    first, created_first = registry.register_version(dave, model_a, version_data())
    second, created_second = registry.register_version(dave, model_a, version_data())

    assert (created_first, created_second) == (True, False)
    assert first.pk == second.pk
    assert ModelVersion.objects.count() == 1
    assert len(events(verb="registered")) == 1


def _competitor(model, sha256: str) -> None:
    """Another request registering the same version number, committed in between."""
    ModelVersion.objects.create(model=model, **{**version_data(sha256=sha256), "labels": {}})


def test_a_concurrent_registration_that_inserts_first_is_answered_idempotently(
    monkeypatch, dave, model_a
):
    """GIVEN another request inserts version 1 after our checks but before our INSERT
    WHEN ours saves THEN the unique constraint trips and the existing row is returned."""
    real_full_clean = ModelVersion.full_clean

    def full_clean_then_lose_the_race(self, *args, **kwargs):
        real_full_clean(self, *args, **kwargs)
        _competitor(model_a, SHA_1)

    monkeypatch.setattr(ModelVersion, "full_clean", full_clean_then_lose_the_race)

    version, created = registry.register_version(dave, model_a, version_data(sha256=SHA_1))

    assert created is False
    assert ModelVersion.objects.get().pk == version.pk
    assert events(verb="registered") == []


def test_a_concurrent_registration_with_another_digest_is_a_conflict(monkeypatch, dave, model_a):
    real_full_clean = ModelVersion.full_clean

    def full_clean_then_lose_the_race(self, *args, **kwargs):
        real_full_clean(self, *args, **kwargs)
        _competitor(model_a, SHA_2)

    monkeypatch.setattr(ModelVersion, "full_clean", full_clean_then_lose_the_race)

    with pytest.raises(Conflict) as refused:
        registry.register_version(dave, model_a, version_data(sha256=SHA_1))

    assert refused.value.field == "sha256"
    assert SHA_2 in refused.value.message


def test_a_concurrent_registration_that_lands_before_validation_is_answered_idempotently(
    monkeypatch, dave, model_a
):
    real_full_clean = ModelVersion.full_clean

    def lose_the_race_then_full_clean(self, *args, **kwargs):
        _competitor(model_a, SHA_1)
        real_full_clean(self, *args, **kwargs)

    monkeypatch.setattr(ModelVersion, "full_clean", lose_the_race_then_full_clean)

    version, created = registry.register_version(dave, model_a, version_data(sha256=SHA_1))

    assert created is False
    assert ModelVersion.objects.get().pk == version.pk


# --- versions: validation names the field ---------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"artifact_uri": "https://models.example.com/a.tar.gz"}, "artifact_uri"),
        ({"artifact_uri": "s3://Bad_Bucket/a.tar.gz"}, "artifact_uri"),
        ({"sha256": "abc123"}, "sha256"),
        ({"sha256": "A" * 64}, "sha256"),
        ({"sha256": "g" * 64}, "sha256"),
        ({"model": 999_999}, "model"),
        ({"labels": {"team": 1}}, "labels"),
        ({"labels": ["team", "vision"]}, "labels"),
        ({"labels": "team=vision"}, "labels"),
        ({"backend": ""}, "backend"),
        ({"runtime": "vllm", "backend": "python"}, "backend"),
        ({"triton_config": ["not", "an", "object"]}, "triton_config"),
    ],
    ids=lambda value: str(value) if isinstance(value, str) else None,
)
def test_an_invalid_version_is_refused_naming_the_field(client_for, dave, model_a, change, field):
    payload = {"model": model_a.pk, **version_data(), **change}

    response = client_for(dave).post("/api/v1/versions/", payload)

    assert response.status_code == 400
    assert list(response.json()) == [field], response.json()
    assert not ModelVersion.objects.exists()


def test_a_version_of_another_tenants_model_is_refused_naming_the_model(client_for, charlie,
                                                                        model_a):
    response = client_for(charlie).post("/api/v1/versions/", {"model": model_a.pk, **version_data()})

    assert response.status_code == 400
    assert list(response.json()) == ["model"]
    # Same answer as for a model that does not exist: nothing leaks about tenant A.
    assert response.json()["model"] == [f"no model with id {model_a.pk}"]
    by_name = client_for(charlie).post("/api/v1/versions/", {"model": "model-a", **version_data()})
    assert by_name.json()["model"] == ["no model with name 'model-a'"]


# --- versions: immutable ---------------------------------------------------------------------------


def test_saving_a_changed_artifact_uri_raises_naming_the_field(model_a):
    version = ModelVersionFactory(model=model_a, version=1)
    original = version.artifact_uri
    version.artifact_uri = "s3://models/elsewhere/1.tar.gz"
    version.sha256 = SHA_2

    with pytest.raises(ValidationError) as refused:
        version.save()

    assert set(refused.value.message_dict) == {"artifact_uri", "sha256"}
    assert "immutable" in refused.value.message_dict["artifact_uri"][0]
    assert ModelVersion.objects.get(pk=version.pk).artifact_uri == original


def test_status_fields_of_a_version_may_change(model_a):
    version = ModelVersionFactory(model=model_a, version=1)
    version.status = ModelVersion.Status.ARCHIVED
    version.status_reason = "superseded"

    version.save()

    assert ModelVersion.objects.get(pk=version.pk).status == "archived"


@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_there_is_no_route_to_change_or_delete_a_version(client_for, alice, model_a, method):
    version = ModelVersionFactory(model=model_a, version=1)

    response = getattr(client_for(alice), method)(
        f"/api/v1/versions/{version.pk}/", {"artifact_uri": "s3://models/x/y"}
    )

    assert response.status_code == 405
    assert response.json() == {"detail": f'Method "{method.upper()}" not allowed.'}
    assert ModelVersion.objects.get(pk=version.pk).artifact_uri == version.artifact_uri


# --- aliases ---------------------------------------------------------------------------------------


def test_setting_then_moving_an_alias_records_created_then_moved(client_for, dave, model_a):
    # The production alias names approved versions only (tests/api/test_production_gate.py).
    v1 = ModelVersionFactory(model=model_a, version=1, status=ModelVersion.Status.APPROVED)
    v2 = ModelVersionFactory(model=model_a, version=2, status=ModelVersion.Status.APPROVED)
    client = client_for(dave)

    created = client.post("/api/v1/aliases/", {"model": model_a.pk, "name": "production",
                                               "version": 1, "reason": "first release"})
    moved = client.post("/api/v1/aliases/", {"model": model_a.pk, "name": "production",
                                             "version": 2, "reason": "promote v2"})

    assert created.status_code == 201, created.json()
    assert moved.status_code == 200, moved.json()
    assert created.json()["id"] == moved.json()["id"]
    assert moved.json()["version"] == 2
    assert Alias.objects.get().version == v2
    first, second = events(object_type="rollouts.alias")
    assert (first.verb, first.before, first.after, first.reason) == (
        "created", {}, {"version": 1}, "first release"
    )
    assert (second.verb, second.before, second.after, second.reason) == (
        "moved", {"version": 1}, {"version": 2}, "promote v2"
    )
    assert second.actor_label == "dave"
    assert v1.pk != v2.pk


def test_setting_an_alias_where_it_already_points_changes_nothing(client_for, dave, model_a):
    AliasFactory(model=model_a, name="production", version=ModelVersionFactory(model=model_a))
    number = Alias.objects.get().version.version

    response = client_for(dave).post(
        "/api/v1/aliases/", {"model": model_a.pk, "name": "production", "version": number}
    )

    assert response.status_code == 200
    assert events(object_type="rollouts.alias") == []


def test_an_alias_to_a_version_only_another_model_has_is_refused_naming_version(
    client_for, dave, model_a, tenant_a
):
    ModelVersionFactory(model=model_a, version=1)
    ModelVersionFactory(model=ModelFactory(tenant=tenant_a, name="other"), version=5)

    response = client_for(dave).post(
        "/api/v1/aliases/", {"model": model_a.pk, "name": "production", "version": 5}
    )

    assert response.status_code == 400
    assert response.json() == {"version": ["model-a has no version 5"]}
    assert not Alias.objects.exists()


def test_set_alias_refuses_a_version_of_another_model(dave, model_a, tenant_a):
    stranger = ModelVersionFactory(model=ModelFactory(tenant=tenant_a, name="other"))

    with pytest.raises(ValidationError) as refused:
        registry.set_alias(dave, model_a, "production", stranger)

    assert refused.value.message_dict == {"version": ["the version belongs to another model"]}
    assert not Alias.objects.exists()


@pytest.mark.parametrize("status", ["rejected", "archived"])
def test_an_alias_to_a_rejected_or_archived_version_is_refused(client_for, dave, model_a, status):
    ModelVersionFactory(model=model_a, version=1, status=status)

    response = client_for(dave).post(
        "/api/v1/aliases/", {"model": model_a.pk, "name": "production", "version": 1}
    )

    assert response.status_code == 400
    assert response.json() == {"version": [f"version is {status}; alias it elsewhere"]}
    assert not Alias.objects.exists()


def test_moving_an_alias_with_put_records_the_move(client_for, dave, model_a):
    alias = AliasFactory(model=model_a, name="staging",
                         version=ModelVersionFactory(model=model_a, version=1))
    ModelVersionFactory(model=model_a, version=2)

    response = client_for(dave).put(
        f"/api/v1/aliases/{alias.pk}/",
        {"model": model_a.pk, "name": "staging", "version": 2, "reason": "canary ok"},
    )

    assert response.status_code == 200, response.json()
    assert response.json()["version"] == 2
    [moved] = events(verb="moved")
    assert (moved.before, moved.after, moved.reason) == ({"version": 1}, {"version": 2}, "canary ok")


def test_an_alias_cannot_be_renamed(client_for, dave, model_a):
    alias = AliasFactory(model=model_a, name="staging",
                         version=ModelVersionFactory(model=model_a, version=1))

    response = client_for(dave).patch(f"/api/v1/aliases/{alias.pk}/", {"name": "prod",
                                                                       "version": 1})

    assert response.status_code == 400
    assert response.json() == {"name": ["an alias cannot be renamed; create the new name"]}


def test_patching_an_alias_without_a_version_keeps_it_where_it_is(client_for, dave, model_a):
    alias = AliasFactory(model=model_a, name="staging",
                         version=ModelVersionFactory(model=model_a, version=1))

    response = client_for(dave).patch(f"/api/v1/aliases/{alias.pk}/", {"reason": "note"})

    assert response.status_code == 200
    assert response.json()["version"] == 1
    assert fresh_alias(alias).version.version == 1
    assert events(object_type="rollouts.alias") == []


def test_creating_an_alias_without_a_version_is_refused_naming_version(client_for, dave, model_a):
    response = client_for(dave).post("/api/v1/aliases/", {"model": model_a.pk, "name": "staging"})

    assert response.status_code == 400
    assert list(response.json()) == ["version"]
    assert not Alias.objects.exists()


def test_deleting_an_alias_is_audited(client_for, dave, model_a):
    alias = AliasFactory(model=model_a, name="staging",
                         version=ModelVersionFactory(model=model_a, version=4))

    response = client_for(dave).delete(f"/api/v1/aliases/{alias.pk}/")

    assert response.status_code == 204
    assert not Alias.objects.exists()
    [deleted] = events(verb="deleted")
    assert (deleted.object_type, deleted.before, deleted.actor_label) == (
        "rollouts.alias", {"version": 4}, "dave"
    )


# --- deployments -------------------------------------------------------------------------------


@pytest.fixture
def cluster(db) -> Cluster:
    cluster = ClusterFactory(name="gpu-east")
    InferenceServerFactory(cluster=cluster, name="triton-1")
    InferenceServerFactory(cluster=cluster, name="triton-2")
    return cluster


def test_a_deployment_is_created_with_its_slo(client_for, dave, model_a, cluster):
    response = client_for(dave).post("/api/v1/deployments/", {
        "name": "resnet-prod", "model": model_a.pk, "cluster": "gpu-east", "production": True,
        "slo_p99_ms": 120, "slo_error_rate": "0.50", "servers": ["triton-1"],
    })

    assert response.status_code == 201
    body = response.json()
    assert (body["tenant"], body["slo_p99_ms"], body["slo_error_rate"]) == ("tenant-a", 120, "0.50")
    assert body["servers"] == ["triton-1"]


def test_a_deployment_without_servers_gets_all_of_its_clusters_servers(client_for, dave, model_a,
                                                                       cluster):
    InferenceServerFactory(cluster=ClusterFactory(name="elsewhere"), name="triton-9")

    response = client_for(dave).post(
        "/api/v1/deployments/", {"name": "resnet", "model": model_a.pk, "cluster": "gpu-east"}
    )

    assert response.status_code == 201
    assert response.json()["servers"] == ["triton-1", "triton-2"]


def test_a_server_of_another_cluster_is_refused_naming_servers(client_for, dave, model_a, cluster):
    InferenceServerFactory(cluster=ClusterFactory(name="elsewhere"), name="triton-9")

    response = client_for(dave).post("/api/v1/deployments/", {
        "name": "resnet", "model": model_a.pk, "cluster": "gpu-east",
        "servers": ["triton-1", "triton-9"],
    })

    assert response.status_code == 400
    assert response.json() == {"servers": ["cluster gpu-east has no server named triton-9"]}
    assert not Deployment.objects.exists()


def test_save_deployment_refuses_servers_of_another_cluster(dave, model_a, cluster):
    stranger = InferenceServerFactory(cluster=ClusterFactory(name="elsewhere"), name="triton-9")
    deployment = Deployment(tenant=model_a.tenant, model=model_a, cluster=cluster, name="resnet")

    with pytest.raises(Conflict) as refused:
        deployments.save_deployment(dave, deployment, [stranger])

    assert refused.value.field == "servers"
    assert "triton-9" in refused.value.message
    assert not Deployment.objects.exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"slo_error_rate": "100.01"}, "slo_error_rate"),
        ({"slo_error_rate": "150"}, "slo_error_rate"),
        ({"slo_error_rate": "-1"}, "slo_error_rate"),
        ({"slo_p99_ms": 0}, "slo_p99_ms"),
        ({"cluster": "no-such-cluster"}, "cluster"),
        ({"name": "Not A Slug"}, "name"),
    ],
)
def test_an_invalid_deployment_is_refused_naming_the_field(client_for, dave, model_a, cluster,
                                                           change, field):
    payload = {"name": "resnet", "model": model_a.pk, "cluster": "gpu-east", **change}

    response = client_for(dave).post("/api/v1/deployments/", payload)

    assert response.status_code == 400
    assert list(response.json()) == [field], response.json()
    assert not Deployment.objects.exists()


def test_a_duplicate_deployment_name_is_refused_naming_name(client_for, dave, model_a, cluster):
    DeploymentFactory(model=model_a, cluster=cluster, name="resnet")

    response = client_for(dave).post(
        "/api/v1/deployments/", {"name": "resnet", "model": model_a.pk, "cluster": "gpu-east"}
    )

    assert response.status_code == 400
    assert response.json() == {"name": ["Deployment with this Tenant and Name already exists."]}
    assert Deployment.objects.count() == 1


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"name": "bert"}, {"name": ["Deployment with this Tenant and Name already exists."]}),
        ({"servers": ["triton-9"]}, {"servers": ["cluster gpu-east has no server named triton-9"]}),
        ({"model": "<other model>"}, {"model": ["a deployment's model cannot change"]}),
    ],
    ids=["name-clash", "foreign-server", "model-change"],
)
def test_an_invalid_deployment_change_is_refused_naming_the_field(client_for, dave, model_a,
                                                                  tenant_a, cluster, change,
                                                                  expected):
    deployment = DeploymentFactory(model=model_a, cluster=cluster, name="resnet")
    DeploymentFactory(model=model_a, cluster=cluster, name="bert")
    InferenceServerFactory(cluster=ClusterFactory(name="elsewhere"), name="triton-9")
    if change.get("model"):
        change = {"model": ModelFactory(tenant=tenant_a, name="other").pk}

    response = client_for(dave).patch(f"/api/v1/deployments/{deployment.pk}/", change)

    assert response.status_code == 400
    assert response.json() == expected
    deployment.refresh_from_db()
    assert (deployment.name, deployment.model_id) == ("resnet", model_a.pk)
    assert not deployment.servers.exists()
    assert not events(object_type="rollouts.deployment")


def test_patching_a_deployments_servers_is_audited(client_for, dave, model_a, cluster):
    deployment = DeploymentFactory(model=model_a, cluster=cluster, name="resnet")

    response = client_for(dave).patch(f"/api/v1/deployments/{deployment.pk}/",
                                      {"servers": ["triton-2"]})

    assert response.status_code == 200, response.json()
    assert response.json()["servers"] == ["triton-2"]
    [updated] = events(verb="updated", object_type="rollouts.deployment")
    assert (updated.actor_label, updated.after) == ("dave", {"servers": ["triton-2"]})


def test_a_deployment_of_another_tenants_model_is_refused_naming_model(client_for, charlie,
                                                                       model_a, cluster):
    response = client_for(charlie).post(
        "/api/v1/deployments/", {"name": "resnet", "model": model_a.pk, "cluster": "gpu-east"}
    )

    assert response.status_code == 400
    assert list(response.json()) == ["model"]
    assert not Deployment.objects.exists()


def test_deployment_writes_are_audited_with_before_after_and_reason(dave, alice, model_a, cluster):
    servers = list(cluster.servers.all())
    deployment = deployments.save_deployment(
        dave, Deployment(tenant=model_a.tenant, model=model_a, cluster=cluster, name="resnet"),
        servers, reason="launch",
    )
    deployment.slo_p99_ms = 250
    deployments.save_deployment(dave, deployment, reason="looser SLO for batch traffic")
    deployments.delete_deployment(alice, deployment, reason="retired")

    created, updated, deleted = events(object_type="rollouts.deployment")
    assert (created.verb, created.actor_label, created.reason) == ("created", "dave", "launch")
    assert created.after["name"] == "resnet"
    assert created.after["servers"] == ["triton-1", "triton-2"]
    assert (updated.verb, updated.before, updated.after, updated.reason) == (
        "updated", {"slo_p99_ms": 500}, {"slo_p99_ms": 250}, "looser SLO for batch traffic"
    )
    assert (deleted.verb, deleted.actor_label, deleted.reason) == ("deleted", "alice", "retired")
    assert deleted.before["slo_p99_ms"] == 250
    assert not Deployment.objects.exists()


def test_deleting_a_cluster_that_carries_deployments_is_a_conflict(client_for, root, model_a,
                                                                   cluster):
    DeploymentFactory(model=model_a, cluster=cluster, name="resnet")

    response = client_for(root).delete(f"/api/v1/clusters/{cluster.pk}/")

    assert response.status_code == 409
    assert Cluster.objects.filter(pk=cluster.pk).exists()
    assert events(verb="deleted") == []


# --- audit log --------------------------------------------------------------------------------

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def trail(dave, alice, charlie, tenant_a, tenant_b, root, client_for):
    """GIVEN one write an hour in tenant A (dave, then alice), one in tenant B and one
    platform-level change."""
    with time_machine.travel(START, tick=False):
        model, _ = registry.create_model(dave, tenant_a, "resnet")
    with time_machine.travel(START + timedelta(hours=1), tick=False):
        v1, _ = registry.register_version(dave, model, version_data(1, SHA_1))
    with time_machine.travel(START + timedelta(hours=2), tick=False):
        registry.set_alias(alice, model, "staging", v1, reason="first release")
    with time_machine.travel(START + timedelta(hours=3), tick=False):
        v2, _ = registry.register_version(dave, model, version_data(2, SHA_2))
    with time_machine.travel(START + timedelta(hours=4), tick=False):
        registry.set_alias(alice, model, "staging", v2, reason="promote")
        registry.create_model(charlie, tenant_b, "bert")
    client_for(root).post("/api/v1/clusters/", {"name": "gpu-west", "kind": "static"})
    return model


def audit_list(client, **params) -> list[dict]:
    response = client.get("/api/v1/audit-events/", params)
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def test_the_audit_log_filters_by_verb(client_for, bob, trail):
    [moved] = audit_list(client_for(bob), verb="moved")

    assert moved["object_type"] == "rollouts.alias"
    assert moved["before"] == {"version": 1}
    assert moved["after"] == {"version": 2}
    assert moved["reason"] == "promote"
    assert moved["actor_label"] == "alice"
    assert moved["tenant"] == "tenant-a"


def test_the_audit_log_filters_by_actor(client_for, bob, trail):
    rows = audit_list(client_for(bob), actor="dav")

    assert [row["verb"] for row in rows] == ["registered", "registered", "created"]
    assert {row["actor_label"] for row in rows} == {"dave"}


def test_the_audit_log_filters_by_object_type(client_for, bob, trail):
    rows = audit_list(client_for(bob), object_type="rollouts.alias")

    assert [row["verb"] for row in rows] == ["moved", "created"]


def test_the_audit_log_filters_by_since_and_until(client_for, bob, trail):
    client = client_for(bob)

    since = audit_list(client, since=(START + timedelta(hours=2)).isoformat())
    window = audit_list(client, since=(START + timedelta(hours=1)).isoformat(),
                        until=(START + timedelta(hours=3)).isoformat())

    assert [row["verb"] for row in since] == ["moved", "registered", "created"]
    assert [(row["verb"], row["object_type"]) for row in window] == [
        ("created", "rollouts.alias"), ("registered", "rollouts.modelversion"),
    ]


def test_the_audit_log_shows_members_only_their_tenant(client_for, bob, charlie, trail):
    bobs = audit_list(client_for(bob))
    charlies = audit_list(client_for(charlie))

    assert {row["tenant"] for row in bobs} == {"tenant-a"}
    assert len(bobs) == 5
    assert [(row["tenant"], row["verb"]) for row in charlies] == [("tenant-b", "created")]


def test_platform_admins_see_platform_level_events_and_filter_by_tenant(client_for, root, trail):
    client = client_for(root)

    everything = audit_list(client)
    tenant_b = audit_list(client, tenant="tenant-b")

    assert len(everything) == 7
    [platform] = [row for row in everything if row["tenant"] is None]
    assert (platform["verb"], platform["object_type"], platform["actor_label"]) == (
        "created", "fleet.cluster", "root"
    )
    assert platform["after"]["name"] == "gpu-west"
    assert [row["object_repr"] for row in tenant_b] == ["tenant-b/bert"]


def test_an_approval_decision_is_in_the_audit_log(client_for, bob, dave, erin, model_a):
    version = ModelVersionFactory(model=model_a)
    approvals.request_approval(dave, version, reason="ready")
    approvals.approve(erin, version, reason="benchmarks fine")

    rows = audit_list(client_for(bob), object_type="rollouts.modelversion")

    assert [(row["verb"], row["actor_label"], row["reason"]) for row in rows] == [
        ("approved", "erin", "benchmarks fine"), ("requested_approval", "dave", "ready"),
    ]
    assert rows[0]["before"] == {"status": "pending_approval"}
    assert rows[0]["after"] == {"status": "approved"}


# --- one way to name things: ids or names, in bodies and filters; nothing sent is dropped --


@pytest.mark.parametrize("ref", ["id", "name"])
def test_a_deployment_takes_its_model_and_cluster_by_id_or_name(client_for, dave, model_a,
                                                                cluster, ref):
    model, where = (model_a.pk, cluster.pk) if ref == "id" else ("model-a", "gpu-east")
    client = client_for(dave)

    response = client.post("/api/v1/deployments/", {"name": "resnet", "model": model,
                                                    "cluster": where})
    listed = client.get("/api/v1/deployments/", {"model": model, "cluster": where}).json()

    assert response.status_code == 201, response.content
    assert (response.json()["model"], response.json()["cluster"]) == (model_a.pk, "gpu-east")
    assert [d["name"] for d in listed["results"]] == ["resnet"]


def test_versions_and_aliases_filter_by_model_name_as_by_id(client_for, dave, model_a, model_b):
    client = client_for(dave)
    client.post("/api/v1/versions/", {"model": "model-a", **version_data()})

    by_name = client.get("/api/v1/versions/", {"model": "model-a"}).json()
    by_id = client.get("/api/v1/versions/", {"model": model_a.pk}).json()
    foreign = client.get("/api/v1/versions/", {"model": "model-b"}).json()

    assert [v["id"] for v in by_name["results"]] == [v["id"] for v in by_id["results"]] != []
    assert foreign["count"] == 0


@pytest.mark.parametrize(
    ("method", "path", "body", "refused"),
    [
        ("post", "models/", {"name": "m", "owner": "x"}, {"owner": ["unknown field"]}),
        ("patch", "models/{model}/", {"tenant": "tenant-b"}, {"tenant": None}),
        ("patch", "models/{model}/", {"tenant": ""}, {"tenant": None}),
        ("patch", "models/{model}/", {"latest_version": 3},
         {"latest_version": ["read-only; leave it out"]}),
        ("post", "deployments/", {"name": "d", "model": "model-a", "cluster": "gpu-east",
                                  "slo_target": 5}, {"slo_target": ["unknown field"]}),
        ("post", "deployments/", {"name": "d", "model": "model-a", "cluster": "gpu-east",
                                  "slo_status": "ok"}, {"slo_status": ["read-only; leave it out"]}),
        ("post", "loads/", {"deployment": 1, "version": 1, "force": True},
         {"force": ["unknown field"]}),
        ("post", "versions/{version}/approve/", {"reasons": "x"}, {"reasons": ["unknown field"]}),
    ],
)
def test_fields_that_would_be_dropped_are_refused_by_name(client_for, dave, alice, model_a,
                                                          cluster, method, path, body, refused):
    version = ModelVersionFactory(model=model_a, version=1)
    url = "/api/v1/" + path.format(model=model_a.pk, version=version.pk)

    response = getattr(client_for(dave), method)(url, body)

    assert response.status_code == 400, response.content
    assert list(response.json()) == list(refused)
    for key, message in refused.items():
        if message is not None:
            assert response.json()[key] == message
    assert fresh_model(model_a).tenant.slug == "tenant-a"


def fresh_model(model: Model) -> Model:
    return Model.objects.select_related("tenant").get(pk=model.pk)


def test_an_alias_cannot_move_to_another_model(client_for, dave, model_a, tenant_a):
    other = ModelFactory(tenant=tenant_a, name="other")
    ModelVersionFactory(model=other, version=1)
    alias = AliasFactory(model=model_a, version=ModelVersionFactory(model=model_a, version=1))

    response = client_for(dave).put(f"/api/v1/aliases/{alias.pk}/",
                                    {"model": other.pk, "name": "staging", "version": 1})

    assert response.status_code == 400
    assert response.json() == {"model": ["an alias cannot move to another model"]}
    assert fresh_alias(alias).model_id == model_a.pk
