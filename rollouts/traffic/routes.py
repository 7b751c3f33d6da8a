"""Deployment routes: the split of a deployment's traffic between its versions and servers.

A deployment's route is what its clients call: one stable URL on the cluster's traffic router
(``fleet.inventory.routers.router_for``), named ``dep-<deployment id>``, in front of one variant per
version ready on one of its servers, named ``v<version>-<server>``. :func:`set_route` is the
one use case behind the API and the console: it checks the caller's role and the request,
builds the router's :class:`~fleet.adapters.routers.base.RouteSpec` (``rollouts.traffic.specs``), puts it in force and records
the change (a :class:`~rollouts.models.RouteRevision` and an audit entry) with the router's
answer. A change the router refuses (nginx failing ``nginx -t`` or its reload) leaves the
route in force as it was: the revision is recorded as failed with the router's message and
the caller gets a 409 naming ``route``.

What a route is made of, by runtime, and how its weights are given: ``rollouts.traffic.specs``.

The default route (:func:`ensure_route`) sends everything to the version the production alias
names, when it is ready, else to the newest ready version. It is made by the console's and the
API's "create route" action, and by the beat task ``rollouts.tasks.ensure_routes`` for every
deployment with a ready version and no route yet (so the first load that becomes ready gets
one within a tick). A failed first attempt leaves a failed route, which the tick leaves alone:
a deployer changes it by hand.

:func:`remove_route` takes a route off the router (its URL stops answering) and keeps the row,
``removed``, with its history: that is how a deployment is retired (remove the route, unload
its versions, delete it), since the version that carries the traffic cannot be unloaded. On a
Kubernetes cluster it deletes what every router kind wrote for the route (an HTTPRoute left
from before a switch to Istio, say), not only the current router's objects. A change of a
cluster's router hands its routes over: ``rollouts.traffic.handover``.

Two changes of one route never interleave: a change claims the route (``claimed_until``) for
as long as the router takes, and :func:`check_unload` refuses to unload a version that carries
traffic (or receives mirrored copies), or any version while a change is being applied.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.adapters.base import AdapterError
from fleet.adapters.routers.base import (
    WEIGHTED,
    RouteSpec,
    RouteSpecError,
    TrafficRouter,
)
from fleet.inventory.routers import leftover_routers, routed_clusters, router_for
from fleet.models import Cluster, InferenceServer, Membership
from fleet.tenancy.scoping import require_role, token_of
from rollouts.models import Alias, Deployment, ModelLoad, ModelVersion, Route, RouteRevision
from rollouts.traffic import specs
from rollouts.traffic.specs import ROUTE, MirrorTarget, Weights, route_name

log = logging.getLogger(__name__)

PRODUCTION_ALIAS = "production"


class RouteFailed(Conflict):
    """The router refused the change; the route in force before it stays in force."""


# --------------------------------------------------------------------------------------------
# What can be routed to
# --------------------------------------------------------------------------------------------


def router_of(deployment: Deployment) -> TrafficRouter:
    """The deployment's cluster's router; a Conflict on ``route`` when there is none."""
    cluster = deployment.cluster
    try:
        router = router_for(cluster)
    except ValueError as exc:
        raise Conflict(
            f"the traffic router of cluster {cluster.name} is misconfigured: {exc}", field=ROUTE
        ) from None
    if router is None:
        raise Conflict(
            f"cluster {cluster.name} has no traffic router (local clusters route through the "
            "local nginx; a static cluster names its nginx router; a Kubernetes cluster names "
            "gateway-api or istio)",
            field=ROUTE,
        )
    return router


def ready_loads(deployment: Deployment) -> list[ModelLoad]:
    """The deployment's loads that are ready on its servers, by version then server name."""
    return list(
        ModelLoad.objects.filter(
            deployment=deployment, state=ModelLoad.State.READY,
            server__in=deployment.servers.all(),
        )
        .select_related("version", "server")
        .order_by("version__version", "server__name", "pk")
    )


# --------------------------------------------------------------------------------------------
# Changing a route
# --------------------------------------------------------------------------------------------


def set_route(
    actor: Any,
    deployment: Deployment,
    weights: Weights,
    *,
    policy: str = WEIGHTED,
    sticky_header: str = "",
    mirror: MirrorTarget | None = None,
    reason: str = "",
) -> Route:
    """Split the deployment's traffic as ``weights`` say and put it in force (deployer role).

    Refusals name the field: ``weights`` (unknown or unready version, not summing to 100),
    ``policy``, ``sticky_header``, ``mirror``; ``route`` when the cluster has no router, when
    another change is being applied, or when the router refused the change (RouteFailed: the
    failed revision is recorded and the route in force is unchanged). Asking for the route
    already in force changes and records nothing.
    """
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    return _set_route(actor, deployment, weights, policy, sticky_header, mirror, reason)


def set_route_as_system(
    deployment: Deployment,
    weights: Weights,
    *,
    policy: str = WEIGHTED,
    sticky_header: str = "",
    mirror: MirrorTarget | None = None,
    reason: str = "",
) -> Route:
    """``set_route`` by Switchyard itself (a rollout's step or its way back): no person's role
    is checked, and the change is recorded as the system's. The same refusals."""
    return _set_route(None, deployment, weights, policy, sticky_header, mirror, reason)


def _set_route(
    actor: Any,
    deployment: Deployment,
    weights: Weights,
    policy: str = WEIGHTED,
    sticky_header: str = "",
    mirror: MirrorTarget | None = None,
    reason: str = "",
) -> Route:
    if Deployment.objects.filter(pk=deployment.pk, archived_at__isnull=False).exists():
        raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
    router = router_of(deployment)
    route, created = claim_route(deployment)
    try:
        # What is ready is read under the claim: an unload asked for now is refused
        # (check_unload), so the versions routed to stay loaded while the change is applied.
        ready = ready_loads(deployment)
        if not ready:
            raise DomainError(
                f"no version of {deployment.model.name} is ready on the deployment's servers: "
                "load one first",
                field="weights",
            )
        spec, meaning, asked = specs.build(deployment, ready, weights, policy, sticky_header, mirror)
        return _apply(actor, route, router, spec, meaning, asked, reason)
    except RouteFailed:
        raise
    except BaseException:
        if created and not route.revisions.exists():
            route.delete()  # nothing was tried on the router: leave no route behind
        raise
    finally:
        Route.objects.filter(pk=route.pk).update(claimed_until=None)
        route.claimed_until = None


def deadline_problem(deployment: Deployment) -> str:
    """Why the deployment's cluster cannot keep a request deadline on its routes ("" when it
    can, or when it has no deadline): a Gateway API HTTPRoute of v1.0's standard channel
    has no timeouts."""
    if deployment.request_timeout_s is None or deployment.cluster_id is None:
        return ""
    cluster = deployment.cluster
    if cluster.is_kubernetes and cluster.kube_router == Cluster.KubeRouter.GATEWAY_API:
        return (f"cluster {cluster.name} routes through Gateway API HTTPRoutes, which have no "
                "request deadline in v1.0's standard channel: leave it empty, or route the "
                "cluster through Istio")
    return ""


def reapply(actor: Any, deployment: Deployment, reason: str) -> Route | None:
    """Put the deployment's route in force again with the same split, policy and mirror, so
    that a change of the deployment's own route settings (its request deadline) reaches the
    router; None when it has no route in force. The refusals of :func:`set_route`."""
    route = Route.objects.filter(deployment=deployment).first()
    if route is None or route.state == Route.State.REMOVED or not route.spec:
        return None
    spec = RouteSpec.from_json(route.spec)
    meaning = route.variants or {}
    weights = {(meaning[v.name]["version"], meaning[v.name]["server"]): v.weight
               for v in spec.variants if v.weight > 0 and v.name in meaning}
    mirror = None
    if spec.mirror is not None and spec.mirror.variant in meaning:
        target = meaning[spec.mirror.variant]
        mirror = MirrorTarget(target["version"], spec.mirror.percent, target["server"])
    return _set_route(actor, deployment, weights, spec.policy, spec.sticky_header, mirror, reason)


def claim_route(deployment: Deployment) -> tuple[Route, bool]:
    """The deployment's route (made when it has none), held for one change; a Conflict when
    another change holds it."""
    route, created = Route.objects.get_or_create(
        deployment=deployment, defaults={"name": route_name(deployment)}
    )
    now = timezone.now()
    until = now + timedelta(seconds=settings.SWITCHYARD_ROUTE_APPLY_LEASE_S)
    # A conditional update: of two changes at once, one gets the route (and the other is told
    # so); a claim left by a worker that died runs out.
    claimed = Route.objects.filter(pk=route.pk).filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
    ).update(claimed_until=until)
    if not claimed:
        raise Conflict("another change of this route is being applied: try again in a moment",
                       field=ROUTE)
    route.refresh_from_db()
    return route, created


def in_force(route: Route) -> dict[str, Any]:
    """The route in force, for the audit log: weights by variant, policy and mirror."""
    return {
        "weights": route.weights,
        "policy": route.policy if route.spec else None,
        "sticky_header": route.sticky_header,
        "mirror": route.spec.get("mirror"),
        "revision": route.revision,
    }


def _apply(
    actor: Any,
    route: Route,
    router: TrafficRouter,
    spec: RouteSpec,
    meaning: dict[str, dict[str, Any]],
    asked: dict[str, int],
    reason: str,
) -> Route:
    wanted = spec.to_json()
    already = route.state == Route.State.IN_FORCE and route.spec == wanted
    before = in_force(route)
    try:
        result = router.apply(spec)
    except RouteSpecError as exc:
        # What this router cannot express (a Gateway API route has no sticky policy, say):
        # refused before anything was sent.
        raise specs.refusal(exc) from None
    except (AdapterError, OSError) as exc:
        message = exc.message if isinstance(exc, AdapterError) else f"{type(exc).__name__}: {exc}"
        _record_failure(actor, route, spec, meaning, asked, reason, message, before)
        raise RouteFailed(
            f"the router refused the change; the route in force is unchanged: {message}",
            field=ROUTE,
        ) from None
    if already and not result.changed and not result.reloaded:
        return route  # asked for what is in force: nothing to do, nothing to record
    token = token_of(actor)
    with transaction.atomic():
        number = _next_number(route)
        RouteRevision.objects.create(
            route=route, number=number, spec=wanted, variants=meaning, weights=asked,
            actor=_user(actor), actor_token=token, actor_label=audit.actor_label(actor),
            reason=reason, result=RouteRevision.Result.APPLIED, changed=result.changed,
            reloaded=result.reloaded, message=result.message, url=result.url,
        )
        mirror = spec.mirror
        fields = {
            "protocol": spec.protocol, "policy": spec.policy, "sticky_header": spec.sticky_header,
            "mirror_variant": mirror.variant if mirror else "",
            "mirror_percent": mirror.percent if mirror else 0,
            "spec": wanted, "variants": meaning, "url": result.url,
            "state": Route.State.IN_FORCE, "error": "", "revision": number,
            "applied_at": timezone.now(), "updated_at": timezone.now(),
        }
        Route.objects.filter(pk=route.pk).update(**fields)
        for key, value in fields.items():
            setattr(route, key, value)
        audit.record(
            actor, "route_changed", route, tenant=route.deployment.tenant, before=before,
            after={**specs.summary(spec), "revision": number,
                   "result": {"changed": result.changed, "reloaded": result.reloaded,
                              "message": result.message}},
            reason=reason,
        )
    return route


def _record_failure(
    actor: Any,
    route: Route,
    spec: RouteSpec,
    meaning: dict[str, dict[str, Any]],
    asked: dict[str, int],
    reason: str,
    message: str,
    before: dict[str, Any],
) -> None:
    with transaction.atomic():
        number = _next_number(route)
        RouteRevision.objects.create(
            route=route, number=number, spec=spec.to_json(), variants=meaning, weights=asked,
            actor=_user(actor), actor_token=token_of(actor), actor_label=audit.actor_label(actor),
            reason=reason, result=RouteRevision.Result.FAILED, message=message,
        )
        Route.objects.filter(pk=route.pk).update(
            state=Route.State.FAILED, error=message, updated_at=timezone.now()
        )
        route.state, route.error = Route.State.FAILED, message
        audit.record(
            actor, "route_change_failed", route, tenant=route.deployment.tenant, before=before,
            after={**specs.summary(spec), "revision": number, "result": {"error": message}},
            reason=reason,
        )


def _next_number(route: Route) -> int:
    return (route.revisions.aggregate(n=Max("number"))["n"] or 0) + 1


def _user(actor: Any) -> Any:
    if actor is None or token_of(actor) is not None or not actor.is_authenticated:
        return None
    return actor


def remove_route(actor: Any, deployment: Deployment, reason: str = "") -> Route:
    """Take the deployment's route off the router (deployer role): its URL stops answering,
    so its versions can be unloaded and the deployment retired. The row stays, ``removed``,
    with its history (and the default-route tick leaves it alone); :func:`set_route` routes
    again. RouteFailed when the router refused; nothing changes then."""
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    route = Route.objects.filter(pk=deployment.pk).first()
    if route is None:
        raise Conflict(f"deployment {deployment.name} has no route", field=ROUTE)
    if route.state == Route.State.REMOVED:
        return route
    router = router_of(deployment)
    route, _created = claim_route(deployment)
    before = in_force(route)
    try:
        try:
            # What a router this cluster used before wrote for the route goes first, so a
            # refusal there leaves the route in force as it was.
            for other in leftover_routers(deployment.cluster):
                remove_leftover(other, route.name)
            existed = router.remove(route.name)
        except (AdapterError, OSError) as exc:
            message = exc.message if isinstance(exc, AdapterError) else f"{type(exc).__name__}: {exc}"
            with transaction.atomic():
                RouteRevision.objects.create(
                    route=route, number=_next_number(route), actor=_user(actor),
                    actor_token=token_of(actor), actor_label=audit.actor_label(actor),
                    reason=reason, result=RouteRevision.Result.FAILED, message=message,
                )
                Route.objects.filter(pk=route.pk).update(
                    state=Route.State.FAILED, error=message, updated_at=timezone.now()
                )
                audit.record(actor, "route_remove_failed", route, tenant=deployment.tenant,
                             before=before, after={"error": message}, reason=reason)
            raise RouteFailed(
                f"the router refused to remove the route; it stays in force: {message}",
                field=ROUTE,
            ) from None
        message = "route removed" if existed else "the router had no such route"
        with transaction.atomic():
            number = _next_number(route)
            RouteRevision.objects.create(
                route=route, number=number, actor=_user(actor), actor_token=token_of(actor),
                actor_label=audit.actor_label(actor), reason=reason,
                result=RouteRevision.Result.APPLIED, changed=existed, reloaded=existed,
                message=message,
            )
            fields = {
                "spec": {}, "variants": {}, "url": "", "mirror_variant": "", "mirror_percent": 0,
                "state": Route.State.REMOVED, "error": "", "revision": number,
                "applied_at": timezone.now(), "updated_at": timezone.now(),
            }
            Route.objects.filter(pk=route.pk).update(**fields)
            for key, value in fields.items():
                setattr(route, key, value)
            audit.record(actor, "route_removed", route, tenant=deployment.tenant, before=before,
                         after={"revision": number, "result": message}, reason=reason)
        return route
    finally:
        Route.objects.filter(pk=route.pk).update(claimed_until=None)
        route.claimed_until = None


def remove_leftover(router: TrafficRouter, name: str) -> bool:
    """Delete what ``router`` (one the cluster does not use now) holds of the route ``name``;
    a cluster without that router's API (its CRDs not installed) holds nothing, and where
    Switchyard's RBAC has no grant for that router's objects (a cluster set up for one router
    only) it cannot have written any: logged, not a failure."""
    try:
        return router.remove(name)
    except AdapterError as exc:
        if getattr(exc, "missing_api", False):
            return False
        if getattr(exc, "kind", "") == "forbidden":
            log.warning("route %s: not removed from a router this cluster does not use: %s",
                        name, exc.message)
            return False
        raise


# --------------------------------------------------------------------------------------------
# The default route
# --------------------------------------------------------------------------------------------


def default_version(deployment: Deployment, ready: list[ModelLoad]) -> tuple[int, str]:
    """The version a new route sends everything to, and why."""
    numbers = {load.version.version for load in ready}
    alias = Alias.objects.filter(model=deployment.model, name=PRODUCTION_ALIAS).select_related(
        "version"
    ).first()
    if alias is not None and alias.version.version in numbers:
        return alias.version.version, f"the {PRODUCTION_ALIAS} alias"
    return max(numbers), "the newest ready version"


def ensure_route(actor: Any, deployment: Deployment, reason: str = "") -> tuple[Route, bool]:
    """The deployment's route, made when it has none: 100% to :func:`default_version`.

    Returns (route, made now). ``actor`` None is the system (the beat task); anyone else
    needs the deployer role. A Conflict on ``deployment`` when no version is ready;
    RouteFailed when the router refused it (the failed route is kept, with its message).
    """
    if actor is not None:
        require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    existing = Route.objects.filter(pk=deployment.pk).first()
    if existing is not None:
        return existing, False
    ready = ready_loads(deployment)
    if not ready:
        raise Conflict(
            f"no version of {deployment.model.name} is ready on deployment {deployment.name}'s "
            "servers: load one first",
            field="deployment",
        )
    number, why = default_version(deployment, ready)
    route = _set_route(actor, deployment, {number: 100},
                       reason=reason or f"default route: all traffic to v{number}, {why}")
    return route, True


def ensure_routes() -> int:
    """Give a default route to every deployment in use that has a ready version, a router and
    no route yet (the beat tick). Returns how many it made."""
    candidates = (
        Deployment.objects.filter(
            archived_at__isnull=True, route__isnull=True, loads__state=ModelLoad.State.READY
        )
        .filter(routed_clusters("cluster__"))
        .select_related("tenant", "model", "cluster")
        .distinct()
    )
    made = 0
    for deployment in candidates:
        try:
            _route, created = ensure_route(None, deployment)
        except DomainError as exc:
            log.warning("deployment %s: no default route: %s", deployment.pk, exc.message)
            continue
        made += created
    return made


# --------------------------------------------------------------------------------------------
# Unloads
# --------------------------------------------------------------------------------------------


def check_unload(deployment: Deployment, version: ModelVersion,
                 servers: Iterable[InferenceServer]) -> None:
    """Refuse (Conflict on ``version``) to take ``version`` off ``servers`` while the route
    sends it traffic or mirrored copies, or while a change of the route is being applied.
    Call it in the unload's transaction: it locks the route row until that commits."""
    route = Route.objects.select_for_update().filter(pk=deployment.pk).first()
    if route is None:
        return
    if route.claimed_until is not None and route.claimed_until > timezone.now():
        raise Conflict(
            "a change of the deployment's route is being applied: try again in a moment",
            field="version",
        )
    server_ids = {s.pk for s in servers}
    for variant in route.split():
        meaning = route.variants.get(variant["name"]) or {}
        if meaning.get("version_id") != version.pk or meaning.get("server_id") not in server_ids:
            continue
        if variant["weight"] > 0:
            raise Conflict(
                f"v{version.version} carries {variant['weight']}% of deployment "
                f"{deployment.name}'s traffic on {meaning.get('server')}: move its traffic "
                "first",
                field="version",
            )
        if variant["mirror"]:
            raise Conflict(
                f"v{version.version} receives {route.mirror_percent}% of deployment "
                f"{deployment.name}'s traffic as mirrored copies on {meaning.get('server')}: "
                "stop the mirror first",
                field="version",
            )


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------

# The demo fraud scorer's input, as the demo's traffic generator sends it.
DEFAULT_INPUT = {"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [0.1, 0.5, 2.0]}
