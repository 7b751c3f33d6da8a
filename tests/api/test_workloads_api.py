"""/api/v1/workloads/: servers on Kubernetes through the API.

What the API answers and writes; the reconciler is driven with the workload adapter's calls
kept in memory (tests/kube/test_workload_world.py), its API calls being proven against
recorded exchanges in tests/kube/.
"""

# ruff: noqa: F811 (the fixtures imported from test_workload_world are redefined as arguments)
from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator

from fleet.adapters.kubernetes import KubeError
from fleet.models import Placement
from rollouts.models import ServerWorkload
from rollouts.workloads import reconciler as workload_reconciler
from rollouts.workloads import requests as workloads
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    ModelFactory,
    ModelVersionFactory,
    QuotaFactory,
)
from tests.kube.test_workload_autoscaling import hpa_kube  # noqa: F401 (fixture)
from tests.kube.test_workload_world import (  # noqa: F401 (fixtures)
    A100,
    H100,
    chat,
    enqueued_workloads,
    fake_kube,
    fraud,
    grant,
    kube_cluster,
)

URL = "/api/v1/workloads/"
State = ServerWorkload.State


def triton_body(**changes) -> dict:
    return {"deployment": "fraud-scorer", "version": 1, "name": "triton-fraud-v1",
            "replicas": 2, "node_selector": A100,
            "model_repository": "s3://switchyard-models/fraud-scorer", **changes}


def make_ready(workload_id: int, fake_kube) -> ServerWorkload:
    """Advance the workload, its pods coming up as soon as it waits for them."""
    for _ in range(5):
        workload = ServerWorkload.objects.get(pk=workload_id)
        if workload.state == State.READY:
            break
        if workload.state == State.PROGRESSING:
            fake_kube.pods_ready(workload.namespace, workload.name)
            ServerWorkload.objects.filter(pk=workload_id).update(next_attempt_at=None)
        workload_reconciler.advance(workload_id)
    return ServerWorkload.objects.get(pk=workload_id)


# --- create ---------------------------------------------------------------------------------


def test_a_deployer_creates_a_workload_admitted_against_the_quota(
    client_for, dave, fraud, enqueued_workloads, django_capture_on_commit_callbacks
):

    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(dave).post(URL, triton_body())

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["in_flight"], body["runtime"]) == ("pending", True, "triton")
    assert (body["deployment_name"], body["cluster"], body["namespace"]) == (
        "fraud-scorer", "gpu-cluster", "serving")
    assert (body["version"], body["replicas"], body["units"]) == (1, 2, 2)
    assert (body["device_class"], body["memory_mib"]) == ("nvidia-a100-80gb", 40960)
    assert body["server"] == "triton-fraud-v1"
    assert body["http_url"] == "http://triton-fraud-v1.serving.svc:8000"
    assert body["ready_replicas"] is None
    assert body["requested_by_label"] == "dave"
    assert enqueued_workloads == [body["id"]]


def test_a_token_of_the_deployer_role_creates_one_too(token_client, tenant_a, fraud):

    response = token_client(tenant_a).post(URL, triton_body())

    assert response.status_code == 201, response.content
    assert response.json()["requested_by_label"].startswith("token:ci-deployer-tenant-a")


def test_a_viewer_is_refused_and_nothing_is_written(client_for, bob, fraud):

    response = client_for(bob).post(URL, triton_body())

    assert response.status_code == 403
    assert not ServerWorkload.objects.exists()


def test_another_tenants_deployment_is_no_deployment_at_all(client_for, charlie, fraud):

    response = client_for(charlie).post(URL, triton_body())

    assert response.status_code == 400
    assert response.json() == {"deployment": ["no deployment with name 'fraud-scorer'"]}


def test_a_short_quota_is_a_409_with_the_numbers(client_for, dave, fraud):

    response = client_for(dave).post(URL, triton_body(replicas=5))

    assert response.status_code == 409
    assert response.json() == {"quota": [
        "GPUs quota of tenant-a on nvidia-a100-80gb exceeded: asks 5, 4 left of 4 (short by 1)"]}
    assert not Placement.objects.exists()


@pytest.mark.parametrize(("changes", "field"), [
    ({"name": "Triton_1"}, "name"),
    ({"namespace": "Serving"}, "namespace"),
    ({"replicas": 0}, "replicas"),
    ({"replicas": 101}, "replicas"),
    ({"gpu_resource": "amd.com/gpu"}, "gpu_resource"),
    ({"node_selector": {"team": "risk"}}, "node_selector"),
    ({"node_selector": "NVIDIA-A100"}, "node_selector"),
    ({"model_repository": "models"}, "model_repository"),
    ({"model_repository": "/models"}, "volume_claim"),
    ({"image": "a b"}, "image"),
    ({"version": 9}, "version"),
    ({"colour": "blue"}, "colour"),
])
def test_bad_input_is_a_400_naming_the_field(client_for, dave, fraud, changes, field):

    response = client_for(dave).post(URL, triton_body(**changes))

    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]


def test_a_deployment_on_another_kind_of_cluster_is_a_409(client_for, dave, fraud, tenant_a):
    deployment, _versions = fraud
    DeploymentFactory(model=deployment.model, tenant=tenant_a, name="static-scorer",
                      cluster=ClusterFactory(name="static-1"))

    response = client_for(dave).post(URL, triton_body(deployment="static-scorer"))

    assert response.status_code == 409
    assert "Kubernetes clusters only" in response.json()["deployment"][0]


def test_the_same_idempotency_key_replays_the_first_request(client_for, dave, fraud):
    client = client_for(dave)

    first = client.post(URL, triton_body(), HTTP_IDEMPOTENCY_KEY="create-1")
    again = client.post(URL, triton_body(), HTTP_IDEMPOTENCY_KEY="create-1")
    other = client.post(URL, triton_body(replicas=1),
                        HTTP_IDEMPOTENCY_KEY="create-1")
    taken = client.post(URL, triton_body())

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == 409
    assert list(other.json()) == ["idempotency_key"]
    assert taken.status_code == 409
    assert list(taken.json()) == ["name"]
    assert ServerWorkload.objects.count() == 1


def test_a_too_long_idempotency_key_is_a_400(client_for, dave, fraud):

    response = client_for(dave).post(URL, triton_body(),
                                     HTTP_IDEMPOTENCY_KEY="k" * 201)

    assert response.status_code == 400
    assert list(response.json()) == ["idempotency_key"]


# --- read -----------------------------------------------------------------------------------


def test_the_list_filters_by_deployment_and_state_and_hides_other_tenants(
    client_for, dave, charlie, fraud, tenant_b
):
    deployment, (v1, v2) = fraud
    one, _ = workloads.create_workload(deployment, v1, dave, name="triton-fraud-v1",
                                       node_selector=A100, model_repository="s3://models/fraud")
    ServerWorkload.objects.filter(pk=one.pk).update(state=State.READY)
    workloads.create_workload(deployment, v2, dave, name="triton-fraud-v2", replicas=1,
                              node_selector=A100, model_repository="s3://models/fraud")
    client = client_for(dave)

    by_state = client.get(URL, {"deployment": "fraud-scorer", "state": "ready"}).json()
    in_flight = client.get(URL, {"state__in": "pending,applying"}).json()
    other = client_for(charlie).get(URL).json()

    assert [w["name"] for w in by_state["results"]] == ["triton-fraud-v1"]
    assert [w["name"] for w in in_flight["results"]] == ["triton-fraud-v2"]
    assert other["results"] == []
    assert client_for(charlie).get(f"{URL}{one.pk}/").status_code == 404
    assert client.get(f"{URL}{one.pk}/").json()["state"] == "ready"


def test_a_bad_filter_value_is_a_400(client_for, dave, fraud):
    response = client_for(dave).get(URL, {"state": "sleeping"})

    assert response.status_code == 400
    assert list(response.json()) == ["state"]


def test_anonymous_callers_get_401(api, fraud):
    assert api.get(URL).status_code == 401
    assert api.post(URL, {}).status_code == 401


def test_a_failure_on_the_cluster_reads_as_state_and_error_never_a_500(
    client_for, dave, fraud, fake_kube, settings
):
    settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = 0  # a refusal (403) is final at once
    client = client_for(dave)
    created = client.post(URL, triton_body()).json()
    fake_kube.fail("apply-Deployment", KubeError(
        'apply Deployment serving/triton-fraud-v1: forbidden by RBAC (403): deployments.apps '
        '"triton-fraud-v1" is forbidden', kind="forbidden", status=403))
    workload_reconciler.advance(created["id"])
    workload_reconciler.advance(created["id"])

    body = client.get(f"{URL}{created['id']}/").json()

    assert (body["state"], body["in_flight"]) == ("failed", False)
    assert "forbidden by RBAC (403)" in body["error"]
    assert "quota released" in body["detail"]


# --- changes --------------------------------------------------------------------------------


def test_scaling_answers_202_and_the_reconciler_carries_it_out(
    client_for, dave, fraud, fake_kube
):
    client = client_for(dave)
    created = client.post(URL, triton_body()).json()
    make_ready(created["id"], fake_kube)
    scale = f"{URL}{created['id']}/scale/"

    response = client.post(scale, {"replicas": 3})
    busy = client.post(scale, {"replicas": 4})

    assert response.status_code == 202, response.content
    assert (response.json()["state"], response.json()["replicas"]) == ("applying", 3)
    assert (response.json()["units"], response.json()["memory_mib"]) == (3, 61440)
    assert busy.status_code == 409
    assert list(busy.json()) == ["state"]
    assert make_ready(created["id"], fake_kube).state == State.READY
    same = client.post(scale, {"replicas": 3})
    assert (same.status_code, same.json()["state"]) == (200, "ready")


def test_scaling_beyond_the_quota_is_a_409_on_replicas(client_for, dave, fraud, fake_kube):
    client = client_for(dave)
    created = client.post(URL, triton_body()).json()
    make_ready(created["id"], fake_kube)

    response = client.post(f"{URL}{created['id']}/scale/", {"replicas": 9})

    assert response.status_code == 409
    assert "asks 7 more, 2 left of 4 (short by 5)" in response.json()["replicas"][0]


@pytest.mark.parametrize("body", [{"replicas": -1}, {"replicas": 101}, {}, {"replicas": "x"}])
def test_a_bad_replica_count_is_a_400(client_for, dave, fraud, body):
    created = client_for(dave).post(URL, triton_body()).json()

    response = client_for(dave).post(f"{URL}{created['id']}/scale/", body)

    assert response.status_code == 400
    assert list(response.json()) == ["replicas"]


def test_a_viewer_cannot_scale(client_for, dave, bob, fraud, fake_kube):
    created = client_for(dave).post(URL, triton_body()).json()
    make_ready(created["id"], fake_kube)

    assert client_for(bob).post(f"{URL}{created['id']}/scale/", {"replicas": 1}).status_code == 403


def test_rolling_a_vllm_server_answers_202_with_both_versions(client_for, dave, chat, fake_kube):
    client = client_for(dave)
    created = client.post(URL, {"deployment": "llm-chat", "version": 1, "name": "vllm-llama",
                                "node_selector": H100}).json()
    make_ready(created["id"], fake_kube)
    roll = f"{URL}{created['id']}/roll/"

    response = client.post(roll, {"version": 2})
    unknown = client.post(roll, {"version": 9})

    assert response.status_code == 202, response.content
    assert (response.json()["version"], response.json()["previous_version"]) == (2, 1)
    assert unknown.status_code == 400
    assert unknown.json() == {"version": ["llm-chat has no version 9"]}


def test_a_triton_server_does_not_roll(client_for, dave, fraud, fake_kube):
    created = client_for(dave).post(URL, triton_body()).json()
    make_ready(created["id"], fake_kube)

    response = client_for(dave).post(f"{URL}{created['id']}/roll/", {"version": 2})

    assert response.status_code == 409
    assert list(response.json()) == ["version"]


def test_deleting_answers_202_then_200(client_for, dave, fraud, fake_kube):
    client = client_for(dave)
    created = client.post(URL, triton_body()).json()

    first = client.delete(f"{URL}{created['id']}/")
    again = client.delete(f"{URL}{created['id']}/")

    assert (first.status_code, first.json()["state"]) == (202, "deleting")
    assert (again.status_code, again.json()["state"]) == (200, "deleting")
    workload_reconciler.advance(created["id"])
    assert client.get(f"{URL}{created['id']}/").json()["state"] == "deleted"


def test_another_tenant_cannot_touch_a_workload(client_for, dave, charlie, fraud):
    created = client_for(dave).post(URL, triton_body()).json()
    client = client_for(charlie)

    assert client.post(f"{URL}{created['id']}/scale/", {"replicas": 1}).status_code == 404
    assert client.post(f"{URL}{created['id']}/roll/", {"version": 2}).status_code == 404
    assert client.delete(f"{URL}{created['id']}/").status_code == 404


# --- the schema -----------------------------------------------------------------------------


def test_the_schema_describes_every_workload_operation_and_its_refusals():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    paths = schema["paths"]

    create = paths["/api/v1/workloads/"]["post"]
    assert set(create["responses"]) >= {"200", "201", "400", "401", "403", "409"}
    assert "quota is short" in create["responses"]["409"]["description"]
    assert any(p["name"] == "Idempotency-Key" for p in create["parameters"])
    components = schema["components"]["schemas"]
    assert components["WorkloadRequestRequest"]["oneOf"] == [
        {"$ref": "#/components/schemas/FixedWorkloadRequest"},
        {"$ref": "#/components/schemas/AutoscaledWorkloadRequest"}]
    body = components["FixedWorkloadRequest"]
    assert set(body["required"]) == {"deployment", "version", "name", "node_selector"}
    assert body["properties"]["node_selector"]["required"] == ["nvidia.com/gpu.product"]
    for path, method in [("/api/v1/workloads/{id}/scale/", "post"),
                         ("/api/v1/workloads/{id}/roll/", "post"),
                         ("/api/v1/workloads/{id}/", "delete")]:
        operation = paths[path][method]
        assert {"200", "202", "409"} <= set(operation["responses"]), path
        assert operation["description"], path
    listing = {p["name"] for p in paths["/api/v1/workloads/"]["get"]["parameters"]}
    assert {"deployment", "state", "state__in", "runtime", "namespace"} <= listing


def test_quota_of_other_tenants_is_not_theirs_to_use(client_for, charlie, tenant_b, fraud):
    """Tenant B's own deployment on the same cluster uses tenant B's quota, not A's."""
    deployment, _versions = fraud
    model = ModelFactory(tenant=tenant_b, name="fraud-b")
    ModelVersionFactory(model=model, version=1, gpus=1)
    DeploymentFactory(model=model, tenant=tenant_b, cluster=deployment.cluster, name="fraud-b")
    grant(tenant_b, deployment.cluster, "risk-b")  # serving is tenant A's

    refused = client_for(charlie).post(URL, triton_body(deployment="fraud-b",
                                                        name="triton-b"))
    QuotaFactory(tenant=tenant_b, device_class="nvidia-a100-80gb", units=1, memory_mib=1024)
    made = client_for(charlie).post(URL, triton_body(deployment="fraud-b",
                                                     name="triton-b", replicas=1))

    assert refused.status_code == 409
    assert "no quota for device class nvidia-a100-80gb" in refused.json()["quota"][0]
    assert made.status_code == 201, made.content


# --- autoscaled workloads -------------------------------------------------------------------


def autoscaled_body(**changes) -> dict:
    body = triton_body(**{"min_replicas": 1, "max_replicas": 3, **changes})
    if "replicas" not in changes:
        del body["replicas"]
    return body


def test_an_autoscaled_workload_is_created_with_its_range_and_quota_for_its_maximum(
    client_for, dave, fraud
):
    response = client_for(dave).post(URL, autoscaled_body())

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["autoscaled"], body["min_replicas"], body["max_replicas"]) == (True, 1, 3)
    assert body["replicas"] == 1
    assert (body["device_class"], body["memory_mib"]) == ("nvidia-a100-80gb", 3 * 20480)
    assert Placement.objects.get().units == 3


def test_a_workload_of_a_fixed_count_says_it_is_not_autoscaled(client_for, dave, fraud):
    body = client_for(dave).post(URL, triton_body()).json()

    assert (body["autoscaled"], body["min_replicas"], body["max_replicas"]) == (False, None, None)


@pytest.mark.parametrize(("changes", "field", "text"), [
    ({"max_replicas": None}, "max_replicas", "together"),
    ({"min_replicas": None}, "min_replicas", "together"),
    ({"min_replicas": 0}, "min_replicas", "greater than or equal to 1"),
    ({"max_replicas": 101}, "max_replicas", "less than or equal to 100"),
    ({"min_replicas": "x"}, "min_replicas", "valid integer"),
    ({"min_replicas": 4}, "max_replicas", "at least min_replicas (4), got 3"),
    ({"replicas": 2}, "replicas", "give min_replicas and max_replicas, not replicas"),
])
def test_a_bad_range_is_a_400_naming_the_field(client_for, dave, fraud, changes, field, text):
    body = {k: v for k, v in autoscaled_body(**changes).items() if v is not None}

    response = client_for(dave).post(URL, body)

    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert text in response.json()[field][0]
    assert not ServerWorkload.objects.exists()


def test_a_maximum_beyond_the_quota_is_a_409_on_max_replicas(client_for, dave, fraud):

    response = client_for(dave).post(URL, autoscaled_body(max_replicas=5))

    assert response.status_code == 409
    assert list(response.json()) == ["max_replicas"]
    assert response.json()["max_replicas"][0].endswith(
        "asks 5, 4 left of 4 (short by 1)")
    assert not Placement.objects.exists()


def test_scaling_an_autoscaled_workload_changes_its_range(client_for, dave, fraud, hpa_kube):
    client = client_for(dave)
    created = client.post(URL, autoscaled_body(max_replicas=2)).json()
    assert make_ready(created["id"], hpa_kube).state == State.READY
    scale = f"{URL}{created['id']}/scale/"

    replicas = client.post(scale, {"replicas": 2})
    both = client.post(scale, {"replicas": 2, "min_replicas": 1, "max_replicas": 4})
    short = client.post(scale, {"min_replicas": 1, "max_replicas": 5})
    half = client.post(scale, {"max_replicas": 4})
    response = client.post(scale, {"min_replicas": 1, "max_replicas": 4})

    assert replicas.status_code == 400
    assert list(replicas.json()) == ["replicas"]
    assert "is autoscaled: its HPA owns the replica count" in replicas.json()["replicas"][0]
    assert "cannot be switched" in replicas.json()["replicas"][0]
    assert (both.status_code, list(both.json())) == (400, ["replicas"])
    assert (short.status_code, list(short.json())) == (409, ["max_replicas"])
    assert (half.status_code, list(half.json())) == (400, ["min_replicas"])
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["state"], body["min_replicas"], body["max_replicas"]) == ("applying", 1, 4)
    assert body["memory_mib"] == 4 * 20480
    assert make_ready(created["id"], hpa_kube).state == State.READY
    same = client.post(scale, {"min_replicas": 1, "max_replicas": 4})
    assert (same.status_code, same.json()["state"]) == (200, "ready")


def test_a_range_on_a_workload_of_a_fixed_count_is_a_400(client_for, dave, fraud, fake_kube):
    client = client_for(dave)
    created = client.post(URL, triton_body()).json()
    make_ready(created["id"], fake_kube)

    response = client.post(f"{URL}{created['id']}/scale/", {"min_replicas": 1, "max_replicas": 3})

    assert response.status_code == 400
    assert list(response.json()) == ["min_replicas"]
    assert "Autoscaling is chosen when a workload is created" in response.json()[
        "min_replicas"][0]


def test_the_schema_describes_the_replica_range():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]

    # Creation: a fixed count, or a range (both bounds, no replicas); never a mix.
    fixed, scaled = components["FixedWorkloadRequest"], components["AutoscaledWorkloadRequest"]
    assert "min_replicas" not in fixed["properties"] and "default" not in fixed["properties"][
        "replicas"]
    assert "replicas" not in scaled["properties"]
    assert {"min_replicas", "max_replicas"} <= set(scaled["required"])
    for name in ("min_replicas", "max_replicas"):
        assert (scaled["properties"][name]["minimum"], scaled["properties"][name]["maximum"]) == (
            1, 100)
    assert fixed["additionalProperties"] is scaled["additionalProperties"] is False
    workload = components["Workload"]["properties"]
    assert workload["autoscaled"]["type"] == "boolean"
    assert workload["min_replicas"]["type"] == workload["max_replicas"]["type"] == [
        "integer", "null"]
    for path in ("/api/v1/workloads/", "/api/v1/workloads/{id}/scale/"):
        assert schema["paths"][path]["post"]["requestBody"]["required"] is True
    # Scaling: replicas, or a range.
    assert components["ScaleRequest"]["oneOf"] == [
        {"$ref": "#/components/schemas/FixedScaleRequest"},
        {"$ref": "#/components/schemas/RangeScaleRequest"}]
    assert components["FixedScaleRequest"]["required"] == ["replicas"]
    assert set(components["RangeScaleRequest"]["required"]) == {"min_replicas", "max_replicas"}
