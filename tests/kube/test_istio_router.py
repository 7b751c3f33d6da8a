"""The Istio router against answers a real kube-apiserver gave (``recorded/05-istio.json``,
Istio 1.22.8's CRDs).

Every request the router sends must be one the recorded server received; :func:`answered`
pairs a recorded request with a recorded answer of another exchange where a scenario needs it
(both halves real; the test says which). Every object written (created, or as a merge patch
leaves it) is validated against the CRD schema.
"""

from __future__ import annotations

import copy
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
from fleet.adapters.routers.istio import MISSING, IstioRouter, route_problem, rule_patch
from tests.kube.replay import (
    GOOD_TOKEN,
    RecordedApiServer,
    answered,
    by_switchyard,
    exchanges,
)
from tests.kube.schemas import DESTINATIONRULE_V1, VIRTUALSERVICE_V1, validate_custom

SHARED = "http://triton-fraud.serving.svc.cluster.local:8000"


def ist(n: int) -> dict[str, Any]:
    """Exchange ``n`` of 05, its writes naming Switchyard's field manager (see by_switchyard)."""
    return by_switchyard(exchanges("05-istio", n)[0])


def guarded(n: int) -> dict[str, Any]:
    """Exchange ``n`` of 08 (merge patches carrying ``metadata.resourceVersion``; another
    writer's change in between), its writes naming Switchyard's field manager."""
    return by_switchyard(exchanges("08-istio-guarded-writes", n)[0])


def auth(n: int) -> dict[str, Any]:
    return exchanges("06-auth-errors", n)[0]


def router(srv: RecordedApiServer | None = None, **options: Any) -> IstioRouter:
    arguments: dict[str, Any] = {"namespace": "serving", "route_domain": "example",
                                 "gateway": "serving/inference-gw", **options}
    url = srv.url if srv is not None else "http://127.0.0.1:9"
    return IstioRouter(KubeAccess(auth=TOKEN, url=url, token=GOOD_TOKEN, timeout_s=1),
                       **arguments)


def fraud(w1: int, w2: int, **options: Any) -> RouteSpec:
    """The recorded route: v1 and v2 of Triton's fraud model behind one Service, told apart
    by the pods' revision label (subsets v1 and v2)."""
    return RouteSpec("fraud-scorer", KSERVE_V2, (
        Variant("v1", SHARED, w1, model="fraud", version=1),
        Variant("v2", SHARED, w2, model="fraud", version=2),
    ), **options)


def merged(target: Any, patch: Any) -> Any:
    """RFC 7386: what a JSON merge patch makes of ``target``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def test_it_is_a_traffic_router():
    assert isinstance(router(), TrafficRouter)


# --------------------------------------------------------------------------------------------
# Creating, changing, applying again
# --------------------------------------------------------------------------------------------


def test_a_new_route_on_one_service_creates_its_subsets_first_then_the_virtual_service():
    """GIVEN no VirtualService fraud-scorer (#13) WHEN 90/10 is applied THEN the
    DestinationRule with subsets v1/v2 is created (#0), then the VirtualService (#1)."""
    with RecordedApiServer([ist(13), ist(0), ist(1)]) as srv:
        result = router(srv).apply(fraud(90, 10))
    srv.assert_all_matched()
    assert srv.unused == []
    assert (result.changed, result.reloaded, result.url) == (True, True, "http://fraud-scorer.example")
    assert "created (generation 1): weights in force v1 90, v2 10" in result.message
    rule, service = [r.body for r in srv.received if r.method == "POST"]
    validate_custom(rule, DESTINATIONRULE_V1)
    validate_custom(service, VIRTUALSERVICE_V1)


def test_weights_change_by_one_merge_patch_carrying_the_resource_version_read():
    """GIVEN the route at 90/10, resourceVersion 238 (08 #2), and its subsets in place (05 #10)
    WHEN 80/20 is applied THEN one merge patch of the http list carries resourceVersion 238
    (08 #3: the server checks it as it checks a PUT's); the DestinationRule is left as it is."""
    with RecordedApiServer([guarded(2), ist(10), guarded(3)]) as srv:
        result = router(srv).apply(fraud(80, 20))
    srv.assert_all_matched()
    assert srv.unused == []
    assert result.changed and "weights in force v1 80, v2 20" in result.message
    [patch] = [r.body for r in srv.received if r.method == "PATCH"]
    assert patch["metadata"] == {"resourceVersion": "238"}
    validate_custom(merged(guarded(2)["response_body"], patch), VIRTUALSERVICE_V1)


def another_writers_change_then_ours() -> dict[str, Any]:
    """The one request of this scenario that was not recorded: Switchyard's merge patch at the
    resourceVersion the other writer left (240), 50/50, the other writer's ``retries`` kept.
    The recorded server accepted a guarded write at 240 (08 #7, a JSON patch to 50/50) and
    answered the object with 50/50 and the retries kept: that answer stands for this one."""
    stale, accepted = guarded(5), guarded(7)
    http = copy.deepcopy(guarded(6)["response_body"]["spec"]["http"])
    for destination in http[0]["route"]:
        destination["weight"] = 50
    return {**stale, "note": "merge patch at 240, 50/50, retries kept / answered as 08 #7",
            "request_body": {"metadata": {"resourceVersion": "240"}, "spec": {"http": http}},
            "status": accepted["status"], "response_headers": accepted["response_headers"],
            "response_body": accepted["response_body"]}


def test_another_writers_change_between_read_and_write_is_a_conflict_read_again_and_kept():
    """GIVEN Switchyard read the route at 80/20 (resourceVersion 239: 08 #2's read answered
    with the object #3 left) and another writer then set 33/67 and added a retries block (240)
    WHEN 50/50 is applied THEN the merge patch carrying 239 is refused (08 #5: 409), the route
    is read again (08 #6) and patched at 240 with the retries block kept."""
    script = [answered(guarded(2), guarded(3)), ist(10), guarded(5), guarded(6), ist(10),
              another_writers_change_then_ours()]
    with RecordedApiServer(script) as srv:
        result = router(srv).apply(fraud(50, 50))
    srv.assert_all_matched()
    assert srv.unused == []
    first, second = [r.body for r in srv.received if r.method == "PATCH"]
    assert first["metadata"] == {"resourceVersion": "239"}
    assert second["metadata"] == {"resourceVersion": "240"}
    assert second["spec"]["http"][0]["retries"] == {
        "attempts": 3, "perTryTimeout": "2s", "retryOn": "5xx,reset,connect-failure"}
    after = merged(guarded(6)["response_body"], second)
    validate_custom(after, VIRTUALSERVICE_V1)
    assert after["spec"] == guarded(10)["response_body"]["spec"]
    assert result.changed and "weights in force v1 50, v2 50" in result.message


def test_a_route_that_keeps_changing_is_a_readable_conflict_after_three_attempts():
    script = [answered(guarded(2), guarded(3)), ist(10), guarded(5)] * 3
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        router(srv).apply(fraud(50, 50))
    srv.assert_all_matched()
    assert srv.unused == []
    assert refused.value.kind == "conflict" and not refused.value.permanent
    assert ("VirtualService serving/fraud-scorer changed under Switchyard on each of 3 "
            "attempts (409 Conflict); nothing of this change was written") in refused.value.message


def test_a_route_another_writer_added_retries_to_reads_back_as_its_split():
    spec = router().spec_of(guarded(6)["response_body"])
    assert spec.weights() == {"v1": 33, "v2": 67}


def test_a_destination_rule_keeps_what_another_writer_added_to_its_policy_and_subsets():
    subject = router()
    before = copy.deepcopy(ist(10)["response_body"])
    before["spec"]["trafficPolicy"]["connectionPool"] = {"tcp": {"maxConnections": 100}}
    before["spec"]["subsets"][1]["trafficPolicy"] = {"tls": {"mode": "ISTIO_MUTUAL"}}
    wanted = subject.destination_rule("fraud-scorer", subject.plan(RouteSpec(
        "fraud-scorer", OPENAI, (Variant("v2", SHARED, 50), Variant("v3", SHARED, 50)))))
    grow = rule_patch(before, wanted, keep=True)
    assert grow["metadata"] == {"resourceVersion": before["metadata"]["resourceVersion"]}
    after = merged(merged(before, grow), rule_patch(merged(before, grow), wanted, keep=False))
    validate_custom(after, DESTINATIONRULE_V1)
    assert after["spec"]["trafficPolicy"]["connectionPool"] == {"tcp": {"maxConnections": 100}}
    assert after["spec"]["subsets"][0] == {
        "name": "v2", "labels": {"switchyard.io/revision": "v2"},
        "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}}


def test_every_write_names_switchyard_as_its_field_manager():
    """The DestinationRule's and the VirtualService's creates, and a weight change, each carry
    ``fieldManager=switchyard``, so managedFields name Switchyard, not ``OpenAPI-Generator``."""
    script = [ist(13), ist(0), ist(1), guarded(2), ist(10), guarded(3)]
    with RecordedApiServer(script) as srv:
        subject = router(srv)
        subject.apply(fraud(90, 10))
        subject.apply(fraud(80, 20))
    srv.assert_all_matched()
    writes = [r for r in srv.received if r.method in ("POST", "PUT", "PATCH")]
    assert [r.method for r in writes] == ["POST", "POST", "PATCH"]
    assert all(r.query.get("fieldManager") == ["switchyard"] for r in writes)


def test_applying_again_reads_and_writes_nothing():
    """The second read is 08 #2's answered with the object 08 #3 left (80/20)."""
    script = [guarded(2), ist(10), guarded(3), answered(guarded(2), guarded(3)), ist(10)]
    with RecordedApiServer(script) as srv:
        subject = router(srv)
        first = subject.apply(fraud(80, 20))
        second = subject.apply(fraud(80, 20))
    srv.assert_all_matched()
    assert srv.unused == []
    assert first.changed
    assert (second.changed, second.reloaded) == (False, False)
    assert "already in force" in second.message


def test_variants_on_services_of_their_own_need_no_destination_rule():
    spec = RouteSpec("dep-7", OPENAI, (
        Variant("v1-llama-a", "http://llama-a.serving:8000", 70),
        Variant("v2-llama-b", "http://llama-b.serving.svc.cluster.local:8000", 30),
    ))
    subject = router()
    plan = subject.plan(spec)
    assert subject.destination_rule("dep-7", plan) is None
    service = subject.virtual_service("dep-7", plan)
    validate_custom(service, VIRTUALSERVICE_V1)
    assert service["spec"]["http"][0]["route"] == [
        {"destination": {"host": "llama-a.serving.svc.cluster.local", "port": {"number": 8000}},
         "weight": 70},
        {"destination": {"host": "llama-b.serving.svc.cluster.local", "port": {"number": 8000}},
         "weight": 30},
    ]


# --------------------------------------------------------------------------------------------
# Failures: readable, and nothing half-applied
# --------------------------------------------------------------------------------------------


def test_a_refused_virtual_service_takes_back_the_destination_rule_made_for_it():
    """The VirtualService's create answered as RBAC answered a limited user's write (06 #8):
    the DestinationRule just created (#0) is deleted again (#12), and the error is readable."""
    script = [ist(13), ist(0), answered(ist(1), auth(8)), ist(12)]
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        router(srv).apply(fraud(90, 10))
    srv.assert_all_matched()
    assert srv.unused == []
    assert [(r.method, r.path.rsplit("/", 2)[-2]) for r in srv.received] == [
        ("GET", "virtualservices"), ("POST", "serving"), ("POST", "serving"),
        ("DELETE", "destinationrules")]
    assert refused.value.kind == "forbidden" and refused.value.permanent
    assert "forbidden by RBAC (403)" in refused.value.message


def test_a_refused_patch_leaves_the_route_as_it_was_and_sends_nothing_more():
    script = [guarded(2), ist(10), answered(guarded(3), auth(8))]
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        router(srv).apply(fraud(80, 20))
    srv.assert_all_matched()
    assert len(srv.received) == 3
    assert refused.value.kind == "forbidden"


def test_a_cluster_without_istio_says_so():
    """The VirtualService read answered as the server answers a resource it does not serve."""
    script = [answered(ist(2), auth(12))]
    with RecordedApiServer(script) as srv, pytest.raises(KubeError) as refused:
        router(srv).apply(fraud(90, 10))
    srv.assert_all_matched()
    assert len(srv.received) == 1
    assert refused.value.missing_api and refused.value.permanent
    assert MISSING in refused.value.message


@pytest.mark.parametrize(("spec", "field", "words"), [
    (fraud(50, 50, policy=STICKY, sticky_header="X-User"), "policy", "sticky cannot"),
    (fraud(50, 50, policy=LEAST_PENDING), "policy", "least-pending cannot"),
    (RouteSpec("r", KSERVE_V2, (Variant("a", SHARED, 50, model="fraud"),
                                Variant("b", SHARED, 50, model="other"))),
     "variants.1.model", "every variant must serve the same model"),
    (RouteSpec("r", OPENAI, (Variant("A_1", SHARED, 50), Variant("b", SHARED, 50))),
     "variants.0.name", "DNS labels"),
    (RouteSpec("r", OPENAI, (Variant("a", SHARED, 25), Variant("b", SHARED, 25),
                             Variant("c", "http://llm.serving:80", 25),
                             Variant("d", "http://llm.serving:80", 25))),
     "variants", "share more than one Service"),
    (RouteSpec("r", OPENAI, (Variant("a", "http://192.0.2.10:8000", 100),)),
     "variants.0.upstream", "must name a Kubernetes Service"),
])
def test_what_istio_cannot_express_is_refused_naming_the_field_before_any_request(
    spec, field, words
):
    # The API server's port is closed: any request would be a KubeError, not this refusal.
    with pytest.raises(RouteSpecError) as refused:
        router().apply(spec)
    assert refused.value.field == field
    assert words in refused.value.message


# --------------------------------------------------------------------------------------------
# Reading back, the URL, removing, health
# --------------------------------------------------------------------------------------------


def test_read_returns_the_split_the_server_holds_with_the_subsets_as_variants():
    with RecordedApiServer([ist(2), ist(13)]) as srv:
        subject = router(srv)
        spec = subject.read("fraud-scorer")
        missing = subject.read("fraud-scorer")
    srv.assert_all_matched()
    assert spec == RouteSpec("fraud-scorer", OPENAI, (
        Variant("v1", SHARED, 90), Variant("v2", SHARED, 10)))
    assert missing is None


def test_read_through_v1beta1_for_older_istio():
    with RecordedApiServer([ist(8)]) as srv:
        spec = router(srv, api_version="v1beta1").read("fraud-scorer")
    srv.assert_all_matched()
    assert spec.weights() == {"v1": 0, "v2": 100}


def test_the_url_is_the_routes_host():
    with RecordedApiServer([ist(2), ist(13)]) as srv:
        subject = router(srv)
        assert subject.url("fraud-scorer") == "http://fraud-scorer.example"
        assert subject.url("fraud-scorer") is None
    srv.assert_all_matched()


def test_remove_deletes_the_virtual_service_then_its_destination_rule():
    with RecordedApiServer([ist(7), ist(11), ist(12), ist(13)]) as srv:
        subject = router(srv)
        assert subject.remove("fraud-scorer") is True
        assert subject.remove("fraud-scorer") is False
    srv.assert_all_matched()
    assert srv.unused == []


def test_health_lists_the_routes_switchyard_wrote():
    with RecordedApiServer([ist(9)]) as srv:
        health = router(srv).health()
    srv.assert_all_matched()
    assert health.ok is True
    assert health.routes == {"fraud-scorer": True}


def test_health_of_a_cluster_without_istio_is_down_with_the_reason():
    with RecordedApiServer([answered(ist(9), auth(11))]) as srv:
        health = router(srv).health()
    srv.assert_all_matched()
    assert health.ok is False and MISSING in health.message


def test_health_never_raises_when_the_api_server_is_unreachable():
    health = router().health()
    assert health.ok is False and "unreachable" in health.message


@pytest.mark.parametrize(("status", "problem"), [
    ({}, ""),
    ({"conditions": [{"type": "Reconciled", "status": "True"}]}, ""),
    ({"conditions": [{"type": "Reconciled", "status": "False", "message": "1/2 proxies"}]},
     "not reconciled by istiod (1/2 proxies)"),
    ({"validationMessages": [{"level": "ERROR", "type": {"code": "IST0101"},
                              "documentationUrl": "https://istio.io/latest/docs/reference/"
                                                  "config/analysis/ist0101/"}]},
     "istiod reports IST0101"),
])
def test_istios_status_says_whether_a_route_is_in_force(status, problem):
    obj = {**ist(2)["response_body"], "status": status}
    found = route_problem(obj)
    assert (found == "") if not problem else (problem in found)


def test_a_virtual_service_edited_outside_switchyard_is_not_read_as_a_split():
    obj = copy.deepcopy(ist(2)["response_body"])
    obj["spec"]["http"][0]["rewrite"] = {"uri": "/v2"}
    with pytest.raises(AdapterError) as refused:
        router().spec_of(obj)
    assert "not in the shape Switchyard writes (its HTTP route has rewrite)" in (
        refused.value.message)


# --------------------------------------------------------------------------------------------
# The objects written, against the CRD schemas
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [
    fraud(100, 0),
    fraud(0, 100, mirror=Mirror("v2", 25)),
    RouteSpec("dep-3", OPENAI, (
        Variant("v1-a", SHARED, 34), Variant("v2-b", SHARED, 33),
        Variant("v3-c", "http://llm-c.models.svc.cluster.local:8001", 33),
    ), mirror=Mirror("v3-c", 100)),
    fraud(90, 10, timeout_s=2.5),
])
def test_every_object_the_router_writes_is_valid_for_the_crds_and_reads_back(spec):
    subject = router(gateway="gateways/public")
    plan = subject.plan(spec)
    service = subject.virtual_service(spec.name, plan)
    validate_custom(service, VIRTUALSERVICE_V1)
    assert service["spec"]["gateways"] == ["gateways/public"]
    rule = subject.destination_rule(spec.name, plan)
    validate_custom(rule, DESTINATIONRULE_V1)
    back = subject.spec_of(service)
    assert list(back.weights().values()) == list(spec.weights().values())
    if spec.mirror:
        assert back.mirror.percent == spec.mirror.percent
        http = service["spec"]["http"][0]
        assert http["mirrorPercentage"] == {"value": float(spec.mirror.percent)}
    assert back.timeout_s == spec.timeout_s
    # The merge patch from the recorded route to this one leaves a valid VirtualService.
    patch = subject.patch_for(ist(2)["response_body"], service)
    validate_custom(merged(ist(2)["response_body"], patch), VIRTUALSERVICE_V1)


def test_a_deadline_is_the_http_routes_timeout_and_only_switchyards_own_is_taken_away():
    """A route's deadline becomes the HTTP route's ``timeout`` (noted in an annotation);
    taking the deadline away removes that timeout, while a timeout another writer set on a
    route without a deadline is kept, and is not read as Switchyard's."""
    subject = router()
    recorded = ist(2)["response_body"]  # the route as the API server held it, no timeout
    with_deadline = subject.virtual_service("fraud-scorer", subject.plan(fraud(90, 10, timeout_s=2.5)))
    patch = subject.patch_for(recorded, with_deadline)
    after = merged(recorded, patch)
    validate_custom(after, VIRTUALSERVICE_V1)
    assert after["spec"]["http"][0]["timeout"] == "2.5s"
    assert after["metadata"]["annotations"]["switchyard.io/request-timeout"] == "2.5s"
    assert subject.spec_of(after).timeout_s == 2.5
    assert subject.patch_for(after, with_deadline) is None  # in force: nothing to write

    without = subject.virtual_service("fraud-scorer", subject.plan(fraud(90, 10)))
    cleared = merged(after, subject.patch_for(after, without))
    validate_custom(cleared, VIRTUALSERVICE_V1)
    assert "timeout" not in cleared["spec"]["http"][0]
    assert "switchyard.io/request-timeout" not in (cleared["metadata"].get("annotations") or {})
    assert subject.spec_of(cleared).timeout_s is None

    theirs = copy.deepcopy(recorded)
    theirs["spec"]["http"][0]["timeout"] = "30s"
    kept = merged(theirs, subject.patch_for(theirs, without) or {})
    assert kept["spec"]["http"][0]["timeout"] == "30s"
    assert subject.spec_of(kept).timeout_s is None
    # A deadline set over another writer's timeout replaces it while it lasts.
    ours = merged(theirs, subject.patch_for(theirs, with_deadline))
    assert ours["spec"]["http"][0]["timeout"] == "2.5s"


def test_new_subsets_are_added_before_the_route_changes_and_pruned_after():
    subject = router()
    before = ist(10)["response_body"]  # subsets v1, v2
    wanted = subject.destination_rule("fraud-scorer", subject.plan(RouteSpec(
        "fraud-scorer", OPENAI, (Variant("v2", SHARED, 50), Variant("v3", SHARED, 50)))))
    grow = rule_patch(before, wanted, keep=True)
    grown = merged(before, grow)
    validate_custom(grown, DESTINATIONRULE_V1)
    assert [s["name"] for s in grown["spec"]["subsets"]] == ["v2", "v3", "v1"]
    shrink = rule_patch(grown, wanted, keep=False)
    assert [s["name"] for s in merged(grown, shrink)["spec"]["subsets"]] == ["v2", "v3"]
    assert rule_patch(merged(grown, shrink), wanted, keep=False) is None


def test_a_gateway_in_the_routes_namespace_is_named_by_its_name_and_none_is_the_mesh():
    assert router(gateway="serving/inference-gw").gateway == "inference-gw"
    assert router(gateway="inference-gw").gateway == "inference-gw"
    mesh = router(gateway="")
    assert "gateways" not in mesh.virtual_service("r", mesh.plan(fraud(100, 0)))["spec"]


class Calls:
    """Stands in for the API in a DestinationRule sequence that was not recorded: holds the
    objects by (plural, name) and lists the calls made, in order."""

    def __init__(self, **objects: dict[str, Any]) -> None:
        self.objects = {("destinationrules", k): v for k, v in objects.items()}
        self.calls: list[tuple[str, str]] = []

    def get(self, _version: str, plural: str, _ns: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", plural))
        return self.objects.get((plural, name))

    def create(self, _version: str, plural: str, _ns: str, body: dict[str, Any]) -> Any:
        self.calls.append(("create", plural))
        self.objects[(plural, body["metadata"]["name"])] = body
        return body

    def merge_patch(self, _version: str, plural: str, _ns: str, name: str, patch: Any) -> Any:
        self.calls.append(("patch", plural))
        self.objects[(plural, name)] = merged(self.objects[(plural, name)], patch)
        return self.objects[(plural, name)]

    def delete(self, _version: str, plural: str, _ns: str, name: str) -> bool:
        self.calls.append(("delete", plural))
        return self.objects.pop((plural, name), None) is not None


def test_a_route_moving_to_new_subsets_keeps_the_old_ones_until_it_no_longer_names_them():
    subject = router()
    api = Calls(**{"fraud-scorer": ist(10)["response_body"]})
    rule = subject.destination_rule("fraud-scorer", subject.plan(RouteSpec(
        "fraud-scorer", OPENAI, (Variant("v2", SHARED, 50), Variant("v3", SHARED, 50)))))

    created, prune = subject._ensure_rule(api, "fraud-scorer", rule, route_is_new=False)
    during = api.objects[("destinationrules", "fraud-scorer")]
    note = subject._tidy(api, "fraud-scorer", rule, prune, ist(7)["response_body"])
    after = api.objects[("destinationrules", "fraud-scorer")]

    assert (created, prune) == (False, True)
    assert [s["name"] for s in during["spec"]["subsets"]] == ["v2", "v3", "v1"]
    assert [s["name"] for s in after["spec"]["subsets"]] == ["v2", "v3"]
    assert note == "unused subsets removed"
    validate_custom(after, DESTINATIONRULE_V1)


def test_a_route_that_no_longer_needs_subsets_deletes_its_destination_rule_after_the_change():
    subject = router()
    api = Calls(**{"fraud-scorer": ist(10)["response_body"]})
    note = subject._tidy(api, "fraud-scorer", None, False, ist(7)["response_body"])
    assert api.calls == [("delete", "destinationrules")]
    assert note == "DestinationRule no longer needed, deleted"


def test_a_routes_host_stays_what_it_was_made_with():
    subject = router(route_domain="models.example.com")
    wanted = subject.virtual_service("fraud-scorer", subject.plan(fraud(0, 100)))
    patch = subject.patch_for(ist(2)["response_body"], wanted)
    assert set(patch["spec"]) == {"http"}
    assert wanted["spec"]["hosts"] == ["fraud-scorer.models.example.com"]
