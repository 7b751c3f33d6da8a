"""Hostile input to the API: every one is a 4xx in the API's error shape naming what is at
fault, never a 500 (a RecursionError, a DataError from PostgreSQL, an HTML error page).

Run on SQLite and PostgreSQL: NUL characters and out-of-range time-zone offsets fail only on
PostgreSQL, which refuses them in a query.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
import time_machine
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.middleware.csrf import _get_failure_view
from django.test import Client, RequestFactory
from rest_framework.test import APIClient

from console import parsers
from fleet import audit
from fleet.models import AuditEvent, Cluster, Quota
from rollouts.canary import requests as rollout
from rollouts.models import Model, ModelLoad, ModelVersion, Rollout
from rollouts.registry import versions as registry
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
    QuotaFactory,
)
from tests.fixtures import sent_tasks

SHA = "1" * 64
NUL = "\x00"


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def client_of(user) -> APIClient:
    """A client that answers what the server answers, 500s included, instead of raising."""
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(user)
    return client


@pytest.fixture
def model_a(tenant_a):
    return ModelFactory(tenant=tenant_a, name="model-a")


@pytest.fixture
def cluster():
    return ClusterFactory(name="local")


def version_body(model: Model, number: int = 1, **extra) -> dict:
    return {
        "model": model.pk, "version": number, "artifact_uri": f"s3://models/model-a/{number}.tgz",
        "sha256": SHA, "size_bytes": 2048, "runtime": "triton", "backend": "python", **extra,
    }


def post_json(client: APIClient, url: str, text: str, method: str = "post"):
    return getattr(client, method)(url, text, content_type="application/json")


def assert_refused(response, field: str, *words: str, status: int = 400) -> list[str]:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"] == "application/json", response.content[:300]
    body = response.json()
    assert list(body) == [field], body
    text = " ".join(body[field])
    for word in words:
        assert word in text, body
    return body[field]


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


# --- JSON nested deeply -----------------------------------------------------------------------


def test_json_nested_a_thousand_deep_in_triton_config_is_a_400_naming_the_path(dave, model_a):
    body = json.dumps(version_body(model_a))[:-1] + ', "triton_config": {"parameters": ' + nested(1000) + "}}"

    response = post_json(client_of(dave), "/api/v1/versions/", body)

    [message] = assert_refused(response, "triton_config", "nested deeper than 64 levels")
    assert message.startswith("triton_config.parameters[0][0]")
    assert not ModelVersion.objects.exists()


@pytest.mark.parametrize(
    ("url", "method", "field"),
    [
        ("/api/v1/models/", "post", "description"),
        ("/api/v1/deployments/", "post", "servers"),
        ("/api/v1/tokens/", "post", "name"),
        ("/api/v1/loads/", "post", "servers"),
        ("/api/v1/aliases/", "post", "reason"),
        ("/api/v1/quotas/", "post", "units"),
        ("/api/v1/rollouts/", "post", "steps"),
        ("/api/v1/benchmarks/", "post", "configs"),
    ],
)
def test_deep_json_is_a_400_on_every_endpoint_that_takes_a_body(alice, root, url, method, field):
    client = client_of(root if "quotas" in url else alice)

    response = post_json(client, url, json.dumps({"name": "x"})[:-1] + f', "{field}": {nested(5000)}}}')

    assert_refused(response, field, "nested deeper than 64 levels")


def test_a_deep_array_as_the_whole_body_is_named_body(dave):
    response = post_json(client_of(dave), "/api/v1/models/", nested(2000))

    assert_refused(response, "body", "nested deeper than 64 levels")


def test_nesting_is_measured_outside_strings_and_up_to_the_limit():
    at_limit = nested(parsers.MAX_DEPTH)
    assert parsers.loads(at_limit) is not None
    with pytest.raises(parsers.InputRefused) as refused:
        parsers.loads('{"a": ' + nested(parsers.MAX_DEPTH) + "}")
    assert refused.value.where == "a" + "[0]" * (parsers.MAX_DEPTH - 1)
    # Brackets and escaped quotes inside strings are text, not nesting.
    text = json.dumps({"note": "[" * 500 + '\\"{' * 300, "list": [1, [2, {"k": [3]}]]})
    assert parsers.loads(text)["list"] == [1, [2, {"k": [3]}]]


def test_the_path_names_keys_and_indexes_of_the_levels_above():
    text = '{"a": [0, 1, {"b\\"c": ' + nested(parsers.MAX_DEPTH) + "}]}"

    with pytest.raises(parsers.InputRefused) as refused:
        parsers.loads(text)

    assert refused.value.where.startswith('a[2].b"c[0][0]')
    assert refused.value.field == "a"


# --- numbers no field stores ---------------------------------------------------------------------


@pytest.mark.parametrize("field", ["size_bytes", "gpus", "estimated_gpu_memory_mib", "version"])
@pytest.mark.parametrize("number", [str(10**30), str(10**400), "1e400", "-1e400", str(2**64)])
def test_a_huge_number_in_a_version_is_a_400_naming_the_field(dave, model_a, field, number):
    body = json.dumps(version_body(model_a))[:-1] + f', "{field}": {number}}}'

    response = post_json(client_of(dave), "/api/v1/versions/", body)

    assert_refused(response, field)
    assert not ModelVersion.objects.exists()


@pytest.mark.parametrize("number", [str(10**30), "1e400", str(2**63)])
def test_a_huge_number_in_a_quota_is_a_400_naming_the_field(root, tenant_a, number):
    client = client_of(root)
    quota = QuotaFactory(tenant=tenant_a, device_class="cpu")

    created = post_json(client, "/api/v1/quotas/",
                        '{"tenant": "tenant-a", "device_class": "gpu", "memory_mib": 1, '
                        f'"units": {number}}}')
    changed = post_json(client, f"/api/v1/quotas/{quota.pk}/", f'{{"units": {number}}}', "patch")

    assert_refused(created, "units")
    assert_refused(changed, "units")
    assert Quota.objects.get(pk=quota.pk).units == quota.units


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_constants_are_refused(dave, constant):
    response = post_json(client_of(dave), "/api/v1/models/", f'{{"name": "m", "x": {constant}}}')

    assert response.status_code == 400
    assert "detail" in response.json()


def test_a_huge_number_deep_in_triton_config_names_its_path(dave, model_a):
    body = json.dumps(version_body(model_a, triton_config={"max_batch_size": 1}))
    body = body.replace('"max_batch_size": 1', f'"max_batch_size": {10**40}')

    response = post_json(client_of(dave), "/api/v1/versions/", body)

    [message] = assert_refused(response, "triton_config", "out of range")
    assert message.startswith("triton_config.max_batch_size: ")


# --- NUL characters ------------------------------------------------------------------------------


@pytest.fixture
def writable(tenant_a, model_a, cluster):
    """One of each object a tenant user or a platform admin can change."""
    return {
        "model": model_a,
        "deployment": DeploymentFactory(model=model_a, cluster=cluster, name="dep-a"),
        "quota": QuotaFactory(tenant=tenant_a, device_class="cpu"),
    }


NUL_WRITES = [
    # (method, url, body, field) — the URL may name an object of ``writable``.
    ("post", "/api/v1/models/", {"name": "a\x00b"}, "name"),
    ("post", "/api/v1/models/", {"name": "ok", "tenant": "tenant-a\x00"}, "tenant"),
    ("post", "/api/v1/models/", {"name": "ok", "description": "\x00"}, "description"),
    ("patch", "/api/v1/models/{model}/", {"tenant": "\x00"}, "tenant"),
    ("patch", "/api/v1/models/{model}/", {"description": "x\x00"}, "description"),
    ("post", "/api/v1/deployments/", {"name": "d2", "model": "{model}", "cluster": "local\x00"}, "cluster"),
    ("post", "/api/v1/deployments/", {"name": "d\x002", "model": "{model}", "cluster": "local"}, "name"),
    ("post", "/api/v1/deployments/", {"name": "d2", "model": "{model}", "cluster": "local", "servers": ["s\x00"]}, "servers"),
    ("patch", "/api/v1/deployments/{deployment}/", {"cluster": "\x00"}, "cluster"),
    ("patch", "/api/v1/deployments/{deployment}/", {"description": "\x00"}, "description"),
    ("post", "/api/v1/tokens/", {"name": "ci", "tenant": "tenant-a\x00"}, "tenant"),
    ("post", "/api/v1/tokens/", {"name": "ci\x00"}, "name"),
    ("post", "/api/v1/tokens/", {"name": "ci", "role": "admin\x00"}, "role"),
    ("post", "/api/v1/quotas/", {"tenant": "tenant-a\x00", "device_class": "gpu", "units": 1, "memory_mib": 1}, "tenant"),
    ("post", "/api/v1/quotas/", {"tenant": "tenant-a", "device_class": "g\x00", "units": 1, "memory_mib": 1}, "device_class"),
    ("patch", "/api/v1/quotas/{quota}/", {"tenant": "\x00"}, "tenant"),
    ("post", "/api/v1/versions/", {"labels": {"team\x00": "x"}}, "labels"),
    ("post", "/api/v1/versions/", {"labels": {"team": "x\x00"}}, "labels"),
    ("post", "/api/v1/versions/", {"git_sha": "\x00"}, "git_sha"),
    ("post", "/api/v1/loads/", {"deployment": "{deployment}", "alias": "\x00"}, "alias"),
    ("post", "/api/v1/aliases/", {"model": "{model}", "name": "\x00", "version": 1}, "name"),
    ("post", "/api/v1/rollouts/", {"deployment": "{deployment}", "version": 2, "reason": "\x00"}, "reason"),
    ("post", "/api/v1/rollouts/", {"deployment": "{deployment}", "version": 2, "alias": "p\x00"}, "alias"),
    ("post", "/api/v1/rollouts/", {"deployment": "d\x00", "version": 2}, "deployment"),
    ("post", "/api/v1/rollouts/", {"deployment": "{deployment}", "steps": [{"set_weight\x00": 5}]}, "steps"),
    ("post", "/api/v1/benchmarks/", {"deployment": "{deployment}", "version": 1, "server": "s\x00"}, "server"),
    ("post", "/api/v1/benchmarks/", {"deployment": "d\x00", "version": 1}, "deployment"),
    ("post", "/api/v1/benchmarks/", {"deployment": "{deployment}", "version": 1, "protocol": "triton_http\x00"}, "protocol"),
    ("post", "/api/v1/benchmarks/", {"deployment": "{deployment}", "version": 1, "configs": [{"max_batch_size\x00": 8}]}, "configs"),
    ("post", "/api/v1/benchmarks/", {"deployment": "{deployment}", "version": 1, "request": {"inputs": [{"name": "x\x00"}]}}, "request"),
]


def _fill(value, objects):
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return objects[value[1:-1]].pk
    if isinstance(value, dict):
        return {k: _fill(v, objects) for k, v in value.items()}
    return value


@pytest.mark.parametrize(("method", "url", "body", "field"), NUL_WRITES,
                         ids=[f"{m}-{u.split('/')[3]}-{f}" for m, u, _, f in NUL_WRITES])
@pytest.mark.parametrize("encoding", ["json", "form"])
def test_a_nul_character_in_a_body_is_a_400_naming_the_field(
    alice, root, writable, method, url, body, field, encoding
):
    client = client_of(root if "quotas" in url else alice)
    url = url.format(**{name: obj.pk for name, obj in writable.items()})
    body = _fill(body, writable)
    if url == "/api/v1/versions/":
        body = {**version_body(writable["model"]), **body}
    if encoding == "form":
        if any(isinstance(v, dict | list) for v in body.values()):
            pytest.skip("nested values have no form encoding")
        if method == "post":  # multipart: DRF's MultiPartParser
            response = client.post(url, body, format="multipart")
        else:  # urlencoded: DRF's FormParser (Django fills request.POST for POST only)
            response = client.patch(url, urlencode(body),
                                    content_type="application/x-www-form-urlencoded")
    else:
        response = getattr(client, method)(url, body, format="json")

    assert_refused(response, field, "NUL characters are not allowed")


NUL_QUERIES = [
    ("/api/v1/models/", "name"), ("/api/v1/models/", "tenant__slug"),
    ("/api/v1/versions/", "model__name"), ("/api/v1/deployments/", "tenant__slug"),
    ("/api/v1/loads/", "deployment__name"), ("/api/v1/loads/", "state__in"),
    ("/api/v1/tokens/", "tenant__slug"), ("/api/v1/quotas/", "tenant__slug"),
    ("/api/v1/quotas/", "device_class"), ("/api/v1/servers/", "cluster"),
    ("/api/v1/clusters/", "name"), ("/api/v1/gpus/", "device_class"),
    ("/api/v1/audit-events/", "tenant"), ("/api/v1/audit-events/", "actor"),
    ("/api/v1/audit-events/", "verb"), ("/api/v1/tenants/", "slug"),
    ("/api/v1/aliases/", "name"), ("/api/v1/models/", "ordering"),
    ("/api/v1/benchmarks/", "deployment"), ("/api/v1/benchmarks/", "server"),
    ("/api/v1/benchmarks/", "model"), ("/api/v1/benchmarks/", "state__in"),
    ("/api/v1/benchmarks/compare/", "a"),
]


@pytest.mark.parametrize(("url", "param"), NUL_QUERIES)
def test_a_nul_character_in_a_query_parameter_is_a_400_naming_it(alice, url, param):
    response = client_of(alice).get(url, {param: "x\x00y"})

    assert_refused(response, param, "NUL characters are not allowed")


def test_a_nul_character_in_a_query_parameter_name_or_a_header_is_a_400(alice):
    client = client_of(alice)

    by_name = client.get("/api/v1/models/?na%00me=x")
    by_header = client.post("/api/v1/loads/", {}, format="json", HTTP_IDEMPOTENCY_KEY="k\x00")
    by_token = APIClient(raise_request_exception=False).get(
        "/api/v1/models/", HTTP_AUTHORIZATION="Bearer sy_abcdefgh_\x00"
    )

    assert_refused(by_name, "na\\u0000me", "NUL characters are not allowed")
    assert_refused(by_header, "header Idempotency-Key", "NUL characters are not allowed")
    assert_refused(by_token, "header Authorization", "NUL characters are not allowed")


def test_a_lone_surrogate_escape_is_a_400_naming_the_field(dave):
    response = post_json(client_of(dave), "/api/v1/models/", '{"name": "m", "description": "\\ud800"}')

    assert_refused(response, "description", "not valid Unicode")
    assert not Model.objects.exists()


def test_the_checks_leave_ordinary_input_alone(alice):
    client = client_of(alice)

    created = client.post("/api/v1/models/", {"name": "ok", "description": "tabs\tand ünïcode ✓ [{"},
                          format="json")
    listed = client.get("/api/v1/models/", {"name__icontains": "o"})

    assert created.status_code == 201, created.json()
    assert created.json()["description"] == "tabs\tand ünïcode ✓ [{"
    assert listed.json()["count"] == 1


# --- since/until on the audit log -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("param", "value", "words"),
    [
        ("since", "2026-01-01T00:00:00+20:00", ["+20:00", "out of range"]),
        ("until", "2026-01-01T00:00:00-16:00", ["-16:00", "out of range"]),
        ("since", "0001-01-01T00:00:00+05:00", ["out of range"]),
        ("until", "9999-12-31T23:00:00-05:00", ["out of range"]),
        ("since", "2026-13-45", ["valid date/time"]),
        ("until", "2026-02-30T00:00:00Z", ["valid date/time"]),
    ],
)
def test_since_and_until_out_of_range_are_a_400_naming_them(bob, param, value, words):
    response = client_of(bob).get("/api/v1/audit-events/", {param: value})

    assert_refused(response, param, *words)


def test_since_and_until_with_an_offset_are_compared_in_utc(alice, bob, tenant_a):
    with time_machine.travel(datetime(2026, 5, 1, 10, 0, tzinfo=UTC), tick=False):
        audit.record(alice, "created", tenant_a, tenant=tenant_a)
    client = client_of(bob)

    def count(**params) -> int:
        response = client.get("/api/v1/audit-events/", params)
        assert response.status_code == 200, response.json()
        return len(response.json()["results"])  # the audit log pages by cursor: no count

    # 10:00 UTC is 23:59 at +13:59 and 00:00 the next day at +14:00.
    assert count(since="2026-05-01T23:59:00+13:59") == 1
    assert count(since="2026-05-02T00:01:00+14:00") == 0
    assert count(until="2026-05-01T00:00:00-10:00") == 0
    assert count(until="2026-05-01T00:01:00-10:00") == 1
    assert count(since="0001-01-01T00:00:00Z", until="9999-12-31T23:59:59Z") == 1
    assert AuditEvent.objects.count() == 1


# --- errors from outside DRF answer JSON --------------------------------------------------------------


def test_an_unknown_api_path_is_a_json_404(alice):
    response = client_of(alice).get("/api/v1/no-such-thing/")

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found: no API endpoint at /api/v1/no-such-thing/"}


def test_an_unknown_console_path_is_still_an_html_404(client, alice):
    client.force_login(alice)

    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_a_body_over_the_upload_limit_is_a_json_413(settings, dave, model_a):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps(version_body(model_a, labels={"big": "x" * 2000}))

    response = post_json(client_of(dave), "/api/v1/versions/", body)

    assert response.status_code == 413
    assert response.json() == {"detail": "the request body is larger than 1000 bytes"}


def test_an_unexpected_exception_is_a_json_500_with_the_api_shape(monkeypatch, alice):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("rollouts.api.views.ModelViewSet.list", broken)

    response = client_of(alice).get("/api/v1/models/")

    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    assert list(response.json()) == ["detail"]
    assert "a bug" not in response.content.decode()


def test_a_suspicious_request_is_a_json_400(monkeypatch, alice):
    def suspicious(*args, **kwargs):
        raise SuspiciousOperation("forged")

    monkeypatch.setattr("rollouts.api.views.ModelViewSet.list", suspicious)

    response = client_of(alice).get("/api/v1/models/")

    assert response.status_code == 400
    assert response.json() == {"detail": "bad request"}


def test_a_csrf_failure_on_an_api_path_is_json_and_html_elsewhere(alice):
    failure_view = _get_failure_view()
    factory = RequestFactory()

    api = failure_view(factory.post("/api/v1/models/"), reason="CSRF token missing.")
    console = failure_view(factory.post("/fleet/tokens/new/"), reason="CSRF token missing.")

    assert api.status_code == 403
    assert json.loads(api.content) == {"detail": "CSRF Failed: CSRF token missing."}
    assert console.status_code == 403
    assert console["Content-Type"].startswith("text/html")


def test_a_session_post_without_csrf_token_is_a_json_403(alice):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(alice)

    response = client.post("/api/v1/models/", {"name": "m"}, format="json")

    assert response.status_code == 403
    assert response.json()["detail"].startswith("CSRF Failed")


# --- triton_config checked against Triton's ModelConfig when registered ---------------------------


@pytest.mark.parametrize(
    ("config", "path", "words"),
    [
        ({"bogus": 1}, "triton_config.bogus", "not a field of Triton's ModelConfig"),
        ({"instance_group": [{"count": 1, "kind": "KIND_X"}]}, "triton_config.instance_group[0].kind",
         "Invalid enum value KIND_X"),
        ({"instance_group": [{"count": 1, "colour": "red"}]}, "triton_config.instance_group[0].colour",
         "not a field"),
        ({"instance_group": {"count": 1}}, "triton_config.instance_group", "must be a list"),
        ({"instance_group": [{"count": "many"}]}, "triton_config.instance_group[0].count", "int"),
        ({"instance_group": [{"count": 0}]}, "triton_config.instance_group[0].count", "at least 1"),
        ({"instance_group": [{"count": 2**40}]}, "triton_config.instance_group[0].count", "out of range"),
        ({"max_batch_size": "eight"}, "triton_config.max_batch_size", "int"),
        ({"max_batch_size": 1.5}, "triton_config.max_batch_size", "integer"),
        ({"input": [{"name": "x", "dims": [1, "y"]}]}, "triton_config.input[0].dims[1]", "int"),
        ({"dynamic_batching": {"max_queue_delay_microseconds": -1}},
         "triton_config.dynamic_batching.max_queue_delay_microseconds", "out of range"),
        ({"parameters": {"k": {"string_value": 5}}}, "triton_config.parameters[k].string_value", ""),
        ({"parameters": {"k": "v"}}, "triton_config.parameters[k]", "must be an object"),
        ({"optimization": {"cuda": {"graphs": "yes"}}}, "triton_config.optimization.cuda.graphs",
         "true or false"),
        ({"name": "another-model"}, "triton_config.name", "must be the model's name"),
        ({"backend": "onnxruntime"}, "triton_config.backend", "differs from the version's backend"),
        ({"version_policy": {"latest": {"num_versions": 1}}}, "triton_config.version_policy",
         "set by Switchyard"),
    ],
)
def test_a_triton_config_triton_would_refuse_is_a_400_naming_its_path(dave, model_a, config, path, words):
    response = client_of(dave).post("/api/v1/versions/", version_body(model_a, triton_config=config),
                                    format="json")

    [message] = assert_refused(response, "triton_config", words)
    assert message.startswith(f"{path}: "), message
    assert not ModelVersion.objects.exists()


def test_the_configs_switchyard_ships_and_tests_with_are_valid(dave, model_a):
    configs = [
        {},
        {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]},  # local/demo.py
        {"instance_group": [{"count": 3, "kind": "KIND_CPU"}]},
        {"name": "model-a", "backend": "python", "max_batch_size": 8,
         "dynamic_batching": {"max_queue_delay_microseconds": "100"},
         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
         "parameters": {"EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env"}},
         "instanceGroup": [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}]},
    ]
    client = client_of(dave)

    for number, config in enumerate(configs, start=1):
        response = client.post("/api/v1/versions/", version_body(model_a, number, triton_config=config),
                               format="json")
        assert response.status_code == 201, (config, response.json())
    # The second is the demo's (local/demo.py); the factories' versions have none.
    ModelVersionFactory.build(model=model_a, version=99).full_clean(validate_constraints=False)


def test_the_domain_refuses_a_bad_triton_config_for_every_caller(dave, model_a):
    data = {k: v for k, v in version_body(model_a).items() if k != "model"}

    with pytest.raises(ValidationError) as refused:
        registry.register_version(dave, model_a, {**data, "triton_config": {"name": "other"}})

    assert list(refused.value.message_dict) == ["triton_config"]
    assert not ModelVersion.objects.exists()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"parameters": {"k": {"string_value": "a\x00"}}},
         "triton_config.parameters[k].string_value: NUL characters are not allowed"),
        ({"parameters": {"k\x00": {"string_value": "a"}}},
         "triton_config.parameters: NUL characters are not allowed in names"),
        ({"max_batch_size": 8, "name": "model-a"}, None),
    ],
)
def test_the_model_refuses_nul_characters_in_triton_config_the_parser_never_sees(model_a, config,
                                                                                  message):
    # The admin and the demo build versions without the API's parser.
    version = ModelVersionFactory.build(model=model_a, triton_config=config)

    if message is None:
        version.full_clean(validate_constraints=False)
        return
    with pytest.raises(ValidationError) as refused:
        version.full_clean(validate_constraints=False)
    assert refused.value.message_dict == {"triton_config": [message]}


def test_a_vllm_version_has_no_triton_config(dave, model_a):
    body = version_body(model_a, runtime="vllm", backend="", triton_config={"max_batch_size": 8})

    response = client_of(dave).post("/api/v1/versions/", body, format="json")

    assert_refused(response, "triton_config", "vLLM versions have no Triton config")


# --- labels: one rule in the model, used by the API -----------------------------------------------


@pytest.mark.parametrize(
    "labels", [{"team": 1}, ["team"], "team=vision", {"team": None}, {"": "x"}, {"team": {"a": "b"}}]
)
def test_labels_are_refused_by_the_model_as_by_the_api(dave, model_a, labels):
    version = ModelVersion(**{**version_body(model_a), "model": model_a, "labels": labels})

    with pytest.raises(ValidationError) as refused:
        version.full_clean()
    response = client_of(dave).post("/api/v1/versions/", version_body(model_a, labels=labels),
                                    format="json")

    assert list(refused.value.message_dict) == ["labels"]
    assert assert_refused(response, "labels") == refused.value.message_dict["labels"]


# --- charsets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("charset", ["bz2_codec", "rot13"])
def test_a_charset_that_is_no_text_encoding_is_a_400(dave, charset):
    response = client_of(dave).post(
        "/api/v1/models/", b'{"name": "m"}', content_type=f"application/json; charset={charset}"
    )

    assert response.status_code == 400
    assert "is not a text encoding" in response.json()["detail"]
    assert not Model.objects.exists()


def test_a_body_that_is_not_text_in_its_charset_is_a_400(dave):
    response = client_of(dave).post(
        "/api/v1/models/", b'{"name": "\xff\xfe"}', content_type="application/json; charset=utf-8"
    )

    assert response.status_code == 400
    assert "is not utf-8 text" in response.json()["detail"]


# --- the console, through its pages -------------------------------------------------------------


def test_a_nul_character_in_a_console_filter_or_form_is_a_400_page_naming_it(alice, tenant_a):
    client = Client(raise_request_exception=False)
    client.force_login(alice)

    listed = client.get("/registry/", {"q": f"fraud{NUL}"})
    posted = client.post("/fleet/tokens/new/", {"tenant": tenant_a.slug, "name": f"ci{NUL}",
                                                "role": "viewer"})

    for response in (listed, posted):
        assert response.status_code == 400
        assert response["Content-Type"].startswith("text/html")
    assert b"NUL characters are not allowed" in listed.content and b"q" in listed.content
    assert b"name" in posted.content
    assert not tenant_a.tokens.exists()


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00+20:00", "2026-13-45"])
def test_the_console_audit_log_names_a_date_it_cannot_read(alice, tenant_a, value):
    audit.record(alice, "created", tenant_a, tenant=tenant_a)
    client = Client(raise_request_exception=False)
    client.force_login(alice)

    page = client.get("/audit/", {"since": value})

    assert page.status_code == 400
    assert b"since:" in page.content


# --- rollout requests ---------------------------------------------------------------------------


@pytest.fixture
def rollable(tenant_a):
    """A deployment a rollout can be asked for: a local cluster (it has a traffic router), v1
    ready on its server, v2 registered. Refusals past the body's shape come from the domain."""
    cluster = ClusterFactory(name="local-routed", kind=Cluster.Kind.LOCAL)
    server = InferenceServerFactory(cluster=cluster, name="triton-1")
    model = ModelFactory(tenant=tenant_a, name="scorer")
    v1 = ModelVersionFactory(model=model, version=1)
    ModelVersionFactory(model=model, version=2)
    deployment = DeploymentFactory(model=model, cluster=cluster, name="scorer")
    deployment.servers.set([server])
    ModelLoad.objects.create(tenant=tenant_a, deployment=deployment, server=server, version=v1,
                             state=ModelLoad.State.READY, requested_by_label="seed")
    return deployment


@pytest.fixture
def no_broker(monkeypatch):
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_rollout", sent.append)
    return sent


HUGE_FLOAT = "<1e400>"  # sent as the JSON number 1e400, which Python's json cannot write
ROLLOUT_BODIES = [
    # (what is added to {"deployment": <rollable>, "version": 2}, field, words)
    ({"version": 10**30}, "version", ["out of range"]),
    ({"version": 2**63}, "version", ["less than or equal to"]),
    ({"version": HUGE_FLOAT}, "version", ["out of range"]),
    ({"version": "two"}, "version", ["valid integer"]),
    ({"version": True}, "version", ["valid integer"]),
    ({"version": 2.5}, "version", ["valid integer"]),
    ({"baseline": -1}, "baseline", ["greater than or equal to 1"]),
    ({"deployment": {"id": 1}}, "deployment", ["give the deployment's id"]),
    ({"deployment": 2**63 - 1}, "deployment", ["no deployment with id"]),
    ({"deployment": [1]}, "deployment", ["give the deployment's id"]),
    ({"strategy": ["canary"]}, "strategy", []),
    ({"steps": "5,25,50"}, "steps", ["must be a non-empty list of steps"]),
    ({"steps": [None]}, "steps", ["steps[0]: a step is an object"]),
    ({"steps": [{"set_weight": "5"}]}, "steps", ["steps[0]: set_weight is an integer"]),
    ({"steps": [{"set_weight": True}]}, "steps", ["steps[0]: set_weight is an integer"]),
    ({"steps": [{"set_weight": 5.5}]}, "steps", ["steps[0]: set_weight is an integer"]),
    ({"steps": [{"set_weight": 1e300}]}, "steps", ["steps[0]: set_weight is an integer"]),
    ({"steps": [{"set_weight": 10**30}]}, "steps", ["steps[0].set_weight: the number", "out of range"]),
    ({"steps": [{"set_weight": 5, "pause": {}}]}, "steps", ["steps[0]: a step is an object"]),
    ({"steps": [{"pause": {"seconds": True}}]}, "steps", ["steps[0]: pause seconds"]),
    ({"steps": [{"pause": {"seconds": 1e308}}]}, "steps", ["steps[0]: pause seconds"]),
    ({"steps": [{"pause": None}]}, "steps", ["steps[0]: pause is {}"]),
    ({"steps": [{"approval": {"by": "erin"}}]}, "steps", ["steps[0]: approval takes no settings"]),
    ({"steps": [{"set_weight": 5}] * 101}, "steps", ["at most 100 steps"]),
    ({"analysis": "strict"}, "analysis", ["must be an object of analysis settings"]),
    ({"analysis": {"alpha": "0.05"}}, "analysis", ["analysis.alpha: must be a number"]),
    ({"analysis": {"alpha": None}}, "analysis", ["analysis.alpha: must be a number"]),
    ({"analysis": {"planned_samples": 2**62}}, "analysis", ["analysis.planned_samples: must be an integer"]),
    ({"analysis": {"min_samples": 10.5}}, "analysis", ["analysis.min_samples: must be an integer"]),
    ({"analysis": {"alpha": HUGE_FLOAT}}, "analysis", ["analysis.alpha: the number", "out of range"]),
    ({"analysis": {"x" * 10_000: 1}}, "analysis", ["unknown setting 'xxxx"]),
    ({"variants": "1:50,2:50", "strategy": "ab", "duration_s": 60}, "variants",
     ["Expected a list"]),
    ({"variants": [{"version": 1, "weight": 50}, "v2"], "strategy": "ab"}, "variants", []),
    ({"duration_s": -5}, "duration_s", ["seconds from 1 to 2592000, got -5"]),
    ({"duration_s": 10**19}, "duration_s", ["seconds from 1 to 2592000"]),
    ({"sample_size": "lots"}, "sample_size", ["valid integer"]),
    ({"promote": "maybe"}, "promote", ["valid boolean"]),
    ({"require_approval": {"yes": True}}, "require_approval", ["valid boolean"]),
    ({"servers": "triton-1"}, "servers", ["Expected a list"]),
    ({"servers": ["t" * 65]}, "servers", []),
    ({"servers": [None]}, "servers", []),
    ({"alias": "a" * 65}, "alias", ["an alias name", "at most 64"]),
    ({"alias": ["production"]}, "alias", []),
    ({"sticky_header": "X-" + "a" * 100}, "sticky_header", []),
    ({"reason": {"text": "why"}}, "reason", ["Not a valid string"]),
    ({"reason": "x" * 100_000}, "reason", ["no more than 2000"]),
    ({"unknown": 1}, "unknown", ["unknown field"]),
]


@pytest.mark.parametrize(("extra", "field", "words"), ROLLOUT_BODIES,
                         ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(ROLLOUT_BODIES)])
def test_a_hostile_rollout_request_is_a_400_naming_the_field(dave, rollable, no_broker, extra,
                                                             field, words):
    body = json.dumps({"deployment": rollable.pk, "version": 2, **extra})
    body = body.replace(f'"{HUGE_FLOAT}"', "1e400")

    response = post_json(client_of(dave), "/api/v1/rollouts/", body)

    assert_refused(response, field, *words)
    assert not Rollout.objects.exists()


@pytest.mark.parametrize(("text", "field"), [
    ('{"deployment": 1, "version": 2, "steps": ' + nested(1000) + "}", "steps"),
    ('{"deployment": 1, "version": 2, "analysis": {"alpha": ' + nested(100) + "}}", "analysis"),
    ('{"deployment": 1, "version": 2, "reason": "a\\u0000b"}', "reason"),
    ('{"deployment": 1, "version": 2, "steps": [{"pause\\u0000": {}}]}', "steps"),
    ('{"deployment": 1, "version": 2, "sticky_header": "X-\\u0000"}', "sticky_header"),
    ('{"deployment": 1, "version": 2, "servers": ["\\u0000"]}', "servers"),
    ('{"deployment": "\\u0000", "version": 2}', "deployment"),
    ('{"deployment": 1, "version": 2, "duration_s": NaN}', "detail"),
])
def test_deep_nul_and_non_finite_rollout_bodies_are_refused_by_the_parser(dave, text, field):
    response = post_json(client_of(dave), "/api/v1/rollouts/", text)

    assert response.status_code == 400, response.content
    assert list(response.json()) == [field], response.json()


def test_a_hostile_idempotency_key_or_action_body_is_a_400(dave, rollable, no_broker):
    client = client_of(dave)
    long_key = client.post("/api/v1/rollouts/", {"deployment": rollable.pk, "version": 2},
                           format="json", HTTP_IDEMPOTENCY_KEY="k" * 5000)
    nul_key = client.post("/api/v1/rollouts/", {"deployment": rollable.pk, "version": 2},
                          format="json", HTTP_IDEMPOTENCY_KEY="k\x00")
    made, _ = rollout.create_rollout(dave, rollable, version=2)
    as_list = client.post(f"/api/v1/rollouts/{made.pk}/abort/", {"reason": ["no"]}, format="json")
    with_nul = post_json(client, f"/api/v1/rollouts/{made.pk}/pause/", '{"reason": "\\u0000"}')

    assert_refused(long_key, "idempotency_key", "at most 200 characters")
    assert_refused(nul_key, "header Idempotency-Key", "NUL characters are not allowed")
    assert_refused(as_list, "reason", "Not a valid string")
    assert_refused(with_nul, "reason", "NUL characters are not allowed")
    assert Rollout.objects.get(pk=made.pk).requested_action == ""
