"""What a sync makes of a cluster that fails: wrong credentials, RBAC refusing one resource,
an unreachable API, a watch that drops, unusable settings. Each ends as a readable state on
the cluster and a failed ClusterSync row; none raises (fleet.inventory.kube_sync)."""

from __future__ import annotations

import copy
import socket
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from fleet.inventory import kube_sync
from fleet.models import Cluster, ClusterSync, InferenceServer, Node
from tests.fixtures.http_server import QuietHTTPServer
from tests.kube.replay import RecordedApiServer, exchanges
from tests.kube.test_kube_sync import DISCOVERY, make_cluster

pytestmark = pytest.mark.django_db


def test_wrong_credentials_fail_the_sync_and_the_connection():
    with RecordedApiServer(exchanges("06-auth-errors", 0)) as srv:
        cluster = make_cluster(srv.url)
        sync = kube_sync.sync_cluster(cluster, page_size=0)
        srv.assert_all_matched()
        assert len(srv.received) == 1  # nothing else is tried with credentials refused
    message = ("list nodes: the API server refused the credentials (401 Unauthorized): check "
               "the token")
    assert (sync.pk is not None, sync.ok, sync.kind, sync.errors) == (
        True, False, ClusterSync.Kind.LIST, [message])
    cluster.refresh_from_db()
    assert (cluster.sync_state, cluster.sync_detail) == (Cluster.SyncState.FAILED, message)
    assert (cluster.connection_state, cluster.connection_detail) == (
        Cluster.ConnectionState.FAILED, message)
    assert cluster.nodes_resource_version == "" and not Node.objects.exists()


def test_rbac_refusing_the_node_list_still_applies_the_discovered_servers():
    """06 #5: a user that may get nodes but not list them (403); the Deployments list answers."""
    with RecordedApiServer(exchanges("06-auth-errors", 5) + exchanges(*DISCOVERY)) as srv:
        cluster = make_cluster(srv.url)
        sync = kube_sync.sync_cluster(cluster, page_size=0)
        srv.assert_all_matched()
    assert not sync.ok
    assert sync.errors == [
        'list nodes: forbidden by RBAC (403): nodes is forbidden: User "gpu-node-reader" '
        'cannot list resource "nodes" in API group "" at the cluster scope'
    ]
    assert sorted(sync.added) == ["server triton-fraud-v1", "server triton-fraud-v2",
                                  "server vllm-llama"]
    cluster.refresh_from_db()
    assert cluster.sync_state == Cluster.SyncState.PARTIAL
    assert cluster.sync_detail.startswith("list nodes: forbidden by RBAC (403)")
    assert cluster.sync_detail.endswith("0 nodes; 3 discovered servers")
    assert cluster.connection_state == Cluster.ConnectionState.OK
    assert cluster.nodes_resource_version == ""  # the next sync lists again


def _deployments_forbidden() -> dict:
    """The Deployments list of 03 #11 (the request exactly as recorded) answered with a 403
    Status shaped as the real server's 403 on the node list (06 #5), for deployments."""
    exchange = copy.deepcopy(exchanges(*DISCOVERY)[0])
    status = copy.deepcopy(exchanges("06-auth-errors", 5)[0])
    status["response_body"]["message"] = (
        'deployments.apps is forbidden: User "gpu-node-reader" cannot list resource '
        '"deployments" in API group "apps" at the cluster scope')
    status["response_body"]["details"] = {"group": "apps", "kind": "deployments"}
    exchange.update(status=403, response_headers=status["response_headers"],
                    response_body=status["response_body"], note="403 on the deployments list")
    return exchange


def test_rbac_refusing_the_deployments_list_still_applies_the_nodes():
    with RecordedApiServer([*exchanges("02-nodes", 4), _deployments_forbidden()]) as srv:
        cluster = make_cluster(srv.url)
        sync = kube_sync.sync_cluster(cluster, page_size=0)
        srv.assert_all_matched()
        assert srv.unused == []
    assert not sync.ok and len([n for n in sync.added if n.startswith("node")]) == 4
    assert sync.errors == [
        'list deployments: forbidden by RBAC (403): deployments.apps is forbidden: User '
        '"gpu-node-reader" cannot list resource "deployments" in API group "apps" at the '
        'cluster scope'
    ]
    cluster.refresh_from_db()
    assert cluster.sync_state == Cluster.SyncState.PARTIAL
    assert cluster.nodes_resource_version == "207"
    assert Node.objects.filter(cluster=cluster).count() == 4
    assert not InferenceServer.objects.exists()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_api_fails_readably():
    cluster = make_cluster(f"http://127.0.0.1:{_closed_port()}")
    sync = kube_sync.sync_cluster(cluster)
    assert not sync.ok and len(sync.errors) == 1
    assert sync.errors[0].startswith("list nodes: API server unreachable: ")
    assert "Connection refused" in sync.errors[0]
    cluster.refresh_from_db()
    assert cluster.sync_state == Cluster.SyncState.FAILED
    assert cluster.sync_detail == sync.errors[0]
    assert cluster.connection_state == Cluster.ConnectionState.FAILED
    assert cluster.connection_detail == sync.errors[0]


def test_a_missing_secret_variable_fails_readably(monkeypatch, settings):
    settings.SWITCHYARD_KUBE_SECRET_ENV_ALLOWED = ["GPU_EAST_TOKEN"]
    monkeypatch.delenv("GPU_EAST_TOKEN", raising=False)
    cluster = make_cluster("http://127.0.0.1:9", kube_secret_env="GPU_EAST_TOKEN")
    Cluster.objects.filter(pk=cluster.pk).update(kube_secret_encrypted="")
    cluster.refresh_from_db()
    sync = kube_sync.sync_cluster(cluster)
    message = "the environment variable GPU_EAST_TOKEN is not set where Switchyard runs"
    assert sync.errors == [message]
    cluster.refresh_from_db()
    assert (cluster.sync_state, cluster.connection_state) == (
        Cluster.SyncState.FAILED, Cluster.ConnectionState.FAILED)
    assert cluster.connection_detail == message


class _DroppingWatch:
    """Answers the watch of 02-nodes #21 with its first ``keep`` events as the real server
    sent them, then drops the connection without ending the stream."""

    def __init__(self, keep: int) -> None:
        recorded = exchanges("02-nodes", 21)[0]
        lines = recorded["response_body"][:keep]
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_GET(self) -> None:
                owner.requests.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for line in lines:
                    data = (line + "\n").encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def test_a_watch_that_drops_keeps_the_events_received_and_resumes_after_them():
    with RecordedApiServer(exchanges("02-nodes", 20) + exchanges(*DISCOVERY)) as srv:
        cluster = make_cluster(srv.url)
        kube_sync.sync_cluster(cluster, page_size=0)
        srv.assert_all_matched()
    dropping = _DroppingWatch(keep=2)
    try:
        cluster.api_url = dropping.url
        cluster.save()
        sync = kube_sync.sync_cluster(cluster, watch_timeout=30)
    finally:
        dropping.stop()
    assert dropping.requests == ["/api/v1/nodes?resourceVersion=210&timeoutSeconds=30&watch=true"]
    assert (sync.kind, sync.ok) == (ClusterSync.Kind.WATCH, False)
    assert (sync.added, sync.changed, sync.gone) == (["node gpu-l4-02"], ["node gpu-l4-02"], [])
    assert len(sync.errors) == 1
    assert sync.errors[0].startswith("watch nodes (the stream dropped): API server unreachable")
    assert sync.errors[0].endswith(
        "after 2 events; the next sync resumes from resourceVersion 212")
    assert sync.resource_version == "212"
    cluster.refresh_from_db()
    assert cluster.nodes_resource_version == "212"
    assert cluster.sync_state == Cluster.SyncState.PARTIAL
    assert cluster.connection_state == Cluster.ConnectionState.OK
    l4 = Node.objects.get(cluster=cluster, name="gpu-l4-02")
    assert l4.labels["switchyard.io/pool"] == "batch" and l4.ready is False


def test_an_unexpected_failure_is_recorded_not_raised(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(kube_sync, "_apply_node", broken)
    with RecordedApiServer(exchanges("02-nodes", 4)) as srv:
        cluster = make_cluster(srv.url)
        sync = kube_sync.sync_cluster(cluster, page_size=0)
    assert sync.errors == ["internal error: RuntimeError: disk full"]
    cluster.refresh_from_db()
    assert cluster.sync_state == Cluster.SyncState.FAILED
    assert "disk full" in cluster.sync_detail
    assert not Node.objects.exists()  # the transaction applying the list was rolled back

