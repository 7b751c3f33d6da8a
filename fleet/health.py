"""Inference server health: probe every server concurrently and record what each said.

A dead or slow server costs at most one probe timeout and never delays the others: probes
run in a thread pool, each with its own hard timeout, and the results are written as they
come back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from fleet.adapters import triton, vllm
from fleet.adapters.base import ServerProbe
from fleet.adapters.router import RouterHealth
from fleet.models import Cluster, InferenceServer
from fleet.routers import router_for

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


def check_all(timeout: float | None = None) -> dict[str, int]:
    """Probe every server in parallel; return how many ended in each health state."""
    timeout = timeout or settings.SWITCHYARD_PROBE_TIMEOUT_S
    servers = list(InferenceServer.objects.all())
    counts: dict[str, int] = {}
    if not servers:
        return counts
    workers = min(MAX_PARALLEL_PROBES, len(servers))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe") as pool:
        futures = {pool.submit(_probe, server, timeout): server for server in servers}
        for future in as_completed(futures):
            server = futures[future]
            try:
                probe = future.result()
            except Exception as exc:  # an adapter bug must not stop the other servers
                log.exception("probe of %s failed", server)
                probe = ServerProbe(False, False, "", [], f"probe failed: {exc}", 0.0)
            recorded = record_probe(server.pk, probe)
            if recorded is not None:
                counts[recorded.health] = counts.get(recorded.health, 0) + 1
    return counts


# --- Traffic routers ----------------------------------------------------------------------------


def _router_state(health: RouterHealth) -> str:
    if health.ok:
        return Cluster.RouterState.UP
    # Answered the status call (a count of connections) but some route is not in force.
    if health.active_connections is not None:
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

    Returns how many routers ended in each state. A router that cannot be asked (its adapter
    raised) is recorded down with the reason.
    """
    routers = []
    for cluster in Cluster.objects.exclude(kind=Cluster.Kind.KUBERNETES):
        router = router_for(cluster)
        if router is not None:
            routers.append((cluster, router))
    counts: dict[str, int] = {}
    if not routers:
        return counts
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PROBES, len(routers)),
                            thread_name_prefix="router-probe") as pool:
        futures = {pool.submit(router.health): cluster for cluster, router in routers}
        for future in as_completed(futures):
            cluster = futures[future]
            try:
                health = future.result()
            except Exception as exc:  # an adapter bug must not stop the other routers
                log.exception("router probe of cluster %s failed", cluster)
                health = RouterHealth(ok=False, message=f"probe failed: {exc}")
            recorded = record_router(cluster.pk, health)
            if recorded is not None:
                counts[recorded.router_state] = counts.get(recorded.router_state, 0) + 1
    return counts
