"""A cluster's secret may be read from the environment only from a variable the platform names
in SWITCHYARD_KUBE_SECRET_ENV_ALLOWED. The issue's reproduction, as a platform admin would run
it through the API and the console: point a cluster at a listener with ``kube_secret_env``
``SECRET_KEY`` and test the connection. Setting it is a 400 on ``kube_secret_env``; a row that
names it anyway sends nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.models import Cluster
from tests.factories import ClusterFactory
from tests.kube import test_connection as connection_tests
from tests.kube.replay import RecordedApiServer
from tests.kube.test_connection import TOKEN, connected

pytestmark = pytest.mark.django_db
listener = connection_tests.listener  # a fixture: an HTTP server that records every request

SECRET = "the-web-process-secret-key-0123456789"


@pytest.fixture(autouse=True)
def environment(monkeypatch, settings) -> None:
    settings.SWITCHYARD_KUBE_SECRET_ENV_ALLOWED = ["SY_TEST_GPU_EAST_TOKEN"]
    monkeypatch.setenv("SECRET_KEY", SECRET)
    monkeypatch.setenv("SY_TEST_GPU_EAST_TOKEN", TOKEN)


def body(url: str, **fields) -> dict:
    return {"name": "gpu-east", "kind": "kubernetes", "kube_auth": "token", "api_url": url,
            "kube_secret_env": "SECRET_KEY", **fields}


def test_the_api_refuses_a_variable_the_platform_does_not_allow(root, client_for, listener):
    url, seen = listener
    api = client_for(root)

    created = api.post("/api/v1/clusters/", body(url), format="json")
    allowed = api.post("/api/v1/clusters/", body(url, kube_secret_env="SY_TEST_GPU_EAST_TOKEN"),
                       format="json")
    moved = api.patch(f"/api/v1/clusters/{allowed.json()['id']}/",
                      {"kube_secret_env": "SECRET_KEY"}, format="json")

    assert created.status_code == 400, created.content
    assert list(created.json()) == ["kube_secret_env"]
    assert "SWITCHYARD_KUBE_SECRET_ENV_ALLOWED" in created.json()["kube_secret_env"][0]
    assert allowed.status_code == 201, allowed.content
    assert moved.status_code == 400 and list(moved.json()) == ["kube_secret_env"]
    assert Cluster.objects.get().kube_secret_env == "SY_TEST_GPU_EAST_TOKEN"
    assert seen == []


def test_test_connection_of_a_row_naming_secret_key_sends_nothing(root, client_for, listener):
    url, seen = listener
    cluster = ClusterFactory(name="gpu-east", kind=Cluster.Kind.KUBERNETES,
                             kube_auth=Cluster.KubeAuth.TOKEN, api_url=url,
                             kube_secret_env="SECRET_KEY")

    answer = client_for(root).post(f"/api/v1/clusters/{cluster.pk}/test-connection/")

    assert answer.status_code == 200
    assert answer.json()["ok"] is False
    assert "'SECRET_KEY' is not an environment variable name" in answer.json()["detail"]
    assert seen == []
    assert SECRET not in answer.content.decode()


def test_an_allowed_variable_is_sent_by_test_connection(root, client_for):
    with RecordedApiServer(connected()) as srv:
        made = client_for(root).post(
            "/api/v1/clusters/", body(srv.url, kube_secret_env="SY_TEST_GPU_EAST_TOKEN"),
            format="json")
        answer = client_for(root).post(f"/api/v1/clusters/{made.json()['id']}/test-connection/")
    srv.assert_all_matched()

    assert answer.json()["ok"] is True
    assert srv.received[0].authorization == f"Bearer {TOKEN}"


def test_the_console_form_refuses_it_on_the_same_field(root, listener):
    url, seen = listener
    client = Client()
    client.force_login(root)
    form = {"name": "gpu-east", "kind": "kubernetes", "description": "", "kube_auth": "token",
            "api_url": url, "kube_ca_bundle": "", "kube_secret": "", "kube_kubeconfig": "",
            "kube_context": "", "kube_secret_env": "SECRET_KEY", "kube_namespace": "switchyard",
            "kube_router": "", "kube_gateway": "", "kube_route_host": "", "s3_endpoint_url": "",
            "s3_region": ""}

    answer = client.post("/fleet/clusters/new/", form)

    assert answer.status_code == 400
    html = answer.content.decode()
    assert '<p class="error" id="kube_secret_env-error">' in html
    assert "SWITCHYARD_KUBE_SECRET_ENV_ALLOWED" in html
    assert not Cluster.objects.exists()
    assert seen == []
