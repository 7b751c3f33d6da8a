"""The benchmarks API: requests (201, 200 replays, 400 naming the field, 409 busy), reads,
cancel, the compact results for CI, compare, and registering a measured config.

No sweep runs here (tests/benchmarks/ run them on a real Triton); the reconciler is called
where a cancel is carried out. Finished jobs are rows with the runner's shape of figures.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from fleet.models import Cluster
from rollouts.benchmarks import reconciler
from rollouts.models import BenchmarkJob, ModelVersion
from tests.api.benchmark_rows import finished_job, queued_job
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
    QuotaFactory,
)
from tests.fixtures import sent_tasks

URL = "/api/v1/benchmarks/"
UNUSED = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def enqueued(monkeypatch):
    """What would go to the broker (the reconciler's next tick) is kept here."""
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_benchmark", sent.append)
    return sent


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class Setup:
    """A deployment of ``scorer`` with one Triton server (``triton-a``), versions 1 and 2
    registered, and a CPU quota; ``two`` adds a second server."""

    def __init__(self, tenant, name: str = "scorer", *, two: bool = False) -> None:
        self.cluster = ClusterFactory(name=f"c-{uuid.uuid4().hex[:6]}", kind=Cluster.Kind.LOCAL)
        self.a = InferenceServerFactory(cluster=self.cluster, name=f"triton-a-{name}",
                                        http_url=UNUSED)
        servers = [self.a]
        if two:
            servers.append(InferenceServerFactory(cluster=self.cluster, name=f"triton-b-{name}",
                                                  http_url=UNUSED))
        self.model = ModelFactory(tenant=tenant, name=name)
        self.v1, self.v2 = (ModelVersionFactory(model=self.model, version=n) for n in (1, 2))
        self.deployment = DeploymentFactory(model=self.model, cluster=self.cluster, name=name)
        self.deployment.servers.set(servers)
        if not tenant.quotas.filter(device_class="cpu").exists():
            QuotaFactory(tenant=tenant, device_class="cpu")


@pytest.fixture
def setup(tenant_a) -> Setup:
    return Setup(tenant_a)


def api_as(user) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(user)
    return client


def ask(client: APIClient, setup: Setup, key: str | None = None, **body: Any):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(URL, {"deployment": setup.deployment.pk, "version": 1, **body},
                       format="json", **headers)


def field_error(response, field: str, status: int = 400) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert list(body) == [field], body
    return " ".join(body[field])


# --- asking for a benchmark ------------------------------------------------------------------


def test_a_request_answers_201_with_the_job_queued_and_enqueued(
    dave, setup, enqueued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = ask(api_as(dave), setup, levels=[8, 1, 4, 4],
                       duration_s=3, warmup_s=0.5, slo={"p99_ms": 25})

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["phase"], body["progress"]) == ("queued", "queued", 0.0)
    assert (body["deployment"], body["deployment_name"], body["model"], body["version"],
            body["server"]) == (setup.deployment.pk, "scorer", "scorer", 1, setup.a.name)
    assert (body["protocol"], body["mode"], body["levels"]) == ("triton_http", "concurrency",
                                                                 [1, 4, 8])
    assert (body["duration_s"], body["warmup_s"]) == (3.0, 0.5)
    # The SLO left out takes the deployment's error rate (a fraction here).
    assert body["slo"] == {"p99_ms": 25.0,
                           "error_rate": float(setup.deployment.slo_error_rate) / 100}
    assert (body["results"], body["summary"], body["error"]) == ([], {}, "")
    assert (body["is_active"], body["is_final"], body["shares_production"]) == (True, False, False)
    assert body["requested_by_label"] == "dave"
    assert enqueued == [body["id"]]


def test_the_deployment_is_taken_by_name_and_a_rate_sweep_by_its_rates(dave, setup):
    response = api_as(dave).post(URL, {"deployment": "scorer", "version": 2, "mode": "rate",
                                       "levels": [25.5, 10]}, format="json")

    assert response.status_code == 201, response.content
    assert (response.json()["mode"], response.json()["levels"]) == ("rate", [10.0, 25.5])
    assert BenchmarkJob.objects.get().version == setup.v2


HUGE = "<1e400>"  # sent as the JSON number 1e400, which Python's json cannot write
BODIES = [
    # (what is added to {"deployment": <setup>, "version": 1}, field, words)
    ({"levels": "1,2,4"}, "levels", ["a non-empty list of concurrencies"]),
    ({"levels": []}, "levels", ["a non-empty list"]),
    ({"levels": [0]}, "levels", ["from 1 to 512, got 0"]),
    ({"levels": [1.5]}, "levels", ["a whole number, got 1.5"]),
    ({"levels": [600]}, "levels", ["from 1 to 512, got 600"]),
    ({"levels": [True]}, "levels", ["a number, got True"]),
    ({"levels": ["4"]}, "levels", ["a number, got '4'"]),
    ({"levels": list(range(1, 22))}, "levels", ["at most 20 levels"]),
    ({"levels": [10**30]}, "levels", ["levels[0]: the number", "out of range"]),
    ({"levels": [HUGE]}, "levels", ["out of range"]),
    ({"mode": "rate", "levels": [30000]}, "levels", ["from 0 to 20000"]),
    ({"mode": "burst"}, "mode", ['"burst" is not a valid choice']),
    ({"protocol": "http2"}, "protocol", ['"http2" is not a valid choice']),
    ({"protocol": "openai_chat"}, "protocol", ["openai_chat does not fit a triton server"]),
    ({"protocol": "triton_grpc"}, "protocol", ["has no gRPC address recorded"]),
    ({"server": "triton-9"}, "server", ["deployment scorer has no server named 'triton-9'"]),
    ({"server": ["triton-a-scorer"]}, "server", ["Not a valid string"]),
    ({"version": 9}, "version", ["scorer has no version 9"]),
    ({"version": 10**30}, "version", ["out of range"]),
    ({"version": "two"}, "version", ["valid integer"]),
    ({"version": True}, "version", ["valid integer"]),
    ({"deployment": 2**63 - 1}, "deployment", ["no deployment with id"]),
    ({"deployment": {"id": 1}}, "deployment", ["give the deployment's id"]),
    ({"configs": [{"instance_count": 2}]}, "configs",
     ["configs[0]: unknown fields instance_count; a sweep may set instance_group"]),
    ({"configs": [{"dynamic_batching": {"max_queue_delay_microseconds": 100}}]}, "configs",
     ["configs[0]: dynamic batching needs max_batch_size above 0"]),
    ({"configs": [{"instance_group": 17}]}, "configs",
     ["configs[0].instance_group: from 1 to 16, got 17"]),
    ({"configs": [{"instance_group": {"count": 2, "kind": "KIND_GPU"}}]}, "configs",
     ['configs[0].instance_group: a count, or {"count": n}']),
    ({"configs": [{"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": -1}}]},
     "configs", ["configs[0].dynamic_batching.max_queue_delay_microseconds: microseconds"]),
    ({"configs": [{"max_batch_size": 10**30}]}, "configs", ["out of range"]),
    ({"configs": [{"instance_group": 1}] * 9}, "configs", ["at most 8 configs"]),
    ({"configs": {"instance_group": 2}}, "configs", ["a list of config overrides"]),
    ({"duration_s": 0}, "duration_s", ["greater than 0"]),
    ({"duration_s": 601}, "duration_s", ["less than or equal to 600"]),
    ({"duration_s": HUGE}, "duration_s", ["out of range"]),
    ({"duration_s": True}, "duration_s", ["valid number"]),
    ({"warmup_s": -1}, "warmup_s", ["greater than or equal to 0"]),
    ({"max_requests": 10**30}, "max_requests", ["out of range"]),
    ({"refine_steps": 7}, "refine_steps", ["less than or equal to 6"]),
    ({"error_limit": 0}, "error_limit", ["greater than 0"]),
    ({"slo": {"p99": 5}}, "slo", ["unknown fields p99"]),
    ({"slo": {"error_rate": 5}}, "slo", ["slo.error_rate: a fraction from 0 to 1"]),
    ({"slo": {"p99_ms": -5}}, "slo", ["slo.p99_ms: from 0 to"]),
    ({"slo": "fast"}, "slo", ["an object: p99_ms"]),
    ({"request": {"inputs": "x"}}, "request", ["request.inputs: inputs: a list of"]),
    ({"request": "abc"}, "request", ["an object"]),
    # A benchmark targets the fleet's servers, never a URL it is given.
    ({"url": "http://10.0.0.1:8000"}, "url", ["unknown field"]),
    ({"tenant": "tenant-b"}, "tenant", ["unknown field"]),
]


@pytest.mark.parametrize(("extra", "field", "words"), BODIES,
                         ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(BODIES)])
def test_a_bad_request_is_a_400_naming_the_field(dave, setup, extra, field, words):
    body = json.dumps({"deployment": setup.deployment.pk, "version": 1, **extra})
    body = body.replace(f'"{HUGE}"', "1e400")

    response = api_as(dave).post(URL, body, content_type="application/json")

    text = field_error(response, field)
    for word in words:
        assert word in text, text
    assert not BenchmarkJob.objects.exists()


@pytest.mark.parametrize(("text", "field"), [
    ('{"deployment": "scorer", "version": 1, "server": "triton\\u0000"}', "server"),
    ('{"deployment": "scorer\\u0000", "version": 1}', "deployment"),
    ('{"deployment": "scorer", "version": 1, "configs": [{"max_batch_size\\u0000": 8}]}',
     "configs"),
    ('{"deployment": "scorer", "version": 1, "request": {"inputs": [{"name": "\\u0000"}]}}',
     "request"),
    ('{"deployment": "scorer", "version": 1, "duration_s": NaN}', "detail"),
])
def test_nul_characters_and_non_finite_numbers_are_refused(dave, setup, text, field):
    response = api_as(dave).post(URL, text, content_type="application/json")

    assert response.status_code == 400, response.content
    assert list(response.json()) == [field], response.json()
    if field != "detail":
        assert "NUL characters are not allowed" in " ".join(response.json()[field])
    assert not BenchmarkJob.objects.exists()


def test_a_deployment_with_several_servers_needs_the_server_named(dave, tenant_a):
    two = Setup(tenant_a, "pair", two=True)
    client = api_as(dave)

    unnamed = ask(client, two)
    named = ask(client, two, server=two.a.name)

    assert "name the server to benchmark on (the deployment has 2)" in field_error(unnamed, "server")
    assert named.status_code == 201 and named.json()["server"] == two.a.name


def test_another_tenants_deployment_is_a_400_on_deployment(charlie, setup):
    response = ask(api_as(charlie), setup)

    assert f"no deployment with id {setup.deployment.pk}" in field_error(response, "deployment")


def test_a_second_job_on_the_same_server_is_a_409_naming_the_server(dave, setup):
    client = api_as(dave)
    first = ask(client, setup)
    second = ask(client, setup, version=2)

    assert first.status_code == 201
    assert field_error(second, "server", 409) == (
        f"benchmark {first.json()['id']} is queued on {setup.a.name}: one job per server at a time")
    assert BenchmarkJob.objects.count() == 1


def test_the_same_idempotency_key_replays_and_another_body_is_a_409(dave, setup):
    client = api_as(dave)
    first = ask(client, setup, key="ci-run-77", levels=[1, 2])
    again = ask(client, setup, key="ci-run-77", levels=[1, 2])
    other = ask(client, setup, key="ci-run-77", levels=[1, 4])
    too_long = ask(client, setup, key="k" * 201)

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["idempotency_key"] == "ci-run-77"
    assert "used for a different request" in field_error(other, "idempotency_key", 409)
    assert "at most 200 characters" in field_error(too_long, "idempotency_key")
    assert BenchmarkJob.objects.count() == 1


def test_a_quota_too_small_for_the_load_is_a_409_on_quota(dave, setup, tenant_a):
    tenant_a.quotas.update(units=0)

    response = ask(api_as(dave), setup)

    assert "asks 1, 0 left of 0" in field_error(response, "quota", 409)


def test_a_viewer_may_read_but_not_start_or_cancel(bob, dave, setup):
    job = queued_job(setup.deployment, setup.v1)
    client = api_as(bob)

    started = ask(client, setup)
    cancelled = client.post(f"{URL}{job.pk}/cancel/", {}, format="json")
    read = client.get(f"{URL}{job.pk}/")

    for refused in (started, cancelled):
        assert refused.status_code == 403
        assert "this needs the deployer role in the tenant" in refused.json()["detail"]
    assert read.status_code == 200
    assert BenchmarkJob.objects.get(pk=job.pk).cancel_requested_by == ""


# --- reading -----------------------------------------------------------------------------------


def test_a_job_reads_with_its_progress_results_and_summary(bob, setup):
    job = finished_job(setup.deployment, setup.v1, shares_production=True)

    body = api_as(bob).get(f"{URL}{job.pk}/").json()

    assert (body["state"], body["progress"], body["phase"], body["is_final"]) == (
        "succeeded", 1.0, "done", True)
    assert body["shares_production"] is True and body["error"] == ""
    [entry] = body["results"]
    assert entry["label"] == "default"
    assert [level["value"] for level in entry["levels"]] == [1, 2, 4]
    assert entry["levels"][1]["server"]["compute_ms"] > 0
    assert body["summary"]["best"]["max_load_rps"] == 240.0
    listed = api_as(bob).get(URL).json()["results"]
    assert [row["id"] for row in listed] == [job.pk]
    assert "results" not in listed[0] and listed[0]["summary"]["best_label"] == "default"


def test_lists_filter_by_state_deployment_version_server_and_model(bob, tenant_a, setup):
    other = Setup(tenant_a, "ranker")
    v1_done = finished_job(setup.deployment, setup.v1)
    v2_queued = queued_job(setup.deployment, setup.v2)
    ranker = finished_job(other.deployment, other.v1, state=BenchmarkJob.State.FAILED)
    client = api_as(bob)

    def ids(**params: Any) -> set[int]:
        response = client.get(URL, params)
        assert response.status_code == 200, response.json()
        return {row["id"] for row in response.json()["results"]}

    assert ids(state="succeeded") == {v1_done.pk}
    assert ids(state__in="queued,failed") == {v2_queued.pk, ranker.pk}
    assert ids(deployment="scorer") == {v1_done.pk, v2_queued.pk}
    assert ids(deployment=other.deployment.pk) == {ranker.pk}
    assert ids(version=2) == {v2_queued.pk}
    assert ids(server=other.a.name) == {ranker.pk}
    assert ids(model="ranker") == {ranker.pk}
    assert ids(model="nothing") == set()
    assert "must be a whole number" in field_error(client.get(URL, {"version": "two"}), "version")
    assert field_error(client.get(URL, {"state": "done"}), "state")


def test_another_tenants_job_is_a_404_on_every_endpoint(charlie, setup):
    job = finished_job(setup.deployment, setup.v1, configs=[{"instance_group": [{"count": 2}]}])
    client = api_as(charlie)

    answers = [client.get(f"{URL}{job.pk}/"), client.get(f"{URL}{job.pk}/results/"),
               client.post(f"{URL}{job.pk}/cancel/", {}, format="json"),
               client.post(f"{URL}{job.pk}/register-config/", {}, format="json")]

    assert [a.status_code for a in answers] == [404] * 4
    assert client.get(URL).json()["count"] == 0
    assert setup.model.versions.count() == 2


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_answers_202_and_the_next_tick_ends_the_job_cancelled(dave, setup, enqueued):
    made = ask(api_as(dave), setup).json()
    enqueued.clear()

    response = api_as(dave).post(f"{URL}{made['id']}/cancel/", {}, format="json")

    assert response.status_code == 202, response.content
    assert response.json()["cancel_requested_by"] == "dave"
    assert response.json()["state"] == "queued"
    reconciler.advance(made["id"])
    after = api_as(dave).get(f"{URL}{made['id']}/").json()
    assert (after["state"], after["phase"], after["is_final"]) == (
        "cancelled", "cancelled by dave", True)


def test_cancel_of_a_finished_job_is_a_409(dave, setup):
    job = finished_job(setup.deployment, setup.v1)

    response = api_as(dave).post(f"{URL}{job.pk}/cancel/", {}, format="json")

    assert field_error(response, "state", 409) == f"benchmark {job.pk} is succeeded already"


# --- results for CI ----------------------------------------------------------------------------


def test_results_answer_each_configs_levels_compactly(bob, setup):
    job = finished_job(setup.deployment, setup.v1, configs=[
        {"instance_group": [{"count": n, "kind": "KIND_CPU"}]} for n in (1, 2)])

    body = api_as(bob).get(f"{URL}{job.pk}/results/").json()

    assert (body["id"], body["state"], body["is_final"], body["model"], body["version"]) == (
        job.pk, "succeeded", True, "scorer", 1)
    assert body["summary"]["best_label"] == "2 instances"
    assert [c["label"] for c in body["configs"]] == ["1 instance", "2 instances"]
    level = body["configs"][1]["levels"][1]
    assert set(level) == {"value", "requests", "ok", "errors", "error_rate", "throughput_rps",
                          "offered_rps", "latency_ms", "refinement", "verdict", "server",
                          "within_slo"}
    assert (level["value"], level["throughput_rps"], level["within_slo"]) == (2, 300.0, True)
    assert level["latency_ms"]["p50"] <= level["latency_ms"]["p99"]
    assert level["server"]["available"] is True
    failing = body["configs"][1]["levels"][2]
    assert failing["within_slo"] is False and failing["verdict"] == ["p99 52.0 ms over 40 ms"]


# --- compare -------------------------------------------------------------------------------------


def test_compare_sets_two_summaries_side_by_side_with_the_change(bob, setup, tenant_b, charlie):
    fast = finished_job(setup.deployment, setup.v1, rps=240.0)
    slow = finished_job(setup.deployment, setup.v2, rps=180.0)
    theirs = finished_job(Setup(tenant_b, "secret").deployment,
                          ModelVersion.objects.get(model__name="secret", version=1))
    client = api_as(bob)

    body = client.get(f"{URL}compare/", {"a": fast.pk, "b": slow.pk}).json()

    assert (body["a"]["version"], body["b"]["version"]) == (1, 2)
    assert (body["a"]["best"]["max_load_rps"], body["b"]["best"]["max_load_rps"]) == (240.0, 180.0)
    assert body["max_load_rps_change_pct"] == -25.0 and body["same_mode"] is True
    assert "give a benchmark job's id" in field_error(
        client.get(f"{URL}compare/", {"a": fast.pk}), "b")
    assert "must be a whole number" in field_error(
        client.get(f"{URL}compare/", {"a": "first", "b": slow.pk}), "a")
    assert f"no benchmark job with id {theirs.pk}" in field_error(
        client.get(f"{URL}compare/", {"a": fast.pk, "b": theirs.pk}), "b")
    assert api_as(charlie).get(f"{URL}compare/", {"a": theirs.pk, "b": theirs.pk}).status_code == 200


def test_compare_has_no_change_when_a_job_found_no_load_within_its_slo(bob, setup):
    none = finished_job(setup.deployment, setup.v1, rps=0.0)
    some = finished_job(setup.deployment, setup.v2, rps=100.0)

    body = api_as(bob).get(f"{URL}compare/", {"a": none.pk, "b": some.pk}).json()

    assert body["max_load_rps_change_pct"] is None


# --- register the measured config ----------------------------------------------------------------


def test_register_config_makes_a_version_with_the_best_config(dave, setup):
    job = finished_job(setup.deployment, setup.v1, configs=[
        {"instance_group": [{"count": n, "kind": "KIND_CPU"}]} for n in (1, 2)])
    client = api_as(dave)

    best = client.post(f"{URL}{job.pk}/register-config/", {}, format="json")
    chosen = client.post(f"{URL}{job.pk}/register-config/", {"config": 0}, format="json")

    assert best.status_code == 201, best.content
    assert (best.json()["version"], best.json()["model"]) == (3, setup.model.pk)
    assert best.json()["triton_config"]["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    assert best.json()["labels"] == {"derived_from": "v1", "benchmark_job": str(job.pk),
                                     "benchmark_config": "2 instances"}
    assert best.json()["sha256"] == setup.v1.sha256
    assert chosen.status_code == 201
    assert ModelVersion.objects.get(model=setup.model, version=4).triton_config[
        "instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]


def test_register_config_refuses_what_has_no_measured_config(dave, bob, setup):
    sweep = finished_job(setup.deployment, setup.v1, configs=[{"max_batch_size": 8}])
    plain = finished_job(setup.deployment, setup.v2)
    client = api_as(dave)

    missing = client.post(f"{URL}{sweep.pk}/register-config/", {"config": 5}, format="json")
    too_big = client.post(f"{URL}{sweep.pk}/register-config/", {"config": 8}, format="json")
    wrong = client.post(f"{URL}{sweep.pk}/register-config/", {"index": 0}, format="json")
    not_a_sweep = client.post(f"{URL}{plain.pk}/register-config/", {}, format="json")
    viewer = api_as(bob).post(f"{URL}{sweep.pk}/register-config/", {}, format="json")

    assert field_error(missing, "config") == "no measured config with that index"
    assert "less than or equal to 7" in field_error(too_big, "config")
    assert field_error(wrong, "index") == "unknown field"
    assert "only a finished config sweep" in field_error(not_a_sweep, "job", 409)
    assert viewer.status_code == 403
    assert setup.model.versions.count() == 2
