"""Inference server health: probe every server concurrently and record what each said.

A dead or slow server costs at most one probe timeout and never delays the others: probes
run in a thread pool, each with its own hard timeout, and the results are written as they
come back.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from fleet.adapters import triton, vllm
from fleet.adapters.base import ServerProbe
from fleet.adapters.routers.base import RouterHealth
from fleet.inventory.routers import router_for
from fleet.models import Cluster, InferenceServer

log = logging.getLogger(__name__)

PROBES: dict[str, Callable[[str, float], ServerProbe]] = {
    InferenceServer.Runtime.TRITON: triton.probe,
    InferenceServer.Runtime.VLLM: vllm.probe,
}
MAX_PARALLEL_PROBES = 16


def classify(probe: ServerProbe) -> str:
    if probe.ready:
        return InferenceServer.Health.HEALTHY
    if probe.live:
        return InferenceServer.Health.UNHEALTHY
    return InferenceServer.Health.UNREACHABLE


def record_probe(server_id: int, probe: ServerProbe) -> InferenceServer | None:
    """Write one probe's result. Returns None if the server was deleted meanwhile."""
    server = InferenceServer.objects.filter(pk=server_id).first()
    if server is None:
        return None
    now = timezone.now()
    new_health = classify(probe)
    changes: dict[str, object] = {
        "health": new_health,
        "health_detail": probe.error,
        "last_checked_at": now,
        "probe_latency_ms": probe.latency_ms,
    }
    if new_health != server.health:
        changes["health_changed_at"] = now
        log.info("server %s is now %s: %s", server, new_health, probe.error or "ready")
    if probe.live or probe.ready:
        changes.update(
            last_seen_at=now,
            consecutive_failures=0,
            server_version=probe.version or server.server_version,
            reported_models=[
                {"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
                for m in probe.models
            ],
        )
    else:
        # What an unreachable server had loaded is unknown now: show nothing rather than stale.
        changes.update(consecutive_failures=F("consecutive_failures") + 1, reported_models=[])
    # An UPDATE, not save(): a server deleted since the read above simply updates no row.
    if not InferenceServer.objects.filter(pk=server_id).update(**changes):
        return None
    server.refresh_from_db()
    return server


def _probe(server: InferenceServer, timeout: float) -> ServerProbe:
    return PROBES[server.runtime](server.http_url, timeout)


def check_server(server_id: int, timeout: float | None = None) -> InferenceServer | None:
    server = InferenceServer.objects.filter(pk=server_id).first()
    if server is None:
        return None
    return record_probe(server.pk, _probe(server, timeout or settings.SWITCHYARD_PROBE_TIMEOUT_S))


def _probe_all(
    targets: list[tuple[Any, Callable[[], Any]]],
    failed: Callable[[Exception], Any],
    record: Callable[[Any, Any], str | None],
) -> dict[str, int]:
    """Run each target's probe in a thread pool and record results as they come back; an
    adapter bug is recorded through ``failed`` and never stops the others. Counts the states
    ``record`` returns."""
    counts: dict[str, int] = {}
    if not targets:
        return counts
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PROBES, len(targets)),
                            thread_name_prefix="probe") as pool:
        futures = {pool.submit(probe): target for target, probe in targets}
        for future in as_completed(futures):
            target = futures[future]
            try:
                result = future.result()
            except Exception as exc:
                log.exception("probe of %s failed", target)
                result = failed(exc)
            state = record(target, result)
            if state is not None:
                counts[state] = counts.get(state, 0) + 1
    return counts


def check_all(timeout: float | None = None) -> dict[str, int]:
    """Probe every server in parallel; return how many ended in each health state."""
    timeout = timeout or settings.SWITCHYARD_PROBE_TIMEOUT_S

    def record(server: InferenceServer, probe: ServerProbe) -> str | None:
        recorded = record_probe(server.pk, probe)
        return recorded.health if recorded is not None else None

    return _probe_all(
        [(server, functools.partial(_probe, server, timeout))
         for server in InferenceServer.objects.all()],
        lambda exc: ServerProbe(False, False, "", [], f"probe failed: {exc}", 0.0),
        record,
    )


# --- Traffic routers ----------------------------------------------------------------------------


def _router_state(health: RouterHealth) -> str:
    if health.ok:
        return Cluster.RouterState.UP
    # Answered the status call (a count of connections), or serves some of its routes, but
    # some route is not in force.
    if health.active_connections is not None or any(health.routes.values()):
        return Cluster.RouterState.DEGRADED
    return Cluster.RouterState.DOWN


def record_router(cluster_id: int, health: RouterHealth) -> Cluster | None:
    """Write one router probe onto its cluster. None if the cluster was deleted meanwhile."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return None
    now = timezone.now()
    state = _router_state(health)
    changes: dict[str, object] = {
        "router_state": state,
        "router_detail": health.message[:500],
        "router_routes": len(health.routes),
        "router_connections": health.active_connections,
        "router_checked_at": now,
    }
    if state != cluster.router_state:
        changes["router_state_changed_at"] = now
        log.info("traffic router of cluster %s is now %s: %s", cluster, state, health.message)
    Cluster.objects.filter(pk=cluster_id).update(**changes)
    cluster.refresh_from_db()
    return cluster


def check_routers() -> dict[str, int]:
    """Ask every cluster's traffic router how it is, in parallel; record it on the cluster.

    Returns how many routers ended in each state. A router that cannot be built (a Kubernetes
    cluster's unusable settings) or asked (its adapter raised) is recorded down with the
    reason. Kubernetes clusters are asked through their API (``kube_router`` set).
    """
    targets: list[tuple[Cluster, Callable[[], RouterHealth]]] = []
    clusters = Cluster.objects.exclude(kind=Cluster.Kind.KUBERNETES, kube_router="")
    for cluster in clusters:
        try:
            router = router_for(cluster)
        except ValueError as exc:  # a Kubernetes cluster whose settings are unusable
            targets.append((cluster, functools.partial(RouterHealth, False, f"unusable: {exc}")))
            continue
        if router is not None:
            targets.append((cluster, router.health))

    def record(cluster: Cluster, health: RouterHealth) -> str | None:
        recorded = record_router(cluster.pk, health)
        return recorded.router_state if recorded is not None else None

    return _probe_all(
        targets, lambda exc: RouterHealth(ok=False, message=f"probe failed: {exc}"), record
    )
