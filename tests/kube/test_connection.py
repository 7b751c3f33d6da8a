"""How Switchyard reaches a cluster's API and the "test connection" action, against answers a
real kube-apiserver gave (``recorded/``), a local TLS server and a closed port.

A connection test is ``GET /version`` and then ``GET /api/v1/nodes`` with the credentials:
/version is answered to anonymous callers, so a missing credential or a missing RBAC grant
only shows on the node list, which is what the sync needs first. A wrong token is refused on
/version itself (401), as the real server does (``10-bad-token``).
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from console.exceptions import DomainError
from fleet.adapters import kubernetes as kube
from fleet.inventory import kube_connection, secrets
from fleet.models import Cluster
from tests.factories import ClusterFactory
from tests.fixtures.http_server import QuietHTTPServer
from tests.kube.replay import RecordedApiServer, exchanges

TOKEN = "sy-kube-token-0123456789abcdefXYZW"
VERSION = "v1.24.0-alpha.1+ab451280a0ea81"
#: What the platform lets a cluster's kube_secret_env name in these tests.
ALLOWED_ENV = ["SY_TEST_KUBE_TOKEN", "KUBE_TOKEN"]


@pytest.fixture(autouse=True)
def allowed_env(settings) -> None:
    settings.SWITCHYARD_KUBE_SECRET_ENV_ALLOWED = ALLOWED_ENV


def connected() -> list[dict]:
    """GET /version and the full node list (four nodes), as the real server answered."""
    return exchanges("01-server-discovery", 0) + exchanges("02-nodes", 4)


def refused_token() -> list[dict]:
    """A wrong bearer token: 401 on GET /version itself, the first call (a real server never
    answers /version to a token it refuses and the node list then 401)."""
    return exchanges("10-bad-token", 0)


def no_list_grant() -> list[dict]:
    """GET /version answered, then 403: a user that may get a node but not list them."""
    return exchanges("01-server-discovery", 0) + exchanges("06-auth-errors", 5)


def token_cluster(url: str, **fields) -> Cluster:
    cluster = ClusterFactory(
        name=fields.pop("name", "gpu-east"), kind=Cluster.Kind.KUBERNETES,
        kube_auth=Cluster.KubeAuth.TOKEN, api_url=url, **fields,
    )
    if not cluster.kube_secret_env:
        kube_connection.set_secret(cluster, TOKEN)
        cluster.save()
    return cluster


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- TLS: a CA, a server certificate it signs for 127.0.0.1, and a CA that signed nothing here


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def make_ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def server_context(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                   folder: Path) -> ssl.SSLContext:
    """A server-side TLS context with a certificate for 127.0.0.1 signed by ``ca``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(_name("kube-apiserver")).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "server.pem").write_text(_pem(cert))
    (folder / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem", folder / "server.key")
    return context


@pytest.fixture
def tls_api() -> Iterator[tuple[RecordedApiServer, str, str]]:
    """The recorded answers served over TLS: (server, https URL, PEM of the CA that signed
    its certificate)."""
    ca, ca_key = make_ca("switchyard-test-ca")
    with tempfile.TemporaryDirectory() as folder:
        context = server_context(ca, ca_key, Path(folder))
        srv = RecordedApiServer(connected())
        # The replay server's listening socket, wrapped: each connection is TLS from accept().
        srv._httpd.socket = context.wrap_socket(srv._httpd.socket, server_side=True)
        host, port = srv._httpd.server_address[:2]
        with srv:
            yield srv, f"https://{host}:{port}", _pem(ca)


# --- the connection test


@pytest.mark.django_db
def test_it_reports_the_server_version_and_how_many_nodes_it_may_list():
    with RecordedApiServer(connected()) as srv:
        cluster = token_cluster(srv.url)
        result = kube_connection.test_connection(cluster)
    srv.assert_all_matched()

    assert (result.ok, result.server_version) == (True, VERSION)
    assert result.detail == f"connected: Kubernetes {VERSION}, 4 nodes listed"
    # Both calls carried the stored token, decrypted.
    assert [r.authorization for r in srv.received] == [f"Bearer {TOKEN}"] * 2
    assert [(r.method, r.path, r.query) for r in srv.received] == [
        ("GET", "/version", {}), ("GET", "/api/v1/nodes", {})]
    row = Cluster.objects.get(pk=cluster.pk)
    assert (row.connection_state, row.kube_server_version) == ("ok", VERSION)
    assert row.connection_detail == result.detail and row.connection_checked_at is not None


@pytest.mark.django_db
def test_a_refused_token_is_a_recorded_failure_at_the_first_call():
    with RecordedApiServer(refused_token()) as srv:
        cluster = token_cluster(srv.url, kube_server_version="v1.23.0")
        result = kube_connection.test_connection(cluster)
    srv.assert_all_matched()

    assert result.ok is False and result.server_version == ""
    assert result.detail == ("GET /version: the API server refused the credentials "
                             "(401 Unauthorized): check the token")
    assert [(r.method, r.path) for r in srv.received] == [("GET", "/version")]
    row = Cluster.objects.get(pk=cluster.pk)
    assert (row.connection_state, row.connection_detail) == ("failed", result.detail)
    # A failure does not forget the version last seen.
    assert row.kube_server_version == "v1.23.0"


@pytest.mark.django_db
def test_a_credential_without_the_list_nodes_grant_fails_naming_rbac():
    with RecordedApiServer(no_list_grant()) as srv:
        result = kube_connection.test_connection(token_cluster(srv.url))
    srv.assert_all_matched()

    assert result.ok is False
    assert result.detail.startswith("GET /api/v1/nodes: forbidden by RBAC (403): ")
    assert 'cannot list resource "nodes"' in result.detail


@pytest.mark.django_db
def test_the_ca_bundle_decides_whether_tls_is_trusted(tls_api):
    srv, url, ca = tls_api
    other_ca, _ = make_ca("a-ca-that-signed-nothing-here")
    wrong = token_cluster(url, name="wrong-ca", kube_ca_bundle=_pem(other_ca))
    right = token_cluster(url, name="right-ca", kube_ca_bundle=ca)

    refused = kube_connection.test_connection(wrong)
    trusted = kube_connection.test_connection(right)
    srv.assert_all_matched()

    assert refused.ok is False
    assert refused.detail.startswith("GET /version: TLS failed: certificate verify failed")
    assert "check the CA bundle" in refused.detail
    assert Cluster.objects.get(pk=wrong.pk).connection_state == "failed"
    # The same server, trusted through the CA that signed its certificate.
    assert (trusted.ok, trusted.server_version) == (True, VERSION)


@pytest.mark.django_db
def test_an_unreachable_api_server_is_a_readable_failure():
    port = closed_port()
    result = kube_connection.test_connection(token_cluster(f"https://127.0.0.1:{port}"))

    assert result.ok is False
    assert result.detail.startswith(f"GET /version: API server unreachable: 127.0.0.1:{port}: ")
    assert "Connection refused" in result.detail


@pytest.mark.django_db
def test_a_server_that_is_not_a_kubernetes_api_is_named_so():
    class Web(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body>It works!</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    web = QuietHTTPServer(("127.0.0.1", 0), Web)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        result = kube_connection.test_connection(
            token_cluster(f"http://127.0.0.1:{web.server_address[1]}"))
    finally:
        web.shutdown()
        web.server_close()

    assert result.ok is False
    assert result.detail == f"GET /version: {kube.NOT_KUBERNETES}"


@pytest.mark.django_db
def test_a_kubeconfig_context_is_used_as_named():
    with RecordedApiServer(connected()) as srv:
        away = f"http://127.0.0.1:{closed_port()}"
        kubeconfig = yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "elsewhere",
            "clusters": [{"name": "lab", "cluster": {"server": srv.url}},
                         {"name": "away", "cluster": {"server": away}}],
            "users": [{"name": "switchyard", "user": {"token": TOKEN}}],
            "contexts": [
                {"name": "lab", "context": {"cluster": "lab", "user": "switchyard"}},
                {"name": "elsewhere", "context": {"cluster": "away", "user": "switchyard"}},
            ],
        })
        cluster = ClusterFactory(name="kc", kind=Cluster.Kind.KUBERNETES,
                                 kube_auth=Cluster.KubeAuth.KUBECONFIG, kube_context="lab")
        kube_connection.set_secret(cluster, kubeconfig)
        cluster.save()
        result = kube_connection.test_connection(cluster)
        cluster.kube_context = "staging"
        missing = kube_connection.test_connection(cluster)
    srv.assert_all_matched()

    assert (result.ok, result.server_version) == (True, VERSION)
    assert [r.authorization for r in srv.received] == [f"Bearer {TOKEN}"] * 2
    assert missing.ok is False
    assert missing.detail.startswith("the kubeconfig cannot be used: ")
    assert "staging" in missing.detail


@pytest.mark.django_db
def test_a_token_referenced_from_the_environment_is_read_when_used(monkeypatch):
    monkeypatch.setenv("SY_TEST_KUBE_TOKEN", TOKEN)
    with RecordedApiServer(connected()) as srv:
        cluster = token_cluster(srv.url, kube_secret_env="SY_TEST_KUBE_TOKEN")
        result = kube_connection.test_connection(cluster)
    srv.assert_all_matched()

    assert result.ok is True
    assert srv.received[0].authorization == f"Bearer {TOKEN}"
    assert cluster.kube_secret_encrypted == ""
    assert kube_connection.secret_hint(cluster) == "from $SY_TEST_KUBE_TOKEN"


@pytest.mark.django_db
def test_a_missing_environment_variable_is_a_recorded_failure(monkeypatch):
    monkeypatch.delenv("SY_TEST_KUBE_TOKEN", raising=False)
    cluster = token_cluster("https://127.0.0.1:6443", kube_secret_env="SY_TEST_KUBE_TOKEN")

    result = kube_connection.test_connection(cluster)

    assert result.ok is False
    assert result.detail == ("the environment variable SY_TEST_KUBE_TOKEN is not set where "
                             "Switchyard runs")
    assert Cluster.objects.get(pk=cluster.pk).connection_state == "failed"


@pytest.mark.django_db
def test_in_cluster_access_outside_a_pod_says_so():
    cluster = ClusterFactory(name="here", kind=Cluster.Kind.KUBERNETES,
                             kube_auth=Cluster.KubeAuth.IN_CLUSTER)

    result = kube_connection.test_connection(cluster)

    assert result.ok is False
    assert result.detail.startswith("no in-cluster service account here")


@pytest.mark.django_db
def test_a_secret_stored_under_another_key_asks_to_be_entered_again(settings):
    cluster = token_cluster("https://127.0.0.1:6443")
    settings.SWITCHYARD_SECRET_KEY = "a-rotated-key"

    result = kube_connection.test_connection(cluster)

    assert result.ok is False and "enter it again" in result.detail
    assert kube_connection.secret_hint(cluster) == "stored, unreadable with the current key"


@pytest.mark.django_db
def test_only_kubernetes_clusters_have_a_connection_to_test():
    static = ClusterFactory(name="static-1", kind=Cluster.Kind.STATIC)

    with pytest.raises(kube_connection.NotKubernetes) as refused:
        kube_connection.test_connection(static)

    assert refused.value.field == "kind"
    assert Cluster.objects.get(pk=static.pk).connection_state == "unknown"


# --- the secret


@pytest.mark.django_db
def test_the_secret_is_stored_encrypted_and_shown_as_a_hint_only():
    cluster = token_cluster("https://127.0.0.1:6443")

    stored = Cluster.objects.filter(pk=cluster.pk).values_list("kube_secret_encrypted", flat=True)
    assert TOKEN not in stored[0] and TOKEN[-8:] not in stored[0]
    assert secrets.decrypt(stored[0]) == TOKEN
    assert kube_connection.secret_of(Cluster.objects.get(pk=cluster.pk)) == TOKEN
    assert kube_connection.secret_hint(cluster) == f"stored, …XYZW ({len(TOKEN)} characters)"


def test_a_new_secret_replaces_the_variable_and_a_variable_replaces_the_secret():
    cluster = Cluster(kind=Cluster.Kind.KUBERNETES, kube_secret_env="OLD")

    kube_connection.change_secret(cluster, secret=TOKEN, secret_env=None)
    assert (kube_connection.secret_of(cluster), cluster.kube_secret_env) == (TOKEN, "")

    kube_connection.change_secret(cluster, secret="", secret_env=None)
    assert kube_connection.secret_of(cluster) == TOKEN  # empty: keep the stored one

    kube_connection.change_secret(cluster, secret="", secret_env="KUBE_TOKEN")
    assert (cluster.kube_secret_encrypted, cluster.kube_secret_env) == ("", "KUBE_TOKEN")

    kube_connection.change_secret(cluster, secret=TOKEN, secret_env=None)
    kube_connection.change_secret(cluster, secret=None, secret_env=None)
    assert (cluster.kube_secret_encrypted, cluster.kube_secret_env) == ("", "")

    with pytest.raises(DomainError) as both:
        kube_connection.change_secret(cluster, secret=TOKEN, secret_env="KUBE_TOKEN")
    assert both.value.field == "kube_secret"


# --- which environment variables a cluster may read -------------------------------------------


@pytest.fixture
def listener() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP server a platform admin points a cluster at: records every request."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = QuietHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.django_db
def test_the_secret_key_is_not_sent_to_a_listener(listener, monkeypatch):
    """GIVEN a cluster row whose kube_secret_env is SECRET_KEY and whose API URL is a
    listener (written before the fence, or by hand) WHEN its connection is tested THEN the
    variable is not read, nothing is sent, and the failure is recorded readably."""
    url, seen = listener
    monkeypatch.setenv("SECRET_KEY", "the-web-process-secret-key-0123456789")
    cluster = token_cluster(url, kube_secret_env="SECRET_KEY")

    result = kube_connection.test_connection(cluster)

    assert seen == []
    assert result.ok is False
    assert "'SECRET_KEY' is not an environment variable name Switchyard may read" in result.detail
    assert "SWITCHYARD_KUBE_SECRET_ENV_ALLOWED" in result.detail
    assert "the-web-process-secret-key" not in result.detail
    row = Cluster.objects.get(pk=cluster.pk)
    assert (row.connection_state, row.connection_detail) == (
        Cluster.ConnectionState.FAILED, result.detail)
    with pytest.raises(secrets.EnvNotAllowed) as refused:
        kube_connection.secret_of(cluster)
    assert refused.value.field == "kube_secret_env"


@pytest.mark.django_db
def test_a_variable_the_platform_allows_is_read_and_sent(monkeypatch, settings):
    settings.SWITCHYARD_KUBE_SECRET_ENV_ALLOWED = ["SY_TEST_GPU_EAST_TOKEN"]
    monkeypatch.setenv("SY_TEST_GPU_EAST_TOKEN", TOKEN)
    with RecordedApiServer(connected()) as srv:
        cluster = token_cluster(srv.url, kube_secret_env="SY_TEST_GPU_EAST_TOKEN")
        result = kube_connection.test_connection(cluster)
    srv.assert_all_matched()

    assert result.ok is True
    assert [r.authorization for r in srv.received] == [f"Bearer {TOKEN}"] * 2


@pytest.mark.parametrize("name", ["SECRET_KEY", "DATABASE_URL", "SWITCHYARD_SECRET_KEY",
                                  "KUBE_TOKEN_2", "kube_token"])
def test_naming_a_variable_the_platform_does_not_allow_is_refused(name):
    cluster = Cluster(kind=Cluster.Kind.KUBERNETES)

    with pytest.raises(DomainError) as refused:
        kube_connection.change_secret(cluster, secret="", secret_env=name)

    assert refused.value.field == "kube_secret_env"
    assert f"{name!r} is not an environment variable name" in refused.value.message
    assert "now: SY_TEST_KUBE_TOKEN, KUBE_TOKEN" in refused.value.message
    assert cluster.kube_secret_env == ""
