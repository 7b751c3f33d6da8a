"""Clusters and servers are shared by every tenant; what each caller reads of them.

Tenant members (every role, tokens too, either tenant) read names, kinds and health. How a
cluster's API is reached (its URL, authentication, CA bundle, the token's hint, the variable
it is read from, the S3 endpoint) and the error texts that name it, a server's files (model
repository, log) and its metrics URL are the platform's: only platform admins read them.
Each check looks for the values themselves in the whole answer, not only for the keys.
"""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from fleet.adapters.base import ServerProbe
from fleet.inventory import health, kube_connection
from fleet.models import Cluster, ClusterSync, InferenceServer
from tests.factories import ClusterFactory, InferenceServerFactory, NodeFactory

TOKEN = "kube-token-for-the-visibility-tests-QRST"
API_URL = "https://api.gpu-east.internal.example:6443"
CA = "-----BEGIN CERTIFICATE-----\nMIIvisibilityCA\n-----END CERTIFICATE-----\n"
S3_ENDPOINT = "http://minio.platform.internal.example:9000"
ENV_NAME = "PLATFORM_ONLY_KUBE_TOKEN_VAR"
CONNECTION_ERROR = "GET /version: API server unreachable: api.gpu-east.internal.example:6443: timed out"
SYNC_ERROR = "GET /api/v1/nodes: API server unreachable: api.gpu-east.internal.example:6443: refused"
REPOSITORY = "/srv/platform/triton-shared/model-repository"
LOG = "/var/log/platform/triton-shared.log"
METRICS = "http://triton-shared.platform.internal.example:8002/metrics"
HTTP_URL = "http://127.0.0.1:9"

#: The values a tenant member never reads, with the field each one is in.
HIDDEN = {
    "api_url": API_URL,
    "kube_ca_bundle": "MIIvisibilityCA",
    "kube_secret_hint": "QRST",  # the token's last four characters
    "kube_secret_env": ENV_NAME,
    "s3_endpoint_url": S3_ENDPOINT,
    "connection_detail": CONNECTION_ERROR,
    "sync_detail": SYNC_ERROR,
    "model_repository": REPOSITORY,
    "log_path": LOG,
    "metrics_url": METRICS,
}
#: The token's length, as the hint says it ("(40 characters)").
LENGTH = f"({len(TOKEN)} characters)"
CLUSTER_ADMIN_FIELDS = {"api_url", "s3_endpoint_url", "kube_auth", "kube_context",
                        "kube_ca_bundle", "kube_secret_env", "kube_secret_hint",
                        "connection_detail", "sync_detail"}
SERVER_ADMIN_FIELDS = {"metrics_url", "model_repository", "log_path"}


@pytest.fixture(autouse=True)
def fake_probes(monkeypatch):
    """servers/check probes for real; answer at once instead of touching the network."""

    def probe(http_url: str, timeout: float) -> ServerProbe:
        return ServerProbe(ready=False, live=False, error="connection refused")

    monkeypatch.setattr(health, "PROBES", dict.fromkeys(InferenceServer.Runtime, probe))


@pytest.fixture
def fleet(db) -> dict[str, object]:
    """A kubernetes cluster reached by token, one whose token is read from a variable, and a
    Triton server on the first with its repository, log and metrics URL recorded."""
    cluster = ClusterFactory(
        name="gpu-east", kind=Cluster.Kind.KUBERNETES, kube_auth=Cluster.KubeAuth.TOKEN,
        api_url=API_URL, kube_ca_bundle=CA, s3_endpoint_url=S3_ENDPOINT, s3_region="eu-west-1",
        connection_state="failed", connection_detail=CONNECTION_ERROR,
        sync_state="failed", sync_detail=SYNC_ERROR, kube_route_host="routes.example.com",
    )
    kube_connection.set_secret(cluster, TOKEN)
    cluster.save()
    by_env = ClusterFactory(name="gpu-west", kind=Cluster.Kind.KUBERNETES,
                            kube_auth=Cluster.KubeAuth.TOKEN, api_url=API_URL,
                            kube_secret_env=ENV_NAME)
    start = timezone.now() - datetime.timedelta(minutes=1)
    ClusterSync.objects.create(cluster=cluster, kind="list", ok=False, errors=[SYNC_ERROR],
                               started_at=start, finished_at=start)
    node = NodeFactory(cluster=cluster, name="gpu-h100-01")
    server = InferenceServerFactory(
        cluster=cluster, node=node, name="triton-shared", http_url=HTTP_URL,
        grpc_url="127.0.0.1:8001", metrics_url=METRICS, model_repository=REPOSITORY,
        log_path=LOG, health="healthy",
    )
    return {"cluster": cluster, "by_env": by_env, "server": server}


def reads(client, fleet) -> dict[str, object]:
    """Every answer about the shared fleet a member can ask for, by path."""
    cluster, by_env, server = fleet["cluster"], fleet["by_env"], fleet["server"]
    answers = {}
    for path in (
        "/api/v1/clusters/", f"/api/v1/clusters/{cluster.pk}/", f"/api/v1/clusters/{by_env.pk}/",
        f"/api/v1/clusters/{cluster.pk}/syncs/", "/api/v1/servers/",
        f"/api/v1/servers/{server.pk}/", "/api/v1/nodes/", "/api/v1/gpus/",
    ):
        answers[path] = client.get(path)
    answers["check"] = client.post(f"/api/v1/servers/{server.pk}/check/")
    return answers


MEMBERS = ["alice", "erin", "dave", "bob", "charlie"]


@pytest.mark.django_db
@pytest.mark.parametrize("persona", MEMBERS)
def test_a_member_of_any_role_reads_no_platform_detail_of_clusters_and_servers(
    request, client_for, fleet, persona,
):
    answers = reads(client_for(request.getfixturevalue(persona)), fleet)

    for path, response in answers.items():
        assert response.status_code == 200, (path, response.content)
        text = response.content.decode()
        for field, value in HIDDEN.items():
            assert value not in text, f"{persona} reads {field} at {path}"
        assert LENGTH not in text, f"{persona} reads the token's length at {path}"
        assert SYNC_ERROR.split(": ", 1)[1] not in text
    cluster = answers[f"/api/v1/clusters/{fleet['cluster'].pk}/"].json()
    server = answers[f"/api/v1/servers/{fleet['server'].pk}/"].json()
    assert not CLUSTER_ADMIN_FIELDS & set(cluster)
    assert not SERVER_ADMIN_FIELDS & set(server)
    # What a member needs stays: names, kinds, health, where to call.
    assert (cluster["name"], cluster["kind"], cluster["connection_state"],
            cluster["sync_state"], cluster["kube_route_host"]) == (
        "gpu-east", "kubernetes", "failed", "failed", "routes.example.com")
    assert (server["name"], server["runtime"], server["health"], server["http_url"],
            server["grpc_url"]) == ("triton-shared", "triton", "healthy", HTTP_URL, "127.0.0.1:8001")
    assert answers["check"].json()["health"] == "unreachable"
    assert [row["ok"] for row in answers[f"/api/v1/clusters/{fleet['cluster'].pk}/syncs/"]
            .json()["results"]] == [False]


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["viewer", "deployer", "approver", "admin"])
def test_a_tenant_token_reads_no_platform_detail_either(token_client, tenant_a, fleet, role):
    for path, response in reads(token_client(tenant_a, role), fleet).items():
        assert response.status_code == 200, (path, response.content)
        text = response.content.decode()
        for field, value in HIDDEN.items():
            assert value not in text, f"a {role} token reads {field} at {path}"
        assert LENGTH not in text


@pytest.mark.django_db
def test_a_platform_admin_reads_everything(root, client_for, fleet):
    answers = reads(client_for(root), fleet)

    cluster = answers[f"/api/v1/clusters/{fleet['cluster'].pk}/"].json()
    by_env = answers[f"/api/v1/clusters/{fleet['by_env'].pk}/"].json()
    server = answers[f"/api/v1/servers/{fleet['server'].pk}/"].json()
    assert set(cluster) >= CLUSTER_ADMIN_FIELDS
    assert (cluster["api_url"], cluster["kube_ca_bundle"], cluster["s3_endpoint_url"],
            cluster["connection_detail"], cluster["sync_detail"], cluster["kube_auth"]) == (
        API_URL, CA, S3_ENDPOINT, CONNECTION_ERROR, SYNC_ERROR, "token")
    assert cluster["kube_secret_hint"] == f"stored, …QRST {LENGTH}"
    assert (by_env["kube_secret_env"], by_env["kube_secret_hint"]) == (ENV_NAME, f"from ${ENV_NAME}")
    assert (server["model_repository"], server["log_path"], server["metrics_url"]) == (
        REPOSITORY, LOG, METRICS)
    listed = answers["/api/v1/servers/"].json()["results"]
    assert listed[0]["model_repository"] == REPOSITORY
    assert answers["check"].json()["log_path"] == LOG
    syncs = answers[f"/api/v1/clusters/{fleet['cluster'].pk}/syncs/"].json()["results"]
    assert syncs[0]["errors"] == [SYNC_ERROR]
    assert TOKEN not in str([r.content for r in answers.values()])


@pytest.mark.django_db
def test_the_schema_marks_the_platform_fields_optional_in_answers(api):
    schema = api.get("/api/schema/?format=json").json()["components"]["schemas"]

    for name, hidden in (("Cluster", CLUSTER_ADMIN_FIELDS), ("InferenceServer", SERVER_ADMIN_FIELDS),
                         ("ClusterSync", {"errors"})):
        component = schema[name]
        assert hidden <= set(component["properties"]), name
        assert not hidden & set(component.get("required", [])), name
        for field in hidden:
            assert "Platform admins only" in component["properties"][field]["description"], field
    # The fields a member reads are still required.
    assert {"name", "kind", "connection_state"} <= set(schema["Cluster"]["required"])
    assert {"name", "runtime", "health", "http_url"} <= set(schema["InferenceServer"]["required"])
