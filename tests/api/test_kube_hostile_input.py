"""Hostile input to the Kubernetes endpoints (clusters, workloads): each is a 4xx in the API's
error shape naming the field, never a 500, and nothing is written."""

# ruff: noqa: F811 (the fixtures imported from test_workload_world are redefined as arguments)
from __future__ import annotations

import pytest

from fleet.models import Cluster, Placement
from rollouts.models import ServerWorkload
from tests.api.test_hostile_input import assert_refused, client_of, nested, post_json
from tests.kube.test_workload_world import (  # noqa: F401 (fixtures)
    A100,
    enqueued_workloads,
    fraud,
    kube_cluster,
)

WORKLOADS = "/api/v1/workloads/"
CLUSTERS = "/api/v1/clusters/"
HUGE = 10**30


def workload_body(**changes) -> dict:
    return {"deployment": "fraud-scorer", "version": 1, "name": "triton-fraud-v1",
            "replicas": 1, "node_selector": A100,
            "model_repository": "s3://switchyard-models/fraud-scorer", **changes}


def cluster_body(**changes) -> dict:
    return {"name": "gpu-west", "kind": "kubernetes", "kube_auth": "token",
            "api_url": "https://10.0.0.1:6443", "kube_secret": "t" * 40, **changes}


@pytest.mark.parametrize(("changes", "field"), [
    ({"name": "triton\x00v1"}, "name"),
    ({"model_repository": "s3://b/\x00"}, "model_repository"),
    ({"node_selector": {"nvidia.com/gpu.product": "A100\x00"}}, "node_selector"),
    ({"replicas": HUGE}, "replicas"),
    ({"replicas": -1}, "replicas"),
    ({"replicas": "many"}, "replicas"),
    ({"replicas": 1.5}, "replicas"),
    ({"version": HUGE}, "version"),
    ({"node_selector": ["nvidia.com/gpu.product"]}, "node_selector"),
    ({"node_selector": {"nvidia.com/gpu.product": {"deep": "x"}}}, "node_selector"),
    ({"gpu_resource": "nvidia.com/gpu; rm -rf /"}, "gpu_resource"),
    ({"image": "x" * 5000}, "image"),
    ({"name": "Triton_Fraud"}, "name"),
    ({"name": "t" * 64}, "name"),
    ({"namespace": "kube-system/../x"}, "namespace"),
])
def test_a_hostile_workload_request_is_a_400_naming_the_field(dave, fraud, enqueued_workloads,
                                                                changes, field):
    response = client_of(dave).post(WORKLOADS, workload_body(**changes), format="json")

    assert_refused(response, field)
    assert not ServerWorkload.objects.exists()
    assert not Placement.objects.exists()


def test_a_deeply_nested_node_selector_is_refused_by_the_parser(dave, fraud):
    text = ('{"deployment": "fraud-scorer", "version": 1, "name": "t", "node_selector": '
            f'{{"a": {nested(2000)}}}}}')
    response = post_json(client_of(dave), WORKLOADS, text)

    assert response.status_code == 400
    assert "node_selector" in str(response.json()) or "body" in str(response.json())
    assert not ServerWorkload.objects.exists()


@pytest.mark.parametrize(("changes", "field"), [
    ({"replicas": HUGE}, "replicas"),
    ({"replicas": -3}, "replicas"),
    ({"replicas": "\x00"}, "replicas"),
])
def test_a_hostile_scale_is_a_400_naming_the_field(dave, fraud, enqueued_workloads, changes,
                                                  field):
    created = client_of(dave).post(WORKLOADS, workload_body(), format="json")
    assert created.status_code == 201, created.json()

    response = client_of(dave).post(f"{WORKLOADS}{created.json()['id']}/scale/", changes,
                                    format="json")

    assert_refused(response, field)
    assert ServerWorkload.objects.get().replicas == 1


@pytest.mark.parametrize(("changes", "field"), [
    ({"kube_secret": "tok\x00en"}, "kube_secret"),
    ({"kube_secret": "t" * 200_000}, "kube_secret"),
    ({"kube_ca_bundle": "-----BEGIN CERTIFICATE-----\x00"}, "kube_ca_bundle"),
    ({"kube_secret_env": "KUBE TOKEN", "kube_secret": None}, "kube_secret_env"),
    ({"api_url": "gopher://10.0.0.1"}, "api_url"),
    ({"api_url": "https://" + "a" * 300 + ".example"}, "api_url"),
    ({"kube_namespace": "Serving"}, "kube_namespace"),
    ({"kube_router": "linkerd"}, "kube_router"),
    ({"kube_router": "gateway-api", "kube_gateway": "no-namespace"}, "kube_gateway"),
    ({"kube_route_host": "bad host"}, "kube_route_host"),
    ({"kube_auth": "password"}, "kube_auth"),
    ({"kube_context": "c\x00"}, "kube_context"),
])
def test_a_hostile_cluster_is_a_400_naming_the_field(root, changes, field):
    response = client_of(root).post(CLUSTERS, cluster_body(**changes), format="json")

    assert_refused(response, field)
    assert not Cluster.objects.filter(name="gpu-west").exists()


def test_a_test_connection_to_an_absurd_address_is_a_recorded_failure_not_an_error(root):
    created = client_of(root).post(CLUSTERS, cluster_body(api_url="https://127.0.0.1:1"),
                                   format="json")
    assert created.status_code == 201, created.json()

    response = client_of(root).post(f"{CLUSTERS}{created.json()['id']}/test-connection/")

    assert response.status_code == 200
    assert response.json()["ok"] is False
    assert "unreachable" in response.json()["detail"]
    assert Cluster.objects.get(name="gpu-west").connection_state == "failed"
