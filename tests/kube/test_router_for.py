"""``fleet.inventory.routers.router_for`` on Kubernetes cluster rows: the Gateway API or Istio router,
built from the cluster's access and router settings, sending what a real server accepted."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.adapters.routers.base import KSERVE_V2, RouteSpec, Variant
from fleet.adapters.routers.gateway_api import GatewayApiRouter
from fleet.adapters.routers.istio import IstioRouter
from fleet.inventory.routers import has_router, routed_clusters, router_for
from fleet.models import Cluster
from tests.factories import ClusterFactory
from tests.kube.replay import GOOD_TOKEN, RecordedApiServer, by_switchyard, exchanges

pytestmark = pytest.mark.django_db

TOKEN_ENV = "SY_TEST_ROUTER_KUBE_TOKEN"


def kube_cluster(url: str = "http://127.0.0.1:9", **fields: Any) -> Cluster:
    values: dict[str, Any] = {
        "name": "gpu-east", "kind": Cluster.Kind.KUBERNETES, "kube_auth": Cluster.KubeAuth.TOKEN,
        "api_url": url, "kube_secret_env": TOKEN_ENV, "kube_namespace": "serving",
        "kube_router": Cluster.KubeRouter.GATEWAY_API, "kube_gateway": "serving/inference-gw",
        "kube_route_host": "example", **fields,
    }
    return ClusterFactory(**values)


@pytest.fixture(autouse=True)
def token(monkeypatch, settings):
    settings.SWITCHYARD_KUBE_SECRET_ENV_ALLOWED = [TOKEN_ENV, "SY_TEST_ROUTER_UNSET"]
    monkeypatch.setenv(TOKEN_ENV, GOOD_TOKEN)


def test_a_gateway_api_cluster_routes_through_httproutes_in_its_namespace():
    router = router_for(kube_cluster())
    assert isinstance(router, GatewayApiRouter)
    assert (router.namespace, router.gateway_namespace, router.gateway_name, router.route_domain,
            router.api_version, router.listener) == (
        "serving", "serving", "inference-gw", "example", "", None)


def test_an_istio_cluster_routes_through_virtual_services():
    router = router_for(kube_cluster(kube_router=Cluster.KubeRouter.ISTIO, kube_gateway=""))
    assert isinstance(router, IstioRouter)
    assert (router.namespace, router.route_domain, router.gateway, router.api_version) == (
        "serving", "example", "", "v1")


def test_a_kubernetes_cluster_without_a_router_has_none():
    assert router_for(kube_cluster(kube_router="", kube_gateway="")) is None



@pytest.mark.parametrize(("fields", "routed"), [
    ({"kind": Cluster.Kind.LOCAL}, True),
    ({"kind": Cluster.Kind.STATIC, "router_kind": Cluster.RouterKind.NGINX,
      "router_conf_dir": "/tmp/sy-test-router", "router_reload_command": "true"}, True),
    ({"kind": Cluster.Kind.STATIC, "router_kind": Cluster.RouterKind.NONE}, False),
    ({"kind": Cluster.Kind.KUBERNETES, "kube_router": Cluster.KubeRouter.ISTIO}, True),
    ({"kind": Cluster.Kind.KUBERNETES, "kube_router": ""}, False),
])
def test_which_clusters_have_a_router_is_one_rule_for_a_row_a_query_and_the_router(fields, routed):
    """``has_router``, its query filter (the default-route tick's) and ``router_for`` agree."""
    cluster = kube_cluster(**fields) if fields["kind"] == Cluster.Kind.KUBERNETES else ClusterFactory(**fields)
    assert has_router(cluster) is routed
    assert Cluster.objects.filter(routed_clusters(), pk=cluster.pk).exists() is routed
    assert (router_for(cluster) is not None) is routed

@pytest.mark.parametrize(("fields", "words"), [
    ({"kube_route_host": ""}, "kube_route_host is empty"),
    ({"kube_gateway": "inference-gw"}, "namespace/name"),
    ({"kube_secret_env": "SY_TEST_ROUTER_UNSET"}, "SY_TEST_ROUTER_UNSET is not set"),
])
def test_unusable_settings_are_a_value_error_with_the_reason(fields, words):
    with pytest.raises(ValueError, match=words):
        router_for(kube_cluster(**fields))


def test_the_router_of_a_cluster_row_creates_a_route_exactly_as_the_real_server_saw_it():
    """Discovery (v1beta1), the route missing (its GET answered with the recorded 404 of a
    missing HTTPRoute), the Gateway's listener, the create (04 #4): built from the row alone."""
    gw = [by_switchyard(e) for e in exchanges("04-gateway-api")]
    missing = {**gw[5], "status": 404, "response_headers": gw[34]["response_headers"],
               "response_body": gw[34]["response_body"]}
    spec = RouteSpec("fraud-scorer", KSERVE_V2, (
        Variant("v1-a", "http://triton-fraud-v1.serving:8000", 100, model="fraud", version=1),
        Variant("v2-b", "http://triton-fraud-v2.serving:8000", 0, model="fraud", version=2),
    ))
    with RecordedApiServer([gw[0], gw[1], missing, gw[7], gw[4]]) as srv:
        result = router_for(kube_cluster(srv.url)).apply(spec)
    srv.assert_all_matched()
    assert srv.unused == []
    assert result.changed and result.url == "http://fraud-scorer.example"


def test_the_router_of_an_istio_row_reads_the_weights_in_force():
    with RecordedApiServer(exchanges("05-istio", 2)) as srv:
        cluster = kube_cluster(srv.url, kube_router=Cluster.KubeRouter.ISTIO, kube_gateway="")
        spec = router_for(cluster).read("fraud-scorer")
    srv.assert_all_matched()
    assert spec.weights() == {"v1": 90, "v2": 10}
