"""Drain before unload: a version leaves a routed server only once nothing is in flight to it.

An unload is asked only while the deployment's route sends the version no traffic and no
copies (``rollouts.traffic.routes.check_unload``), but requests the router had already sent
may still be running on the server. Before the load reconciler unloads, :func:`drain` asks
the deployment's router what is still in flight under the configurations it replaced (the
nginx router: its workers from before the last reload, which finish their requests and
exit). The unload waits while the router says some are, up to ``SWITCHYARD_DRAIN_TIMEOUT_S``
from when it was asked; a router that cannot say is given ``SWITCHYARD_DRAIN_GRACE_S`` after
the route's last change. A deployment without a route has nothing to drain.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from fleet.inventory.routers import has_router, router_for
from rollouts.models import ModelLoad, Route

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Drain:
    """Where a load's drain stands: ``done``, and what to record (empty: nothing to say)."""

    done: bool
    message: str = ""


def drain(load: ModelLoad) -> Drain:
    """Whether ``load`` (unloading) may leave its server now."""
    route = Route.objects.filter(pk=load.deployment_id).first()
    cluster = load.deployment.cluster
    if route is None or not has_router(cluster):
        return Drain(True)
    now = timezone.now()
    asked = load.phase_started_at or now
    waited = (now - asked).total_seconds()
    where = f"v{load.version.version} on {load.server.name}"
    try:
        router = router_for(cluster)
    except ValueError as exc:  # its settings are unusable: the grace below (the cluster's
        # settings stay in the operators' log, not in the tenant's timeline)
        log.warning("load %s: no router to drain through: %s", load.pk, exc)
        router = None
    draining = getattr(router, "draining", None)
    in_flight = draining() if draining is not None else None
    if in_flight is None:
        changed = route.applied_at or route.updated_at
        since = (now - changed).total_seconds() if changed else settings.SWITCHYARD_DRAIN_GRACE_S
        if since < settings.SWITCHYARD_DRAIN_GRACE_S:
            return Drain(False, f"draining {where}: the router cannot say what is in flight; "
                                f"{settings.SWITCHYARD_DRAIN_GRACE_S:g} s after the route's "
                                "change")
        return Drain(True, f"drained {where}: {since:.1f} s since its traffic moved (the router "
                           "cannot say what is in flight)")
    if in_flight == 0:
        return Drain(True, f"drained {where}: no request in flight to it ({waited:.1f} s after "
                           "the unload was asked)")
    if waited >= settings.SWITCHYARD_DRAIN_TIMEOUT_S:
        return Drain(True, f"drain timeout: {_workers(in_flight)} still finishing requests "
                           f"after {waited:.0f} s; unloading {where} all the same")
    return Drain(False, f"draining {where}: {_workers(in_flight)} from before the route's "
                        "change still finishing their requests")


def _workers(count: int) -> str:
    return f"{count} router worker{'' if count == 1 else 's'}"
