"""What the Kubernetes traffic routers (Gateway API, Istio) share.

* :func:`service_of`: a variant's upstream URL as the Kubernetes Service it names. On a
  Kubernetes cluster a variant's upstream is a Service's in-cluster URL,
  ``http://<service>.<namespace>[.svc[.<cluster domain>]]:<port>`` (a bare ``<service>``
  is a Service in the route's own namespace); anything else (an IP address, a path, https)
  cannot be the target of an HTTPRoute backendRef or an Istio destination, and is refused.
* :func:`check_expressible`: what neither API can express truthfully (the sticky and
  least-pending policies, the per-variant kserve-v2 rewrite) raises RouteSpecError naming
  the field.
* :class:`CustomObjects`: one API client for the calls of one router operation, each failure a
  readable :class:`~fleet.adapters.kubernetes.KubeError` (a CRD that is not installed says
  so, with ``missing_api``). Every write names the field manager ``switchyard`` (as the
  workloads' server-side applies do), so an object's ``managedFields`` say which of its
  fields Switchyard wrote, not the client library's default ``OpenAPI-Generator``.
* :func:`percentages` and :func:`variant_names`: reading a split back from an object.

Plain Python: no Django, no settings.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client

from fleet.adapters.kubernetes import (
    FIELD_MANAGER,
    KubeAccess,
    KubeError,
    api_client,
    call,
    request_timeout,
)
from fleet.adapters.routers.base import (
    KSERVE_V2,
    LEAST_PENDING,
    STICKY,
    RouteSpec,
    RouteSpecError,
)

DEPLOYMENT_LABEL = "switchyard.io/deployment"  # on an HTTPRoute: the route it carries
REVISION_LABEL = "switchyard.io/revision"  # on pods: the variant an Istio subset selects
CLUSTER_DOMAIN = "cluster.local"
MAX_ATTEMPTS = 3  # writes refused for a stale read (409) are re-read and retried this often
MAX_VARIANT_NAME = 63

_DNS_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_DOMAIN = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$")
_VERSION = re.compile(r"^v[0-9]+(?:(?:alpha|beta)[0-9]+)?$")


def is_dns_label(value: str) -> bool:
    return bool(_DNS_LABEL.match(value))


def is_domain(value: str) -> bool:
    return len(value) <= 253 and bool(_DOMAIN.match(value))


def is_api_version(value: str) -> bool:
    return bool(_VERSION.match(value))


@dataclass(frozen=True)
class ServiceRef:
    """A port of a Kubernetes Service: what a backendRef or an Istio destination names."""

    name: str
    namespace: str
    port: int
    domain: str = CLUSTER_DOMAIN

    @property
    def host(self) -> str:
        """The Service's fully qualified in-cluster name."""
        return f"{self.name}.{self.namespace}.svc.{self.domain}"

    def url(self) -> str:
        """The canonical upstream URL of this Service port."""
        return f"http://{self.host}:{self.port}"


def service_of(upstream: str, namespace: str, field: str) -> ServiceRef:
    """The Service that ``upstream`` names; a bare ``http://<service>:<port>`` is in
    ``namespace`` (the route's). RouteSpecError on ``field`` when it names no Service."""
    parts = urlsplit(upstream)
    if parts.scheme != "http":
        raise RouteSpecError(
            "must be a Service's http:// URL: the gateway speaks plain HTTP to the backend "
            f"(TLS to a backend is not part of the routes Switchyard writes), got {upstream!r}",
            field=field,
        )
    if parts.path not in ("", "/"):
        raise RouteSpecError(
            f"must be a Service's base URL without a path (the route cannot add one), got "
            f"{upstream!r}",
            field=field,
        )
    host = (parts.hostname or "").lower()
    labels = host.split(".")
    if len(labels) == 1:
        name, ns, domain = labels[0], namespace, CLUSTER_DOMAIN
    elif len(labels) == 2:
        (name, ns), domain = labels, CLUSTER_DOMAIN
    elif len(labels) >= 3 and labels[2] == "svc":
        name, ns = labels[0], labels[1]
        domain = ".".join(labels[3:]) or CLUSTER_DOMAIN
    else:
        name = ns = domain = ""
    if not (is_dns_label(name) and is_dns_label(ns) and is_domain(domain)) or name.isdigit():
        raise RouteSpecError(
            "must name a Kubernetes Service: http://<service>.<namespace>[.svc[.cluster.local]]"
            f":<port>, got {upstream!r}",
            field=field,
        )
    try:
        port = parts.port or 80
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise RouteSpecError(f"has an invalid port, got {upstream!r}", field=field)
    return ServiceRef(name=name, namespace=ns, port=port, domain=domain)


def check_expressible(route: RouteSpec, api: str) -> None:
    """Refuse (RouteSpecError naming the field) what a Kubernetes router cannot express.

    * ``least-pending``: neither an HTTPRoute nor a VirtualService picks a backend by its
      requests in flight; the split between variants is by weight only.
    * ``sticky``: an HTTPRoute (Gateway API v1.0) has no session persistence, and Istio picks a
      weighted destination at random for every request (consistent hashing only chooses a pod
      inside the destination), so neither keeps a key on its variant.
    * ``kserve-v2`` variants of different models: the path passes through unchanged (no
      per-backend rewrite to ``/v2/models/<model>/versions/<n>``), so clients name one model.
    """
    if route.policy == LEAST_PENDING:
        raise RouteSpecError(
            f"least-pending cannot be expressed by {api}: it splits between variants by weight "
            "only; use the weighted policy",
            field="policy",
        )
    if route.policy == STICKY:
        raise RouteSpecError(
            f"sticky cannot be expressed by {api}: it picks a weighted backend for every "
            "request, so a key would not keep its variant; use the weighted policy",
            field="policy",
        )
    if route.protocol == KSERVE_V2:
        models = {v.model for v in route.variants}
        if len(models) > 1:
            index = next(i for i, v in enumerate(route.variants) if v.model != route.variants[0].model)
            raise RouteSpecError(
                f"{api} passes /v2/models/<model>/... through unchanged (it cannot rewrite the "
                "model per variant): every variant must serve the same model, got "
                f"{', '.join(sorted(models))}",
                field=f"variants.{index}.model",
            )


def percentages(raw: Sequence[int]) -> list[int]:
    """Weights as whole percentages summing to 100 (largest remainder), as they are in force:
    a gateway splits in proportion to the weights. All zero stays all zero (no traffic)."""
    total = sum(raw)
    if total == 100 or total <= 0:
        return list(raw)
    exact = [w * 100 / total for w in raw]
    floors = [int(x) for x in exact]
    short = 100 - sum(floors)
    order = sorted(range(len(raw)), key=lambda i: (-(exact[i] - floors[i]), i))
    for i in order[:short]:
        floors[i] += 1
    return floors


def variant_names(bases: Sequence[str], ports: Sequence[int]) -> list[str]:
    """Unique variant names for backends read back from an object: ``base``, then
    ``base-<port>`` when a base repeats, then ``-<n>``; shortened with a hash past 63."""
    names: list[str] = []
    for index, base in enumerate(bases):
        name = base
        if bases.count(base) > 1:
            name = f"{base}-{ports[index]}"
            if [f"{b}-{p}" for b, p in zip(bases, ports, strict=True)].count(name) > 1:
                name = f"{name}-{index}"
        if len(name) > MAX_VARIANT_NAME:
            digest = hashlib.sha256(name.encode()).hexdigest()[:8]
            name = f"{name[: MAX_VARIANT_NAME - 9].rstrip('-.')}-{digest}"
        names.append(name)
    return names


def route_host(name: str, domain: str) -> str:
    """The host clients call the route ``name`` at: ``<name>.<domain>``."""
    return f"{name}.{domain}"


def condition(conditions: Any, kind: str) -> dict[str, Any] | None:
    """The condition of type ``kind`` in a ``conditions`` list, or None."""
    if not isinstance(conditions, list):
        return None
    for item in conditions:
        if isinstance(item, dict) and item.get("type") == kind:
            return item
    return None


def guard(current: dict[str, Any]) -> dict[str, Any]:
    """The part of a JSON merge patch that makes the API server refuse it (409 Conflict, as
    for a PUT) unless the object is still the one read: ``current``'s resourceVersion."""
    version = (current.get("metadata") or {}).get("resourceVersion")
    return {"metadata": {"resourceVersion": version}} if version else {}


# --------------------------------------------------------------------------------------------
# The API
# --------------------------------------------------------------------------------------------


class CustomObjects:
    """Calls on one API group's custom objects through one ApiClient; see :func:`session`.

    Every failure is a readable KubeError. A 404 that is not a Status (the group, version or
    resource is not served: its CRD is not installed) is re-raised with ``missing_api`` and
    ``missing`` (what to install) in its message; a 404 for an object is None (get) or False
    (delete).
    """

    def __init__(self, api: client.ApiClient, access: KubeAccess, group: str, missing: str) -> None:
        self.api = api
        self.objects = client.CustomObjectsApi(api)
        self.timeout = request_timeout(access)
        self.group = group
        self.missing = missing

    def _call(self, fn: Any, what: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(fn, *args, what=what, _request_timeout=self.timeout, **kwargs)
        except KubeError as exc:
            if exc.missing_api:
                raise KubeError(
                    f"{what}: this cluster does not serve it (404 page not found): "
                    f"{self.missing}",
                    kind=exc.kind, status=exc.status, missing_api=True,
                ) from exc
            raise

    def discover(self) -> dict[str, Any]:
        """``GET /apis/<group>``: the versions of the group the server serves."""
        path = f"/apis/{self.group}"

        def get(_request_timeout: Any) -> Any:
            params = self.api.param_serialize(
                method="GET", resource_path=path, header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(*params, _request_timeout=_request_timeout)
            response.read()
            return self.api.response_deserialize(response, {"200": "object"}).data

        return self._call(get, f"GET {path}")

    def resources(self, version: str) -> list[str]:
        """The resources ``/apis/<group>/<version>`` serves (``httproutes``, ...)."""
        found = self._call(self.objects.get_api_resources, f"GET /apis/{self.group}/{version}",
                           self.group, version)
        data = found.to_dict() if hasattr(found, "to_dict") else found
        return [r.get("name", "") for r in (data or {}).get("resources") or []]

    def get(self, version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self.objects.get_namespaced_custom_object,
                              f"GET {plural} {namespace}/{name}",
                              self.group, version, namespace, plural, name)
        except KubeError as exc:
            if exc.kind == "not_found" and not exc.missing_api:
                return None
            raise

    def list(self, version: str, plural: str, namespace: str) -> list[dict[str, Any]]:
        found = self._call(self.objects.list_namespaced_custom_object,
                           f"LIST {plural} in {namespace}",
                           self.group, version, namespace, plural)
        return [item for item in found.get("items") or [] if isinstance(item, dict)]

    def create(self, version: str, plural: str, namespace: str, body: dict[str, Any]) -> Any:
        return self._call(self.objects.create_namespaced_custom_object,
                          f"create {plural} {namespace}/{body['metadata']['name']}",
                          self.group, version, namespace, plural, body,
                          field_manager=FIELD_MANAGER)

    def replace(self, version: str, plural: str, namespace: str, body: dict[str, Any]) -> Any:
        name = body["metadata"]["name"]
        return self._call(self.objects.replace_namespaced_custom_object,
                          f"update {plural} {namespace}/{name}",
                          self.group, version, namespace, plural, name, body,
                          field_manager=FIELD_MANAGER)

    def merge_patch(self, version: str, plural: str, namespace: str, name: str,
                    patch: dict[str, Any]) -> Any:
        return self._call(self.objects.patch_namespaced_custom_object,
                          f"patch {plural} {namespace}/{name}",
                          self.group, version, namespace, plural, name, patch,
                          field_manager=FIELD_MANAGER,
                          _content_type="application/merge-patch+json")

    def delete(self, version: str, plural: str, namespace: str, name: str) -> bool:
        """Delete the object; False when there was none."""
        try:
            self._call(self.objects.delete_namespaced_custom_object,
                       f"delete {plural} {namespace}/{name}",
                       self.group, version, namespace, plural, name)
        except KubeError as exc:
            if exc.kind == "not_found" and not exc.missing_api:
                return False
            raise
        return True


@contextlib.contextmanager
def session(access: KubeAccess, group: str, missing: str) -> Iterator[CustomObjects]:
    """A :class:`CustomObjects` on a fresh ApiClient, closed on exit."""
    with api_client(access) as api:
        yield CustomObjects(api, access, group, missing)
