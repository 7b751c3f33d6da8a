"""What the deployment page's Traffic panel shows: the route in force with the share each
variant got in the last minute, the change form (deployers) and the route's history.

Nothing here decides: changes go through ``rollouts.traffic.forms`` to the functions of
``rollouts.traffic.routes`` the API calls."""

from __future__ import annotations

from typing import Any

import redis
from django.http import HttpRequest

from fleet.inventory.routers import has_router
from rollouts.models import Deployment, Route
from rollouts.traffic import routes, samples
from rollouts.traffic.forms import RouteDefaultForm, RouteForm, RouteRemoveForm

TRAFFIC_WINDOW_S = 60  # the Traffic panel's measured split covers the last minute


def measured_split(deployment: Deployment, route: Route | None) -> list[dict[str, Any]]:
    """The split in force, each variant with what it got in the last TRAFFIC_WINDOW_S: its
    share of the requests, its figures and its mirrored copies' (no figures while Redis is
    away), and whether its version is still ready on its server."""
    split = route.split() if route is not None else []
    if not split:
        return split
    try:
        measured = samples.summary(deployment.pk, TRAFFIC_WINDOW_S)
    except redis.RedisError:
        measured = {}
    total = sum(m["count"] for m in measured.values())
    ready = {(load.version_id, load.server_id) for load in routes.ready_loads(deployment)}
    for row in split:
        meaning = route.variants.get(row["name"]) or {}
        figures = measured.get(row["name"]) or {}
        count = figures.get("count", 0)
        row["requests"] = count
        row["figures"] = figures if count else None
        copies = figures.get("mirror") or {}
        row["copies"] = copies if copies.get("count") else None
        row["measured"] = round(100 * count / total, 1) if total else None
        row["gone"] = (meaning.get("version_id"), meaning.get("server_id")) not in ready
    return split


def traffic_panel_context(
    request: HttpRequest, deployment: Deployment, can_deploy: bool,
    form: RouteForm | RouteDefaultForm | RouteRemoveForm | None,
) -> dict[str, Any]:
    """The Traffic panel: the route in force with the share each variant got in the last
    minute, the change form (deployers) and the history; ``form`` is a refused change,
    shown in place."""
    route = Route.objects.filter(pk=deployment.pk).first()
    split = measured_split(deployment, route)
    refused = form if isinstance(form, RouteDefaultForm | RouteRemoveForm) else None
    if can_deploy and not isinstance(form, RouteForm) and routes.ready_loads(deployment):
        form = RouteForm(actor=request.user, deployment=deployment)
    return {
        "route_refusal": refused,
        "route": route,
        "route_split": split,
        "route_revisions": route.revisions.all()[:10] if route is not None else [],
        "route_form": form if can_deploy and isinstance(form, RouteForm) else None,
        "has_router": has_router(deployment.cluster),
        "can_route": can_deploy,
        "traffic_window_s": TRAFFIC_WINDOW_S,
    }
