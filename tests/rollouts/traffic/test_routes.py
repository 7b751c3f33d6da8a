"""Deployment routes on a REAL nginx (Debian package): the API, the console and the domain.

The session's nginx (``tests/fixtures/route_nginx.py``) serves every route. Tests marked
``triton`` route to the session's REAL Triton, with versions 1 and 2 of a model loaded through
the real load path (``tests/rollouts/triton_world.py``) and count where requests went by the
variant nginx names in each answer. The others route to servers that are never called
(``http://127.0.0.1:9``): nginx checks such a route and puts it in force without reaching them.
"""

from __future__ import annotations

import collections
import json
import math
import time
import uuid
from pathlib import Path

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from rest_framework.test import APIClient

from fleet.adapters.routers.nginx import NginxRouter
from fleet.adapters.routers.nginx_conf import IDENTITY_PATH
from fleet.inventory.routers import local_router_options, router_for
from fleet.models import AuditEvent, Cluster, InferenceServer, Membership
from rollouts.deployments import calling
from rollouts.loads import requests as loads
from rollouts.models import Alias, ModelLoad, ModelVersion, Route, RouteRevision
from rollouts.tasks import ensure_routes
from rollouts.traffic import routes, samples, specs
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    MembershipFactory,
    ModelFactory,
    ModelVersionFactory,
    UserFactory,
)
from tests.fixtures.route_nginx import nginx_static_router
from tests.rollouts.triton_world import load_once

FEATURES = [0.1, 0.5, 2.0]
INFER = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": FEATURES}]}
UNUSED = "http://127.0.0.1:9"  # a server nginx never calls in these tests


def api_as(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def route_url(deployment) -> str:
    return f"/api/v1/routes/{deployment.pk}/"


def ready(deployment, version: ModelVersion, server: InferenceServer) -> ModelLoad:
    return ModelLoad.objects.create(
        tenant=deployment.tenant, deployment=deployment, server=server, version=version,
        state=ModelLoad.State.READY, requested_by_label="test",
    )


def within_binomial(seen: int, n: int, percent: int, sigmas: float = 4.5) -> bool:
    """``seen`` of ``n`` is within ``sigmas`` standard deviations of ``percent`` %: a correct
    weighted split fails this about once in 150 000 runs."""
    p = percent / 100
    return abs(seen - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


# --------------------------------------------------------------------------------------------
# Without Triton: servers nginx never calls
# --------------------------------------------------------------------------------------------


class Plain:
    """Tenant A's deployment on a local cluster with two servers and three versions."""

    def __init__(self, tenant, kind: str = Cluster.Kind.LOCAL, name: str = "scorer") -> None:
        self.cluster = ClusterFactory(name=f"c-{uuid.uuid4().hex[:6]}", kind=kind)
        self.a = InferenceServerFactory(cluster=self.cluster, name="triton-a", http_url=UNUSED)
        self.b = InferenceServerFactory(cluster=self.cluster, name="triton-b", http_url=UNUSED)
        self.model = ModelFactory(tenant=tenant, name=name)
        self.v1, self.v2, self.v3 = (ModelVersionFactory(model=self.model, version=n)
                                     for n in (1, 2, 3))
        self.deployment = DeploymentFactory(model=self.model, cluster=self.cluster, name=name)
        self.deployment.servers.set([self.a, self.b])


@pytest.fixture
def plain(db, use_route_nginx, tenant_a) -> Plain:
    return Plain(tenant_a)


def test_a_version_weight_is_split_evenly_over_its_servers_the_remainder_first_by_name(plain, dave):
    for version in (plain.v1, plain.v2):
        for server in (plain.a, plain.b):
            ready(plain.deployment, version, server)

    route = routes.set_route(dave, plain.deployment, {1: 33, 2: 67}, reason="canary")

    assert route.state == Route.State.IN_FORCE
    assert route.weights == {"v1-triton-a": 17, "v1-triton-b": 16,
                             "v2-triton-a": 34, "v2-triton-b": 33}
    assert route.version_weights == {1: 33, 2: 67}
    assert route.spec["protocol"] == "kserve-v2"
    # Requests are rewritten to the model's name on the shared servers (its tenant's).
    served = f"{plain.deployment.tenant.slug}.scorer"
    assert {v["name"]: (v["model"], v["version"]) for v in route.spec["variants"]} == {
        "v1-triton-a": (served, 1), "v1-triton-b": (served, 1),
        "v2-triton-a": (served, 2), "v2-triton-b": (served, 2),
    }
    # Samples map back to rows through the variants of the revision.
    assert route.variants["v2-triton-b"] == {"version_id": plain.v2.pk, "version": 2,
                                             "server_id": plain.b.pk, "server": "triton-b"}
    # What nginx serves is what the row says.
    served = router_for(plain.cluster).read(route.name)
    assert served.weights() == route.weights
    assert route.url == router_for(plain.cluster).url(route.name)


def test_weights_per_server_and_ready_versions_left_out_get_nothing(plain, dave):
    for version in (plain.v1, plain.v2):
        for server in (plain.a, plain.b):
            ready(plain.deployment, version, server)

    route = routes.set_route(dave, plain.deployment, {(1, "triton-a"): 70, (1, "triton-b"): 30})

    assert route.weights == {"v1-triton-a": 70, "v1-triton-b": 30,
                             "v2-triton-a": 0, "v2-triton-b": 0}


@pytest.mark.parametrize(("weights", "field", "message"), [
    ({1: 90, 2: 20}, "weights", "must sum to 100, got 110"),
    ({1: 90}, "weights", "must sum to 100, got 90"),
    ({9: 100}, "weights", "scorer has no version 9"),
    ({1: 50, 3: 50}, "weights", "v3 is not ready on the deployment's servers (triton-a, triton-b)"),
    ({(1, "triton-b"): 100}, "weights", "v1 is not ready on triton-b"),
    ({1: 50, (1, "triton-a"): 50}, "weights", "give its weight once"),
    ({1: 101}, "weights", "from 0 to 100"),
])
def test_a_refused_split_names_the_field_and_changes_nothing(plain, dave, weights, field, message):
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.a)
    before = routes.set_route(dave, plain.deployment, {1: 100})
    served = router_for(plain.cluster).read(before.name)
    events = AuditEvent.objects.count()

    with pytest.raises(routes.DomainError) as refused:
        routes.set_route(dave, plain.deployment, weights)

    assert refused.value.field == field
    assert message in refused.value.message
    assert refused.value.status_code == 400
    assert Route.objects.get(pk=before.pk).spec == before.spec
    assert RouteRevision.objects.filter(route=before).count() == 1
    assert AuditEvent.objects.count() == events
    assert router_for(plain.cluster).read(before.name) == served


def test_a_first_refused_split_leaves_no_route(plain, dave):
    ready(plain.deployment, plain.v1, plain.a)

    with pytest.raises(routes.DomainError):
        routes.set_route(dave, plain.deployment, {1: 99})

    assert not Route.objects.filter(pk=plain.deployment.pk).exists()


@pytest.mark.parametrize(("policy", "header", "field"), [
    ("sticky", "", "sticky_header"),
    ("sticky", "X User", "sticky_header"),
    ("sticky", "x_user", "sticky_header"),
    ("weighted", "X-User", "sticky_header"),
    ("random", "", "policy"),
])
def test_policies_and_their_header_are_checked(plain, dave, policy, header, field):
    ready(plain.deployment, plain.v1, plain.a)

    with pytest.raises(routes.DomainError) as refused:
        routes.set_route(dave, plain.deployment, {1: 100}, policy=policy, sticky_header=header)

    assert refused.value.field == field


def test_the_mirror_names_a_ready_version_and_a_percent(plain, dave):
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.b)

    with pytest.raises(routes.DomainError) as unready:
        routes.set_route(dave, plain.deployment, {1: 100}, mirror=specs.MirrorTarget(3, 10))
    with pytest.raises(routes.DomainError) as too_much:
        routes.set_route(dave, plain.deployment, {1: 100}, mirror=specs.MirrorTarget(2, 101))
    route = routes.set_route(dave, plain.deployment, {1: 100}, policy="sticky",
                             sticky_header="X-User", mirror=specs.MirrorTarget(2, 25))

    assert (unready.value.field, too_much.value.field) == ("mirror", "mirror")
    assert "v3 is not ready" in unready.value.message
    assert (route.mirror_variant, route.mirror_percent) == ("v2-triton-b", 25)
    assert router_for(plain.cluster).read(route.name).mirror.percent == 25
    assert route.sticky_header == "X-User"


def test_asking_for_the_route_in_force_changes_and_records_nothing(plain, dave):
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.a)
    routes.set_route(dave, plain.deployment, {1: 80, 2: 20})
    conf = Path(local_router_options()["conf_dir"]) / "routes" / f"dep-{plain.deployment.pk}.conf"
    written = conf.stat().st_mtime_ns
    events = AuditEvent.objects.count()

    route = routes.set_route(dave, plain.deployment, {1: 80, 2: 20})

    assert route.revision == 1
    assert RouteRevision.objects.filter(route=route).count() == 1
    assert AuditEvent.objects.count() == events
    assert conf.stat().st_mtime_ns == written


def test_lora_adapters_on_one_server_cannot_both_carry_weight(db, use_route_nginx, tenant_a, dave):
    cluster = ClusterFactory(name="vllm-local", kind=Cluster.Kind.LOCAL)
    server = InferenceServerFactory(cluster=cluster, name="vllm-a", http_url=UNUSED,
                                    runtime=InferenceServer.Runtime.VLLM)
    other = InferenceServerFactory(cluster=cluster, name="vllm-b", http_url=UNUSED,
                                   runtime=InferenceServer.Runtime.VLLM)
    model = ModelFactory(tenant=tenant_a, name="support-bot")
    v1, v2 = (ModelVersionFactory(model=model, version=n, runtime="vllm", backend="",
                                  adapter_of="base") for n in (1, 2))
    deployment = DeploymentFactory(model=model, cluster=cluster, name="bot")
    deployment.servers.set([server, other])
    ready(deployment, v1, server)
    ready(deployment, v2, server)
    ready(deployment, v2, other)

    with pytest.raises(routes.DomainError) as shared:
        routes.set_route(dave, deployment, {1: 50, 2: 50})
    route = routes.set_route(dave, deployment, {1: 50, (2, "vllm-b"): 50})

    assert shared.value.field == "weights" and "share server vllm-a" in shared.value.message
    assert route.spec["protocol"] == "openai"
    assert all(v["model"] == "" and v["version"] is None for v in route.spec["variants"])
    assert route.weights == {"v1-vllm-a": 50, "v2-vllm-a": 0, "v2-vllm-b": 50}
    assert "support-bot-v1" in calling.guide(deployment).curl


def test_a_cluster_without_a_router_is_refused_on_route(db, use_route_nginx, tenant_a, dave):
    plain = Plain(tenant_a, kind=Cluster.Kind.STATIC)
    ready(plain.deployment, plain.v1, plain.a)

    with pytest.raises(routes.Conflict) as refused:
        routes.set_route(dave, plain.deployment, {1: 100})

    assert refused.value.field == "route" and "has no traffic router" in refused.value.message
    assert not Route.objects.exists()


def test_a_static_cluster_routes_through_the_nginx_it_names(db, use_route_nginx, tenant_a, dave):
    plain = Plain(tenant_a, kind=Cluster.Kind.STATIC)
    nginx_static_router(plain.cluster, use_route_nginx)
    ready(plain.deployment, plain.v1, plain.a)

    route = routes.set_route(dave, plain.deployment, {1: 100})

    assert route.state == Route.State.IN_FORCE
    assert route.url.startswith("http://127.0.0.1:")
    identity = httpx.get(f"{route.url}{IDENTITY_PATH}", timeout=5)
    assert identity.status_code == 200, identity.text


def test_a_router_directory_that_cannot_be_written_fails_the_change_with_its_reason(
    db, use_route_nginx, tenant_a, dave, tmp_path
):
    plain = Plain(tenant_a, kind=Cluster.Kind.STATIC)
    nginx_static_router(plain.cluster, use_route_nginx)
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.a)
    url = route_url(plain.deployment)
    first = api_as(dave).put(url, {"weights": {"1": 100}})
    assert first.status_code == 200, first.content
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # no directory can be made under a file, not even by root
    Cluster.objects.filter(pk=plain.cluster.pk).update(router_conf_dir=str(blocker / "nginx"))

    refused = api_as(dave).put(url, {"weights": {"2": 100}, "reason": "all on v2"})

    assert refused.status_code == 409, refused.content
    assert "Not a directory" in refused.json()["route"][0]
    route = Route.objects.get(pk=plain.deployment.pk)
    assert route.state == Route.State.FAILED and route.version_weights == {1: 100, 2: 0}
    assert route.revisions.get(number=2).result == RouteRevision.Result.FAILED
    # nginx still serves the route as it was.
    router = NginxRouter(**use_route_nginx.process.router_options())
    assert router.read(route.name).weights() == {"v1-triton-a": 100, "v2-triton-a": 0}
    assert router.health().routes[route.name] is True


@pytest.mark.parametrize(("fields", "wrong"), [
    ({"kind": "static"}, {"router_conf_dir", "router_reload_command", "router_public_host"}),
    ({"kind": "local", "router_conf_dir": "/srv/nginx", "router_reload_command": "nginx -s reload",
      "router_public_host": "router-1"}, {"router_kind"}),
    ({"kind": "static", "router_conf_dir": "relative/dir", "router_reload_command": "nginx 'oops",
      "router_public_host": "bad host"},
     {"router_conf_dir", "router_reload_command", "router_public_host"}),
])
def test_a_cluster_naming_an_nginx_router_is_checked_field_by_field(db, fields, wrong):
    cluster = Cluster(name="edge", router_kind=Cluster.RouterKind.NGINX, **fields)

    with pytest.raises(ValidationError) as refused:
        cluster.full_clean()

    assert set(refused.value.message_dict) == wrong


def test_a_deployment_with_nothing_ready_gets_no_default_route(plain, dave):
    response = api_as(dave).post("/api/v1/routes/", {"deployment": plain.deployment.pk})

    assert response.status_code == 409
    assert "load one first" in response.json()["deployment"][0]
    assert not Route.objects.exists()


def test_the_router_of_a_local_cluster_is_the_local_nginx(use_route_nginx):
    assert local_router_options() == use_route_nginx.process.router_options()


def test_the_default_route_goes_to_the_production_alias_else_the_newest_ready(plain, dave):
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.a)
    Alias.objects.create(model=plain.model, name="production", version=plain.v1)

    route, made = routes.ensure_route(dave, plain.deployment)
    again, made_again = routes.ensure_route(dave, plain.deployment)

    assert made and not made_again
    assert again.pk == route.pk and again.revision == 1
    assert route.version_weights == {1: 100, 2: 0}
    assert "the production alias" in route.revisions.get().reason


def test_the_beat_tick_routes_a_deployment_once_a_version_is_ready(plain, tenant_a):
    assert ensure_routes() == 0  # nothing ready yet
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.b)
    unrouted = Plain(tenant_a, kind=Cluster.Kind.STATIC, name="other")  # no router: left alone
    ready(unrouted.deployment, unrouted.v1, unrouted.a)

    assert ensure_routes() == 1
    assert ensure_routes() == 0  # the second tick changes nothing

    route = Route.objects.get(pk=plain.deployment.pk)
    assert route.version_weights == {1: 0, 2: 100}
    assert route.revisions.get().actor_label == "system"
    assert not Route.objects.filter(pk=unrouted.deployment.pk).exists()


def test_the_system_moves_a_route_with_the_same_checks_and_is_recorded_as_itself(plain):
    """A rollout's step is Switchyard's own change: no person's role, the same refusals."""
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.a)

    route = routes.set_route_as_system(plain.deployment, {1: 90, 2: 10}, reason="rollout 7: step 1")
    with pytest.raises(routes.DomainError) as refused:
        routes.set_route_as_system(plain.deployment, {1: 90, 3: 10})

    assert route.version_weights == {1: 90, 2: 10}
    assert (route.revisions.get().actor_label, route.revisions.get().reason) == (
        "system", "rollout 7: step 1")
    assert refused.value.field == "weights"
    assert Route.objects.get(pk=route.pk).version_weights == {1: 90, 2: 10}


def test_a_version_carrying_traffic_cannot_be_unloaded(plain, dave):
    one = ready(plain.deployment, plain.v1, plain.a)
    two = ready(plain.deployment, plain.v2, plain.a)
    routes.set_route(dave, plain.deployment, {1: 90, 2: 10})

    with pytest.raises(routes.Conflict) as refused:
        loads.request_unload(dave, plain.deployment, plain.v2)
    routes.set_route(dave, plain.deployment, {1: 100}, mirror=specs.MirrorTarget(2, 5))
    with pytest.raises(routes.Conflict) as mirrored:
        loads.request_unload(dave, plain.deployment, plain.v2)
    routes.set_route(dave, plain.deployment, {1: 100})
    moved = loads.request_unload(dave, plain.deployment, plain.v2)

    assert refused.value.field == "version"
    assert "v2 carries 10% of deployment scorer's traffic on triton-a: move its traffic first" \
        in refused.value.message
    assert "stop the mirror first" in mirrored.value.message
    assert [m.pk for m in moved] == [two.pk]
    assert ModelLoad.objects.get(pk=one.pk).state == ModelLoad.State.READY


def test_a_removed_route_stops_answering_lets_its_versions_go_and_can_route_again(plain, dave):
    ready(plain.deployment, plain.v1, plain.a)
    route = routes.set_route(dave, plain.deployment, {1: 100})
    url = route.url

    removed = routes.remove_route(dave, plain.deployment, reason="retiring")
    again = routes.remove_route(dave, plain.deployment)
    assert ensure_routes() == 0  # the tick does not route it again
    unloaded = loads.request_unload(dave, plain.deployment, plain.v1)

    assert removed.state == again.state == Route.State.REMOVED
    assert (removed.spec, removed.url, removed.revision) == ({}, "", 2)
    assert router_for(plain.cluster).read(route.name) is None
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}{IDENTITY_PATH}", timeout=2)
    assert len(unloaded) == 1
    assert AuditEvent.objects.filter(verb="route_removed", reason="retiring").count() == 1
    ready(plain.deployment, plain.v2, plain.a)
    back = routes.set_route(dave, plain.deployment, {2: 100})
    assert back.state == Route.State.IN_FORCE and back.revision == 3


def test_a_change_in_flight_is_a_conflict_for_another(plain, dave):
    ready(plain.deployment, plain.v1, plain.a)
    route = routes.set_route(dave, plain.deployment, {1: 100})
    Route.objects.filter(pk=route.pk).update(claimed_until=route.applied_at.replace(year=2999))

    with pytest.raises(routes.Conflict) as refused:
        routes.set_route(dave, plain.deployment, {1: 100}, policy="least-pending")
    with pytest.raises(routes.Conflict) as unload:
        loads.request_unload(dave, plain.deployment, plain.v1)

    assert refused.value.field == "route" and "being applied" in refused.value.message
    assert unload.value.field == "version"


def test_the_split_table_refreshes_with_what_each_variant_got(plain, dave, settings, client):
    settings.SWITCHYARD_REDIS_PREFIX = f"test-split-{uuid.uuid4().hex[:8]}"
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.b)
    routes.set_route(dave, plain.deployment, {1: 90, 2: 10})
    partial = reverse("rollouts:deployment-route-split", args=[plain.deployment.pk])
    client.force_login(dave)

    def sample(variant: str) -> str:
        return json.dumps({
            "time": "t", "msec": time.time(), "route": f"dep-{plain.deployment.pk}",
            "variant": variant, "mirror": False, "method": "POST", "path": "/v2/models/m/infer",
            "status": 200, "upstream_addr": "a", "upstream_status": "200",
            "upstream_response_time": "0.004", "request_time": 0.005, "bytes_sent": 10,
            "request_id": uuid.uuid4().hex,
        })

    before = client.get(partial, HTTP_HX_REQUEST="true").content.decode()
    samples.record([sample("v1-triton-a") for _ in range(9)] + [sample("v2-triton-b")])
    after = client.get(partial, HTTP_HX_REQUEST="true").content.decode()

    assert before.count("no requests") == 2
    assert 'hx-trigger="every 2s"' in after
    assert "90.0% (9 requests)" in after and "10.0% (1 request)" in after
    assert after.count('<td class="num" data-p50>5.0 ms</td>') == 2
    assert after.count('<td class="num" data-errors>0.00 %</td>') == 2


# --------------------------------------------------------------------------------------------
# The API
# --------------------------------------------------------------------------------------------


def test_the_api_reads_sets_and_patches_a_route(plain, dave, bob):
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.b)
    url = route_url(plain.deployment)

    missing = api_as(bob).get(url)
    put = api_as(dave).put(url, {"weights": {"1": 90, "2": 10}, "reason": "canary v2"})
    api_as(dave).patch(url, {"policy": "sticky", "sticky_header": "X-User",
                                       "mirror": {"version": 2, "percent": 50}})
    read = api_as(bob).get(url)
    history = api_as(bob).get(f"{url}revisions/")

    assert missing.status_code == 404
    assert put.status_code == 200, put.content
    body = read.json()
    assert body["url"] == put.json()["url"] and body["url"].startswith("http://127.0.0.1:")
    assert body["weights"] == {"1": 90, "2": 10}  # kept by the PATCH
    assert (body["policy"], body["sticky_header"], body["state"]) == ("sticky", "X-User", "in_force")
    assert body["mirror"] == {"variant": "v2-triton-b", "version": 2, "server": "triton-b",
                              "percent": 50}
    assert [(v["name"], v["weight"]) for v in body["variants"]] == [
        ("v1-triton-a", 90), ("v2-triton-b", 10)]
    revisions = history.json()["results"]
    assert [(r["number"], r["result"], r["actor"]) for r in revisions] == [
        (2, "applied", "dave"), (1, "applied", "dave")]
    assert revisions[1]["reason"] == "canary v2" and revisions[1]["reloaded"] is True
    # The deployment names the URL too, and none once the route is removed.
    deployment_url = f"/api/v1/deployments/{plain.deployment.pk}/"
    assert api_as(bob).get(deployment_url).json()["route_url"] == body["url"]
    routes.remove_route(dave, plain.deployment)
    assert api_as(bob).get(deployment_url).json()["route_url"] is None


@pytest.mark.parametrize(("body", "field"), [
    ({"weights": {"1": 90, "2": 20}}, "weights"),
    ({"weights": {"1": "90"}}, "weights"),
    ({"weights": {"v1": 100}}, "weights"),
    ({"weights": {}}, "weights"),
    ({"weights": {"7": 100}}, "weights"),
    ({"weights": {"1": 100}, "policy": "sticky", "sticky_header": "bad header"}, "sticky_header"),
    ({"weights": {"1": 100}, "mirror": {"version": 2, "percent": 500}}, "mirror"),
    ({"weights": {"1": 100}, "mirror": {"version": 3, "percent": 5}}, "mirror"),
    ({"weights": {"1": 100}, "colour": "red"}, "colour"),
])
def test_the_api_refuses_bad_input_naming_the_field(plain, dave, body, field):
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.a)
    api_as(dave).put(route_url(plain.deployment), {"weights": {"1": 100}})
    events = AuditEvent.objects.count()

    response = api_as(dave).put(route_url(plain.deployment), body)

    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert Route.objects.get(pk=plain.deployment.pk).version_weights == {1: 100, 2: 0}
    assert AuditEvent.objects.count() == events


def test_a_deployments_request_deadline_reaches_its_route_as_it_is(plain, dave, bob):
    """The deployment's request deadline is put in force on its route at once, the split,
    policy and mirror kept; clearing it gives the router's own limit back; a value out of
    range is a 400 naming the field that changes nothing."""
    ready(plain.deployment, plain.v1, plain.a)
    ready(plain.deployment, plain.v2, plain.b)
    routes.set_route(dave, plain.deployment, {1: 90, 2: 10}, mirror=specs.MirrorTarget(2, 50))
    deployment_url = f"/api/v1/deployments/{plain.deployment.pk}/"
    conf = router_for(plain.cluster).routes_dir / f"{specs.route_name(plain.deployment)}.conf"

    changed = api_as(dave).patch(deployment_url, {"request_timeout_s": 2.5}, format="json")

    assert changed.status_code == 200, changed.content
    assert changed.json()["request_timeout_s"] == 2.5
    route = Route.objects.get(pk=plain.deployment.pk)
    assert route.spec["timeout_s"] == 2.5
    assert route.version_weights == {1: 90, 2: 10}
    assert route.spec["mirror"] == {"variant": "v2-triton-b", "percent": 50}
    assert router_for(plain.cluster).read(route.name).timeout_s == 2.5
    assert "proxy_read_timeout 2500ms;" in conf.read_text()
    assert api_as(bob).get(route_url(plain.deployment)).json()["timeout_s"] == 2.5
    assert route.revisions.order_by("-number").first().actor_label == "dave"
    assert AuditEvent.objects.filter(verb="updated", after__request_timeout_s=2.5).exists()

    events = AuditEvent.objects.count()
    for bad in (0, 0.05, 3601, "NaN", "soon", True, [5]):
        refused = api_as(dave).patch(deployment_url, {"request_timeout_s": bad}, format="json")
        assert refused.status_code == 400, (bad, refused.content)
        assert "request_timeout_s" in refused.json(), refused.json()
    assert AuditEvent.objects.count() == events
    assert Route.objects.get(pk=plain.deployment.pk).spec["timeout_s"] == 2.5

    cleared = api_as(dave).patch(deployment_url, {"request_timeout_s": None}, format="json")
    assert cleared.status_code == 200, cleared.content
    assert Route.objects.get(pk=plain.deployment.pk).spec["timeout_s"] is None
    assert "proxy_read_timeout 300s;" in conf.read_text()


def test_a_deadline_is_refused_on_a_cluster_whose_router_has_none(db, tenant_a, dave):
    """Gateway API v1.0's HTTPRoute has no timeouts: a deadline there is a 400 naming it."""
    cluster = ClusterFactory(name="gw", kind=Cluster.Kind.KUBERNETES,
                             kube_router=Cluster.KubeRouter.GATEWAY_API)
    model = ModelFactory(tenant=tenant_a, name="gw-model")
    deployment = DeploymentFactory(model=model, cluster=cluster, name="gw-dep")

    refused = api_as(dave).patch(f"/api/v1/deployments/{deployment.pk}/",
                                 {"request_timeout_s": 5}, format="json")

    assert refused.status_code == 400, refused.content
    assert "Gateway API" in refused.json()["request_timeout_s"][0]
    deployment.refresh_from_db()
    assert deployment.request_timeout_s is None


def test_the_api_gives_a_default_route(plain, dave):
    ready(plain.deployment, plain.v1, plain.a)

    made = api_as(dave).post("/api/v1/routes/", {"deployment": plain.deployment.name})
    again = api_as(dave).post("/api/v1/routes/", {"deployment": plain.deployment.pk})

    assert made.status_code == 201, made.content
    assert again.status_code == 200
    assert made.json()["weights"] == {"1": 100}


def test_tenancy_on_routes(plain, dave, bob, charlie):
    ready(plain.deployment, plain.v1, plain.a)
    url = route_url(plain.deployment)

    viewer = api_as(bob).put(url, {"weights": {"1": 100}})
    other = api_as(charlie).put(url, {"weights": {"1": 100}})
    other_default = api_as(charlie).post("/api/v1/routes/", {"deployment": plain.deployment.pk})
    api_as(dave).put(url, {"weights": {"1": 100}})
    other_read = api_as(charlie).get(url)
    other_history = api_as(charlie).get(f"{url}revisions/")
    other_list = api_as(charlie).get("/api/v1/routes/")

    assert viewer.status_code == 403
    assert "this needs the deployer role" in viewer.json()["detail"]
    assert other.status_code == 404 and other_read.status_code == 404
    assert other_history.status_code == 404
    assert other_default.status_code == 400 and "deployment" in other_default.json()
    assert other_list.json()["results"] == []
    assert RouteRevision.objects.count() == 1


# --------------------------------------------------------------------------------------------
# With the real Triton
# --------------------------------------------------------------------------------------------


@pytest.fixture
def two_versions(world, use_route_nginx):
    """Versions 1 and 2 of the world's model, ready on the real Triton; the route is taken
    away again at the end so the world can unload them."""
    one = load_once(world, world.version(1))
    two = load_once(world, world.version(2))
    assert (one.state, two.state) == (ModelLoad.State.READY, ModelLoad.State.READY), (
        one.error, two.error)
    yield world
    Route.objects.filter(pk=world.deployment.pk).delete()


def split_of(url: str, model: str, n: int, headers: dict[str, str] | None = None) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    with httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(n):
            response = client.post(f"/v2/models/{model}/infer", json=INFER, headers=headers)
            assert response.status_code == 200, response.text
            seen[response.headers["x-switchyard-variant"]] += 1
    return seen


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_a_deployer_moves_the_split_to_90_10_and_requests_follow_it(two_versions, route_samples):
    world = two_versions
    client = api_as(world.user)
    url = route_url(world.deployment)

    first = client.put(url, {"weights": {"1": 100}, "reason": "all on v1"})
    assert first.status_code == 200, first.content
    assert split_of(first.json()["url"], world.model.name, 20) == {"v1-triton": 20}
    started = time.monotonic()
    moved = client.put(url, {"weights": {"1": 90, "2": 10}, "reason": "canary v2"})
    took = time.monotonic() - started
    n = 400
    seen = split_of(moved.json()["url"], world.model.name, n)

    assert moved.status_code == 200, moved.content
    assert took < 5, took
    assert set(seen) == {"v1-triton", "v2-triton"}
    assert within_binomial(seen["v2-triton"], n, 10), seen
    # Every change is audited with who, why and nginx's answer.
    events = AuditEvent.objects.filter(object_type="rollouts.route",
                                       object_id=str(world.deployment.pk)).order_by("pk")
    assert [(e.verb, e.actor_label, e.reason) for e in events] == [
        ("route_changed", world.user.username, "all on v1"),
        ("route_changed", world.user.username, "canary v2"),
    ]
    assert events[1].before["weights"] == {"v1-triton": 100, "v2-triton": 0}
    assert events[1].after["weights"] == {"v1-triton": 90, "v2-triton": 10}
    assert events[1].after["result"]["reloaded"] is True
    # nginx's samples name the route and the variants the contract with the collector says.
    deadline = time.monotonic() + 2
    name = f"dep-{world.deployment.pk}"
    while time.monotonic() < deadline:
        records = [json.loads(line.split("switchyard: ", 1)[1]) for line in route_samples.lines
                   if f'"route":"{name}"' in line]
        if {r["variant"] for r in records} >= {"v1-triton", "v2-triton"}:
            break
        time.sleep(0.05)
    assert {r["variant"] for r in records} >= {"v1-triton", "v2-triton"}


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_an_nginx_that_refuses_keeps_the_route_in_force_and_records_why(two_versions):
    world = two_versions
    client = api_as(world.user)
    url = route_url(world.deployment)
    first = client.put(url, {"weights": {"1": 70, "2": 30}})
    assert first.status_code == 200, first.content
    # The server's URL now names a host nginx cannot resolve: nginx -t refuses the route.
    good = world.server.http_url
    InferenceServer.objects.filter(pk=world.server.pk).update(
        http_url="http://no-such-host.invalid:8000")

    refused = client.put(url, {"weights": {"1": 50, "2": 50}, "reason": "even split"})

    InferenceServer.objects.filter(pk=world.server.pk).update(http_url=good)
    assert refused.status_code == 409, refused.content
    message = refused.json()["route"][0]
    assert "host not found in upstream" in message and "no-such-host.invalid" in message
    route = Route.objects.get(pk=world.deployment.pk)
    assert route.state == Route.State.FAILED and "host not found" in route.error
    assert route.version_weights == {1: 70, 2: 30}
    failed = route.revisions.get(number=2)
    assert failed.result == RouteRevision.Result.FAILED and "host not found" in failed.message
    assert failed.weights == {"1": 50, "2": 50} and failed.reason == "even split"
    assert AuditEvent.objects.filter(verb="route_change_failed", reason="even split").exists()
    # The old split is still what nginx serves.
    seen = split_of(first.json()["url"], world.model.name, 200)
    assert within_binomial(seen["v2-triton"], 200, 30), seen
    body = client.get(url).json()
    assert body["state"] == "failed" and body["weights"] == {"1": 70, "2": 30}


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_sticky_keys_keep_their_variant_and_the_console_form_round_trips(two_versions, client):
    world = two_versions
    viewer = UserFactory(username=f"viewer-{uuid.uuid4().hex[:6]}")
    MembershipFactory(user=viewer, tenant=world.tenant, role=Membership.Role.VIEWER)
    page = reverse("rollouts:deployment", args=[world.deployment.pk])
    action = reverse("rollouts:deployment-route", args=[world.deployment.pk])
    client.force_login(world.user)

    made = client.post(reverse("rollouts:deployment-route-default", args=[world.deployment.pk]))
    bad = client.post(action, {"weight_1": "60", "weight_2": "30", "policy": "weighted"})
    good = client.post(action, {"weight_1": "50", "weight_2": "50", "policy": "sticky",
                                "sticky_header": "X-User", "reason": "A/B test"})
    shown = client.get(page).content.decode()

    assert made.status_code == 302
    assert bad.status_code == 400
    assert 'id="weights-error">must sum to 100, got 90' in bad.content.decode()
    assert good.status_code == 302, good.content.decode()
    route = Route.objects.get(pk=world.deployment.pk)
    assert (route.policy, route.sticky_header, route.version_weights) == (
        "sticky", "X-User", {1: 50, 2: 50})
    assert route.url in shown
    call = client.get(reverse("rollouts:deployment-call", args=[world.deployment.pk])).content.decode()
    assert f"{route.url}/v2/models/{world.model.name}/infer" in call and "X-User: user-42" in call
    assert 'data-variant="v1-triton"' in shown and "A/B test" in shown
    # A key keeps its variant while the weights stay as they are.
    for user in ("alice", "bob", "carol", "dan"):
        assert len(split_of(route.url, world.model.name, 8, {"X-User": user})) == 1
    # Back to weighted as the form comes back filled in: its sticky header field means nothing now.
    back = client.post(action, {"weight_1": "50", "weight_2": "50", "policy": "weighted",
                                "sticky_header": "X-User"})
    assert back.status_code == 302, back.content.decode()
    route.refresh_from_db()
    assert (route.policy, route.sticky_header) == ("weighted", "")
    # A viewer sees the panel but not the form, and may not post it.
    client.force_login(viewer)
    seen = client.get(page).content.decode()
    posted = client.post(action, {"weight_1": "100", "policy": "weighted"})
    assert route.url in seen and 'id="route-form"' not in seen
    assert posted.status_code == 403
