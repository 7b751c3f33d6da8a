"""What the schema says of the API's inputs is what the API does: list parameters (filters,
ordering, pages) refuse what they cannot read with a 400 naming the parameter, instead of
ignoring it; bodies refuse what DRF would silently drop; and the schema states each rule."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
from drf_spectacular.generators import SchemaGenerator
from jsonschema import Draft202012Validator
from rest_framework.test import APIClient

from fleet import audit
from fleet.models import Membership
from fleet.tenancy import tokens
from rollouts.models import Model, ModelLoad
from tests.api.test_schema_fuzz import refused_only_for_what_no_schema_states
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)


def client_of(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def assert_refused(response, field: str, *words: str) -> str:
    assert response.status_code == 400, (response.status_code, response.content[:300])
    body = response.json()
    assert list(body) == [field], body
    text = " ".join(body[field])
    for word in words:
        assert word in text, body
    return text


@pytest.fixture(scope="module")
def schema(django_db_blocker) -> dict:
    with django_db_blocker.unblock():
        generated = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(json.dumps(generated, default=str))


def parameter(schema: dict, path: str, name: str, method: str = "get") -> dict:
    [found] = [p for p in schema["paths"][path][method].get("parameters", []) if p["name"] == name]
    return found


@pytest.fixture
def world(tenant_a):
    cluster = ClusterFactory(name="local")
    server = InferenceServerFactory(cluster=cluster, name="triton-1")
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    versions = [ModelVersionFactory(model=model, version=n) for n in (1, 2, 3)]
    prod = DeploymentFactory(model=model, cluster=cluster, name="fraud-prod", production=True)
    canary = DeploymentFactory(model=model, cluster=cluster, name="fraud-canary")
    for deployment in (prod, canary):
        deployment.servers.set([server])
    for deployment, state in ((prod, ModelLoad.State.READY), (canary, ModelLoad.State.FAILED)):
        ModelLoad.objects.create(tenant=tenant_a, deployment=deployment, server=server,
                                 version=versions[0], state=state)
    return {"model": model, "prod": prod, "canary": canary, "cluster": cluster}


def names(response) -> list[str]:
    assert response.status_code == 200, response.content[:300]
    return [row.get("name") for row in response.json()["results"]]


# --- filters --------------------------------------------------------------------------------------


def test_a_boolean_filter_reads_true_and_false_and_refuses_anything_else(alice, world, schema):
    client = client_of(alice)

    assert names(client.get("/api/v1/deployments/", {"production": "true"})) == ["fraud-prod"]
    assert names(client.get("/api/v1/deployments/", {"production": "false"})) == ["fraud-canary"]
    for junk in ("null", "yes", "True", ""):
        assert_refused(client.get("/api/v1/deployments/", {"production": junk}), "production")
    assert parameter(schema, "/api/v1/deployments/", "production")["schema"]["type"] == "boolean"


def test_a_whole_number_filter_refuses_fractions_and_other_spellings(alice, world, schema):
    client = client_of(alice)

    kept = client.get("/api/v1/versions/", {"version__lte": "2"})

    assert [row["version"] for row in kept.json()["results"]] == [2, 1]
    assert client.get("/api/v1/versions/", {"version__lte": "2.0"}).json() == kept.json()
    for junk in ("0.5", "2.01", "1_000", " 2", "²", "", "1e2", "99999999999999999999"):
        assert_refused(client.get("/api/v1/versions/", {"version__lte": junk}), "version__lte")
    stated = parameter(schema, "/api/v1/versions/", "version__lte")["schema"]
    assert stated == {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}


def test_an_empty_date_time_or_choice_is_refused_and_empty_text_is_no_filter(alice, tenant_a):
    client = client_of(alice)
    audit.record(alice, "created", tenant_a, tenant=tenant_a)

    assert_refused(client.get("/api/v1/audit-events/", {"until": ""}), "until", "give a value")
    assert_refused(client.get("/api/v1/clusters/", {"kind": ""}), "kind", "give a value")
    assert len(client.get("/api/v1/audit-events/", {"actor": ""}).json()["results"]) == 1


def test_the_console_audit_form_still_reads_empty_fields_as_no_filter(alice, tenant_a):
    audit.record(alice, "created", tenant_a, tenant=tenant_a)
    client = APIClient()
    client.force_login(alice)

    page = client.get("/audit/", {"tenant": "", "verb": "", "actor": "", "since": "", "until": ""})

    assert page.status_code == 200
    assert b"created" in page.content


def test_a_list_of_choices_checks_each_one(alice, world, schema):
    client = client_of(alice)

    both = client.get("/api/v1/loads/", {"state__in": "ready,failed"})

    assert len(both.json()["results"]) == 2  # loads page by cursor: no count
    assert_refused(client.get("/api/v1/loads/", {"state__in": "ready,bogus"}), "state__in")
    assert_refused(client.get("/api/v1/loads/", {"state__in": "ready,"}), "state__in", "empty item")
    assert_refused(client.get("/api/v1/loads/", {"state__in": ""}), "state__in", "give a value")
    stated = parameter(schema, "/api/v1/loads/", "state__in")
    assert stated["schema"]["minItems"] == 1 and "ready" in stated["schema"]["items"]["enum"]
    assert (stated["style"], stated["explode"]) == ("form", False)


def test_loads_filter_and_take_the_deployment_by_id_or_name(alice, world):
    client = client_of(alice)
    prod = world["prod"]

    by_name = client.get("/api/v1/loads/", {"deployment": "fraud-prod"})
    by_id = client.get("/api/v1/loads/", {"deployment": str(prod.pk)})
    nothing = client.get("/api/v1/loads/", {"deployment": "nope"})
    unknown = client.post("/api/v1/loads/", {"deployment": "nope", "version": 1}, format="json")
    as_float = client.post("/api/v1/loads/", {"deployment": float(prod.pk), "version": 9},
                           format="json")

    assert [row["deployment"] for row in by_name.json()["results"]] == ["fraud-prod"]
    assert by_id.json() == by_name.json()
    assert nothing.json()["results"] == []
    assert_refused(unknown, "deployment", "no deployment with name 'nope'")
    assert_refused(as_float, "version", "fraud-scorer has no version 9")  # 7.0 is id 7


# --- ordering -------------------------------------------------------------------------------------


def test_ordering_takes_the_listed_fields_and_refuses_others(alice, world, schema):
    client = client_of(alice)

    descending = client.get("/api/v1/deployments/", {"ordering": "-name"})
    two = client.get("/api/v1/deployments/", {"ordering": "production,name"})

    assert names(descending) == ["fraud-prod", "fraud-canary"]
    assert names(two) == ["fraud-canary", "fraud-prod"]
    text = assert_refused(client.get("/api/v1/clusters/", {"ordering": "?x"}), "ordering", "'?x'")
    assert "name" in text
    assert_refused(client.get("/api/v1/clusters/", {"ordering": ""}), "ordering", "give a value")
    assert_refused(client.get("/api/v1/clusters/", {"ordering": " name"}), "ordering")
    stated = parameter(schema, "/api/v1/deployments/", "ordering")
    assert {"name", "-name", "production"} <= set(stated["schema"]["items"]["enum"])
    assert (stated["style"], stated["explode"], stated["schema"]["minItems"]) == ("form", False, 1)


def test_fields_the_database_cannot_sort_by_are_not_offered(alice, tenant_a, schema):
    """A token's ``state`` is worked out in Python, a deployment's ``servers`` are many rows:
    neither is offered, and asking for one is a 400, not a database error."""
    client = client_of(alice)
    tokens.issue(alice, tenant_a, "ci", Membership.Role.DEPLOYER)

    token_terms = parameter(schema, "/api/v1/tokens/", "ordering")["schema"]["items"]["enum"]
    deployment_terms = parameter(schema, "/api/v1/deployments/", "ordering")["schema"]["items"]["enum"]

    assert "state" not in token_terms and "created_at" in token_terms
    assert "servers" not in deployment_terms
    assert_refused(client.get("/api/v1/tokens/", {"ordering": "state"}), "ordering")
    assert_refused(client.get("/api/v1/deployments/", {"ordering": "servers"}), "ordering")


# --- pages ----------------------------------------------------------------------------------------


def test_a_page_is_a_whole_number_from_one(alice, world, schema):
    client = client_of(alice)

    for junk in ("", "abc", "0", "-1", "1.5", "last"):
        assert_refused(client.get("/api/v1/models/", {"page": junk}), "page")
    past_the_end = client.get("/api/v1/models/", {"page": "2"})

    assert client.get("/api/v1/models/", {"page": "1"}).json()["count"] == 1
    assert client.get("/api/v1/models/", {"page": "1.0"}).json()["count"] == 1
    assert past_the_end.status_code == 404
    assert parameter(schema, "/api/v1/models/", "page")["schema"]["minimum"] == 1


def test_a_post_that_answers_a_list_takes_no_list_parameters_and_answers_no_page(schema):
    operation = schema["paths"]["/api/v1/loads/"]["post"]

    assert [p["name"] for p in operation.get("parameters", [])] == ["Idempotency-Key"]
    for code in ("200", "202"):
        answer = operation["responses"][code]["content"]["application/json"]["schema"]
        assert answer["type"] == "array"


def test_the_latency_window_states_its_bounds(alice, world, schema):
    client = client_of(alice)
    url = f"/api/v1/deployments/{world['prod'].pk}/latency/"

    assert_refused(client.get(url, {"window": "0"}), "window", "between 60 and 2592000")
    assert_refused(client.get(url, {"window": "9_00"}), "window", "number of seconds")
    stated = parameter(schema, "/api/v1/deployments/{id}/latency/", "window")["schema"]
    assert (stated["minimum"], stated["maximum"], stated["default"]) == (60, 2592000, 900)


# --- bodies ---------------------------------------------------------------------------------------


def test_an_empty_tenant_in_a_form_is_refused_not_read_as_left_out(alice, world):
    client = client_of(alice)
    model = world["model"]

    created = client.post("/api/v1/models/", {"name": "m2", "tenant": ""}, format="multipart")
    patched = client.patch(f"/api/v1/models/{model.pk}/", urlencode({"tenant": ""}),
                           content_type="application/x-www-form-urlencoded")
    as_json = client.patch(f"/api/v1/models/{model.pk}/", {"tenant": ""}, format="json")

    assert_refused(created, "tenant", "blank")
    assert_refused(patched, "tenant", "blank")
    assert_refused(as_json, "tenant")
    assert not Model.objects.filter(name="m2").exists()
    assert client.post("/api/v1/models/", {"name": "m2"}, format="multipart").status_code == 201


def test_an_error_rate_is_a_percentage_written_as_a_string(alice, world, schema):
    client = client_of(alice)
    url = f"/api/v1/deployments/{world['canary'].pk}/"

    for junk in (0.5, "", "-1", "100.01", "007.5", " 1"):
        assert_refused(client.patch(url, {"slo_error_rate": junk}, format="json"), "slo_error_rate")
    kept = client.patch(url, {"slo_error_rate": "2.5"}, format="json")

    assert kept.json()["slo_error_rate"] == "2.50"
    pattern = schema["components"]["schemas"]["PatchedDeploymentRequest"]["properties"][
        "slo_error_rate"]["pattern"]
    assert pattern == "^(100(\\.0{0,2})?|[0-9]{1,2}(\\.[0-9]{0,2})?)$"


def test_request_bodies_are_documented_as_json_and_integers_within_64_bits(schema):
    bodies = [
        operation["requestBody"]["content"]
        for item in schema["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict) and "requestBody" in operation
    ]
    version = schema["components"]["schemas"]["ModelVersionRequest"]["properties"]

    assert bodies and all(list(content) == ["application/json"] for content in bodies)
    assert version["model"]["oneOf"][0]["maximum"] == 2**63 - 1
    assert version["labels"]["additionalProperties"] == {"type": "string"}


def test_the_triton_config_schema_is_tritons_model_config(schema):
    """What the schema accepts is what registering a version accepts, and the other way round,
    for a few configs on each side of the line."""
    components = schema["components"]["schemas"]
    config_schema = {"$ref": "#/components/schemas/TritonModelConfig", "components": {
        "schemas": components}}
    validator = Draft202012Validator(config_schema)
    good = [{}, {"max_batch_size": 8, "instance_group": [{"kind": "KIND_CPU", "count": 2}],
                 "parameters": {"k": {"string_value": "v"}}}]
    bad = [{"max_batch_sizes": 8}, {"instance_group": [{"count": 0}]},
           {"instance_group": [{"kind": "KIND_NOPE"}]}, {"max_batch_size": 2**40},
           {"version_policy": {"latest": {"num_versions": 1}}},
           {"dynamic_batching": {}, "sequence_batching": {}}]

    from rollouts.registry import triton_config

    for config in good:
        assert validator.is_valid(config), config
        assert triton_config.problems(config, model_name=None, backend="python") == []
    for config in bad:
        assert not validator.is_valid(config), config
        assert triton_config.problems(config, model_name=None, backend="python"), config


# --- the fuzz's oracle ----------------------------------------------------------------------------


def test_the_fuzz_forgives_a_400_only_for_what_no_schema_states(alice, world):
    """The fuzz's own check (tests/api/test_schema_fuzz.py) reads the API's real messages: an
    unknown reference, a NUL character or a past moment alone is forgiven; mixed with any
    other error, or any other error alone, it is not."""
    client = client_of(alice)
    deployment = {"name": "d2", "cluster": "local", "model": "fraud-scorer"}
    past = datetime(2000, 1, 1, tzinfo=UTC).isoformat()

    forgiven = [
        client.post("/api/v1/deployments/", {**deployment, "model": "nope"}, format="json"),
        client.post("/api/v1/deployments/", {**deployment, "cluster": 999999}, format="json"),
        client.post("/api/v1/tokens/", {"name": "t", "tenant": "nope"}, format="json"),
        client.post("/api/v1/tokens/", {"name": "t", "expires_at": past}, format="json"),
        client.post("/api/v1/loads/", {"deployment": "fraud-prod", "version": 9}, format="json"),
        client.post("/api/v1/models/", {"name": "a\x00b"}, format="json"),
    ]
    not_forgiven = [
        client.post("/api/v1/deployments/", {**deployment, "model": "nope", "slo_error_rate": "x"},
                    format="json"),
        client.post("/api/v1/deployments/", {**deployment, "name": "Not A Slug"}, format="json"),
        client.get("/api/v1/clusters/", {"ordering": "nope"}),
    ]

    for response in forgiven:
        assert response.status_code == 400, response.content
        assert refused_only_for_what_no_schema_states(response), response.json()
    for response in not_forgiven:
        assert response.status_code == 400, response.content
        assert not refused_only_for_what_no_schema_states(response), response.json()
