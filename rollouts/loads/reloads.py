"""Reloads: a version that is ready on a server sent its config again.

A server may run a ready version with another config than the one Switchyard loads it with
(changed by hand, by a benchmark's config override, by a server restarted from its
repository). :func:`reload_for` puts such loads back into ``loading`` with the version's own
config; the load reconciler's loading step then sends it (a no-op on a server already running
it: ``ServerRuntime.load`` compares first), reads the config back and records it. The
version keeps serving while Triton loads the new config beside it, and its placement keeps
holding the quota. A reload that fails leaves the version as it ran before, ready
(``rollouts.loads.reconciler``): a load is marked a reload by having been ready before
(``ready_at`` set while it is loading).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from console import logs
from console.celery import send_soon
from console.exceptions import Conflict
from fleet import audit
from fleet.models import InferenceServer
from rollouts.loads.requests import record_event
from rollouts.models import Deployment, ModelLoad, ModelVersion

State = ModelLoad.State


def is_reload(load: ModelLoad) -> bool:
    """A load of a version that was ready on the server, loading its config again."""
    return load.state == State.LOADING and load.ready_at is not None


def reload_for(
    actor: Any, deployment: Deployment, version: ModelVersion, servers: list[InferenceServer],
    *, label: str, why: str,
) -> list[ModelLoad]:
    """Send ``version``'s own config again to the ``servers`` of the deployment where it is
    ready, once the caller's right to it is settled (``actor`` None: the system). Returns
    the loads put back into loading. A load or unload of the model in flight on one of the
    servers is a Conflict; a server where the version is not ready is left out."""
    reloaded: list[ModelLoad] = []
    with transaction.atomic():
        locked = Deployment.objects.select_for_update().only("archived_at").get(pk=deployment.pk)
        if locked.archived_at:
            raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
        for server in sorted(servers, key=lambda s: s.name):
            # The server's row lock, as load and unload requests take it: one at a time.
            InferenceServer.objects.select_for_update().filter(pk=server.pk).first()
            busy = ModelLoad.objects.filter(
                server=server, version__model_id=version.model_id, state__in=ModelLoad.IN_FLIGHT
            ).select_related("version").first()
            if busy is not None:
                raise Conflict(
                    f"{busy.get_state_display().lower()} of {version.model.name} "
                    f"v{busy.version.version} is in flight on {server.name} (load {busy.pk}): "
                    "wait for it to finish", field="version")
            load = ModelLoad.objects.filter(
                deployment=deployment, server=server, version=version, state=State.READY
            ).first()
            if load is None:
                continue
            before = {"config_hash": load.config_hash,
                      "config_override": load.config_override is not None}
            ModelLoad.objects.filter(pk=load.pk, state=State.READY).update(
                state=State.LOADING, config_override=None, phase_started_at=timezone.now(),
                attempts=0, next_attempt_at=None, error="", updated_at=timezone.now(),
                request_id=logs.REQUEST_ID.get() or load.request_id,
            )
            load.refresh_from_db()
            record_event(load, f"reload of v{version.version} on {server.name} with its own config "
                               f"requested by {label}: {why}")
            audit.record(actor, "requested_reload", load, tenant=deployment.tenant, before=before,
                         after={"version": version.version, "server": server.name}, reason=why)
            send_soon("rollouts.tasks.advance_load", load.pk)
            reloaded.append(load)
    return reloaded
