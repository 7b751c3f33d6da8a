"""The Gateway API router against answers a real kube-apiserver gave (``recorded/``).

Every request the router sends must be one the recorded server received (RecordedApiServer
answers anything else 599 and ``assert_all_matched`` fails). Where a scenario needs an answer
that was recorded for a neighbouring request (a 404 for a route that does not exist yet, a 409
or 403 for a write), :func:`answered` pairs a recorded request with a recorded answer: both
halves are real, and the test says which. Every object the router writes is validated against
the CRD schema of the version it was written through.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet.adapters.base import AdapterError
from fleet.adapters.kubernetes import TOKEN, KubeAccess, KubeError
from fleet.adapters.routers.base import (
    KSERVE_V2,
    LEAST_PENDING,
    OPENAI,
    STICKY,
    Mirror,
    RouteSpec,
    RouteSpecError,
    TrafficRouter,
    Variant,
)
from fleet.adapters.routers.gateway_api import MISSING, GatewayApiRouter
from tests.kube.replay import (
    GOOD_TOKEN,
    RecordedApiServer,
    answered,
    by_switchyard,
    exchanges,
)
from tests.kube.schemas import HTTPROUTE_V1, HTTPROUTE_V1BETA1, validate_custom

V1 = "http://triton-fraud-v1.serving:8000"
V2 = "http://triton-fraud-v2.serving.svc.cluster.local:8000"


def gw(n: int) -> dict[str, Any]:
    """Exchange ``n`` of 04, its writes naming Switchyard's field manager (by_switchyard)."""
    return by_switchyard(exchanges("04-gateway-api", n)[0])


def gw1(n: int) -> dict[str, Any]:
    return by_switchyard(exchanges("04b-gateway-api-v1", n)[0])


def auth(n: int) -> dict[str, Any]:
    return exchanges("06-auth-errors", n)[0]


def router(srv: RecordedApiServer, **options: Any) -> GatewayApiRouter:
    options.setdefault("api_version", "v1beta1")
    return GatewayApiRouter(
        KubeAccess(auth=TOKEN, url=srv.url, token=GOOD_TOKEN),
        namespace="serving", gateway="serving/inference-gw", route_domain="example", **options,
    )


def offline(**options: Any) -> GatewayApiRouter:
    """A router whose API server does not answer (for what is decided before any request)."""
    arguments: dict[str, Any] = {"namespace": "serving", "gateway": "serving/inference-gw",
                                 "route_domain": "example", "api_version": "v1", **options}
    return GatewayApiRouter(KubeAccess(auth=TOKEN, url="http://127.0.0.1:9", token="t",
                                       timeout_s=1), **arguments)


def fraud(w1: int, w2: int, name: str = "fraud-scorer", **options: Any) -> RouteSpec:
    """The recorded route: Triton's fraud model, v1 and v2 each on a Service of its own."""
    return RouteSpec(name, KSERVE_V2, (
        Variant("v1-triton-fraud-v1", V1, w1, model="fraud", version=1),
        Variant("v2-triton-fraud-v2", V2, w2, model="fraud", version=2),
    ), **options)


def written(srv: RecordedApiServer, method: str) -> list[Any]:
    return [r.body for r in srv.received if r.method == method]


def test_it_is_a_traffic_router():
    with RecordedApiServer([]) as srv:
        assert isinstance(router(srv), TrafficRouter)


# --------------------------------------------------------------------------------------------
# Creating, then applying again
# --------------------------------------------------------------------------------------------


def test_a_new_route_is_discovered_read_missing_attached_to_the_gateways_listener_and_created():
    """GIVEN Gateway API v0.7.1 (v1beta1 only) and no HTTPRoute fraud-scorer
    WHEN the route is applied twice
    THEN the router discovers v1beta1, finds no route (404), reads the Gateway for the listener
    that accepts fraud-scorer.example (http), creates the route exactly as recorded (#4), and
    the second apply reads it (#5) and writes nothing."""
    script = [gw(0), gw(1), answered(gw(5), gw(34)), gw(7), gw(4), gw(5)]
    with RecordedApiServer(script) as srv:
        subject = router(srv, api_version="")
        first = subject.apply(fraud(100, 0))
        second = subject.apply(fraud(100, 0))
    srv.assert_all_matched()
    assert srv.unused == []
    assert (first.changed, first.reloaded, first.url) == (True, True, "http://fraud-scorer.example")
    assert "created (generation 1)" in first.message
    assert "weights in force triton-fraud-v1 100, triton-fraud-v2 0" in first.message
    assert (second.changed, second.reloaded) == (False, False)
    assert "already in force" in second.message
    [body] = written(srv, "POST")
    validate_custom(body, HTTPROUTE_V1BETA1)


def test_weights_change_by_a_put_carrying_the_resource_version_read():
    """GIVEN the route at 10/100 (resourceVersion 280, #27) WHEN 100/0 is applied THEN the
    router PUTs the object it read with the rule replaced (#28) and reports the weights the
    server returned; the Gateway is not read (the route already names it)."""
    with RecordedApiServer([gw(27), gw(28)]) as srv:
        result = router(srv).apply(fraud(100, 0))
    srv.assert_all_matched()
    assert srv.unused == []
    assert result.changed and "updated (generation 10)" in result.message
    assert "triton-fraud-v1 100, triton-fraud-v2 0" in result.message
    [body] = written(srv, "PUT")
    assert body["metadata"]["resourceVersion"] == "280"
    validate_custom(body, HTTPROUTE_V1BETA1)


def test_every_write_names_switchyard_as_its_field_manager():
    """A create and a PUT each carry ``fieldManager=switchyard`` (as the workloads' applies
    do), so the HTTPRoute's managedFields name Switchyard, not ``OpenAPI-Generator``."""
    script = [answered(gw(5), gw(34)), gw(7), gw(4), gw(27), gw(28)]
    with RecordedApiServer(script) as srv:
        subject = router(srv)
        subject.apply(fraud(100, 0))
        result = subject.apply(fraud(100, 0))
    srv.assert_all_matched()
    writes = [r for r in srv.received if r.method in ("POST", "PUT", "PATCH")]
    assert [r.method for r in writes] == ["POST", "PUT"]
    assert all(r.query.get("fieldManager") == ["switchyard"] for r in writes)
    assert result.changed


def test_a_stale_write_is_read_again_and_retried():
    """GIVEN a PUT refused with 409 Conflict (#28's request answered as #29 was)
    WHEN the route is applied THEN the router reads the route again and writes again."""
    script = [gw(27), answered(gw(28), gw(29)), gw(27), gw(28)]
    with RecordedApiServer(script) as srv:
        result = router(srv).apply(fraud(100, 0))
    srv.assert_all_matched()
    assert srv.unused == []
    assert [r.method for r in srv.received] == ["GET", "PUT", "GET", "PUT"]
    assert result.changed


def test_a_route_that_keeps_changing_is_a_readable_conflict_after_three_attempts():
    script = [gw(27), gw(29)] * 3
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        router(srv).apply(fraud(10, 90))
    srv.assert_all_matched()
    assert len(srv.received) == 6
    assert refused.value.kind == "conflict" and not refused.value.permanent
    assert "changed under Switchyard on each of 3 attempts" in refused.value.message
    assert "nothing of this change was written" in refused.value.message


def test_on_gateway_api_v1_the_route_is_discovered_and_written_through_v1():
    """GIVEN the CRDs upgraded to v1.0.0 (preferred v1, #1/#2) and fraud-scorer-v1api at 90/10
    (#12) WHEN 0/100 is applied THEN the PUT goes through v1 (#15), keeping the route's own
    host (a route's URL stays what it was made with)."""
    script = [gw1(1), gw1(2), gw1(12), gw1(15)]
    with RecordedApiServer(script) as srv:
        subject = router(srv, api_version="")
        result = subject.apply(fraud(0, 100, name="fraud-scorer-v1api"))
    srv.assert_all_matched()
    assert srv.unused == []
    assert subject.api_version == "v1"
    assert result.url == "http://v1api.fraud-scorer.example"
    [body] = written(srv, "PUT")
    validate_custom(body, HTTPROUTE_V1)


# --------------------------------------------------------------------------------------------
# Failures: readable, and nothing half-applied
# --------------------------------------------------------------------------------------------


def test_a_write_forbidden_by_rbac_is_readable_and_nothing_more_is_sent():
    """The PUT answered as RBAC answered a limited user's write to this HTTPRoute (06 #8)."""
    script = [gw(27), answered(gw(28), auth(8))]
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        router(srv).apply(fraud(100, 0))
    srv.assert_all_matched()
    assert [r.method for r in srv.received] == ["GET", "PUT"]
    assert refused.value.kind == "forbidden" and refused.value.permanent
    assert "forbidden by RBAC (403)" in refused.value.message
    assert "cannot patch resource \"httproutes\"" in refused.value.message


def test_a_write_the_server_finds_invalid_is_readable_with_its_causes_and_not_retried():
    """The v1 PUT answered as the server answered an HTTPRoute its CEL rules refuse (04b #14)."""
    script = [gw1(12), answered(gw1(15), gw1(14))]
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        router(srv, api_version="v1").apply(fraud(0, 100, name="fraud-scorer-v1api"))
    srv.assert_all_matched()
    assert len(srv.received) == 2
    assert refused.value.kind == "invalid" and refused.value.permanent
    assert "Must have port for Service reference" in refused.value.message
    assert refused.value.causes[0]["field"] == "spec.rules[0].backendRefs[1]"


def test_a_cluster_without_the_gateway_api_says_so_and_sends_nothing_more():
    """Discovery answered as the server answers a group it does not serve (06 #10)."""
    script = [answered(gw(0), auth(10))]
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        router(srv, api_version="").apply(fraud(100, 0))
    srv.assert_all_matched()
    assert len(srv.received) == 1
    assert refused.value.missing_api and refused.value.permanent
    assert "GET /apis/gateway.networking.k8s.io: this cluster does not serve it" in (
        refused.value.message)
    assert MISSING in refused.value.message


def test_a_route_read_where_the_crd_is_missing_is_a_missing_api_not_an_absent_route():
    """GET of the route answered as the server answers a resource it does not serve (06 #12)."""
    script = [answered(gw(5), auth(12))]
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        router(srv).read("fraud-scorer")
    srv.assert_all_matched()
    assert refused.value.missing_api


@pytest.mark.parametrize(("spec", "field", "words"), [
    (fraud(100, 0, policy=STICKY, sticky_header="X-User"), "policy", "sticky cannot"),
    (fraud(100, 0, policy=LEAST_PENDING), "policy", "least-pending cannot"),
    (fraud(90, 10, mirror=Mirror("v2-triton-fraud-v2", 10)), "mirror.percent",
     "RequestMirror has no percentage"),
    (RouteSpec("r", KSERVE_V2, (Variant("a", V1, 50, model="fraud", version=1),
                                Variant("b", V1, 50, model="fraud", version=2))),
     "variants.1.upstream", "cannot rewrite /v2/models/<model> to a version per backend"),
    (RouteSpec("r", KSERVE_V2, (Variant("a", V1, 50, model="fraud"),
                                Variant("b", V2, 50, model="other"))),
     "variants.1.model", "every variant must serve the same model"),
    (RouteSpec("r", OPENAI, (Variant("a", "https://llm.serving:8000", 100),)),
     "variants.0.upstream", "http:// URL"),
    (RouteSpec("r", OPENAI, (Variant("a", "http://10.0.0.7:8000", 100),)),
     "variants.0.upstream", "must name a Kubernetes Service"),
    (RouteSpec("r", OPENAI, (Variant("a", "http://llm.serving:8000/v1", 100),)),
     "variants.0.upstream", "without a path"),
    (RouteSpec("r", OPENAI, (Variant("a", "http://llm.example.com:8000", 100),)),
     "variants.0.upstream", "must name a Kubernetes Service"),
    (RouteSpec("r", OPENAI, tuple(Variant(f"v{i}", f"http://llm-{i}.serving:8000", 100 if i == 0
                                          else 0) for i in range(17))),
     "variants", "at most 16 backends"),
    (fraud(90, 20), "weights", "must sum to 100"),
    (RouteSpec("r", OPENAI, (Variant("a", "http://llm.serving:8000", 100),), timeout_s=5),
     "timeout_s", "has no timeouts"),
])
def test_what_an_httproute_cannot_express_is_refused_naming_the_field_before_any_request(
    spec, field, words
):
    # The API server's port is closed: any request would be a KubeError, not this refusal.
    with pytest.raises(RouteSpecError) as refused:
        offline().apply(spec)
    assert refused.value.field == field
    assert words in refused.value.message


def test_a_route_of_the_same_name_that_switchyard_did_not_make_is_not_overwritten():
    foreign = gw(35)["response_body"]  # an HTTPRoute without the switchyard label
    subject = offline()
    with pytest.raises(AdapterError) as refused:
        subject._check_owned(foreign, "fraud-scorer-shadow")
    assert refused.value.permanent
    assert "is not Switchyard's (no label switchyard.io/deployment)" in refused.value.message


# --------------------------------------------------------------------------------------------
# Reading back, the URL, removing
# --------------------------------------------------------------------------------------------


def test_read_returns_the_split_the_server_holds():
    with RecordedApiServer([gw(5), gw(27), gw(34)]) as srv:
        subject = router(srv)
        created = subject.read("fraud-scorer")
        edited = subject.read("fraud-scorer")  # 10/100 by a JSON patch (#21): in proportion
        missing = subject.read("fraud-scorer-missing")
    srv.assert_all_matched()
    assert created == RouteSpec("fraud-scorer", OPENAI, (
        Variant("triton-fraud-v1", "http://triton-fraud-v1.serving.svc.cluster.local:8000", 100),
        Variant("triton-fraud-v2", "http://triton-fraud-v2.serving.svc.cluster.local:8000", 0),
    ))
    assert edited.weights() == {"triton-fraud-v1": 9, "triton-fraud-v2": 91}
    assert missing is None


def test_a_route_made_through_v1beta1_reads_back_through_v1():
    with RecordedApiServer([gw1(1), gw1(2), gw1(3)]) as srv:
        spec = router(srv, api_version="").read("fraud-scorer")
    srv.assert_all_matched()
    assert spec.weights() == {"triton-fraud-v1": 75, "triton-fraud-v2": 25}


def test_the_url_is_the_routes_host_and_none_without_a_route():
    with RecordedApiServer([gw(5), gw(34)]) as srv:
        subject = router(srv)
        assert subject.url("fraud-scorer") == "http://fraud-scorer.example"
        assert subject.url("fraud-scorer-missing") is None
    srv.assert_all_matched()


def test_remove_deletes_the_route_and_says_false_when_there_is_none():
    with RecordedApiServer([gw(36), answered(gw(36), gw(34))]) as srv:
        subject = router(srv)
        assert subject.remove("fraud-scorer-shadow") is True
        assert subject.remove("fraud-scorer-shadow") is False
    srv.assert_all_matched()


def test_remove_through_v1():
    with RecordedApiServer([gw1(18)]) as srv:
        assert router(srv, api_version="v1").remove("fraud-scorer-v1api") is True
    srv.assert_all_matched()


# --------------------------------------------------------------------------------------------
# Health
# --------------------------------------------------------------------------------------------


def test_health_reports_each_routes_accepted_and_resolved_refs_for_its_current_generation():
    """The route fraud-scorer has Accepted and ResolvedRefs True, but for generation 1 while it
    is at 11; fraud-scorer-v1api has no status at all (no controller ran)."""
    with RecordedApiServer([gw1(1), gw1(2), gw1(17)]) as srv:
        health = router(srv, api_version="").health()
    srv.assert_all_matched()
    assert health.ok is False
    assert health.routes == {"fraud-scorer": False, "fraud-scorer-v1api": False}
    assert "generation 1, not the current 11" in health.message
    assert "no gateway controller has accepted it on Gateway serving/inference-gw" in (
        health.message)


def test_health_of_a_version_the_cluster_does_not_serve_is_down_with_the_reason():
    with RecordedApiServer([auth(13)]) as srv:
        health = router(srv, api_version="v9").health()
    srv.assert_all_matched()
    assert health.ok is False and health.routes == {}
    assert "does not serve it" in health.message and MISSING in health.message


def test_health_never_raises_when_the_api_server_is_unreachable():
    health = offline().health()
    assert health.ok is False and "unreachable" in health.message


def accepted(generation: int, seen: int, resolved: str = "True") -> dict[str, Any]:
    obj = gw(33)["response_body"]
    obj = {**obj, "metadata": {**obj["metadata"], "generation": generation}}
    parent = obj["status"]["parents"][0]
    conditions = [{**c, "observedGeneration": seen} for c in parent["conditions"]]
    conditions[1] = {**conditions[1], "status": resolved, "reason": "BackendNotFound",
                     "message": "Service triton-fraud-v2 not found"} if resolved != "True" else (
        conditions[1])
    return {**obj, "status": {"parents": [{**parent, "conditions": conditions}]}}


@pytest.mark.parametrize(("obj", "problem"), [
    (accepted(11, 11), ""),
    (accepted(11, 10), "has taken generation 10, not the current 11"),
    (accepted(11, 11, resolved="False"),
     "ResolvedRefs is False (BackendNotFound: Service triton-fraud-v2 not found)"),
    (gw(5)["response_body"], "no gateway controller has accepted it"),
])
def test_a_routes_state_comes_from_its_gateway_controllers_conditions(obj, problem):
    subject = offline()
    found = subject.route_problem(obj)
    assert (found == "") if not problem else (problem in found)


# --------------------------------------------------------------------------------------------
# The objects written, against the CRD schemas
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("crd", [HTTPROUTE_V1BETA1, HTTPROUTE_V1])
@pytest.mark.parametrize("spec", [
    fraud(100, 0),
    fraud(0, 100),
    RouteSpec("dep-12", OPENAI, (
        Variant("v1-llama-a", "http://llama-a.serving:8000", 34),
        Variant("v1-llama-b", "http://llama-b.other-ns.svc.cluster.local:8001", 33),
        Variant("v2-llama-c", "http://llama-c:8000", 33),
    )),
    fraud(100, 0, mirror=Mirror("v2-triton-fraud-v2", 100)),
])
def test_every_object_the_router_writes_is_valid_for_the_crd(crd, spec):
    subject = offline(gateway="gateways/inference-gw", route_domain="models.example.com")
    version = crd[1]
    backends, mirror = subject.plan(spec)
    created = subject.route_object(spec.name, version, backends, mirror, "http")
    validate_custom(created, crd)
    assert created["spec"]["hostnames"] == [f"{spec.name}.models.example.com"]
    assert created["spec"]["parentRefs"] == [
        {"name": "inference-gw", "namespace": "gateways", "sectionName": "http"}]
    # The PUT body: the recorded route with this spec's rule (and the parent it must name).
    current = gw(27)["response_body"]
    updated = subject.updated_object({**current, "apiVersion": f"{crd[0]}/{version}"},
                                     "fraud-scorer", backends, mirror, lambda: "http")
    validate_custom(updated, crd)
    # What is written reads back as the same split.
    assert subject.spec_of(created).weights() == dict(
        zip([r["name"] if "namespace" not in r else f"{r['name']}.{r['namespace']}"
             for r in created["spec"]["rules"][0]["backendRefs"]],
            spec.weights().values(), strict=True))
    if spec.mirror:
        assert subject.spec_of(created).mirror == Mirror("triton-fraud-v2", 100)


def test_a_cross_namespace_backend_names_its_namespace():
    subject = offline()
    spec = RouteSpec("r", OPENAI, (Variant("a", "http://llm.models:8000", 100),))
    rule = subject.rule(*subject.plan(spec))
    assert rule["backendRefs"] == [{"group": "", "kind": "Service", "name": "llm",
                                    "namespace": "models", "port": 8000, "weight": 100}]


# --------------------------------------------------------------------------------------------
# The Gateway's listener
# --------------------------------------------------------------------------------------------


class OneGateway:
    """Answers the router's GET of the Gateway with ``gateway`` (a listener shape that was not
    recorded: these are plain reads of a dict)."""

    def __init__(self, gateway: dict[str, Any] | None) -> None:
        self.gateway = gateway

    def get(self, *_args: Any) -> dict[str, Any] | None:
        return self.gateway


def listeners(*items: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"gatewayClassName": "x", "listeners": list(items)}}


HTTP_EXAMPLE = {"name": "http", "protocol": "HTTP", "port": 80, "hostname": "*.example"}


@pytest.mark.parametrize(("gateway", "namespace", "section"), [
    (listeners(HTTP_EXAMPLE), "serving", "http"),
    (listeners({"name": "tcp", "protocol": "TCP", "port": 9000}, HTTP_EXAMPLE), "serving", "http"),
    (listeners(HTTP_EXAMPLE, {"name": "https", "protocol": "HTTPS", "port": 443}), "serving", ""),
    (listeners({**HTTP_EXAMPLE, "allowedRoutes": {"namespaces": {"from": "All"}}}), "models",
     "http"),
])
def test_the_route_attaches_to_the_one_listener_that_accepts_it(gateway, namespace, section):
    subject = offline(namespace=namespace)
    assert subject._section(OneGateway(gateway), "v1", "fraud-scorer") == section


@pytest.mark.parametrize(("gateway", "words"), [
    (listeners({**HTTP_EXAMPLE, "hostname": "*.other.example"}), "no HTTP listener that accepts"),
    (listeners(HTTP_EXAMPLE), "from namespace models"),
    (None, "does not exist"),
])
def test_a_gateway_that_would_not_serve_the_route_is_a_readable_refusal(gateway, words):
    subject = offline(namespace="models")
    with pytest.raises(AdapterError) as refused:
        subject._section(OneGateway(gateway), "v1", "fraud-scorer")
    assert words in refused.value.message


@pytest.mark.parametrize(("options", "words"), [
    ({"gateway": "inference-gw"}, "namespace/name"),
    ({"route_domain": ""}, "domain they are served under"),
    ({"api_version": "latest"}, "not an API version"),
])
def test_a_misconfigured_router_is_a_value_error(options, words):
    with pytest.raises(ValueError, match=words):
        offline(**options)
