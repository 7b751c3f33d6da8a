"""A Kubernetes cluster's router changing, and a route deleted: nothing left on the cluster.

Switching ``kube_router`` hands each route over (``rollouts.traffic.handover``): the new
router's objects are written and read back, then the old router's are deleted; a route the
new router refuses keeps the cluster on its router. The hand-over is router-agnostic, so its
tests use in-memory routers; deleting a route replays a real kube-apiserver's answers.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from fleet.adapters.base import AdapterError
from fleet.adapters.routers.base import KSERVE_V2, ApplyResult, RouteSpec, Variant
from fleet.models import Cluster
from rollouts.models import Route
from rollouts.traffic import handover, routes
from tests.factories import DeploymentFactory
from tests.kube.replay import RecordedApiServer, answered, exchanges
from tests.kube.test_kube_sync import make_cluster

pytestmark = pytest.mark.django_db

SPEC = RouteSpec("fraud-scorer", KSERVE_V2, (
    Variant("v1-a", "http://triton-fraud-v1.serving:8000", 90, model="fraud", version=1),
    Variant("v2-b", "http://triton-fraud-v2.serving:8000", 10, model="fraud", version=2),
))


class MemoryRouter:
    """A router holding routes in memory, listing what was done to it."""

    def __init__(self, kind: str, refuse: bool = False) -> None:
        self.kind, self.refuse = kind, refuse
        self.routes: dict[str, RouteSpec] = {}
        self.calls: list[tuple[str, str]] = []

    def apply(self, route: RouteSpec) -> ApplyResult:
        self.calls.append(("apply", route.name))
        if self.refuse:
            raise AdapterError("forbidden by RBAC (403)", permanent=True)
        self.routes[route.name] = route
        return ApplyResult(True, True, "written", f"http://{route.name}.{self.kind}.example")

    def read(self, name: str) -> RouteSpec | None:
        self.calls.append(("read", name))
        return self.routes.get(name)

    def remove(self, name: str) -> bool:
        self.calls.append(("remove", name))
        return self.routes.pop(name, None) is not None


@pytest.fixture
def routed(monkeypatch) -> dict[str, Any]:
    """A gateway-api cluster with one route in force, its routers in memory by kind."""
    cluster = make_cluster("http://127.0.0.1:9", kube_namespace="serving",
                           kube_router=Cluster.KubeRouter.GATEWAY_API,
                           kube_gateway="serving/inference-gw", kube_route_host="example")
    deployment = DeploymentFactory(cluster=cluster)
    route = Route.objects.create(deployment=deployment, name="fraud-scorer",
                                 spec=SPEC.to_json(), state=Route.State.IN_FORCE,
                                 url="http://fraud-scorer.example")
    kinds = {"gateway-api": MemoryRouter("gateway-api"), "istio": MemoryRouter("istio")}
    kinds["gateway-api"].routes["fraud-scorer"] = SPEC
    monkeypatch.setattr(handover, "router_for", lambda c: kinds[c.kube_router])
    return {"cluster": cluster, "route": route, "routers": kinds}


def switch(root, cluster: Cluster) -> Any:
    caller = APIClient()
    caller.force_authenticate(root)
    return caller.patch(f"/api/v1/clusters/{cluster.pk}/",
                        {"kube_router": "istio", "kube_gateway": ""}, format="json")


def test_switching_the_router_writes_reads_back_then_deletes_the_old_routers_objects(
    root, routed
):
    gateway, istio = routed["routers"]["gateway-api"], routed["routers"]["istio"]
    answer = switch(root, routed["cluster"])
    assert answer.status_code == 200, answer.content
    assert istio.calls == [("apply", "fraud-scorer"), ("read", "fraud-scorer")]
    assert istio.routes["fraud-scorer"].weights() == SPEC.weights()
    assert gateway.calls == [("remove", "fraud-scorer")] and gateway.routes == {}
    routed["cluster"].refresh_from_db()
    assert routed["cluster"].kube_router == Cluster.KubeRouter.ISTIO
    route = Route.objects.get(pk=routed["route"].pk)
    assert route.url == "http://fraud-scorer.istio.example" and route.claimed_until is None


def test_a_route_the_new_router_refuses_keeps_the_cluster_on_its_router(root, routed):
    routed["routers"]["istio"].refuse = True
    answer = switch(root, routed["cluster"])
    assert answer.status_code == 409
    assert "route fraud-scorer could not move to the new router" in str(answer.json())
    routed["cluster"].refresh_from_db()
    assert routed["cluster"].kube_router == Cluster.KubeRouter.GATEWAY_API
    gateway = routed["routers"]["gateway-api"]
    assert gateway.calls == [] and "fraud-scorer" in gateway.routes
    assert ("remove", "fraud-scorer") in routed["routers"]["istio"].calls  # nothing left there
    assert Route.objects.get(pk=routed["route"].pk).claimed_until is None


def test_deleting_a_route_deletes_what_every_router_kind_wrote_for_it(root):
    """GIVEN an Istio cluster that used the Gateway API before, with route fraud-scorer
    WHEN the route is deleted (DELETE /api/v1/routes/<id>/)
    THEN the HTTPRoute left from before is deleted (discovery 04 #0, #1), then the
    VirtualService and its DestinationRule (05 #7, #11, #12).

    Not recorded: a DELETE of HTTPRoute fraud-scorer (the recording deletes another route,
    fraud-scorer-shadow, 04 #36). It is that exchange with the name changed: a DELETE of a
    custom resource answers 200 with a Status naming the object."""
    gw, ist = exchanges("04-gateway-api"), exchanges("05-istio")
    delete = {**gw[36], "path": gw[36]["path"].replace("fraud-scorer-shadow", "fraud-scorer"),
              "note": "DELETE HTTPRoute fraud-scorer / answered as 04 #36 (another name)"}
    with RecordedApiServer([gw[0], gw[1], delete, ist[7], ist[11], ist[12]]) as srv:
        cluster = make_cluster(srv.url, kube_namespace="serving",
                               kube_router=Cluster.KubeRouter.ISTIO, kube_route_host="example")
        deployment = DeploymentFactory(cluster=cluster)
        Route.objects.create(deployment=deployment, name="fraud-scorer", spec=SPEC.to_json(),
                             state=Route.State.IN_FORCE)
        caller = APIClient()
        caller.force_authenticate(root)
        answer = caller.delete(f"/api/v1/routes/{deployment.pk}/")
    srv.assert_all_matched()
    assert srv.unused == []
    assert answer.status_code == 204
    assert Route.objects.get(pk=deployment.pk).state == Route.State.REMOVED


def test_a_cluster_without_the_other_routers_crds_holds_nothing_of_it(root):
    """The Gateway API's discovery answered as the server answers a group it does not serve
    (06 #11): nothing to delete there; the Istio objects are deleted."""
    gw, ist, auth = exchanges("04-gateway-api"), exchanges("05-istio"), exchanges("06-auth-errors")
    script = [answered(gw[0], auth[11]), ist[7], ist[11], ist[12]]
    with RecordedApiServer(script) as srv:
        cluster = make_cluster(srv.url, kube_namespace="serving",
                               kube_router=Cluster.KubeRouter.ISTIO, kube_route_host="example")
        deployment = DeploymentFactory(cluster=cluster)
        Route.objects.create(deployment=deployment, name="fraud-scorer", spec=SPEC.to_json(),
                             state=Route.State.IN_FORCE)
        route = routes.remove_route(root, deployment)
    srv.assert_all_matched()
    assert srv.unused == []
    assert route.state == Route.State.REMOVED
