"""An API server URL that is not a Kubernetes API server: what it is told, on each path.

A kube-apiserver never redirects and never answers HTML: its errors are JSON ``Status``
objects, except a path it does not serve (an API group, version or resource whose CRD is not
installed), which it answers ``404 page not found`` as text/plain (``recorded/06``). So only
those two mean "missing"; any other web server answering the cluster's ``api_url`` (a 404
HTML page, a 301 to a login page) is named as not a Kubernetes API server, and a sync of it
fails the connection rather than recording it ``ok``. The web servers here are tiny local
``http.server``\\ s answering as such apps do.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from fleet.adapters.kubernetes import TOKEN, KubeAccess, KubeError
from fleet.adapters.routers.istio import IstioRouter
from fleet.inventory import kube_connection, kube_sync
from fleet.models import Cluster
from tests.fixtures.http_server import QuietHTTPServer
from tests.kube.replay import GOOD_TOKEN, RecordedApiServer, answered, exchanges
from tests.kube.test_kube_sync import make_cluster

HTML_404 = b"<!doctype html><html><head><title>Not Found</title></head><body>Nope</body></html>"


class WebApp(BaseHTTPRequestHandler):
    """A web application: ``answer`` says how it answers every GET."""

    answer = "html-404"

    def log_message(self, *args: object) -> None:
        return

    def do_GET(self) -> None:
        if self.answer == "redirect" and not self.path.startswith("/login"):
            self._send(301, "text/html", b"<html>Moved</html>", Location="/login/")
        elif self.answer == "redirect":
            # Where the redirect leads: a page that happens to be a JSON object.
            self._send(200, "application/json", json.dumps({"items": []}).encode())
        elif self.answer == "plain-404":
            self._send(404, "text/plain; charset=utf-8", b"404 page not found\n")
        else:
            self._send(404, "text/html; charset=utf-8", HTML_404)

    def _send(self, status: int, content_type: str, body: bytes, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def web_app() -> Iterator[tuple[str, type[WebApp]]]:
    handler = type("App", (WebApp,), {})
    server = QuietHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.django_db
def test_a_web_app_answering_version_with_an_html_404_is_not_a_kubernetes_api_server(web_app):
    url, _app = web_app
    result = kube_connection.test_connection(make_cluster(url))
    assert result.ok is False
    assert result.detail.startswith(
        f"GET /version: {url} is not a Kubernetes API server: it answered 404 text/html "
        "('<!doctype html>")
    assert "CRD" not in result.detail


@pytest.mark.django_db
def test_a_redirect_is_not_a_kubernetes_api_server_and_names_where_it_leads(web_app):
    url, app = web_app
    app.answer = "redirect"
    result = kube_connection.test_connection(make_cluster(url))
    assert result.ok is False
    assert result.detail == (
        f"GET /version: {url} is not a Kubernetes API server: it answered 301 Moved "
        "Permanently redirecting to /login/; check the cluster's API server URL")


@pytest.mark.django_db
@pytest.mark.parametrize("answer", ["redirect", "html-404"])
def test_a_sync_of_an_address_that_is_not_kubernetes_fails_the_connection(web_app, answer):
    url, app = web_app
    app.answer = answer
    cluster = make_cluster(url)
    sync = kube_sync.sync_cluster(cluster, page_size=0)
    cluster.refresh_from_db()
    assert sync.ok is False
    assert cluster.connection_state == Cluster.ConnectionState.FAILED
    assert cluster.sync_state == Cluster.SyncState.FAILED
    assert f"list nodes: {url} is not a Kubernetes API server" in cluster.connection_detail


def test_a_plain_404_on_version_is_not_a_kubernetes_api_server_either(web_app):
    """Every kube-apiserver serves /version: its own ``404 page not found`` there is no
    missing CRD."""
    url, app = web_app
    app.answer = "plain-404"
    with pytest.raises(KubeError) as refused:
        kube_connection.kube.server_version(KubeAccess(auth=TOKEN, url=url, token="t"))
    assert refused.value.kind == "not_kubernetes" and not refused.value.missing_api
    assert "it answered 404 text/plain ('404 page not found')" in refused.value.message


def istio(url: str) -> IstioRouter:
    return IstioRouter(KubeAccess(auth=TOKEN, url=url, token=GOOD_TOKEN, timeout_s=2),
                       namespace="serving", route_domain="example")


def test_a_router_on_a_web_app_says_it_is_not_kubernetes_not_that_a_crd_is_missing(web_app):
    url, _app = web_app
    with pytest.raises(KubeError) as refused:
        istio(url).read("fraud-scorer")
    assert refused.value.kind == "not_kubernetes" and refused.value.permanent
    assert not refused.value.missing_api
    assert f"{url} is not a Kubernetes API server: it answered 404 text/html" in (
        refused.value.message)


def test_the_api_servers_own_plain_404_on_an_api_path_still_means_a_missing_crd():
    """The VirtualService read answered as the real server answered an unknown group (06)."""
    script = [answered(exchanges("05-istio", 2)[0], exchanges("06-auth-errors", 12)[0])]
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        istio(srv.url).read("fraud-scorer")
    srv.assert_all_matched()
    assert refused.value.missing_api and refused.value.kind == "not_found"
    assert "this cluster does not serve it (404 page not found)" in refused.value.message
