"""Per-request samples from an Envoy gateway (Envoy Gateway, Istio's ingress gateway).

On Kubernetes a deployment's route is an HTTPRoute (Gateway API) or a VirtualService (Istio),
named ``dep-<id>`` and served at ``dep-<id>.<kube_route_host>``. The gateway writes one JSON
access-log line per request in a format the operator sets (:data:`ENVOY_GATEWAY_FORMAT`,
:data:`ISTIO_FORMAT`), a log shipper sends each line to the collector as a UDP syslog message,
and :func:`rollouts.traffic.samples.parse_line` recognises it (a ``response_code`` and no ``route``)
and hands it here. A gateway knows its own names, not Switchyard's variant names, so a line
becomes a sample in two steps:

1. :func:`parse`: the line's values (Envoy renders them typed, or all as strings; ``"-"``,
   ``""`` and ``null`` are unset): when the request ended (``start_time`` plus ``duration``),
   status, durations in ms, bytes, request id, and what names the route and the backend.
2. :class:`RouteResolver`: the route in force (:class:`rollouts.models.Route`, cached for
   ``SWITCHYARD_SAMPLES_ROUTE_CACHE_S`` seconds, 5 by default: one query per route and period,
   never one per line) says which variant the backend is.

The route: Envoy Gateway names its xDS routes ``httproute/<namespace>/<name>/rule/<i>/match/
<j>/...`` (``%ROUTE_NAME%``), so the HTTPRoute's name, which is the route's name; Istio names
them after the VirtualService's HTTP route (``primary`` for every Switchyard route), so for
Istio, and whenever ``route_name`` names no HTTPRoute, the Host header does: each route has a
host of its own, ``<route>.<kube_route_host>``, checked against the route's URL.

The backend, in this order:

* ``backend`` (``backend_namespace``, ``backend_port``): the Service Envoy Gateway records on
  each endpoint (``%METADATA(UPSTREAM_HOST:envoy-gateway:backend:name)%``, with its
  ``LbEndpointMetadata`` runtime flag), matched against the variants' Services;
* ``upstream_cluster`` ``httproute/<ns>/<route>/rule/0/backend/<i>``: Envoy Gateway's cluster of
  one backendRef (when a rule's backends get a cluster each), and the i-th backendRef is the
  i-th variant (:meth:`fleet.adapters.routers.gateway_api.GatewayApiRouter.plan` writes them in
  the variants' order);
* ``upstream_cluster`` ``outbound|<port>|<subset>|<host>``: Istio's cluster of a destination:
  the subset is the variant's name (variants sharing a Service), else the Service's host and
  port name the variant;
* ``upstream_cluster`` ``httproute/<ns>/<route>/rule/0``: Envoy Gateway's one cluster for all
  of a rule's backends, which does not say which one served: the line maps only when the
  route has a single variant.

A route known by its name whose line names no cluster (the gateway answered it itself before
choosing a backend) is :class:`~rollouts.traffic.sample_types.Unrouted`, as nginx's are. A line for a route
that is not in force on a Kubernetes gateway, or whose backend is none of the route's
variants, raises :class:`~rollouts.traffic.sample_types.Unmapped` (counted ``unmapped``, dropped); a host
that is no route's is a foreign route. Envoy does not log mirrored copies in the access log,
so gateway samples have no ``mirror`` ones.

A gateway's samples carry no split ``key``: the format is the gateway's, one for all routes,
and cannot name each route's sticky header, so a sticky A/B split on Kubernetes is judged with
every request a user of its own (per request); judging it per user needs the nginx router.
Their ``header_ms`` is ``%RESPONSE_DURATION%`` (the time to the backend's first byte) and
``stream`` is read from ``%RESP(CONTENT-TYPE)%``.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError, connection

from fleet.adapters.routers.base import RouteSpecError
from fleet.adapters.routers.kube_common import ServiceRef, service_of
from fleet.models import Cluster
from rollouts.models import Route
from rollouts.traffic.sample_types import (
    MAX_PATH,
    ROUTE_NAME,
    Sample,
    SampleError,
    Unmapped,
    Unrouted,
)

log = logging.getLogger(__name__)

ROUTE_CACHE_S = 5.0
MAX_CACHED_ROUTES = 4096
UNSET = (None, "", "-")

# The JSON access-log formats to give the gateways (the docs show them as YAML): keys are what
# parse() reads, values Envoy's command operators. ``%START_TIME(%s.%3f)%`` is epoch seconds
# with milliseconds; Envoy's default ``%START_TIME%`` (ISO 8601) is read too.
_COMMON_FORMAT = {
    "start_time": "%START_TIME(%s.%3f)%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "authority": "%REQ(:AUTHORITY)%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "response_code": "%RESPONSE_CODE%",
    "response_code_details": "%RESPONSE_CODE_DETAILS%",
    "response_flags": "%RESPONSE_FLAGS%",
    "duration": "%DURATION%",
    "response_duration": "%RESPONSE_DURATION%",
    "bytes_sent": "%BYTES_SENT%",
    "content_type": "%RESP(CONTENT-TYPE)%",
    "upstream_host": "%UPSTREAM_HOST%",
    "upstream_cluster": "%UPSTREAM_CLUSTER%",
    "route_name": "%ROUTE_NAME%",
}
ENVOY_GATEWAY_FORMAT: dict[str, str] = {
    **_COMMON_FORMAT,
    "backend": "%METADATA(UPSTREAM_HOST:envoy-gateway:backend:name)%",
    "backend_namespace": "%METADATA(UPSTREAM_HOST:envoy-gateway:backend:namespace)%",
    "backend_port": "%METADATA(UPSTREAM_HOST:envoy-gateway:backend:sectionName)%",
}
ISTIO_FORMAT: dict[str, str] = dict(_COMMON_FORMAT)

# Other names of the same values: Envoy Gateway's default JSON format, and Istio's default
# JSON format (``accessLogEncoding: JSON``), are read as they are.
_ALIASES = {
    "path": ("path", "x-envoy-origin-path"),
    "authority": ("authority", ":authority"),
    "request_id": ("request_id", "x-request-id"),
    "response_duration": ("response_duration", "upstream_service_time",
                          "x-envoy-upstream-service-time"),
}

_EG_ROUTE = re.compile(r"^httproute/(?P<ns>[^/]+)/(?P<name>[^/]+)/rule/\d+(?:/|$)")
_EG_BACKEND = re.compile(
    r"^httproute/(?P<ns>[^/]+)/(?P<name>[^/]+)/rule/(?P<rule>\d+)/backend/(?P<index>\d+)$"
)
_EG_RULE = re.compile(r"^httproute/(?P<ns>[^/]+)/(?P<name>[^/]+)/rule/(?P<rule>\d+)$")
_ISTIO_CLUSTER = re.compile(r"^outbound\|(?P<port>\d+)\|(?P<subset>[^|]*)\|(?P<host>[^|]+)$")


def route_cache_s() -> float:
    """Seconds a route's mapping is reused (SWITCHYARD_SAMPLES_ROUTE_CACHE_S, default 5)."""
    return float(getattr(settings, "SWITCHYARD_SAMPLES_ROUTE_CACHE_S", ROUTE_CACHE_S))


# --------------------------------------------------------------------------------------------
# One line
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GatewayLine:
    """A gateway's access-log line, its values checked; not yet a variant's sample.

    ``t`` is when the request ended (its start plus its duration). ``answered``: the status
    came from the backend (``response_code_details`` ``via_upstream``), not from the gateway.
    ``upstream_ms`` is ``%RESPONSE_DURATION%``, the time to the backend's first byte: the
    sample's ``header_ms`` too. ``stream``: the backend answered ``text/event-stream``.
    """

    t: float
    status: int
    latency_ms: float
    upstream_ms: float | None
    bytes: int
    answered: bool
    stream: bool
    upstream_addr: str
    method: str
    path: str
    request_id: str
    route_name: str
    authority: str
    cluster: str
    backend: str
    backend_namespace: str
    backend_port: int | None


def _value(data: Mapping[str, Any], name: str) -> Any:
    for key in _ALIASES.get(name, (name,)):
        value = data.get(key)
        if value not in UNSET:
            return value
    return None


def _text(data: Mapping[str, Any], name: str, limit: int) -> str:
    value = _value(data, name)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SampleError(f"{name} must be a string, got {value!r}"[:200])
    return str(value)[:limit]


def _number(data: Mapping[str, Any], name: str) -> float | None:
    value = _value(data, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SampleError(f"{name} must be a number, got {value!r}"[:200])
    try:
        number = float(value)
    except ValueError:
        raise SampleError(f"{name} must be a number, got {value!r}"[:200]) from None
    if not math.isfinite(number) or number < 0:
        raise SampleError(f"{name} must be a positive number, got {value!r}"[:200])
    return number


def _required(data: Mapping[str, Any], name: str) -> float:
    number = _number(data, name)
    if number is None:
        raise SampleError(f"{name} is missing")
    return number


def _start(data: Mapping[str, Any]) -> float:
    """``start_time`` as epoch seconds: ``%START_TIME(%s.%3f)%`` or ISO 8601 (the default)."""
    value = _value(data, "start_time")
    if value is None:
        raise SampleError("start_time is missing")
    moment: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        moment = float(value)
    elif isinstance(value, str):
        try:
            moment = float(value)
        except ValueError:
            try:
                when = datetime.fromisoformat(value)
            except ValueError:
                raise SampleError(f"start_time is not a time: {value[:60]!r}") from None
            moment = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    if moment is None or not math.isfinite(moment) or moment <= 0:
        raise SampleError(f"start_time is not a time: {value!r}"[:200])
    return moment


def parse(data: Mapping[str, Any]) -> GatewayLine:
    """The values of one gateway line; SampleError naming what is wrong with it.

    Envoy's 0 (the client went away before any answer) is recorded as nginx does, 499.
    """
    start = _start(data)
    code = _required(data, "response_code")
    duration = _required(data, "duration")
    status = 499 if code == 0 else int(code)
    if code != int(code) or not 100 <= status <= 599:
        raise SampleError(f"response_code must be an HTTP status, got {code:g}")
    details = _text(data, "response_code_details", 128)
    upstream_ms = _number(data, "response_duration")
    answered = details == "via_upstream" if details else upstream_ms is not None
    port = _number(data, "backend_port")
    return GatewayLine(
        t=round(start + duration / 1000.0, 3),
        status=status,
        latency_ms=round(duration, 3),
        upstream_ms=round(upstream_ms, 3) if upstream_ms is not None else None,
        bytes=int(_number(data, "bytes_sent") or 0),
        answered=answered,
        stream=_text(data, "content_type", 64).lower().startswith("text/event-stream"),
        upstream_addr=_text(data, "upstream_host", 256),
        method=_text(data, "method", 16),
        path=_text(data, "path", MAX_PATH),
        request_id=_text(data, "request_id", 128),
        route_name=_text(data, "route_name", 512),
        authority=_text(data, "authority", 300).lower(),
        cluster=_text(data, "upstream_cluster", 512),
        backend=_text(data, "backend", 253),
        backend_namespace=_text(data, "backend_namespace", 63),
        backend_port=int(port) if port is not None else None,
    )


def _host(authority: str) -> str:
    """The host of a Host header (``dep-12.example.com:80`` -> ``dep-12.example.com``)."""
    if authority.startswith("["):
        return authority.partition("]")[0] + "]"
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


def route_of(line: GatewayLine) -> tuple[int, str]:
    """(deployment id, namespace or "") of the route the line names; SampleError ``foreign
    route`` when it names none of Switchyard's."""
    found = _EG_ROUTE.match(line.route_name)
    if found is not None:
        match = ROUTE_NAME.match(found["name"])
        if match is None:
            raise SampleError(f"foreign route {line.route_name[:80]!r}")
        return int(match.group(1)), found["ns"]
    label = _host(line.authority).partition(".")[0]
    match = ROUTE_NAME.match(label)
    if match is None:
        raise SampleError(f"foreign route: host {line.authority[:80]!r}")
    return int(match.group(1)), ""


# --------------------------------------------------------------------------------------------
# The route in force
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A variant of the route in force and the Service (and Istio subset) it is."""

    name: str
    service: ServiceRef | None
    subset: str


@dataclass(frozen=True, slots=True)
class RouteTargets:
    """What the gateway's names for one route mean: its host, namespace and variants in the
    order they were written (backendRefs, destinations)."""

    deployment_id: int
    name: str
    namespace: str
    host: str
    targets: tuple[Target, ...]

    def variant_for(self, line: GatewayLine, via_namespace: str = "") -> str | None:
        """The variant that served ``line``; None when the gateway chose no backend (it
        answered itself); Unmapped when the backend is none of the variants."""
        if via_namespace and via_namespace != self.namespace:
            raise Unmapped(f"HTTPRoute {via_namespace}/{self.name} is not the route in force "
                           f"(namespace {self.namespace})")
        if not via_namespace and _host(line.authority) != self.host:
            raise Unmapped(f"host {line.authority[:80]!r} is not route {self.name}'s "
                           f"({self.host})")
        if line.backend:
            return self._by_service(line)
        cluster = line.cluster
        if not cluster:
            return None
        for pattern in (_EG_BACKEND, _EG_RULE):
            found = pattern.match(cluster)
            if found is not None:
                return self._by_eg_cluster(found, cluster)
        found = _ISTIO_CLUSTER.match(cluster)
        if found is not None:
            return self._by_istio_cluster(found, cluster)
        raise Unmapped(f"route {self.name}: upstream cluster {cluster[:120]!r} is none of its "
                       "backends")

    def _by_service(self, line: GatewayLine) -> str:
        found = [
            t for t in self.targets if t.service is not None
            and t.service.name == line.backend
            and (not line.backend_namespace or t.service.namespace == line.backend_namespace)
            and (line.backend_port is None or t.service.port == line.backend_port)
        ]
        if len(found) != 1:
            where = f"{line.backend_namespace or '?'}/{line.backend}:{line.backend_port or '?'}"
            raise Unmapped(f"route {self.name}: backend Service {where} is "
                           f"{'none' if not found else 'more than one'} of its variants")
        return found[0].name

    def _by_eg_cluster(self, found: re.Match[str], cluster: str) -> str:
        if (found["ns"], found["name"], found["rule"]) != (self.namespace, self.name, "0"):
            raise Unmapped(f"route {self.name}: upstream cluster {cluster[:120]!r} is not its "
                           "rule")
        index = found.groupdict().get("index")
        if index is None:
            if len(self.targets) == 1:
                return self.targets[0].name
            raise Unmapped(
                f"route {self.name}: Envoy Gateway's cluster {cluster[:120]!r} holds all of its "
                f"{len(self.targets)} backends; log the backend Service (the backend field, "
                "LbEndpointMetadata) to tell them apart"
            )
        if int(index) >= len(self.targets):
            raise Unmapped(f"route {self.name}: it has no backend {index} ({cluster[:120]!r})")
        return self.targets[int(index)].name

    def _by_istio_cluster(self, found: re.Match[str], cluster: str) -> str:
        host, port, subset = found["host"], int(found["port"]), found["subset"]
        same = [t for t in self.targets if t.service is not None
                and (t.service.host, t.service.port) == (host, port)]
        if subset:
            same = [t for t in same if t.name == subset]
        if len(same) != 1:
            raise Unmapped(f"route {self.name}: upstream cluster {cluster[:120]!r} is "
                           f"{'none' if not same else 'more than one'} of its variants")
        return same[0].name


def targets_of(route: Route) -> RouteTargets:
    """The gateway's names for ``route`` (deployment and cluster loaded); Unmapped when the
    route is not in force on a Kubernetes cluster's gateway."""
    cluster = route.deployment.cluster
    if cluster.kind != Cluster.Kind.KUBERNETES or not cluster.kube_router:
        raise Unmapped(f"route {route.name} is on cluster {cluster.name}, which has no "
                       "Kubernetes gateway")
    variants = [v for v in (route.spec or {}).get("variants") or [] if isinstance(v, dict)]
    if not variants:
        raise Unmapped(f"route {route.name} has no route in force")
    services: list[ServiceRef | None] = []
    for index, variant in enumerate(variants):
        try:
            services.append(service_of(str(variant.get("upstream", "")), cluster.kube_namespace,
                                       f"variants.{index}.upstream"))
        except RouteSpecError:
            services.append(None)
    keys = [(s.host, s.port) if s else None for s in services]
    shared = {k for k in keys if k is not None and keys.count(k) > 1}
    targets = tuple(
        Target(str(v.get("name", "")), s, str(v.get("name", "")) if k in shared else "")
        for v, s, k in zip(variants, services, keys, strict=True)
    )
    host = urlsplit(route.url).hostname or f"{route.name}.{cluster.kube_route_host}"
    return RouteTargets(route.deployment_id, route.name, cluster.kube_namespace, host.lower(),
                        targets)


class RouteResolver:
    """Gateway lines to samples, through the routes in force, each read from the database at
    most once per ``ttl_s`` (a route that does not exist too), and at most ``max_routes``
    remembered. Safe to share between threads."""

    def __init__(self, ttl_s: float | None = None, *, max_routes: int = MAX_CACHED_ROUTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = route_cache_s() if ttl_s is None else ttl_s
        self.max_routes = max_routes
        self.clock = clock
        self.lookups = 0  # database reads made, for tests and the curious
        self._cache: dict[int, tuple[float, RouteTargets | None, str]] = {}
        self._lock = threading.Lock()

    def sample(self, data: Mapping[str, Any]) -> Sample | Unrouted:
        """The sample of one gateway line: SampleError (``foreign route``, or malformed) or
        Unmapped when it is none."""
        line = parse(data)
        deployment_id, namespace = route_of(line)
        variant = self.targets(deployment_id).variant_for(line, namespace)
        if variant is None:
            return Unrouted(deployment_id)
        return Sample(
            t=line.t, deployment_id=deployment_id, variant=variant, mirror=False,
            status=line.status, latency_ms=line.latency_ms, upstream_ms=line.upstream_ms,
            bytes=line.bytes, upstream_status=str(line.status) if line.answered else "",
            upstream_addr=line.upstream_addr, method=line.method, path=line.path,
            request_id=line.request_id, header_ms=line.upstream_ms, stream=line.stream,
        )

    def targets(self, deployment_id: int) -> RouteTargets:
        """The mapping of route ``dep-<deployment_id>``; Unmapped when there is none."""
        now = self.clock()
        with self._lock:
            cached = self._cache.get(deployment_id)
        if cached is None or cached[0] <= now:
            cached = (now + self.ttl_s, *self._load(deployment_id))
            with self._lock:
                if len(self._cache) >= self.max_routes:
                    self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                    if len(self._cache) >= self.max_routes:
                        self._cache.clear()
                self._cache[deployment_id] = cached
        _, targets, problem = cached
        if targets is None:
            raise Unmapped(problem)
        return targets

    def _load(self, deployment_id: int) -> tuple[RouteTargets | None, str]:
        self.lookups += 1
        try:
            route = (Route.objects.select_related("deployment__cluster")
                     .filter(pk=deployment_id).first())
        except DatabaseError as exc:
            if not connection.in_atomic_block:
                connection.close()  # reconnect on the next read
            log.warning("cannot read route dep-%s: %s", deployment_id, exc)
            return None, f"route dep-{deployment_id} cannot be read: {exc}"[:300]
        if route is None:
            return None, f"route dep-{deployment_id} does not exist"
        try:
            return targets_of(route), ""
        except Unmapped as exc:
            return None, str(exc)


_default: RouteResolver | None = None


def default_resolver() -> RouteResolver:
    """The process's resolver (the collector's), made on first use."""
    global _default
    if _default is None:
        _default = RouteResolver()
    return _default
