"""Noisy neighbours on shared servers: what another deployment changed on a server just as a
deployment there went over or near its SLO, and keeping other tenants' loads off the servers
of production deployments that ask for it.

**Seen.** Each SLO tick, for every deployment that is breaching or at risk, the changes on
its servers by *other* deployments within ``WINDOW`` before it (loads and unloads starting,
benchmarks running) are recorded once each as ``SloDisturbance`` rows. Both deployments'
pages show them (:func:`for_page`); across tenants the change is "a change on this server"
and the deployment it touched "another deployment on this server": no name crosses a
tenant's border.

**Kept off.** A production deployment with ``guard_servers``, or any production deployment
of a tenant with ``guard_production_servers``, keeps other tenants' loads off its servers
(:func:`refuse_guarded`, called by the load path: a load, a rollout's or a benchmark's).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from console.exceptions import Conflict
from fleet.models import InferenceServer
from fleet.tenancy.scoping import tenant_roles
from rollouts.models import (
    BenchmarkJob,
    Deployment,
    ModelLoad,
    ModelLoadEvent,
    SloDisturbance,
    SloStatus,
)

WINDOW = timedelta(minutes=10)
TROUBLED = (SloStatus.State.BREACHING, SloStatus.State.AT_RISK)
STARTS = {ModelLoad.State.LOADING: SloDisturbance.Kind.LOAD, ModelLoad.State.UNLOADING: SloDisturbance.Kind.UNLOAD}


def refuse_guarded(server: InferenceServer, deployment: Deployment) -> None:
    """Conflict when ``server`` carries another tenant's production deployment that keeps
    other tenants' loads off its servers."""
    guard = (Deployment.objects.filter(servers=server, production=True, archived_at__isnull=True)
             .exclude(tenant_id=deployment.tenant_id)
             .filter(Q(guard_servers=True) | Q(tenant__guard_production_servers=True)).exists())
    if guard:
        raise Conflict(
            f"server {server.name} carries another tenant's production deployment, which keeps other "
            "tenants' loads off its servers: load onto another server of the deployment", field="servers")


@dataclass(frozen=True)
class Change:
    kind: str
    key: str
    label: str
    at: datetime
    cause: Deployment
    server: InferenceServer


def changes_near(deployment: Deployment, now: datetime) -> list[Change]:
    """Other deployments' loads and unloads that started on ``deployment``'s servers within
    ``WINDOW``, and their benchmarks that ran then."""
    servers = list(deployment.servers.all())
    since = now - WINDOW
    found = []
    events = (ModelLoadEvent.objects.filter(load__server__in=servers, state__in=STARTS, created_at__gte=since)
              .exclude(load__deployment=deployment)
              .select_related("load__deployment__model", "load__version", "load__server"))
    for event in events:
        load = event.load
        found.append(Change(STARTS[event.state], f"load:{load.pk}:{event.state}",
                            f"{STARTS[event.state]} of {load.deployment.model.name} v{load.version.version}",
                            event.created_at, load.deployment, load.server))
    jobs = (BenchmarkJob.objects.filter(server__in=servers, started_at__isnull=False, started_at__lte=now)
            .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
            .exclude(deployment=deployment).select_related("deployment__model", "version", "server"))
    for job in jobs:
        found.append(Change(SloDisturbance.Kind.BENCHMARK, f"benchmark:{job.pk}",
                            f"benchmark {job.pk} of {job.deployment.model.name} v{job.version.version}",
                            job.started_at, job.deployment, job.server))
    return found


def record(deployment: Deployment, state: str, reason: str, now: datetime) -> int:
    """Record the changes near a troubled ``deployment`` not recorded yet; returns how many."""
    if state not in TROUBLED:
        return 0
    known = set(SloDisturbance.objects.filter(affected=deployment).values_list("cause_key", flat=True))
    added = 0
    for change in changes_near(deployment, now):
        if change.key in known:
            continue
        try:
            with transaction.atomic():
                SloDisturbance.objects.create(
                    affected=deployment, cause=change.cause, server=change.server, kind=change.kind,
                    cause_key=change.key, cause_label=change.label[:200], changed_at=change.at,
                    detected_at=now, affected_state=state, affected_reason=reason[:300])
            added += 1
        except IntegrityError:
            continue  # another tick recorded it
    return added


def _may_see(user: Any, deployment: Deployment) -> bool:
    roles = tenant_roles(user)  # None: every tenant (a platform admin)
    return roles is None or deployment.tenant_id in roles


def for_page(user: Any, deployment: Deployment, limit: int = 10) -> dict[str, list[dict[str, Any]]]:
    """What the deployment page shows: the changes that coincided with this deployment going
    over its SLO (``seen_here``) and this deployment's changes that coincided with another's
    (``caused``), each named only to those who may see the other deployment."""
    seen_here = []
    for d in (SloDisturbance.objects.filter(affected=deployment)
              .select_related("cause__tenant", "server")[:limit]):
        named = _may_see(user, d.cause)
        seen_here.append({"at": d.changed_at, "detected_at": d.detected_at, "server": d.server.name,
                          "state": d.affected_state,
                          "what": f"{d.cause_label} (deployment {d.cause.name})" if named
                          else "a change on this server", "kind": d.kind if named else ""})
    caused = []
    for d in (SloDisturbance.objects.filter(cause=deployment)
              .select_related("affected__tenant", "server")[:limit]):
        named = _may_see(user, d.affected)
        caused.append({"at": d.changed_at, "detected_at": d.detected_at, "server": d.server.name,
                       "state": d.affected_state, "what": d.cause_label,
                       "whom": f"deployment {d.affected.name}" if named else "another deployment on this server",
                       "reason": d.affected_reason if named else ""})
    return {"seen_here": seen_here, "caused": caused}
