"""Inference server health: probe every server concurrently and record what each said.

A dead or slow server costs at most one probe timeout and never delays the others: probes
run in a thread pool, each with its own hard timeout, and the results are written in batches
as they come back (one read and one UPDATE a batch, whatever their number). Beat's round
sends one task per shard of the fleet (``SWITCHYARD_SHARDS``, servers by id), which any
worker takes under the shard's lease in Redis (:func:`check_shard`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.db.models import F, QuerySet
from django.utils import timezone

from fleet.adapters import triton, vllm
from fleet.adapters.base import ProbeSteps, ServerProbe
from fleet.adapters.metrics import fetcher
from fleet.adapters.routers.base import RouterHealth
from fleet.inventory import shard_leases
from fleet.inventory.routers import router_for
from fleet.models import Cluster, InferenceServer

log = logging.getLogger(__name__)

PROBES: dict[str, Callable[[str, float], ServerProbe]] = {
    InferenceServer.Runtime.TRITON: triton.probe,
    InferenceServer.Runtime.VLLM: vllm.probe,
}
#: The same probes as the requests they make, for a round on the event loop.
PROBE_STEPS: dict[str, Callable[[str, float], ProbeSteps]] = {
    InferenceServer.Runtime.TRITON: triton.probe_steps,
    InferenceServer.Runtime.VLLM: vllm.probe_steps,
}
MAX_PARALLEL_ROUTERS = 16
ROUND_GRACE_S = 0.5  # beyond the probe timeout, what a round waits for the event loop
FLUSH_IDLE_S = 0.05  # probes' results paused this long: write what came
FLUSH_EVERY_S = 0.25  # and at least this often while they keep coming


def classify(probe: ServerProbe) -> str:
    if probe.ready:
        return InferenceServer.Health.HEALTHY
    if probe.live:
        return InferenceServer.Health.UNHEALTHY
    return InferenceServer.Health.UNREACHABLE


#: What a probe writes on a server's row.
RECORDED = ("health", "health_detail", "last_checked_at", "probe_latency_ms", "health_changed_at",
            "last_seen_at", "consecutive_failures", "server_version", "reported_models")


def _apply(server: InferenceServer, probe: ServerProbe, now: Any) -> None:
    """Set on ``server`` (as read just now) what ``probe`` says."""
    new_health = classify(probe)
    if new_health != server.health:
        server.health_changed_at = now
        log.info("server %s is now %s: %s", server, new_health, probe.error or "ready")
    server.health, server.health_detail = new_health, probe.error
    server.last_checked_at, server.probe_latency_ms = now, probe.latency_ms
    if probe.live or probe.ready:
        server.last_seen_at, server.consecutive_failures = now, 0
        server.server_version = probe.version or server.server_version
        server.reported_models = [
            {"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
            for m in probe.models
        ]
    else:
        # What an unreachable server had loaded is unknown now: show nothing rather than stale.
        server.consecutive_failures += 1
        server.reported_models = []


def record_probes(results: list[tuple[int, ServerProbe]]) -> list[InferenceServer]:
    """Write probes' results: one read of the servers' rows as they are now, one UPDATE of
    all of them. A server deleted meanwhile is left out (and not in the list returned)."""
    if not results:
        return []
    rows = InferenceServer.objects.select_related("cluster").in_bulk([pk for pk, _ in results])
    now = timezone.now()
    written = []
    for pk, probe in results:
        if (server := rows.get(pk)) is not None:
            _apply(server, probe, now)
            written.append(server)
    if written and _update(written) < len(written):
        # Some row went between the read and the write (a server deleted): not recorded.
        left = set(InferenceServer.objects.filter(pk__in=[s.pk for s in written])
                   .values_list("pk", flat=True))
        written = [server for server in written if server.pk in left]
    return written


def _update(servers: list[InferenceServer]) -> int:
    """One UPDATE of the RECORDED fields sent for every server at once (executemany): Django's
    bulk_update builds a CASE per field and row, some 9 ms of CPU a server at a thousand. The
    values are prepared by the fields themselves, as save() prepares them. Rows updated."""
    meta = InferenceServer._meta
    fields = [meta.get_field(name) for name in RECORDED]
    quote = connection.ops.quote_name
    sql = (f"UPDATE {quote(meta.db_table)} SET "
           + ", ".join(f"{quote(f.column)} = %s" for f in fields)
           + f" WHERE {quote(meta.pk.column)} = %s")
    rows = [[f.get_db_prep_save(getattr(s, f.attname), connection) for f in fields] + [s.pk]
            for s in servers]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)
        return cursor.rowcount


def record_probe(server_id: int, probe: ServerProbe) -> InferenceServer | None:
    """Write one probe's result. Returns None if the server was deleted meanwhile."""
    written = record_probes([(server_id, probe)])
    return written[0] if written else None


def _probe(server: InferenceServer, timeout: float) -> ServerProbe:
    return PROBES[server.runtime](server.http_url, timeout)


def check_server(server_id: int, timeout: float | None = None) -> InferenceServer | None:
    server = InferenceServer.objects.filter(pk=server_id).first()
    if server is None:
        return None
    return record_probe(server.pk, _probe(server, timeout or settings.SWITCHYARD_PROBE_TIMEOUT_S))


def check_all(timeout: float | None = None) -> dict[str, int]:
    """Probe every server in parallel, in this process (tests and benchmarks; beat's rounds
    send a task per shard: :func:`check_shard`); how many ended in each health state."""
    return _check(list(InferenceServer.objects.all()), timeout)


def shard_of(servers: QuerySet[InferenceServer], index: int, count: int) -> QuerySet[InferenceServer]:
    """The servers of shard ``index`` of ``count``: those whose id is ``index`` mod ``count``."""
    return servers.alias(shard=F("pk") % count).filter(shard=index)


def check_shard(index: int, count: int | None = None, timeout: float | None = None,
                sent_at: float | None = None) -> dict[str, int]:
    """Probe the servers of one shard under its lease in Redis (``<prefix>:health:shard:<n>``,
    lasting until 1.9 health intervals after the round was sent at ``sent_at``, so one held
    by a worker that died has run out by the second round after: ``shard_leases.seconds``).
    A shard whose lease another worker holds is skipped (``{"skipped": 1}``)."""
    count = count or settings.SWITCHYARD_SHARDS
    store = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    lease = store.lock(f"{settings.SWITCHYARD_REDIS_PREFIX}:health:shard:{index}",
                       timeout=shard_leases.seconds(
                           settings.SWITCHYARD_HEALTH_INTERVAL_S,
                           (timeout or settings.SWITCHYARD_PROBE_TIMEOUT_S) + 1.0, sent_at),
                       blocking=False)
    if not lease.acquire(token=shard_leases.token()):
        return {"skipped": 1}
    try:
        return _check(list(shard_of(InferenceServer.objects.all(), index, count)), timeout)
    finally:
        with contextlib.suppress(redis.exceptions.LockError):
            lease.release()


def _check(servers: list[InferenceServer], timeout: float | None) -> dict[str, int]:
    """Probe ``servers`` at once on the process's event loop (``fleet.adapters.metrics.fetcher``:
    a hung server costs one timeout, never the round, and a probe about 1 ms of CPU where a
    blocking client in a thread took 3.5), writing results in batches as they come: when they
    pause for FLUSH_IDLE_S, at least every FLUSH_EVERY_S, and at the end."""
    timeout = timeout or settings.SWITCHYARD_PROBE_TIMEOUT_S
    counts: dict[str, int] = {}
    if not servers:
        return counts
    pending: list[tuple[int, ServerProbe]] = []
    flushed = time.monotonic()

    def flush() -> None:
        nonlocal flushed
        flushed = time.monotonic()
        for server in record_probes(pending):
            counts[server.health] = counts.get(server.health, 0) + 1
        pending.clear()

    known = [s for s in servers if s.runtime in PROBE_STEPS]
    pending += [(s.pk, ServerProbe(False, False, "", [], f"probe failed: no probe for runtime "
                                   f"{s.runtime!r}", 0.0))
                for s in servers if s.runtime not in PROBE_STEPS]
    results = fetcher.fetcher().probe(
        ((server, server.http_url, PROBE_STEPS[server.runtime]) for server in known), timeout)
    waiting = {server.pk: server for server in known}
    deadline = time.monotonic() + timeout + ROUND_GRACE_S
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            server, probe = results.get(timeout=min(FLUSH_IDLE_S, left))
        except queue.Empty:
            if pending:
                flush()
            continue
        if waiting.pop(server.pk, None) is not None:
            pending.append((server.pk, probe))
        if time.monotonic() - flushed >= FLUSH_EVERY_S:
            flush()
    while waiting:  # what came in time but was not read yet (this thread was busy writing)
        try:
            server, probe = results.get_nowait()
        except queue.Empty:
            break
        if waiting.pop(server.pk, None) is not None:
            pending.append((server.pk, probe))
    for server in waiting.values():  # the loop did not get to it in time
        pending.append((server.pk, ServerProbe(False, False, "", [],
                                               f"no answer within the round's deadline of "
                                               f"{timeout + ROUND_GRACE_S:.1f} s", 0.0)))
    flush()
    return counts


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
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_ROUTERS, len(targets)),
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
