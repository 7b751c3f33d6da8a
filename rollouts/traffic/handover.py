"""Handing a Kubernetes cluster's routes over when its router changes.

A change of ``kube_router`` (gateway-api to istio, say) or of ``kube_namespace`` would leave
the old router's objects serving traffic that Switchyard no longer manages. So the change
(``fleet.inventory.routers.save_router_change``, behind the API and the console form) sends
``router_changing`` before the cluster row is saved, and :func:`hand_over` answers it:

1. every route of the cluster that the router holds (in force, or failed with a split still
   in force) is claimed, so no change of it interleaves;
2. its split in force (``Route.spec``) is written on the new router and read back: the
   weights read must be the ones written. If any route cannot be (the new router cannot
   express it, or refuses it), the objects already written on the new router are deleted
   again and the change is refused (409 on ``kube_router``): the cluster keeps its router and
   every route stays as it was;
3. once the cluster is saved, the old router's objects are deleted (a route missing there
   is done; a refusal is logged and audited, and deleting the route later removes what every
   router kind wrote for it), each route records its new URL, and the claims are released.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db.models import Q
from django.utils import timezone

from console.exceptions import Conflict
from fleet import audit
from fleet.adapters.base import AdapterError
from fleet.adapters.routers.base import RouteSpec, TrafficRouter
from fleet.inventory.routers import has_router, router_for
from fleet.models import Cluster
from rollouts.models import Route
from rollouts.traffic.routes import claim_route, remove_leftover

log = logging.getLogger(__name__)

FIELD = "kube_router"


def routes_held(cluster: Cluster) -> list[Route]:
    """The cluster's routes whose split the router holds."""
    return list(
        Route.objects.filter(deployment__cluster_id=cluster.pk)
        .filter(Q(state=Route.State.IN_FORCE) | Q(state=Route.State.FAILED))
        .exclude(spec={})
        .select_related("deployment__tenant", "deployment")
        .order_by("pk")
    )


def _router(cluster: Cluster, which: str) -> TrafficRouter | None:
    if not has_router(cluster):
        return None
    try:
        return router_for(cluster)
    except ValueError as exc:
        raise Conflict(f"the {which} router of cluster {cluster.name} is misconfigured: {exc}",
                       field=FIELD) from None


def hand_over(sender: Any, *, before: Cluster, after: Cluster,
              **kwargs: Any) -> Callable[[], None] | None:
    """The ``router_changing`` receiver: steps 1 and 2 of the module docstring now; returns
    step 3, to run once the cluster is saved. Conflict on ``kube_router`` when refused."""
    routes = routes_held(after)
    if not routes:
        return None
    new = _router(after, "new")
    if new is None:
        raise Conflict(
            f"cluster {after.name} has {len(routes)} route{'s' if len(routes) != 1 else ''} "
            "in force on its router: remove them first, or choose the router they move to",
            field=FIELD,
        )
    old = _router(before, "current")
    claimed: list[Route] = []
    written: list[tuple[Route, str]] = []
    try:
        for route in routes:
            claim_route(route.deployment)
            claimed.append(route)
            written.append((route, _write(new, route)))
    except BaseException:
        # Take back what the new router holds of every route tried, the refused one too (a
        # write that read back wrong is in force there).
        for route in claimed:
            _quietly(new, route.name)
        _release(claimed)
        raise

    def finish() -> None:
        try:
            for route, url in written:
                _retire(old, route, url, before, after)
        finally:
            _release(claimed)

    return finish


def _write(new: TrafficRouter, route: Route) -> str:
    """Put the route's split in force on ``new`` and read it back; its URL there."""
    spec = RouteSpec.from_json(route.spec)
    try:
        result = new.apply(spec)
        back = new.read(route.name)
    except AdapterError as exc:
        raise Conflict(f"route {route.name} could not move to the new router, so the router "
                       f"stays as it was: {exc.message}", field=FIELD) from None
    wanted = list(spec.weights().values())
    got = list(back.weights().values()) if back is not None else None
    if got != wanted:
        raise Conflict(f"route {route.name} read back from the new router with weights {got}, "
                       f"not {wanted}, so the router stays as it was", field=FIELD)
    return result.url


def _retire(old: TrafficRouter | None, route: Route, url: str, before: Cluster,
            after: Cluster) -> None:
    note = "no object on the old router"
    if old is not None:
        try:
            note = ("old router's objects deleted" if remove_leftover(old, route.name)
                    else note)
        except AdapterError as exc:
            note = f"the old router's objects could not be deleted: {exc.message}"
            log.warning("route %s: %s", route.name, note)
    Route.objects.filter(pk=route.pk).update(url=url, updated_at=timezone.now())
    audit.record(
        None, "route_handed_over", route, tenant=route.deployment.tenant,
        before={"router": before.kube_router, "namespace": before.kube_namespace,
                "url": route.url},
        after={"router": after.kube_router, "namespace": after.kube_namespace, "url": url,
               "result": note},
        reason=f"cluster {after.name}'s router changed",
    )


def _quietly(router: TrafficRouter, name: str) -> None:
    try:
        router.remove(name)
    except AdapterError as exc:
        log.warning("route %s: the new router's object could not be taken back: %s", name,
                    exc.message)


def _release(routes: list[Route]) -> None:
    Route.objects.filter(pk__in=[r.pk for r in routes]).update(claimed_until=None)
