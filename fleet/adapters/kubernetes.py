"""The Kubernetes API through the official ``kubernetes`` client: connection and errors.

Everything that talks to a cluster's API goes through :func:`api_client` (how to reach it)
and :func:`call` (one request, its failure turned into a readable :class:`KubeError`). The
node sync, the server workloads and the Gateway API / Istio routers build on these two.
Plain Python: no Django, no settings.

Authentication (:class:`KubeAccess`):

* ``in-cluster``: the pod's service account (``/var/run/secrets/kubernetes.io/...``);
* ``kubeconfig``: the text of a kubeconfig and a context in it (empty: its current one);
* ``token``: the API server URL, a bearer token and the PEM CA bundle that signs the server's
  certificate (empty: the system's trust store; an ``http://`` URL uses none).
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from fleet.adapters.base import AdapterError

T = TypeVar("T")

IN_CLUSTER = "in-cluster"
KUBECONFIG = "kubeconfig"
TOKEN = "token"
AUTH_KINDS = (IN_CLUSTER, KUBECONFIG, TOKEN)
FIELD_MANAGER = "switchyard"
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class KubeAccess:
    """How to reach one cluster's API. ``token`` and ``kubeconfig`` are secrets: never log
    or show them (``repr`` leaves them out)."""

    auth: str
    url: str = ""
    token: str = ""
    ca_bundle: str = ""
    kubeconfig: str = ""
    context: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __repr__(self) -> str:
        return f"KubeAccess(auth={self.auth!r}, url={self.url!r}, context={self.context!r})"


class KubeError(AdapterError):
    """A failed Kubernetes API call, readable.

    ``kind`` is one of ``unauthorized`` (401), ``forbidden`` (403, RBAC), ``not_found``
    (404: the object, or with ``missing_api`` True the API group/resource/version itself, as
    when a CRD is not installed), ``conflict`` (409: stale resourceVersion or already
    exists), ``gone`` (410: expired resourceVersion or continue token), ``invalid`` (422,
    with ``causes`` naming the fields), ``unsupported`` (415), ``bad_request`` (400),
    ``server`` (5xx), ``unreachable`` (no connection, timeout), ``tls`` (certificate
    refused), ``config`` (the access details themselves are unusable) or ``not_kubernetes``
    (what answered is not a Kubernetes API server: a redirect, an HTML page, a 404 that is
    neither a Status nor the API server's own ``404 page not found``).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        status: int | None = None,
        reason: str = "",
        causes: list[dict[str, str]] | None = None,
        missing_api: bool = False,
    ) -> None:
        permanent = kind not in ("unreachable", "server", "conflict", "gone")
        super().__init__(message, permanent=permanent)
        self.kind = kind
        self.status = status
        self.reason = reason
        self.causes = causes or []
        self.missing_api = missing_api


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


_KINDS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
          409: "conflict", 410: "gone", 415: "unsupported", 422: "invalid"}


#: What a kube-apiserver answers, as text/plain, for a path it does not serve (an API group,
#: version or resource that is not installed). Every other error it answers is a JSON Status.
PAGE_NOT_FOUND = "404 page not found"
#: Paths every kube-apiserver serves: a 404 there is never a missing API.
_SERVED_ALWAYS = ("GET /version", "GET /readyz", "GET /livez", "GET /healthz")


def error_from(exc: BaseException, what: str = "", url: str = "") -> KubeError:
    """The readable KubeError for a failure of the client (``what``: the call, and ``url``:
    the API server's address, for messages)."""
    prefix = f"{what}: " if what else ""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException) and not exc.status and _is_tls(exc.reason):
        # The client's REST layer turns urllib3's SSLError into an ApiException with no status.
        return KubeError(prefix + f"TLS failed: {_tls_text(str(exc.reason))}", kind="tls")
    if isinstance(exc, ApiException):
        status = exc.status or 0
        body = _status_body(exc)
        message = body.get("message") or (exc.body or exc.reason or "").strip()
        reason = body.get("reason") or ""
        causes = (body.get("details") or {}).get("causes") or []
        kind = _KINDS.get(status, "server" if status >= 500 else "bad_request")
        # An unknown group, resource or version answers a plain-text 404, not a Status.
        missing_api = status == 404 and not body and _page_not_found(exc)
        foreign = _not_kubernetes(exc, body, what)
        if foreign:
            return KubeError(
                prefix + f"{url or 'the address'} is not a Kubernetes API server: {foreign}; "
                "check the cluster's API server URL",
                kind="not_kubernetes", status=status,
            )
        if kind == "unauthorized":
            text = "the API server refused the credentials (401 Unauthorized): check the token"
        elif kind == "forbidden":
            text = f"forbidden by RBAC (403): {message}"
        elif missing_api:
            text = "the API server does not serve this resource (404): is its CRD installed?"
        else:
            text = f"{message} ({status} {reason})" if reason else f"{message} ({status})"
        return KubeError(prefix + text, kind=kind, status=status, reason=reason,
                         causes=causes, missing_api=missing_api)
    if isinstance(exc, urllib3.exceptions.SSLError | ssl.SSLError):
        return KubeError(prefix + f"TLS failed: {_tls_text(_root(exc))}", kind="tls")
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and isinstance(
        exc.reason, urllib3.exceptions.SSLError
    ):
        return KubeError(prefix + f"TLS failed: {_tls_text(_root(exc.reason))}", kind="tls")
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return KubeError(prefix + f"API server unreachable: {_root(exc)}", kind="unreachable")
    if isinstance(exc, ConfigException):
        return KubeError(prefix + f"unusable connection settings: {exc}", kind="config")
    if isinstance(exc, pydantic.ValidationError):
        # A 2xx answer the client cannot read as the API object: not a Kubernetes API server.
        return KubeError(prefix + NOT_KUBERNETES, kind="not_kubernetes")
    raise exc


def _content_type(exc: ApiException) -> str:
    headers = exc.headers or {}
    return str(headers.get("Content-Type") or "").split(";")[0].strip().lower()


def _page_not_found(exc: ApiException) -> bool:
    return (_content_type(exc) == "text/plain"
            and (exc.body or "").strip() == PAGE_NOT_FOUND)


def _not_kubernetes(exc: ApiException, body: dict[str, Any], what: str) -> str:
    """What shows that the answer to ``what`` did not come from a kube-apiserver ("" when
    nothing does): it never redirects, never answers HTML, and answers a 404 with a JSON
    Status or, on an API path, its plain ``404 page not found``."""
    status = exc.status or 0
    content_type = _content_type(exc) or "no content type"
    if 300 <= status < 400:
        location = (exc.headers or {}).get("Location") or "nowhere"
        return f"it answered {status} {exc.reason or ''} redirecting to {location}".replace(
            "  ", " ")
    if body.get("kind") == "Status":
        return ""
    text = " ".join((exc.body or "").split())[:120]
    answered = f"it answered {status} {content_type}" + (f" ({text!r})" if text else "")
    if content_type == "text/html":
        return answered
    if status == 404 and not (_page_not_found(exc) and not what.startswith(_SERVED_ALWAYS)):
        return answered
    return ""


#: What a 2xx answer that is not the expected Kubernetes object means, nearly always.
NOT_KUBERNETES = (
    "the answer is not a Kubernetes API object: is the URL the Kubernetes API server's?"
)


def _is_tls(reason: object) -> bool:
    return str(reason or "").startswith("SSLError")


def _tls_text(text: str) -> str:
    """The OpenSSL complaint without its codes: ``certificate verify failed: self-signed
    certificate (check the CA bundle)``."""
    text = text.strip().splitlines()[-1] if text.strip() else text
    text = re.sub(r"^\[SSL(: [A-Z_]+)?\] ", "", text)
    text = re.sub(r" \(_ssl\.c:\d+\)$", "", text)
    if "certificate verify failed" in text:
        text += " (check the CA bundle: it must sign the API server's certificate)"
    return text


def _root(exc: BaseException) -> str:
    """The innermost reason of a connection failure, without urllib3's object reprs."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        return _root(reason)
    if len(exc.args) == 2 and isinstance(exc.args[1], str):
        return exc.args[1]  # (connection, message), e.g. a connect timeout
    text = str(exc)
    # HTTPSConnection(host='10.0.0.1', port=6443): Failed to establish ... -> 10.0.0.1:6443: ...
    text = re.sub(r"^\w*Connection(?:Pool)?\(host='([^']*)', port=(\d+)\): ", r"\1:\2: ", text)
    text = text.removeprefix("None: ")
    return text.split(": ", 1)[-1] if "object at 0x" in text else text


def call(fn: Callable[..., T], *args: Any, what: str = "", **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, its failure raised as a readable KubeError."""
    try:
        return fn(*args, **kwargs)
    except (
        ApiException, urllib3.exceptions.HTTPError, OSError, ConfigException,
        pydantic.ValidationError,
    ) as exc:
        raise error_from(exc, what, _host_of(fn)) from exc


def _host_of(fn: Callable[..., Any]) -> str:
    """The API server ``fn`` (a method of one of the client's API classes) calls, or ""."""
    api = getattr(getattr(fn, "__self__", None), "api_client", None)
    return str(getattr(getattr(api, "configuration", None), "host", "") or "")


@contextlib.contextmanager
def api_client(access: KubeAccess) -> Iterator[client.ApiClient]:
    """An ApiClient for ``access``; closed (and its temporary CA file removed) on exit."""
    if access.auth not in AUTH_KINDS:
        raise KubeError(f"unknown authentication {access.auth!r}", kind="config")
    cleanup: list[str] = []
    configuration = client.Configuration()
    try:
        if access.auth == IN_CLUSTER:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except ConfigException as exc:
                raise KubeError(
                    f"no in-cluster service account here ({exc}): Switchyard is not running "
                    "in a pod of this cluster",
                    kind="config",
                ) from exc
        elif access.auth == KUBECONFIG:
            _load_kubeconfig(access, configuration)
        else:
            if not access.url:
                raise KubeError("token authentication needs the API server URL", kind="config")
            configuration.host = access.url.rstrip("/")
            configuration.api_key = {"authorization": access.token}
            configuration.api_key_prefix = {"authorization": "Bearer"}
            if access.ca_bundle:
                handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (removed in finally)
                    "w", suffix=".pem", delete=False
                )
                with handle:
                    handle.write(access.ca_bundle)
                cleanup.append(handle.name)
                configuration.ssl_ca_cert = handle.name
        configuration.retries = False
        api = client.ApiClient(configuration)
        try:
            yield api
        finally:
            api.close()
    finally:
        for path in cleanup:
            with contextlib.suppress(OSError):
                Path(path).unlink()


def _load_kubeconfig(access: KubeAccess, configuration: client.Configuration) -> None:
    try:
        document = yaml.safe_load(access.kubeconfig)
    except yaml.YAMLError as exc:
        raise KubeError(f"the kubeconfig is not YAML: {exc}", kind="config") from exc
    if not isinstance(document, dict):
        raise KubeError("the kubeconfig is not a YAML mapping", kind="config")
    try:
        config.load_kube_config_from_dict(
            document, context=access.context or None, client_configuration=configuration,
            temp_file_path=tempfile.gettempdir(),
        )
    except ConfigException as exc:
        raise KubeError(f"the kubeconfig cannot be used: {exc}", kind="config") from exc


def request_timeout(access: KubeAccess) -> tuple[float, float]:
    """``_request_timeout`` for ordinary calls: (connect, read) seconds."""
    return (min(access.timeout_s, 5.0), access.timeout_s)


def server_version(access: KubeAccess) -> str:
    """The API server's ``gitVersion`` (GET /version); KubeError when it cannot be had."""
    with api_client(access) as api:
        info = call(client.VersionApi(api).get_code, what="GET /version",
                    _request_timeout=request_timeout(access))
    return info.git_version


@dataclass(frozen=True)
class ConnectionCheck:
    """What a connection test found: the server's version and how many nodes it lists."""

    server_version: str
    nodes: int


def check_connection(access: KubeAccess) -> ConnectionCheck:
    """Whether Switchyard can do its work on the cluster: ``GET /version``, then list the
    nodes with the credentials (``GET /api/v1/nodes``); KubeError when either fails.

    ``/version`` alone proves little: many servers answer it to anyone
    (``system:public-info-viewer``), so an anonymous or wrongly authorised client gets its
    version. Listing nodes is what the node sync does first, so a refused credential (401) or
    a missing RBAC grant (403: ``list`` on ``nodes``) shows here, not at the first sync. The
    list is read as plain JSON and only counted (no client models are built for each node).
    """
    with api_client(access) as api:
        info = call(client.VersionApi(api).get_code, what="GET /version",
                    _request_timeout=request_timeout(access))
        response = call(client.CoreV1Api(api).list_node, what="GET /api/v1/nodes",
                        _preload_content=False, _request_timeout=request_timeout(access))
        try:
            raw = call(lambda: response.data, what="GET /api/v1/nodes")
        finally:
            response.release_conn()
    try:
        listed = json.loads(raw)
    except ValueError:
        listed = None
    if not isinstance(listed, dict) or listed.get("kind") != "NodeList":
        raise KubeError(f"GET /api/v1/nodes: {NOT_KUBERNETES}", kind="not_kubernetes")
    return ConnectionCheck(server_version=info.git_version, nodes=len(listed.get("items") or []))
