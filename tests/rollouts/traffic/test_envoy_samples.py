"""Per-request samples from an Envoy gateway's JSON access log (routes on Kubernetes).

The routes are real rows built for a Kubernetes cluster, and what the gateway was given is what
the real routers write for them (the HTTPRoute of ``GatewayApiRouter``, the VirtualService and
DestinationRule of ``IstioRouter``, checked against the CRDs' schemas): the log lines name the
backends as each gateway names them (Envoy Gateway's ``httproute/<ns>/<route>/rule/0[/backend/
<i>]`` clusters and backend metadata, Istio's ``outbound|<port>|<subset>|<host>`` clusters).
Every line is rendered from the documented format dictionaries
(``rollouts.traffic.envoy_samples.ENVOY_GATEWAY_FORMAT`` / ``ISTIO_FORMAT``) the way Envoy renders a
JSON format: each command operator replaced by its value, typed (numbers, null when unset) or
all strings (``"-"`` when unset). They reach the real collector (``rollouts.traffic.collector.
Collector``, the loop ``manage.py collect_samples`` runs, here in a thread so that it reads
this test's database) as UDP syslog datagrams, as a log shipper sends them, and go into a
redis-server of this module's own. The live latency endpoint's series then reads exact
per-variant figures.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from fleet.adapters.kubernetes import KubeAccess
from fleet.adapters.routers.base import KSERVE_V2, RouteSpec, Variant
from fleet.adapters.routers.gateway_api import GatewayApiRouter
from fleet.adapters.routers.istio import IstioRouter
from fleet.models import Cluster, InferenceServer
from rollouts.models import Route
from rollouts.traffic import envoy_samples, latency, sample_types, samples
from rollouts.traffic.collector import Collector
from rollouts.traffic.envoy_samples import ENVOY_GATEWAY_FORMAT, ISTIO_FORMAT, RouteResolver
from tests.factories import ClusterFactory, DeploymentFactory, InferenceServerFactory, ModelFactory
from tests.fixtures.samples import RedisServer
from tests.kube.schemas import (
    DESTINATIONRULE_V1,
    HTTPROUTE_V1,
    VIRTUALSERVICE_V1,
    validate_custom,
)

pytestmark = pytest.mark.django_db(transaction=True)

NAMESPACE = "serving"
DOMAIN = "models.example.com"
INFER_PATH = "/v2/models/fraud-scorer/infer"
ACCESS = KubeAccess(auth="token", url="https://kube.invalid:6443", token="unused")
# Istio's own default JSON access-log format (accessLogEncoding: JSON, no accessLogFormat), as
# pilot writes it (EnvoyJSONLogFormatIstio): read as it is, through the key aliases.
ISTIO_DEFAULT_JSON = {
    "start_time": "%START_TIME%", "route_name": "%ROUTE_NAME%", "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%", "protocol": "%PROTOCOL%",
    "response_code": "%RESPONSE_CODE%", "response_flags": "%RESPONSE_FLAGS%",
    "response_code_details": "%RESPONSE_CODE_DETAILS%",
    "connection_termination_details": "%CONNECTION_TERMINATION_DETAILS%",
    "bytes_received": "%BYTES_RECEIVED%", "bytes_sent": "%BYTES_SENT%",
    "duration": "%DURATION%", "upstream_service_time": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "x_forwarded_for": "%REQ(X-FORWARDED-FOR)%", "user_agent": "%REQ(USER-AGENT)%",
    "request_id": "%REQ(X-REQUEST-ID)%", "authority": "%REQ(:AUTHORITY)%",
    "upstream_host": "%UPSTREAM_HOST%", "upstream_cluster": "%UPSTREAM_CLUSTER_RAW%",
    "upstream_local_address": "%UPSTREAM_LOCAL_ADDRESS%",
    "downstream_local_address": "%DOWNSTREAM_LOCAL_ADDRESS%",
    "downstream_remote_address": "%DOWNSTREAM_REMOTE_ADDRESS%",
    "requested_server_name": "%REQUESTED_SERVER_NAME%",
    "upstream_transport_failure_reason": "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
}


# --------------------------------------------------------------------------------------------
# Redis and the collector
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def samples_redis(settings, redis_server):
    settings.REDIS_URL = redis_server.url
    settings.SWITCHYARD_REDIS_PREFIX = f"switchyard-test-envoy-{uuid.uuid4().hex[:10]}"


class RunningCollector:
    """The real collector loop in a thread, with a route cache of its own."""

    def __init__(self) -> None:
        self.resolver = RouteResolver(ttl_s=5.0)
        self.collector = Collector("127.0.0.1", 0, flush_s=0.05, store=samples.connect(),
                                   resolver=self.resolver)
        self.port = self.collector.port
        self.thread = threading.Thread(target=self._run, name="collector", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.collector.run()
        finally:
            connections.close_all()  # this thread's database connection

    def send(self, *datagrams: bytes) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for datagram in datagrams:
                sock.sendto(datagram, ("127.0.0.1", self.port))

    def stop(self) -> None:
        self.collector.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def collector(samples_redis) -> Iterator[RunningCollector]:
    running = RunningCollector()
    try:
        yield running
    finally:
        running.stop()


# --------------------------------------------------------------------------------------------
# Lines as Envoy writes them
# --------------------------------------------------------------------------------------------


def render(fmt: dict[str, str], values: dict[str, Any], *, typed: bool = True) -> dict[str, Any]:
    """Envoy's rendering of a JSON format dictionary: every value that is a command operator
    replaced by the operator's value. Typed (Envoy's ``json_format``): numbers stay numbers
    and an unset value is null; untyped (older ``json_format``): every value a string, "-"
    when unset."""
    out: dict[str, Any] = {}
    for key, operator in fmt.items():
        value = values.get(operator)
        if typed:
            out[key] = value
        else:
            out[key] = "-" if value is None else str(value)
    return out


def values(*, start: float, duration: int, authority: str, cluster: str | None,
           status: int = 200, details: str = "via_upstream", flags: str = "-",
           upstream_ms: int | None = None, size: int = 210, host: str | None = "10.8.1.17:8000",
           request_id: str | None = None, route_name: str = "primary",
           backend: tuple[str, str, str] | None = None,
           content_type: str | None = "application/json") -> dict[str, Any]:
    """The value of each command operator for one request through the gateway."""
    name, namespace, port = backend or (None, None, None)
    return {
        "%START_TIME(%s.%3f)%": f"{start:.3f}",
        "%START_TIME%": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start))
        + f".{int(start % 1 * 1000):03d}Z",
        "%REQ(:METHOD)%": "POST",
        "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%": INFER_PATH,
        "%REQ(:AUTHORITY)%": authority,
        "%REQ(X-REQUEST-ID)%": request_id,
        "%RESPONSE_CODE%": status,
        "%RESPONSE_CODE_DETAILS%": details,
        "%RESPONSE_FLAGS%": flags,
        "%DURATION%": duration,
        "%RESPONSE_DURATION%": upstream_ms,
        "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%": upstream_ms,
        "%BYTES_SENT%": size,
        "%RESP(CONTENT-TYPE)%": content_type,
        "%UPSTREAM_HOST%": host,
        "%UPSTREAM_CLUSTER%": cluster,
        "%UPSTREAM_CLUSTER_RAW%": cluster,
        "%ROUTE_NAME%": route_name,
        "%PROTOCOL%": "HTTP/1.1",
        "%METADATA(UPSTREAM_HOST:envoy-gateway:backend:name)%": name,
        "%METADATA(UPSTREAM_HOST:envoy-gateway:backend:namespace)%": namespace,
        "%METADATA(UPSTREAM_HOST:envoy-gateway:backend:sectionName)%": port,
    }


def syslog(line: dict[str, Any]) -> bytes:
    """An RFC 3164 message, as Vector or Fluent Bit (rfc3164) send it."""
    return b"<134>May  1 12:00:00 gw-7d9f envoy: " + json.dumps(line).encode()


def syslog_5424(line: dict[str, Any]) -> bytes:
    """An RFC 5424 message (Fluent Bit's default syslog format), the JSON after a BOM."""
    return ("<134>1 2024-05-01T12:00:00.000000Z gw-7d9f envoy - - - \ufeff"
            + json.dumps(line)).encode()


def nearest_rank(values_: list[float], q: float) -> float:
    ordered = sorted(values_)
    return ordered[math.ceil(q * len(ordered)) - 1]


def wait_for(deployment_id: int, count: int, timeout: float = 5.0) -> dict[str, list]:
    deadline = time.monotonic() + timeout
    while True:
        found = samples.window(deployment_id, 300)
        total = sum(len(v) for v in found.values())
        if total >= count:
            assert total == count, found
            return found
        assert time.monotonic() < deadline, f"{total} of {count} samples after {timeout} s"
        time.sleep(0.02)


def wait_for_counts(collector: RunningCollector, expected: dict[str, int]) -> None:
    deadline = time.monotonic() + 5
    while any(collector.collector.counts[k] < v for k, v in expected.items()):
        assert time.monotonic() < deadline, (collector.collector.counts, expected)
        time.sleep(0.02)


# --------------------------------------------------------------------------------------------
# Routes as the routers write them
# --------------------------------------------------------------------------------------------


def kube_cluster(router: str) -> Cluster:
    return ClusterFactory(
        name=f"gpu-{router}", kind=Cluster.Kind.KUBERNETES, api_url=ACCESS.url,
        kube_auth=Cluster.KubeAuth.TOKEN, kube_namespace=NAMESPACE, kube_router=router,
        kube_gateway=f"{NAMESPACE}/inference-gw" if router == "gateway-api" else "inference-gw",
        kube_route_host=DOMAIN,
    )


def route_row(deployment, spec: RouteSpec, host: str) -> Route:
    """The route in force, as ``rollouts.traffic.routes`` records it after the router applied it."""
    servers = {s.http_url: s for s in deployment.servers.all()}
    return Route.objects.create(
        deployment=deployment, name=spec.name, protocol=spec.protocol,
        state=Route.State.IN_FORCE, revision=1, url=f"http://{host}", spec=spec.to_json(),
        variants={v.name: {"version": v.version, "server": servers[v.upstream].name,
                           "server_id": servers[v.upstream].pk} for v in spec.variants},
    )


def servers(cluster: Cluster, deployment, *names: str) -> list[InferenceServer]:
    made = [
        InferenceServerFactory(cluster=cluster, name=name, source="managed",
                               kube_namespace=NAMESPACE, kube_name=name,
                               http_url=f"http://{name}.{NAMESPACE}.svc:8000")
        for name in names
    ]
    deployment.servers.set(made)
    return made


# --------------------------------------------------------------------------------------------
# Envoy Gateway (Gateway API)
# --------------------------------------------------------------------------------------------


def test_envoy_gateway_lines_become_exact_samples_of_the_httproutes_variants(collector):
    """An HTTPRoute splitting dep-<id> 90/10 between two Services. Envoy Gateway logs the
    HTTPRoute in %ROUTE_NAME% and the backend either in the endpoint's metadata (one cluster
    for the rule) or in the per-backend cluster's name; a 503 with no healthy upstream, a
    retried request, a request without x-request-id and a client that went away are each a
    sample of the variant that took them. The live latency series reads exact figures."""
    cluster = kube_cluster("gateway-api")
    deployment = DeploymentFactory(cluster=cluster, model=ModelFactory(name="fraud-scorer"))
    v1, v2 = servers(cluster, deployment, "triton-fraud-v1", "triton-fraud-v2")
    name = f"dep-{deployment.pk}"
    spec = RouteSpec(name, KSERVE_V2, (
        Variant("v1-triton-fraud-v1", v1.http_url, 90, model="fraud-scorer", version=1),
        Variant("v2-triton-fraud-v2", v2.http_url, 10, model="fraud-scorer", version=2),
    ))
    router = GatewayApiRouter(ACCESS, namespace=NAMESPACE, gateway=f"{NAMESPACE}/inference-gw",
                              route_domain=DOMAIN)
    backends, mirror = router.plan(spec)
    httproute = router.route_object(name, "v1", backends, mirror, "http")
    validate_custom(httproute, HTTPROUTE_V1)
    [host] = httproute["spec"]["hostnames"]
    refs = httproute["spec"]["rules"][0]["backendRefs"]
    route_row(deployment, spec, host)

    # Envoy Gateway's names for this HTTPRoute (internal/gatewayapi: irRouteName,
    # irRouteDestinationName, irDestinationSettingName).
    route_name = f"httproute/{NAMESPACE}/{name}/rule/0/match/0/{host.replace('.', '_')}"
    rule_cluster = f"httproute/{NAMESPACE}/{name}/rule/0"

    def backend_of(index: int) -> tuple[str, str, str]:
        return refs[index]["name"], NAMESPACE, str(refs[index]["port"])

    start = time.time() - 8
    lines: list[dict[str, Any]] = []
    expected: dict[str, list[tuple[int, float, str]]] = {"v1-triton-fraud-v1": [],
                                                          "v2-triton-fraud-v2": []}
    for i in range(30):  # v1, one cluster for the rule, the Service in the endpoint metadata
        duration = 3 + i % 5
        rid = f"eg-v1-{i}"
        lines.append(render(ENVOY_GATEWAY_FORMAT, values(
            start=start + i * 0.1, duration=duration, upstream_ms=duration - 1,
            authority=host, cluster=rule_cluster, route_name=route_name, request_id=rid,
            backend=backend_of(0))))
        expected["v1-triton-fraud-v1"].append((200, duration, rid))
    for i in range(8):  # v2, a cluster per backend (weighted clusters): no metadata
        duration = 11 + i
        rid = f"eg-v2-{i}"
        lines.append(render(ENVOY_GATEWAY_FORMAT, values(
            start=start + 3 + i * 0.1, duration=duration, upstream_ms=duration - 2,
            authority=host, cluster=f"{rule_cluster}/backend/1", route_name=route_name,
            request_id=rid), typed=i % 2 == 0))
        expected["v2-triton-fraud-v2"].append((200, duration, rid))
    # v2 has no healthy endpoint: Envoy answers 503 itself (UH), no upstream host.
    lines.append(render(ENVOY_GATEWAY_FORMAT, values(
        start=start + 4, duration=0, status=503, details="no_healthy_upstream", flags="UH",
        upstream_ms=None, host=None, size=19, authority=host,
        cluster=f"{rule_cluster}/backend/1", route_name=route_name, request_id="eg-503")))
    expected["v2-triton-fraud-v2"].append((503, 0, "eg-503"))
    # A retried request (the first attempt was reset): one sample, the whole duration; a
    # streamed answer.
    lines.append(render(ENVOY_GATEWAY_FORMAT, values(
        start=start + 4.2, duration=250, upstream_ms=248, authority=f"{host}:80",
        cluster=rule_cluster, route_name=route_name, request_id="eg-retried",
        backend=backend_of(0), content_type="text/event-stream; charset=utf-8")))
    expected["v1-triton-fraud-v1"].append((200, 250, "eg-retried"))
    # No x-request-id: Envoy logs it unset.
    lines.append(render(ENVOY_GATEWAY_FORMAT, values(
        start=start + 4.4, duration=5, upstream_ms=4, authority=host, cluster=rule_cluster,
        route_name=route_name, request_id=None, backend=backend_of(0)), typed=False))
    expected["v1-triton-fraud-v1"].append((200, 5, ""))
    # The client went away before the answer: Envoy's 0, nginx's 499.
    lines.append(render(ENVOY_GATEWAY_FORMAT, values(
        start=start + 4.6, duration=30, status=0, details="downstream_remote_disconnect",
        flags="DC", upstream_ms=None, size=0, authority=host, cluster=rule_cluster,
        route_name=route_name, request_id="eg-gone", backend=backend_of(0))))
    expected["v1-triton-fraud-v1"].append((499, 30, "eg-gone"))

    collector.send(*(syslog(line) if i % 3 else syslog_5424(line) for i, line in
                     enumerate(lines)))
    found = wait_for(deployment.pk, len(lines))

    assert set(found) == set(expected)
    for variant, wanted in expected.items():
        got = sorted((s.status, s.latency_ms, s.request_id) for s in found[variant])
        assert got == sorted(wanted), variant
        assert all(s.method == "POST" and s.path == INFER_PATH and not s.mirror
                   for s in found[variant])
    by_id = {s.request_id: s for v in found.values() for s in v}
    assert (by_id["eg-v1-0"].upstream_status, by_id["eg-v1-0"].upstream_ms) == ("200", 2.0)
    assert by_id["eg-v1-0"].upstream_addr == "10.8.1.17:8000"
    assert by_id["eg-v1-0"].bytes == 210 and not by_id["eg-v1-0"].is_error
    assert abs(by_id["eg-v1-0"].t - (start + 0.003)) < 0.002  # start + duration
    unhealthy = by_id["eg-503"]
    assert (unhealthy.upstream_status, unhealthy.upstream_ms, unhealthy.upstream_addr) == (
        "", None, "")
    assert unhealthy.upstream_failed and unhealthy.is_error
    assert by_id["eg-gone"].is_error and by_id["eg-gone"].upstream_failed
    assert by_id["eg-retried"].latency_ms == 250.0
    # The time to the backend's first byte, and whether it streamed; no split key on a gateway.
    assert [(by_id[r].header_ms, by_id[r].stream) for r in ("eg-v1-0", "eg-retried", "eg-503")] == [
        (2.0, False), (248.0, True), (None, False)]
    assert {s.key for v in found.values() for s in v} == {""}

    series = latency.series(deployment, 60)
    assert series["source"] == "router"
    for variant, wanted in expected.items():
        summary = series["versions"][variant]["summary"]
        durations = [float(d) for _, d, _ in wanted]
        assert summary["count"] == len(wanted)
        assert sum(p["requests"] for p in series["versions"][variant]["points"]) == len(wanted)
        for field, q in (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99)):
            assert summary[field] == nearest_rank(durations, q), (variant, field)
        assert summary["errors_5xx"] == sum(1 for s, _, _ in wanted if s >= 500)
        assert summary["errors_4xx"] == sum(1 for s, _, _ in wanted if 400 <= s < 500)
    assert series["versions"]["v2-triton-fraud-v2"]["summary"]["errors_5xx"] == 1
    assert series["versions"]["v1-triton-fraud-v1"]["summary"]["errors_4xx"] == 1
    assert collector.collector.counts["stored"] == len(lines)
    assert collector.resolver.lookups == 1  # one read of the route for the whole batch

    # A deployment of the same cluster whose gateway sent nothing keeps the servers' series.
    quiet = DeploymentFactory(cluster=cluster, model=deployment.model)
    assert latency.series(quiet, 60)["source"] in ("live", "rollups")


# --------------------------------------------------------------------------------------------
# Istio
# --------------------------------------------------------------------------------------------


def test_istio_lines_map_subsets_and_services_to_the_virtualservices_variants(collector):
    """A VirtualService splitting between v1 and v2 on one Service (Istio subsets of a
    DestinationRule) and v3 on a Service of its own. Istio names every Switchyard route
    ``primary``, so the Host header names the route; the cluster ``outbound|port|subset|host``
    names the variant. Istio's own default JSON format is read too."""
    cluster = kube_cluster("istio")
    deployment = DeploymentFactory(cluster=cluster, model=ModelFactory(name="fraud-scorer"))
    shared, v3 = servers(cluster, deployment, "triton-fraud", "triton-fraud-v3")
    name = f"dep-{deployment.pk}"
    spec = RouteSpec(name, KSERVE_V2, (
        Variant("v1-triton-fraud", shared.http_url, 60, model="fraud-scorer", version=1),
        Variant("v2-triton-fraud", shared.http_url, 30, model="fraud-scorer", version=2),
        Variant("v3-triton-fraud-v3", v3.http_url, 10, model="fraud-scorer", version=3),
    ))
    router = IstioRouter(ACCESS, namespace=NAMESPACE, route_domain=DOMAIN,
                         gateway="inference-gw")
    plan = router.plan(spec)
    service = router.virtual_service(name, plan)
    rule = router.destination_rule(name, plan)
    validate_custom(service, VIRTUALSERVICE_V1)
    assert rule is not None
    validate_custom(rule, DESTINATIONRULE_V1)
    [host] = service["spec"]["hosts"]
    route_row(deployment, spec, host)
    # Istio's cluster of each destination (pilot's BuildSubsetKey).
    clusters = {}
    for variant, entry in zip(spec.variants, service["spec"]["http"][0]["route"], strict=True):
        dest = entry["destination"]
        clusters[variant.name] = (f"outbound|{dest['port']['number']}|"
                                  f"{dest.get('subset', '')}|{dest['host']}")
    assert clusters["v1-triton-fraud"].startswith("outbound|8000|v1-triton-fraud|triton-fraud.")
    assert clusters["v3-triton-fraud-v3"] == (
        f"outbound|8000||triton-fraud-v3.{NAMESPACE}.svc.cluster.local")

    start = time.time() - 8
    lines = []
    expected: dict[str, list[tuple[int, float]]] = {v.name: [] for v in spec.variants}
    for i in range(36):
        variant = spec.variants[i % 3].name
        duration = 4 + (i * 7) % 13
        fmt = ISTIO_DEFAULT_JSON if i % 4 == 0 else ISTIO_FORMAT
        lines.append(render(fmt, values(
            start=start + i * 0.1, duration=duration, upstream_ms=duration - 1,
            authority=host if i % 5 else f"{host}:80", cluster=clusters[variant],
            request_id=f"ist-{i}"), typed=i % 2 == 0))
        expected[variant].append((200, duration))
    # v2's pods are all gone: Istio's 503 UH for the v2 subset, no upstream host.
    lines.append(render(ISTIO_FORMAT, values(
        start=start + 5, duration=1, status=503, details="no_healthy_upstream", flags="UH",
        upstream_ms=None, host=None, size=19, authority=host,
        cluster=clusters["v2-triton-fraud"], request_id="ist-503")))
    expected["v2-triton-fraud"].append((503, 1))
    # v3 answered 503 itself after Istio's retry: an upstream failure of v3.
    lines.append(render(ISTIO_FORMAT, values(
        start=start + 5.2, duration=40, status=503, upstream_ms=39, authority=host,
        cluster=clusters["v3-triton-fraud-v3"], request_id="ist-retried")))
    expected["v3-triton-fraud-v3"].append((503, 40))

    collector.send(*(syslog(line) for line in lines))
    found = wait_for(deployment.pk, len(lines))

    for variant, wanted in expected.items():
        assert sorted((s.status, s.latency_ms) for s in found[variant]) == sorted(wanted)
    by_id = {s.request_id: s for v in found.values() for s in v}
    assert by_id["ist-503"].upstream_failed and by_id["ist-503"].upstream_status == ""
    assert by_id["ist-retried"].upstream_status == "503"
    assert by_id["ist-retried"].upstream_failed
    assert by_id["ist-0"].upstream_ms == by_id["ist-0"].latency_ms - 1  # upstream_service_time
    assert abs(by_id["ist-0"].t - (start + by_id["ist-0"].latency_ms / 1000)) < 0.002

    series = latency.series(deployment, 60)
    assert series["source"] == "router"
    for variant, wanted in expected.items():
        summary = series["versions"][variant]["summary"]
        durations = [float(d) for _, d in wanted]
        assert summary["count"] == len(wanted)
        assert summary["p99_ms"] == nearest_rank(durations, 0.99)
        assert summary["p50_ms"] == nearest_rank(durations, 0.5)
        assert summary["errors_5xx"] == sum(1 for s, _ in wanted if s >= 500)
        assert summary["error_rate"] == pytest.approx(
            100 * sum(1 for s, _ in wanted if s >= 500) / len(wanted))


# --------------------------------------------------------------------------------------------
# What cannot be mapped
# --------------------------------------------------------------------------------------------


def test_lines_of_unknown_routes_or_backends_are_dropped_and_counted(collector):
    """Each line that names no route in force, or a backend that is none of the route's
    variants, is counted (unmapped, foreign_route, malformed) and dropped; the collector goes
    on, and a deployment whose lines all fail to map keeps the servers' own series."""
    cluster = kube_cluster("istio")
    deployment = DeploymentFactory(cluster=cluster, model=ModelFactory(name="fraud-scorer"))
    a, b = servers(cluster, deployment, "triton-a", "triton-b")
    name = f"dep-{deployment.pk}"
    host = f"{name}.{DOMAIN}"
    spec = RouteSpec(name, KSERVE_V2, (
        Variant("v1-triton-a", a.http_url, 50, model="fraud-scorer", version=1),
        Variant("v2-triton-b", b.http_url, 50, model="fraud-scorer", version=2),
    ))
    route_row(deployment, spec, host)
    static = DeploymentFactory(cluster=ClusterFactory(name="nginx-static"))
    Route.objects.create(deployment=static, name=f"dep-{static.pk}",
                         state=Route.State.IN_FORCE, url="http://127.0.0.1:8400",
                         spec={"variants": [{"name": "v1-x", "upstream": "http://10.0.0.1:8000",
                                             "weight": 100}]})
    removed = DeploymentFactory(cluster=cluster)
    Route.objects.create(deployment=removed, name=f"dep-{removed.pk}",
                         state=Route.State.REMOVED, url=f"http://dep-{removed.pk}.{DOMAIN}")
    good_cluster = f"outbound|8000||triton-a.{NAMESPACE}.svc.cluster.local"
    start = time.time() - 5

    def line(**changes: Any) -> bytes:
        given = {"start": start, "duration": 5, "upstream_ms": 4, "authority": host,
                 "cluster": good_cluster, **changes}
        return syslog(render(ISTIO_FORMAT, values(**given)))

    unmapped = [
        line(authority=f"dep-{deployment.pk + 10_000}.{DOMAIN}"),  # no such route
        line(authority=f"dep-{static.pk}.{DOMAIN}"),  # a route nginx carries
        line(authority=f"dep-{removed.pk}.{DOMAIN}"),  # taken off the gateway
        line(cluster=f"outbound|8000||triton-c.{NAMESPACE}.svc.cluster.local"),  # not a variant
        line(cluster=f"outbound|9000||triton-a.{NAMESPACE}.svc.cluster.local"),  # other port
        line(cluster="outbound|8000|v9|triton-a.serving.svc.cluster.local"),  # unknown subset
        line(cluster=f"httproute/{NAMESPACE}/{name}/rule/0"),  # one cluster, two backends
        line(cluster=f"httproute/{NAMESPACE}/{name}/rule/0/backend/7"),  # no backend 7
        line(cluster="PassthroughCluster"),
        line(authority=f"{name}.elsewhere.org"),  # not the route's host
        syslog(render(ENVOY_GATEWAY_FORMAT, values(  # a Service that is none of its variants
            start=start, duration=5, authority=host, cluster=f"httproute/{NAMESPACE}/{name}/rule/0",
            route_name=f"httproute/{NAMESPACE}/{name}/rule/0/match/0/x",
            backend=("triton-z", NAMESPACE, "8000")))),
        syslog(render(ENVOY_GATEWAY_FORMAT, values(  # the HTTPRoute of another namespace
            start=start, duration=5, authority=host, cluster=good_cluster,
            route_name=f"httproute/other/{name}/rule/0/match/0/x"))),
    ]
    foreign = [line(authority="api.example.com"), line(authority="")]
    malformed = [
        line(status="abc"),
        syslog({"response_code": 200, "duration": 3}),  # no start_time
        line(status=999),
        line(duration=-4),
        syslog({**render(ISTIO_FORMAT, values(start=start, duration=5, authority=host,
                                              cluster=good_cluster)), "start_time": "nan"}),
        # NaN is not JSON, but Python's reader takes it: as a score it would fail the batch.
        b'<134>May  1 12:00:00 gw envoy: {"start_time": 1714564800, "response_code": 200, '
        b'"duration": NaN, "upstream_cluster": null, "authority": "dep-1.x"}',
        b'<190>May  1 12:00:00 switchyard: ' + json.dumps({  # nginx's, the same way
            "route": "dep-1", "variant": "v1", "mirror": False, "method": "GET", "path": "/",
            "status": 200, "upstream_addr": "a", "upstream_status": "200",
            "upstream_response_time": "0.001", "request_time": 0.001, "bytes_sent": 1,
            "request_id": "x", "msec": float("nan")}).encode(),
    ]
    unrouted = [line(cluster=None, status=403, details="rbac_access_denied", upstream_ms=None)]
    before = samples.collector_stats()
    collector.send(*unmapped, *foreign, *malformed, *unrouted)
    wait_for_counts(collector, {"unmapped": len(unmapped)})
    wait_for_counts(collector, {"foreign_route": len(foreign), "malformed": len(malformed),
                                "unrouted": len(unrouted)})
    assert collector.collector.counts["stored"] == 0
    assert samples.window(deployment.pk, 300) == {}
    stats = samples.collector_stats()
    assert stats["unmapped"] - before["unmapped"] == len(unmapped)
    assert stats["foreign_route"] - before["foreign_route"] == len(foreign)
    assert stats["malformed"] - before["malformed"] == len(malformed)
    # Nothing arrived for the deployment: its latency comes from its servers' metrics.
    assert latency.series(deployment, 60)["source"] != "router"

    collector.send(line(request_id="after"))  # the collector lives on
    [sample] = wait_for(deployment.pk, 1)["v1-triton-a"]
    assert sample.request_id == "after"
    assert collector.thread.is_alive()


# --------------------------------------------------------------------------------------------
# The route cache
# --------------------------------------------------------------------------------------------


def test_the_route_in_force_is_read_once_per_period_not_per_line():
    """200 lines of one route, and 100 of a route that does not exist, read the database once
    each; once the period is over the route is read again, and a change of the route in force
    (v2 on a new Service) maps from then on."""
    cluster = kube_cluster("gateway-api")
    deployment = DeploymentFactory(cluster=cluster, model=ModelFactory(name="fraud-scorer"))
    a, b, c = servers(cluster, deployment, "triton-a", "triton-b", "triton-c")
    name = f"dep-{deployment.pk}"
    host = f"{name}.{DOMAIN}"
    spec = RouteSpec(name, KSERVE_V2, (
        Variant("v1-triton-a", a.http_url, 80, model="fraud-scorer", version=1),
        Variant("v2-triton-b", b.http_url, 20, model="fraud-scorer", version=2),
    ))
    route = route_row(deployment, spec, host)
    clock = [1000.0]
    resolver = RouteResolver(ttl_s=5.0, clock=lambda: clock[0])
    start = time.time()

    def line(backend: str, authority: str = host) -> dict[str, Any]:
        return render(ENVOY_GATEWAY_FORMAT, values(
            start=start, duration=5, authority=authority,
            cluster=f"httproute/{NAMESPACE}/{name}/rule/0",
            route_name=f"httproute/{NAMESPACE}/{name}/rule/0/match/0/x",
            backend=(backend, NAMESPACE, "8000")))

    with CaptureQueriesContext(connection) as queries:
        variants = {resolver.sample(line("triton-b")).variant for _ in range(200)}
        missing = f"dep-{deployment.pk + 1}.{DOMAIN}"
        for _ in range(100):
            with pytest.raises(sample_types.Unmapped, match="does not exist"):
                resolver.sample(render(ISTIO_FORMAT, values(
                    start=start, duration=5, authority=missing, cluster="outbound|8000||x")))
    assert variants == {"v2-triton-b"}
    assert len(queries) == 2 and resolver.lookups == 2

    route.spec = RouteSpec(name, KSERVE_V2, (
        Variant("v1-triton-a", a.http_url, 80, model="fraud-scorer", version=1),
        Variant("v2-triton-c", c.http_url, 20, model="fraud-scorer", version=2),
    )).to_json()
    route.save()
    with pytest.raises(sample_types.Unmapped):  # the period is not over: the old route still maps
        resolver.sample(line("triton-c"))
    clock[0] += 5.1
    assert resolver.sample(line("triton-c")).variant == "v2-triton-c"
    with pytest.raises(sample_types.Unmapped, match="triton-b:8000 is none of its variants"):
        resolver.sample(line("triton-b"))
    assert resolver.lookups == 3

    # The process's resolver is the collector's default, made once.
    assert envoy_samples.default_resolver() is envoy_samples.default_resolver()
