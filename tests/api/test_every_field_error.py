"""A request with several fields wrong is answered once, naming every one of them: a 400 of
``{field: [message], ...}``, the shape of a single field's refusal, and nothing is made."""

from __future__ import annotations

import pytest

from console.exceptions import Conflict, DomainError, FieldErrors
from rollouts.models import BenchmarkJob, Rollout
from tests.api.test_benchmarks_api import Setup
from tests.api.test_rollouts_api import Plain, api_as


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    from tests.fixtures import sent_tasks

    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_rollout", lambda pk: None)
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_benchmark", lambda pk: None)


def test_a_canary_with_four_fields_wrong_names_all_four(dave, tenant_a):
    plain = Plain(tenant_a)
    response = api_as(dave).post("/api/v1/rollouts/", {
        "deployment": plain.deployment.pk, "version": 9, "sticky_header": "not a header!",
        "steps": [{"set_weight": 500}], "analysis": {"alpha": 7},
    }, format="json")

    assert response.status_code == 400, response.content
    body = response.json()
    assert sorted(body) == ["analysis", "steps", "sticky_header", "version"], body
    assert all(isinstance(messages, list) and messages for messages in body.values()), body
    assert "no version 9" in body["version"][0]
    assert body["steps"][0].startswith("steps[0]")
    assert body["analysis"][0].startswith("analysis.alpha")
    assert not Rollout.objects.exists()


def test_an_ab_split_with_three_fields_wrong_names_all_three(dave, tenant_a):
    plain = Plain(tenant_a)
    response = api_as(dave).post("/api/v1/rollouts/", {
        "deployment": plain.deployment.pk, "strategy": "ab", "variants": [
            {"version": 1, "weight": 70}, {"version": 2, "weight": 20}],
        "duration_s": -5, "servers": ["nowhere"],
    }, format="json")

    assert response.status_code == 400, response.content
    assert sorted(response.json()) == ["duration_s", "servers", "variants"], response.json()
    assert not Rollout.objects.exists()


def test_one_wrong_field_is_answered_as_before(dave, tenant_a):
    plain = Plain(tenant_a)
    response = api_as(dave).post("/api/v1/rollouts/", {
        "deployment": plain.deployment.pk, "version": 2, "steps": [{"set_weight": 500}],
    }, format="json")

    assert response.status_code == 400
    assert list(response.json()) == ["steps"]


def test_a_benchmark_with_its_domain_fields_wrong_names_each(dave, tenant_a):
    setup = Setup(tenant_a, two=True)
    response = api_as(dave).post("/api/v1/benchmarks/", {
        "deployment": setup.deployment.pk, "version": 7,
        "slo": {"p99": 5}, "request": {"inputs": "x"},
    }, format="json")

    assert response.status_code == 400, response.content
    body = response.json()
    # No version 7; two servers and none named; the SLO's unknown field. The request's inputs
    # are checked against the version's protocol, so they wait for a version that exists.
    assert sorted(body) == ["server", "slo", "version"], body
    assert not BenchmarkJob.objects.exists()


def test_a_body_refused_in_shape_and_in_the_domain_names_both_at_once(dave, tenant_a):
    """GIVEN a rollout whose version is not a number (the body's shape) and whose steps and
    sticky header the domain refuses THEN one 400 names all three."""
    plain = Plain(tenant_a)
    response = api_as(dave).post("/api/v1/rollouts/", {
        "deployment": plain.deployment.pk, "version": "two", "sticky_header": "not a header!",
        "steps": [{"set_weight": 500}],
    }, format="json")

    assert response.status_code == 400, response.content
    body = response.json()
    assert sorted(body) == ["steps", "sticky_header", "version"], body
    assert body["version"] == ["A valid integer is required."]  # the shape's, not the domain's
    assert not Rollout.objects.exists()


def test_a_benchmark_refused_in_shape_and_in_the_domain_names_both_at_once(dave, tenant_a):
    setup = Setup(tenant_a)
    response = api_as(dave).post("/api/v1/benchmarks/", {
        "deployment": setup.deployment.pk, "duration_s": 0, "warmup_s": -1,
        "slo": {"p99": 5}, "server": "nowhere",
    }, format="json")

    assert response.status_code == 400, response.content
    assert sorted(response.json()) == ["duration_s", "server", "slo", "version", "warmup_s"], (
        response.json())
    assert not BenchmarkJob.objects.exists()


def test_without_a_deployment_the_shape_alone_is_answered(dave, tenant_a):
    response = api_as(dave).post("/api/v1/rollouts/", {"deployment": 10**6, "version": "two"},
                                 format="json")

    assert response.status_code == 400
    assert sorted(response.json()) == ["deployment", "version"]


def test_a_deployment_with_an_unknown_server_and_other_fields_wrong_names_them_all(dave, tenant_a):
    plain = Plain(tenant_a)
    response = api_as(dave).post("/api/v1/deployments/", {
        "name": "scorer-2", "model": plain.model.name, "cluster": plain.cluster.name,
        "servers": [plain.a.name, "nowhere"], "slo_p99_ms": -5, "priority": "high",
    }, format="json")

    assert response.status_code == 400, response.content
    body = response.json()
    assert sorted(body) == ["priority", "servers", "slo_p99_ms"], body
    assert body["servers"] == [f"cluster {plain.cluster.name} has no server named nowhere"]


def test_a_load_of_an_unknown_version_onto_an_unknown_server_names_both(dave, tenant_a):
    plain = Plain(tenant_a)
    response = api_as(dave).post("/api/v1/loads/", {
        "deployment": plain.deployment.pk, "version": 999, "servers": [plain.a.name, "nowhere"],
    }, format="json")

    assert response.status_code == 400, response.content
    assert response.json() == {
        "version": [f"{plain.model.name} has no version 999"],
        "servers": [f"deployment {plain.deployment.name} has no server named nowhere"],
    }


def test_an_unknown_key_does_not_hide_the_other_fields_refusals(dave, tenant_a):
    setup = Setup(tenant_a)
    for deployment, names in [(setup.deployment.pk, ["colour", "duration_s", "slo"]),
                              ("0", ["colour", "deployment", "duration_s"])]:
        response = api_as(dave).post("/api/v1/benchmarks/", {
            "deployment": deployment, "version": 1, "duration_s": 0, "slo": {"p99": 5},
            "colour": "blue"}, format="json")

        assert response.status_code == 400, response.content
        assert sorted(response.json()) == names, response.json()


def test_gathering_keeps_input_refusals_and_lets_conflicts_through():
    errors = FieldErrors()
    with errors.gather():
        raise DomainError("a positive number", field="duration_s")
    with errors.gather():
        raise DomainError("unknown version", field="version")
    with errors.gather():
        raise DomainError("steps[1]: a weight from 0 to 100", field="steps[1].set_weight")
    assert errors.refused("steps") and errors.refused("version") and not errors.refused("slo")
    with pytest.raises(Conflict), errors.gather():
        raise Conflict("archived", field="deployment")
    with pytest.raises(DomainError) as raised:
        errors.raise_any()
    assert raised.value.as_dict() == {
        "duration_s": ["a positive number"], "version": ["unknown version"],
        "steps[1].set_weight": ["steps[1]: a weight from 0 to 100"]}
    assert raised.value.status_code == 400
    FieldErrors().raise_any()  # nothing gathered: nothing raised
