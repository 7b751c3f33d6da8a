"""The scrape tick: every server that carries a deployment, scraped once a tick, its rates
turned into one point per (deployment, version) in the live window and the minute rollups.

**Shards.** The fleet is split into ``SWITCHYARD_SHARDS`` shards (:func:`shards`). A
deployment's point adds up all of its servers, and a server may carry several deployments, so
a shard is made of whole groups of deployments and the servers they share (the connected
groups of the deployment-server graph), each group in shard ``its lowest server id mod
shards``: no server is in two shards, and a shard has every server its deployments need. Beat
sends one task a tick (``rollouts.tasks.scrape_latency``) that sends one task per shard, which
any worker takes; a shard is scraped under a lease in Redis (:func:`run`), so two workers never
scrape it in one tick, and a worker that dies holding it leaves a lease that runs out within
two ticks, when the next tick's task, on another worker, takes the shard.

**What a tick costs.** Every server of a shard is scraped at once on the process's event loop
of keep-alive connections (``fleet.adapters.metrics.fetcher``), each with a hard timeout, and
the whole scrape has a deadline, so a hung server costs one timeout and delays nobody else
(:func:`scrape_all`). Rates come from the difference with the server's previous
scrape's counters, kept in Redis as compact JSON (any worker can take the next tick) and in
the memory of the process that took it. The
database is read twice a shard tick (its deployments, their servers, as values) and written once per
flush: points and rollups are written in batches, as soon as the results pause for
``FLUSH_IDLE_S`` or every ``FLUSH_EVERY_S`` (and at the end), so a deployment whose servers
have all answered is written within a fraction of a second whatever the others do, and the
statements a tick runs do not grow with the fleet (rollups are one ``INSERT ... ON CONFLICT``
per flush). Redis is read once for the previous scrapes and which deployments the router
counts, and written once per flush, pipelined.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings

from console import telemetry
from fleet.adapters.metrics import fetcher, parsing, rates
from fleet.adapters.metrics.values import Counters, SeriesKey, dump_series, load_series
from fleet.inventory import loadstats, shard_leases
from fleet.models import InferenceServer
from rollouts.models import Deployment, LatencyRollup
from rollouts.models.registry import name_on
from rollouts.slo import counters as slo_counters
from rollouts.traffic import live_window

log = logging.getLogger(__name__)

# Beyond the scrape timeout, what a tick waits for its scrape threads to start and finish.
TICK_GRACE_S = 0.2
FLUSH_IDLE_S = 0.05  # results paused this long: write what is complete
FLUSH_EVERY_S = 0.25  # and at least this often while they keep coming
ROLLUP_FIELDS = ("requests", "failures", "slow", "rps", "error_rate", "avg_ms", "p50_ms",
                 "p95_ms", "p99_ms", "ttft_p50_ms", "itl_p50_ms", "last_sample_at")


@dataclass(frozen=True)
class Scraped:
    server: Any  # a Target (a server's row does as well)
    taken_at: float
    text: str | None
    error: str = ""


def kind_of(server: Any) -> str:
    return "vllm" if server.runtime == InferenceServer.Runtime.VLLM else "triton"


def _label(kind: str, version: str, model: str) -> str:
    return f"v{version}" if kind == "triton" and version else model


# --------------------------------------------------------------------------------------------
# Shards
# --------------------------------------------------------------------------------------------


def shards(count: int | None = None) -> dict[int, list[int]]:
    """The ids of the deployments to scrape, by shard (only shards with any): each connected
    group of deployments and the servers they share goes to shard ``lowest server id mod
    count`` (count: ``SWITCHYARD_SHARDS``). One statement."""
    count = count or settings.SWITCHYARD_SHARDS
    pairs = list(Deployment.servers.through.objects.filter(
        deployment__archived_at__isnull=True).values_list("deployment_id", "inferenceserver_id"))
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def root(node: tuple[str, int]) -> tuple[str, int]:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for deployment, server in pairs:
        a, b = root(("d", deployment)), root(("s", server))
        if a != b:
            parent[a] = b
    lowest: dict[tuple[str, int], int] = {}
    for _deployment, server in pairs:
        group = root(("s", server))
        lowest[group] = min(lowest.get(group, server), server)
    found: dict[int, set[int]] = defaultdict(set)
    for deployment, server in pairs:
        found[lowest[root(("s", server))] % count].add(deployment)
    return {index: sorted(ids) for index, ids in sorted(found.items())}


def lease_s(sent_at: float | None = None) -> float:
    """How long a shard's lease lasts, taken now for a tick sent at ``sent_at``: past the
    tick's own deadline, and short enough that a lease left by a dead worker has run out by
    the second tick after (``fleet.inventory.shard_leases.seconds``)."""
    return shard_leases.seconds(settings.SWITCHYARD_SCRAPE_INTERVAL_S,
                                settings.SWITCHYARD_SCRAPE_TIMEOUT_S + TICK_GRACE_S + 0.3,
                                sent_at)


def _lease_key(index: int) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:latency:shard:{index}"


def tick(timeout: float | None = None) -> dict[str, int]:
    """One scrape of every shard, in this process, in one pass (tests and benchmarks; beat's
    ticks send a task per shard instead). Returns counts for logging."""
    return run(shards(), timeout)


def run(plan: dict[int, list[int]], timeout: float | None = None,
        sent_at: float | None = None) -> dict[str, int]:
    """Scrape the deployments of the shards in ``plan`` (index -> deployment ids) once, each
    shard under its lease (:func:`lease_s`; ``sent_at``: when beat's tick sent it): a shard
    whose lease another tick holds is skipped (``skipped``)."""
    timeout = timeout or settings.SWITCHYARD_SCRAPE_TIMEOUT_S
    if not plan:
        return {"servers": 0, "points": 0}
    store = live_window.connect()
    leases, skipped, ids = [], 0, []
    try:
        for index, members in plan.items():
            lease = store.lock(_lease_key(index), timeout=lease_s(sent_at), blocking=False)
            if lease.acquire(token=shard_leases.token()):
                leases.append(lease)
                ids += members
            else:
                skipped += 1
        result = _tick(store, ids, timeout) if ids else {"servers": 0, "points": 0}
    finally:
        for lease in leases:
            with contextlib.suppress(redis.exceptions.LockError):
                lease.release()
    return {**result, "skipped": skipped} if skipped else result


# --------------------------------------------------------------------------------------------
# Scraping
# --------------------------------------------------------------------------------------------


def scrape_all(servers: list[Any], timeout: float) -> Iterator[Scraped | None]:
    """Scrape every server at once (``fleet.adapters.metrics.fetcher``); yield each result as
    it comes, and None whenever none came for FLUSH_IDLE_S (the caller's moment to write what
    is complete).

    The whole scrape has a hard deadline of ``timeout`` plus a little grace: a server that
    has not answered by then is yielded as failed and abandoned, so it holds up neither the
    other servers' results nor the tick's end.
    """
    deadline = time.monotonic() + timeout + TICK_GRACE_S
    results = fetcher.fetcher().fetch(((s, metrics_url(s)) for s in servers), timeout)
    pending = {s.pk: s for s in servers}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            got = results.get(timeout=min(FLUSH_IDLE_S, left))
        except queue.Empty:
            yield None
            continue
        if pending.pop(got.target.pk, None) is not None:
            yield Scraped(got.target, got.taken_at, got.text, got.error)
    while pending:  # what came in time but was not read yet (this thread was busy with it)
        try:
            got = results.get_nowait()
        except queue.Empty:
            break
        if pending.pop(got.target.pk, None) is not None:
            yield Scraped(got.target, got.taken_at, got.text, got.error)
    for server in pending.values():
        yield Scraped(server, time.time(), None,
                      f"no answer within the tick's deadline of {timeout + TICK_GRACE_S:.1f} s; "
                      "abandoned")


def metrics_url(server: Any) -> str:
    return server.metrics_url or f"{server.http_url.rstrip('/')}/metrics"


KEEP_EVERY_S = 10.0
_kept: dict[str, float] = {}  # per process: when each series was last trimmed and kept alive
# Per process: each server's last page as parsed here, by the time it was taken, so a worker
# that scrapes a server again diffs against it without parsing the previous page again.
_parsed: dict[int, tuple[float, dict[SeriesKey, Counters]]] = {}


def windows(scraped: Scraped, prev_raw: bytes | None, pipe: Any) -> dict[tuple[str, str], Any]:
    """(model, version) → Window against the server's previous scrape (``prev_raw``, as read
    from Redis); this scrape is queued on ``pipe`` as the next one's previous."""
    pk = scraped.server.pk
    kind = kind_of(scraped.server)
    current = parsing.parse(kind, scraped.text or "")
    # Kept as "<time taken>\nC<counters as compact JSON>": a kB where the page is tens of kB.
    pipe.set(live_window.prev_key(pk), f"{scraped.taken_at!r}\nC{dump_series(current)}",
             ex=live_window.WINDOW_S)
    cached = _parsed.get(pk)
    _parsed[pk] = (scraped.taken_at, current)
    if prev_raw is None:
        return {}
    then, before_of = previous(prev_raw, kind)
    seconds = scraped.taken_at - then
    if seconds <= 0:
        return {}
    before = cached[1] if cached is not None and cached[0] == then else before_of()
    return {key: rates.window(before.get(key), counters, seconds) for key, counters in current.items()}


def previous(raw: bytes, kind: str) -> tuple[float, Callable[[], dict[SeriesKey, Counters]]]:
    """When a stored scrape was taken, and a function giving its counters (read only when
    asked). Reads what earlier versions stored too: the page's text, or JSON {"t", "text"}."""
    if raw.startswith(b"{"):
        data = json.loads(raw)
        return float(data["t"]), lambda: parsing.parse(kind, data["text"] or "")
    head, _, body = raw.partition(b"\n")
    if body.startswith(b"C"):
        return float(head), lambda: load_series(body[1:])
    return float(head), lambda: parsing.parse(kind, body.decode("utf-8", errors="replace"))


# --------------------------------------------------------------------------------------------
# One tick
# --------------------------------------------------------------------------------------------


@dataclass
class _Batch:
    """What a tick has complete and not yet written: deployments whose servers all answered
    (or failed), with the time their data was read."""

    ready: list[tuple[Served, float]] = field(default_factory=list)
    flushed_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Target:
    """A server as the tick reads it (values, not a row: a thousand rows cost the tick more
    than their pages' parsing)."""

    pk: int
    name: str
    cluster: str
    runtime: str
    source: str
    http_url: str
    metrics_url: str


@dataclass(frozen=True)
class Served:
    """A deployment as the tick writes its points: its model, its latency SLO, its servers."""

    pk: int
    slo_p99_ms: float
    model: str
    tenant: str
    servers: tuple[Target, ...]

    def name_on(self, server: Target) -> str:
        return name_on(self.tenant, self.model, server.runtime, server.source)


def served(ids: Iterable[int]) -> list[Served]:
    """The deployments ``ids`` (not archived) with their servers: two statements."""
    rows = list(Deployment.objects.filter(pk__in=list(ids), archived_at__isnull=True)
                .values_list("pk", "slo_p99_ms", "model__name", "model__tenant__slug"))
    links: dict[int, list[Target]] = defaultdict(list)
    for deployment, *server in Deployment.servers.through.objects.filter(
            deployment_id__in=[row[0] for row in rows]).order_by("inferenceserver_id").values_list(
            "deployment_id", "inferenceserver_id", "inferenceserver__name",
            "inferenceserver__cluster__name", "inferenceserver__runtime",
            "inferenceserver__source", "inferenceserver__http_url",
            "inferenceserver__metrics_url"):
        links[deployment].append(Target(*server))
    return [Served(pk, slo, model, tenant, tuple(links[pk])) for pk, slo, model, tenant in rows]


def _tick(store: redis.Redis, ids: list[int], timeout: float) -> dict[str, int]:
    deployments = served(ids)
    servers = {s.pk: s for d in deployments for s in d.servers}
    if not servers:
        return {"servers": 0, "points": 0}
    order = list(servers)
    prevs = dict(zip(order, store.mget([live_window.prev_key(pk) for pk in order]), strict=True))
    routed = slo_counters.routed_now(store, [d.pk for d in deployments])
    waiting = {d.pk: {s.pk for s in d.servers} for d in deployments}
    of_server: dict[int, list[Served]] = defaultdict(list)
    for deployment in deployments:
        for server in deployment.servers:
            of_server[server.pk].append(deployment)
    found: dict[int, dict[tuple[str, str], Any]] = {}
    taken: dict[int, float] = {}
    pipe = store.pipeline(transaction=False)
    batch = _Batch()
    counts: Counter[str] = Counter(servers=len(servers), points=0, failed=0)
    for scraped in scrape_all(list(servers.values()), timeout):
        if scraped is not None:
            pk = scraped.server.pk
            if scraped.text is None:
                # The previous scrape stays: the next success spans the gap at the right rate.
                log.debug("metrics of %s/%s: %s", scraped.server.cluster, scraped.server.name,
                          scraped.error)
                counts["failed"] += 1
                telemetry.count(telemetry.SCRAPE_FAILURES, {
                    "server": scraped.server.name, "cluster": scraped.server.cluster})
            else:
                found[pk] = windows(scraped, prevs.get(pk), pipe)
                taken[pk] = scraped.taken_at
                loadstats.record(pk, scraped.taken_at, sum(w.rps for w in found[pk].values()), pipe)
            for deployment in of_server[pk]:
                waiting[deployment.pk].discard(pk)
                if not waiting[deployment.pk]:
                    batch.ready.append((deployment, max(
                        (taken[s.pk] for s in deployment.servers if s.pk in taken),
                        default=0.0)))
        if scraped is None or time.monotonic() - batch.flushed_at >= FLUSH_EVERY_S:
            counts["points"] += _flush(store, pipe, batch, found, routed)
    counts["points"] += _flush(store, pipe, batch, found, routed)
    return dict(counts)


def _flush(store: redis.Redis, pipe: Any, batch: _Batch,
           found: dict[int, dict[tuple[str, str], Any]], routed: set[int]) -> int:
    batch.flushed_at = time.monotonic()
    ready, batch.ready = batch.ready, []
    return write(store, ready, found, routed, pipe)


def write(store: redis.Redis, ready: list[tuple[Served, float]],
          found: dict[int, dict[tuple[str, str], Any]], routed: set[int] | None = None,
          pipe: Any = None) -> int:
    """Write the points of the ``ready`` deployments (each with the time its data was read)
    from their servers' windows ``found`` (server id -> windows), with what ``pipe`` already
    holds, in one pipeline; then their minute rollups (one more pipeline to read the minute's
    points, one statement). ``routed``: the deployments whose traffic the router counts. The
    number of points written."""
    pipe = pipe if pipe is not None else store.pipeline(transaction=False)
    written = [(d, label, now) for d, now in ready
               for label in _queue_points(pipe, d, found, now, d.pk in (routed or set()))]
    pipe.execute()
    if written:
        write_rollups(store, written)
    return len(written)


def _queue_points(pipe: Any, deployment: Served, found: dict[int, dict[tuple[str, str], Any]],
                  now: float, routed: bool) -> list[str]:
    """Queue one point per label of the deployment from its servers' windows; the labels."""
    grouped: dict[str, list[Any]] = defaultdict(list)
    for server in deployment.servers:
        name = deployment.name_on(server)
        for (model, version), win in found.get(server.pk, {}).items():
            if model == name:
                grouped[_label(kind_of(server), version, model)].append(win)
    for label, parts in grouped.items():
        point = {"t": now, **combine(parts, deployment.slo_p99_ms)}
        if not routed:  # else the router's counts go to /metrics
            slo_counters.add(pipe, deployment.pk, requests=point["requests"],
                             failures=point["failures"], slow=point["slow"] or 0.0)
        key = live_window.series_key(deployment.pk, label)
        pipe.zadd(key, {json.dumps(point): now})
        pipe.sadd(live_window.labels_key(deployment.pk), label)
        if now - _kept.get(key, 0.0) >= KEEP_EVERY_S:
            # The window's trim and the keys' lifetimes, every few seconds rather than at
            # every point: the window holds at most KEEP_EVERY_S more than 15 minutes.
            _kept[key] = now
            pipe.zremrangebyscore(key, "-inf", now - live_window.WINDOW_S)
            pipe.expire(key, live_window.WINDOW_S)
            pipe.expire(live_window.labels_key(deployment.pk), live_window.WINDOW_S)
    return list(grouped)


def combine(parts: list[Any], slo_ms: float) -> dict[str, Any]:
    """One point from the windows of several servers of one deployment. ``slow``: the
    answered requests slower than ``slo_ms`` (the deployment's latency SLO), each server's
    share of them read off its latency distribution (None where no server has one)."""
    requests = sum(w.requests for w in parts)
    failures = sum(w.failures for w in parts)
    shares = [(rates.share_over(w.latency_cdf, slo_ms), max(w.requests - w.failures, 0.0)) for w in parts]
    slow = sum(share * answered for share, answered in shares if share is not None) \
        if any(share is not None for share, _ in shares) else None

    def weighted(name: str) -> float | None:
        pairs = [(getattr(w, name), w.requests) for w in parts if getattr(w, name) is not None]
        if not pairs:
            return None
        total = sum(n for _, n in pairs)
        if total == 0:
            return max(v for v, _ in pairs)
        return sum(v * n for v, n in pairs) / total

    def worst(name: str) -> float | None:
        values = [getattr(w, name) for w in parts if getattr(w, name) is not None]
        return max(values) if values else None

    return {
        "seconds": max(w.seconds for w in parts),
        "requests": requests,
        "failures": failures,
        "slow": slow,
        "rps": sum(w.rps for w in parts),
        "error_rate": 100.0 * failures / requests if requests else 0.0,
        "avg_ms": weighted("avg_ms"),
        "p50_ms": weighted("p50_ms"),
        "p95_ms": worst("p95_ms"),
        "p99_ms": worst("p99_ms"),
        "ttft_p50_ms": weighted("ttft_p50_ms"),
        "ttft_p99_ms": worst("ttft_p99_ms"),
        "itl_p50_ms": weighted("itl_p50_ms"),
        "queue_ms": weighted("queue_ms"),
    }


def write_rollups(store: redis.Redis, series: list[tuple[Served, str, float]]) -> None:
    """Upsert the current minute of each (deployment, label) series dated ``now`` from its
    points at full resolution: one pipelined read, one statement."""
    reads = store.pipeline(transaction=False)
    starts = []
    for deployment, label, now in series:
        start = now - now % 60
        starts.append(start)
        reads.zrangebyscore(live_window.series_key(deployment.pk, label), start, "+inf")
    rows = []
    for (deployment, label, _now), start, raw in zip(series, starts, reads.execute(), strict=True):
        minute = rollup(deployment, label, start, [json.loads(item) for item in raw])
        if minute is not None:
            rows.append(minute)
    if rows:
        LatencyRollup.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["deployment", "label", "minute"],
            update_fields=list(ROLLUP_FIELDS))


def rollup(deployment: Served, label: str, start: float,
           points: list[dict[str, Any]]) -> LatencyRollup | None:
    """The minute starting at ``start`` of one series, from its points."""
    if not points:
        return None
    requests = sum(p["requests"] for p in points)
    failures = sum(p["failures"] for p in points)
    slow = sum(p.get("slow") or 0.0 for p in points)
    # The seconds the points cover, not the minute's: scraping may have started mid-minute.
    span = max(sum(p.get("seconds", 0.0) for p in points), 1.0)

    def mean(name: str) -> float | None:
        pairs = [(p[name], p["requests"]) for p in points if p.get(name) is not None]
        total = sum(n for _, n in pairs)
        return sum(v * n for v, n in pairs) / total if total else None

    def worst(name: str) -> float | None:
        values = [p[name] for p in points if p.get(name) is not None]
        return max(values) if values else None

    return LatencyRollup(
        deployment_id=deployment.pk, label=label, minute=datetime.fromtimestamp(start, tz=UTC),
        requests=round(requests), failures=round(failures), slow=round(slow),
        rps=requests / span, error_rate=100.0 * failures / requests if requests else 0.0,
        avg_ms=mean("avg_ms"), p50_ms=mean("p50_ms"), p95_ms=worst("p95_ms"),
        p99_ms=worst("p99_ms"), ttft_p50_ms=mean("ttft_p50_ms"), itl_p50_ms=mean("itl_p50_ms"),
        last_sample_at=datetime.fromtimestamp(max(p["t"] for p in points), tz=UTC),
    )
