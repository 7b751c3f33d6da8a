"""The console's fleet pages and their htmx partials: what each caller reads of the shared
clusters and servers.

Tenant members of every role, in either tenant, see names, kinds and health. How a cluster's
API is reached (URL, authentication, CA bundle, the token's hint or the variable it is read
from), the error texts of its connection, sync and traffic router (which name the API server,
the router's files or other tenants' routes), and a server's model repository, log and
metrics URL are shown to platform admins only. The checks look for the values themselves.
"""

from __future__ import annotations

import datetime

import pytest
from django.test import Client
from django.utils import timezone

from fleet.adapters.base import ServerProbe
from fleet.inventory import health, kube_connection
from fleet.models import Cluster, ClusterSync, InferenceServer
from tests.factories import ClusterFactory, InferenceServerFactory, NodeFactory

TOKEN = "kube-token-for-the-visibility-tests-QRST"
API_URL = "https://api.gpu-east.internal.example:6443"
CA = "-----BEGIN CERTIFICATE-----\nMIIvisibilityCA\n-----END CERTIFICATE-----\n"
ENV_NAME = "PLATFORM_ONLY_KUBE_TOKEN_VAR"
CONNECTION_ERROR = "GET /version: API server unreachable: api.gpu-east.internal.example:6443: timed out"
SYNC_DETAIL = "GET /api/v1/nodes: API server unreachable: api.gpu-east.internal.example:6443: refused"
SYNC_ERROR = "watch: API server unreachable: api.gpu-east.internal.example:6443: reset"
KUBE_ROUTER_ERROR = "route globex-secret-route: not accepted by the Gateway"
NGINX_ROUTER_ERROR = "nginx status at http://127.0.0.1:18080/platform-only-status did not answer"
REPOSITORY = "/srv/platform/triton-shared/model-repository"
LOG = "/var/log/platform/triton-shared.log"
METRICS = "http://triton-shared.platform.internal.example:8002/metrics"

#: What a tenant member never reads, by what it is.
HIDDEN = {
    "api_url": API_URL,
    "token's last four": "…QRST",
    "token's length": f"({len(TOKEN)} characters)",
    "kube_secret_env": ENV_NAME,
    "CA bundle": "CA bundle",
    "authentication": "API URL, bearer token and CA bundle",
    "connection_detail": CONNECTION_ERROR,
    "sync_detail": SYNC_DETAIL,
    "sync errors": SYNC_ERROR,
    "kubernetes router detail": KUBE_ROUTER_ERROR,
    "nginx router detail": NGINX_ROUTER_ERROR,
    "model_repository": REPOSITORY,
    "log_path": LOG,
    "metrics_url": METRICS,
}


@pytest.fixture(autouse=True)
def fake_probes(monkeypatch):
    """"Check now" probes for real; answer at once instead of touching the network."""

    def probe(http_url: str, timeout: float) -> ServerProbe:
        return ServerProbe(ready=False, live=False, error="connection refused")

    monkeypatch.setattr(health, "PROBES", dict.fromkeys(InferenceServer.Runtime, probe))


@pytest.fixture
def fleet(db) -> dict[str, object]:
    """A kubernetes cluster reached by token whose connection, sync and router failed; one
    whose token is read from a variable; a static cluster with an nginx router that is down;
    a Triton server with its repository, log and metrics URL recorded."""
    cluster = ClusterFactory(
        name="gpu-east", kind=Cluster.Kind.KUBERNETES, kube_auth=Cluster.KubeAuth.TOKEN,
        api_url=API_URL, kube_ca_bundle=CA, connection_state="failed",
        connection_detail=CONNECTION_ERROR, sync_state="failed", sync_detail=SYNC_DETAIL,
        kube_router="gateway-api", kube_gateway="edge", kube_route_host="routes.example.com",
        router_state="degraded", router_detail=KUBE_ROUTER_ERROR,
    )
    kube_connection.set_secret(cluster, TOKEN)
    cluster.save()
    by_env = ClusterFactory(name="gpu-west", kind=Cluster.Kind.KUBERNETES,
                            kube_auth=Cluster.KubeAuth.TOKEN, api_url=API_URL,
                            kube_secret_env=ENV_NAME)
    ClusterFactory(name="edge-static", kind=Cluster.Kind.STATIC,
                   router_kind=Cluster.RouterKind.NGINX, router_state="down",
                   router_detail=NGINX_ROUTER_ERROR)
    start = timezone.now() - datetime.timedelta(minutes=1)
    ClusterSync.objects.create(cluster=cluster, kind="watch", ok=False, errors=[SYNC_ERROR],
                               started_at=start, finished_at=start)
    node = NodeFactory(cluster=cluster, name="gpu-h100-01")
    server = InferenceServerFactory(
        cluster=cluster, node=node, name="triton-shared", http_url="http://127.0.0.1:9",
        metrics_url=METRICS, model_repository=REPOSITORY, log_path=LOG, health="healthy",
    )
    return {"cluster": cluster, "by_env": by_env, "server": server}


def pages(user, fleet) -> dict[str, str]:
    """Every fleet page and partial that shows clusters or servers, as ``user`` gets it."""
    client = Client()
    client.force_login(user)
    htmx = {"HX-Request": "true"}
    cluster, by_env, server = fleet["cluster"], fleet["by_env"], fleet["server"]
    answers = {
        "/fleet/": client.get("/fleet/"),
        "/fleet/servers/live/": client.get("/fleet/servers/live/", headers=htmx),
        "server": client.get(f"/fleet/servers/{server.pk}/"),
        "server status": client.get(f"/fleet/servers/{server.pk}/status/", headers=htmx),
        "server check": client.post(f"/fleet/servers/{server.pk}/check/", headers=htmx),
        "cluster": client.get(f"/fleet/clusters/{cluster.pk}/"),
        "cluster live": client.get(f"/fleet/clusters/{cluster.pk}/live/", headers=htmx),
        "cluster by env": client.get(f"/fleet/clusters/{by_env.pk}/"),
    }
    for name, response in answers.items():
        assert response.status_code == 200, (name, response.status_code)
    return {name: response.content.decode() for name, response in answers.items()}


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["alice", "erin", "dave", "bob", "charlie"])
def test_a_member_of_any_role_sees_names_kinds_and_health_and_no_platform_detail(
    request, fleet, persona,
):
    shown = pages(request.getfixturevalue(persona), fleet)

    for page, html in shown.items():
        for what, value in HIDDEN.items():
            assert value not in html, f"{persona} sees the {what} on {page}"
    assert 'data-connection="failed"' in shown["cluster"]
    assert 'data-sync="failed"' in shown["cluster live"]
    assert 'data-router-state="degraded"' in shown["cluster live"]
    assert "routes.example.com" in shown["cluster"]  # where the tenant's routes answer
    assert 'data-router="edge-static"' in shown["/fleet/servers/live/"]
    assert 'data-router-state="down"' in shown["/fleet/servers/live/"]
    for page in ("server", "server status"):
        assert "http://127.0.0.1:9" in shown[page] and "Model repository" not in shown[page]
    assert 'data-health="healthy"' in shown["/fleet/servers/live/"]


@pytest.mark.django_db
def test_a_platform_admin_sees_how_each_cluster_is_reached_and_each_servers_files(root, fleet):
    shown = pages(root, fleet)

    for text in (API_URL, f"stored, …QRST ({len(TOKEN)} characters)", "1 certificate",
                 "API URL, bearer token and CA bundle"):
        assert text in shown["cluster"], text
    assert f"from ${ENV_NAME}" in shown["cluster by env"]
    for text in (CONNECTION_ERROR, SYNC_DETAIL, SYNC_ERROR, KUBE_ROUTER_ERROR):
        assert text in shown["cluster"] and text in shown["cluster live"], text
    assert f'title="{SYNC_DETAIL}"' in shown["/fleet/"]
    assert NGINX_ROUTER_ERROR in shown["/fleet/servers/live/"]
    for page in ("server", "server status", "server check"):
        for text in (REPOSITORY, LOG, METRICS):
            assert text in shown[page], (page, text)
    assert TOKEN not in str(shown.values())
