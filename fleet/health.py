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
from fleet.models import InferenceServer

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
