"""Truth drift: what the database says a server serves, held against what the server says.

The health probe (``fleet/inventory/health.py``) records each server's model index in
``InferenceServer.reported_models`` every few seconds: Triton's repository index, vLLM's
``/v1/models``. A server restarted, or changed by hand, no longer serves what Switchyard
loaded onto it. :func:`reconcile_server` compares the loads recorded ``ready`` on a server
with its last index and marks each version the server no longer reports as ready ``lost``:
its quota is released, the load's timeline and the audit log say why, and a new load
request loads it again. :func:`check_configs` does the same for the config a Triton version
runs with (read from the server, at most every :data:`CONFIG_CHECK_EVERY_S` per server).
The reconcile tick (``rollouts.tasks.reconcile_loads``) sends one task per shard of the
servers (``SWITCHYARD_SHARDS``, the health probes' shards), which any worker takes:
:func:`reconcile_shard` reconciles that shard's servers under the shard's lease in Redis
(``<prefix>:drift:shard:<n>``, ``fleet.inventory.shard_leases``), so workers share a fleet's
servers and a worker that dies loses its shards by the second tick after.

An index is trusted only when the last probe read it (a healthy server whose every call
succeeded: an unreachable server's empty list means "unknown", not "empty"), and only for
loads that were ready before that probe started.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from fleet.adapters.base import READY, AdapterError
from fleet.adapters.vllm import adapter_name
from fleet.inventory import shard_leases
from fleet.inventory.health import shard_of
from fleet.inventory.runtimes import runtime_for
from fleet.models import InferenceServer
from rollouts.loads import reconciler
from rollouts.models import Deployment, ModelLoad, ModelVersion

log = logging.getLogger(__name__)
State = ModelLoad.State

# Clocks of the worker that stamped ``ready_at`` and of the prober may differ a little.
CLOCK_SKEW_S = 1.0
# Index states of a version on its way somewhere: judged once it gets there.
MOVING = ("LOADING", "UNLOADING")
CONFIG_CHECK_EVERY_S = 30.0
# A drift shard's lease never ends sooner: what reconciling a shard's servers may take (each
# config read is bounded by the adapter's own timeout).
SHARD_FLOOR_S = 10.0
_config_checked: dict[int, float] = {}  # server id -> time.monotonic() of its last config check


@dataclass(frozen=True)
class Drift:
    """A load recorded ready that the server does not report as ready."""

    load: ModelLoad
    reason: str


def index_known(server: InferenceServer) -> bool:
    """True when the server's last probe read its model index (healthy, every call answered)."""
    return (
        server.health == InferenceServer.Health.HEALTHY
        and not server.health_detail
        and server.last_checked_at is not None
    )


def index_read_after(server: InferenceServer) -> datetime:
    """When the last probe started: the index it read shows every version ready before then."""
    assert server.last_checked_at is not None
    return server.last_checked_at - timedelta(milliseconds=server.probe_latency_ms or 0.0)


def reported_state(server: InferenceServer, version: ModelVersion) -> str | None:
    """The version's state in the server's last index; None when the index does not list it.

    Triton lists every version with its state; vLLM lists what it serves: a base model under
    its name, a LoRA adapter under :func:`fleet.adapters.vllm.adapter_name`.
    """
    entries = [m for m in server.reported_models or [] if isinstance(m, dict)]
    model = version.name_on(server)
    if server.runtime == InferenceServer.Runtime.TRITON:
        for entry in entries:
            if entry.get("name") == model and str(entry.get("version", "")) == str(version.version):
                return str(entry.get("state", ""))
        return None
    name = adapter_name(model, version.version) if version.adapter_of else model
    return READY if any(entry.get("name") == name for entry in entries) else None


def gone_reason(server: InferenceServer, version: ModelVersion) -> str:
    """Why the server's index says the version is not served ("" when it is, or when it is
    on its way: LOADING, UNLOADING)."""
    state = reported_state(server, version)
    if state == READY or state in MOVING:
        return ""
    if state is None:
        return f"{server.name} no longer reports v{version.version} (restarted?)"
    entry = next(
        (m for m in server.reported_models if isinstance(m, dict) and m.get("name") == version.name_on(server)
         and str(m.get("version", "")) == str(version.version)),
        {},
    )
    why = f": {entry['reason']}" if entry.get("reason") else ""
    return f"{server.name} reports v{version.version} {state or 'not loaded'}{why} (restarted?)"


def drifted(server: InferenceServer, ready: list[ModelLoad]) -> list[Drift]:
    """The loads of ``ready`` (recorded ready on ``server``) that its last index contradicts.

    Empty when the index is unknown. A load that became ready after the probe started is not
    judged: the index may predate it.
    """
    if not index_known(server):
        return []
    cutoff = index_read_after(server) - timedelta(seconds=CLOCK_SKEW_S)
    found = []
    for load in ready:
        if load.state != State.READY or (load.ready_at or load.updated_at) > cutoff:
            continue
        reason = gone_reason(server, load.version)
        if reason:
            found.append(Drift(load, reason))
    return found


def _ready_loads(server: InferenceServer) -> list[ModelLoad]:
    return list(
        ModelLoad.objects.filter(server=server, state=State.READY).select_related(
            "version__model", "placement", "tenant", "server"
        )
    )


def _busy_models(server: InferenceServer) -> set[int]:
    """Models with a load or unload in flight on the server: that load settles them."""
    return set(
        ModelLoad.objects.filter(server=server, state__in=ModelLoad.IN_FLIGHT).values_list(
            "version__model_id", flat=True
        )
    )


def reconcile_server(server: InferenceServer) -> list[ModelLoad]:
    """Mark lost the ready loads on ``server`` that its last reported index contradicts.

    Runs under the server's row lock (the one load and unload requests take), so a request
    for the same server waits. Models with a load or unload in flight are left to it.
    Returns the loads marked lost.
    """
    lost = []
    with transaction.atomic():
        server = InferenceServer.objects.select_for_update().filter(pk=server.pk).first()
        if server is None or not index_known(server):
            return []
        busy = _busy_models(server)
        for drift in drifted(server, _ready_loads(server)):
            if drift.load.version.model_id in busy:
                continue
            if reconciler.mark_lost(drift.load, drift.reason):
                log.warning("load %s: %s", drift.load.pk, drift.reason)
                lost.append(drift.load)
    return lost


def check_configs(server: InferenceServer) -> list[ModelLoad]:
    """Compare the config each ready Triton version runs with against its recorded hash.

    A version reloaded outside Switchyard (by hand, or by a server restarted with its
    models loaded from the repository) runs another config than the one recorded: the load
    records the new hash (and quota, when the instance count changed) with a ``drifted``
    event and audit entry. Returns the loads whose config changed.
    """
    if server.runtime != InferenceServer.Runtime.TRITON or not index_known(server):
        return []
    changed = []
    for load in _ready_loads(server):
        if reported_state(server, load.version) != READY:
            continue
        started = timezone.now()
        try:
            runtime = runtime_for(server)
            served = runtime.served(load.version.name_on(server), load.version.version,
                                    settings.SWITCHYARD_PROBE_TIMEOUT_S)
        except AdapterError as exc:
            # Every tick while the server does not answer: its health check says so at INFO.
            log.debug("load %s: config not readable: %s", load.pk, exc)
            continue
        if served.config_hash == load.config_hash:
            continue
        with transaction.atomic():
            InferenceServer.objects.select_for_update().filter(pk=server.pk).first()
            # Switchyard itself changed it meanwhile (a load of the model, which records it).
            touched = ModelLoad.objects.filter(
                server=server, version__model=load.version.model, updated_at__gte=started
            ).exists()
            if touched or load.version.model_id in _busy_models(server):
                continue
            why = (f"{server.name} runs v{load.version.version} with another config than the "
                   "one it was loaded with (changed outside Switchyard, or restarted?)")
            if reconciler.refresh_served_config(load, served.config_hash, served.config, why, verb="drifted"):
                changed.append(load)
    return changed


def servers_shared() -> set[int]:
    """The servers of deployments of more than one server, whose configs must agree
    (``rollouts.deployments.consistency``)."""
    several = (Deployment.objects.filter(archived_at__isnull=True).annotate(n=Count("servers"))
               .filter(n__gt=1).values("pk"))
    return set(Deployment.servers.through.objects.filter(deployment_id__in=several)
               .values_list("inferenceserver_id", flat=True))


def reconcile_shard(index: int, count: int | None = None,
                    sent_at: float | None = None) -> dict[str, int]:
    """:func:`reconcile_all` over the servers of shard ``index`` of ``count`` (default
    ``SWITCHYARD_SHARDS``), under the shard's lease, lasting until 1.9 reconcile intervals
    after the tick that sent it (``sent_at``); ``{"skipped": 1}`` when another worker holds it."""
    count = count or settings.SWITCHYARD_SHARDS
    store = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    lease = store.lock(f"{settings.SWITCHYARD_REDIS_PREFIX}:drift:shard:{index}",
                       timeout=shard_leases.seconds(settings.SWITCHYARD_RECONCILE_INTERVAL_S,
                                                    SHARD_FLOOR_S, sent_at),
                       blocking=False)
    if not lease.acquire(token=shard_leases.token()):
        return {"skipped": 1}
    try:
        return reconcile_all(servers=shard_of(InferenceServer.objects.all(), index, count))
    finally:
        with contextlib.suppress(redis.exceptions.LockError):
            lease.release()


def reconcile_all(now: float | None = None,
                  servers: QuerySet[InferenceServer] | None = None) -> dict[str, int]:
    """Reconcile every server that has ready loads (of ``servers``, default all); configs at
    most every :data:`CONFIG_CHECK_EVERY_S` per server, and every health interval on a server
    of a deployment of several servers (so that a config changed on one of them shows as a
    disagreement within a health tick). A server whose reconciliation fails is logged and
    skipped. Returns counts of what changed."""
    now = time.monotonic() if now is None else now
    counts = {"lost": 0, "config": 0}
    shared = servers_shared()
    # A Kubernetes workload's server is watched through its Deployment's readiness by the
    # workload reconciler, which owns what runs there (and the quota its pods hold).
    servers = ((InferenceServer.objects.all() if servers is None else servers)
               .filter(model_loads__state=State.READY)
               .exclude(source=InferenceServer.Source.MANAGED).distinct())
    for server in servers:
        try:
            counts["lost"] += len(reconcile_server(server))
            every = settings.SWITCHYARD_HEALTH_INTERVAL_S if server.pk in shared else CONFIG_CHECK_EVERY_S
            if now - _config_checked.get(server.pk, float("-inf")) >= every:
                _config_checked[server.pk] = now
                counts["config"] += len(check_configs(server))
        except Exception:  # one server must not stop the others
            log.exception("reconciling %s failed", server)
    return counts


def drift_of(server: InferenceServer, ready: list[ModelLoad]) -> dict[int, str]:
    """Load id -> why, for display: the ready loads the server's last index contradicts."""
    return {d.load.pk: d.reason for d in drifted(server, ready)}


def recently_lost(server: InferenceServer, queryset: Any, hours: int = 24) -> list[ModelLoad]:
    """Loads of ``queryset`` lost from ``server`` in the last ``hours``, newest first."""
    since = timezone.now() - timedelta(hours=hours)
    return list(
        queryset.filter(server=server, state=State.LOST, finished_at__gte=since)
        .select_related("version__model")
        .order_by("-finished_at")[:10]
    )


def on_server(load: ModelLoad) -> str:
    """What the server's last check says of a ready load's version, in words, or why it
    says nothing: never checked, not healthy at its last check, checked before the load was
    ready."""
    server, version = load.server, load.version
    if server.last_checked_at is None:
        return f"not known yet: {server.name} has not been checked"
    if not index_known(server):
        detail = f" ({server.health_detail})" if server.health_detail else ""
        return (f"not known: {server.name} was {server.get_health_display().lower()} at its "
                f"last check{detail}, so its model list was not read")
    if (load.ready_at or load.updated_at) > index_read_after(server) - timedelta(
            seconds=CLOCK_SKEW_S):
        return f"not known yet: {server.name} was last checked before v{version.version} was ready"
    state = reported_state(server, version)
    if state is None:
        return f"{server.name} does not list v{version.version}"
    return f"{server.name} reports v{version.version} {state}"
