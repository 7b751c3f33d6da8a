"""The fleet's router probe on Kubernetes clusters: each cluster's Gateway API or Istio router
is asked through its API (answers a real kube-apiserver gave) and the state recorded."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from fleet.adapters.routers.base import RouterHealth
from fleet.inventory import health
from fleet.models import Cluster
from tests.factories import ClusterFactory
from tests.kube.replay import GOOD_TOKEN, RecordedApiServer, answered, exchanges

pytestmark = pytest.mark.django_db

TOKEN_ENV = "SY_TEST_ROUTER_HEALTH_TOKEN"


@pytest.fixture(autouse=True)
def token(monkeypatch, settings):
    settings.SWITCHYARD_KUBE_SECRET_ENV_ALLOWED = [TOKEN_ENV]
    monkeypatch.setenv(TOKEN_ENV, GOOD_TOKEN)


def kube_cluster(name: str, url: str, **fields: Any) -> Cluster:
    values: dict[str, Any] = {
        "name": name, "kind": Cluster.Kind.KUBERNETES, "kube_auth": Cluster.KubeAuth.TOKEN,
        "api_url": url, "kube_secret_env": TOKEN_ENV, "kube_namespace": "serving",
        "kube_router": Cluster.KubeRouter.GATEWAY_API, "kube_gateway": "serving/inference-gw",
        "kube_route_host": "example", **fields,
    }
    return ClusterFactory(**values)


def test_an_istio_router_whose_routes_istio_does_not_fault_is_up():
    with RecordedApiServer(exchanges("05-istio", 9)) as srv:
        cluster = kube_cluster("mesh", srv.url, kube_router=Cluster.KubeRouter.ISTIO,
                               kube_gateway="")
        counts = health.check_routers()
    srv.assert_all_matched()
    cluster.refresh_from_db()
    assert counts == {"up": 1}
    assert (cluster.router_state, cluster.router_routes) == (Cluster.RouterState.UP, 1)


def test_gateway_routes_no_controller_has_accepted_make_the_router_down_with_the_reason():
    with RecordedApiServer(exchanges("04b-gateway-api-v1", 1, 2, 17)) as srv:
        cluster = kube_cluster("gw", srv.url)
        health.check_routers()
    srv.assert_all_matched()
    cluster.refresh_from_db()
    assert cluster.router_state == Cluster.RouterState.DOWN
    assert cluster.router_routes == 2
    assert "route fraud-scorer: the gateway controller has taken generation 1" in (
        cluster.router_detail)


def test_unusable_settings_are_recorded_down_and_a_cluster_without_a_router_is_left_alone():
    broken = kube_cluster("broken", "http://127.0.0.1:9", kube_route_host="")
    plain = kube_cluster("plain", "http://127.0.0.1:9", kube_router="", kube_gateway="")
    health.check_routers()
    broken.refresh_from_db()
    plain.refresh_from_db()
    assert broken.router_state == Cluster.RouterState.DOWN
    assert broken.router_detail.startswith("unusable: kube_route_host is empty")
    assert plain.router_state == Cluster.RouterState.UNKNOWN


def test_a_router_serving_some_of_its_routes_is_degraded():
    partial = RouterHealth(ok=False, message="route b: Accepted is False",
                           routes={"a": True, "b": False})
    nothing = RouterHealth(ok=False, message="no answer", routes={"a": False})
    assert health._router_state(partial) == Cluster.RouterState.DEGRADED
    assert health._router_state(nothing) == Cluster.RouterState.DOWN


def test_a_cluster_without_the_gateway_api_shows_its_router_down_on_the_cluster_page(bob, root):
    """Discovery answered as the recorded server answers a group it does not serve (06 #10):
    the probe records the router down saying what to install, and the cluster page says so."""
    script = [answered(exchanges("04-gateway-api", 0)[0], exchanges("06-auth-errors", 10)[0])]
    with RecordedApiServer(script) as srv:
        cluster = kube_cluster("no-gateway-api", srv.url)
        health.check_routers()
    srv.assert_all_matched()
    cluster.refresh_from_db()
    assert cluster.router_state == Cluster.RouterState.DOWN
    assert "install the Gateway API CRDs" in cluster.router_detail

    seen = {}
    for user in (bob, root):
        page = Client()
        page.force_login(user)
        html = page.get(f"/fleet/clusters/{cluster.pk}/live/", HTTP_HX_REQUEST="true")
        assert html.status_code == 200
        seen[user.username] = html.content.decode()
    # Members see the router down; the detail (it names the API server) is a platform admin's.
    assert 'data-router-state="down"' in seen[bob.username]
    assert "install the Gateway API CRDs" not in seen[bob.username]
    assert "install the Gateway API CRDs" in seen[root.username]
