"""Drift on the console pages: versions recorded ready that a server does not report, and
loads lost from a server lately (see rollouts/loads/drift.py)."""

from __future__ import annotations

from typing import Any

from django import template

from fleet.models import InferenceServer
from rollouts.loads import drift
from rollouts.models import Deployment, ModelLoad

register = template.Library()


@register.inclusion_tag("rollouts/partials/server_drift.html")
def server_drift(
    server: InferenceServer, user: Any, deployment: Deployment | None = None
) -> dict[str, Any]:
    """Badges for ``server``: "DRIFT: not on server" for each version recorded ready that its
    last index does not list as ready, and the loads lost from it in the last day. Only the
    loads ``user`` may see (of ``deployment``, when given)."""
    loads = ModelLoad.objects.visible_to(user)
    if deployment is not None:
        loads = loads.filter(deployment=deployment)
    ready = list(
        loads.filter(server=server, state=ModelLoad.State.READY).select_related("version__model")
    )
    reasons = drift.drift_of(server, ready)
    return {
        "unreported": [(load, reasons[load.pk]) for load in ready if load.pk in reasons],
        "lost": drift.recently_lost(server, loads),
        "show_model": deployment is None,
    }
