"""Live latency: scrape every deployment's servers, keep a rolling window, roll up minutes.

Each tick (Celery beat, every second or two) scrapes the metrics endpoint of every server
that carries a deployment, in parallel and each with a hard timeout, so a dead server delays
nobody. Rates come from the difference with the previous scrape of the same server (kept in
Redis as the raw text, so any worker can take the next tick), counter resets included. Points
go to a Redis sorted set per (deployment, version) kept for 15 minutes at full resolution, and
the current minute is upserted into ``LatencyRollup`` (kept 30 days) on every tick.

Where a deployment's traffic goes through its route, the router's per-request samples
(``rollouts.traffic.samples``) replace that estimate in :func:`series`: exact percentiles and every
4xx and 5xx, per variant, with the copies mirrored to a candidate shown apart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import redis
from django.conf import settings
from django.utils import timezone

from console import telemetry
from fleet.adapters.base import AdapterError
from fleet.adapters.metrics import parsing, rates, scraping
from fleet.inventory import loadstats
from fleet.models import InferenceServer
from rollouts.models import Deployment, LatencyRollup
from rollouts.slo import counters as slo_counters
from rollouts.traffic import samples

log = logging.getLogger(__name__)

WINDOW_S = 15 * 60
ROLLUP_KEEP = timedelta(days=30)
MAX_PARALLEL = 32
# Beyond the scrape timeout, what a tick waits for its scrape threads to start and finish.
TICK_GRACE_S = 0.2
FIELDS = (
    "rps", "error_rate", "p50_ms", "p95_ms", "p99_ms", "avg_ms", "ttft_p50_ms", "ttft_p99_ms",
    "itl_p50_ms",
)
ROUTER_POINTS = 300  # at most this many points per variant from router samples (1 s up to 5 min)
ROUTER_FIELDS = ("requests", "errors", "errors_4xx", "errors_5xx", "upstream_errors", "max_ms")


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def _series_key(deployment_id: int, label: str) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:latency:{deployment_id}:series:{label}"


def _labels_key(deployment_id: int) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:latency:{deployment_id}:labels"


def _prev_key(server_id: int) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:metrics:prev:{server_id}"


@dataclass(frozen=True)
class Scraped:
    server: InferenceServer
    taken_at: float
    text: str | None
    error: str = ""


def _scrape(server: InferenceServer, timeout: float, client: httpx.Client) -> Scraped:
    kind = "vllm" if server.runtime == InferenceServer.Runtime.VLLM else "triton"
    url = server.metrics_url or f"{server.http_url.rstrip('/')}/metrics"
    taken = time.time()
    try:
        return Scraped(server, taken, scraping.fetch_text(kind, url, timeout, client))
    except AdapterError as exc:
        return Scraped(server, taken, None, exc.message)


def _label(kind: str, version: str, model: str) -> str:
    return f"v{version}" if kind == "triton" and version else model


def _windows(scraped: Scraped, store: redis.Redis) -> dict[tuple[str, str], Any]:
    """(model, version) → Window against this server's previous scrape; stores this one."""
    kind = "vllm" if scraped.server.runtime == InferenceServer.Runtime.VLLM else "triton"
    current = parsing.parse(kind, scraped.text or "")
    raw = store.get(_prev_key(scraped.server.pk))
    store.set(_prev_key(scraped.server.pk), json.dumps({"t": scraped.taken_at, "text": scraped.text}),
              ex=WINDOW_S)
    if raw is None:
        return {}
    prev = json.loads(raw)
    seconds = scraped.taken_at - float(prev["t"])
    if seconds <= 0:
        return {}
    before = parsing.parse(kind, prev["text"] or "")
    return {key: rates.window(before.get(key), counters, seconds) for key, counters in current.items()}


def _combine(parts: list[Any], slo_ms: float) -> dict[str, Any]:
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


def tick(timeout: float | None = None) -> dict[str, int]:
    """One scrape of every server that carries a deployment. Returns counts for logging."""
    timeout = timeout or settings.SWITCHYARD_SCRAPE_TIMEOUT_S
    deployments = list(Deployment.objects.prefetch_related("servers__cluster").select_related("model__tenant"))
    servers = {s.pk: s for d in deployments for s in d.servers.all()}
    if not servers:
        return {"servers": 0, "points": 0}
    store = _redis()
    # One tick at a time: two overlapping ticks would diff against each other's baselines.
    lock = store.lock(f"{settings.SWITCHYARD_REDIS_PREFIX}:latency:tick", timeout=5, blocking=False)
    if not lock.acquire():
        return {"servers": len(servers), "points": 0, "skipped": 1}
    try:
        return _tick(store, deployments, servers, timeout)
    finally:
        with contextlib.suppress(redis.exceptions.LockError):
            lock.release()


def _scrape_all(servers: list[InferenceServer], timeout: float) -> Iterator[Scraped]:
    """Scrape every server in parallel; yield each result as it completes.

    The whole scrape has a hard deadline of ``timeout`` plus a little grace: a server that
    has not answered by then (hung, or its thread never got to run) is yielded as failed and
    abandoned, so it holds up neither the other servers' results nor the tick's end.
    """
    deadline = time.monotonic() + timeout + TICK_GRACE_S
    limits = httpx.Limits(max_connections=MAX_PARALLEL, max_keepalive_connections=MAX_PARALLEL)
    client = httpx.Client(limits=limits)
    pool = ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(servers)),
                              thread_name_prefix="latency-scrape")
    futures = {pool.submit(_scrape, server, timeout, client): server for server in servers}
    pending = set(futures)
    try:
        try:
            for future in as_completed(futures, timeout=max(deadline - time.monotonic(), 0.0)):
                pending.discard(future)
                yield future.result()
        except FuturesTimeout:
            for future in list(pending):
                pending.discard(future)
                if future.done():
                    yield future.result()
                else:
                    yield Scraped(futures[future], time.time(), None,
                                  f"no answer within the tick's deadline of "
                                  f"{timeout + TICK_GRACE_S:.1f} s; abandoned")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        _close_when_done(list(futures), client)


def _close_when_done(futures: list[Future[Scraped]], client: httpx.Client) -> None:
    """Close the tick's HTTP client once its last scrape thread has ended (each ends within
    its own timeout), without waiting for it here."""
    lock = threading.Lock()
    left = [len(futures)]

    def one_done(_: Future[Scraped]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            client.close()

    if not futures:
        client.close()
    for future in futures:
        future.add_done_callback(one_done)


def _tick(store: redis.Redis, deployments: list[Deployment], servers: dict[int, InferenceServer],
          timeout: float) -> dict[str, int]:
    # Each deployment's points are written as soon as all of its servers have answered (or
    # failed, or were abandoned at the deadline), whatever the other servers do.
    waiting = {d.pk: {s.pk for s in d.servers.all()} for d in deployments}
    of_server: dict[int, list[Deployment]] = defaultdict(list)
    for deployment in deployments:
        for server in deployment.servers.all():
            of_server[server.pk].append(deployment)
    windows: dict[int, dict[tuple[str, str], Any]] = {}
    taken: dict[int, float] = {}
    points = failed = 0
    for scraped in _scrape_all(list(servers.values()), timeout):
        pk = scraped.server.pk
        if scraped.text is None:
            # The previous scrape stays: the next success spans the gap at the right rate.
            # Every tick while it lasts: the server's health probe logs its change of state.
            log.debug("metrics of %s: %s", scraped.server, scraped.error)
            failed += 1
            telemetry.count(telemetry.SCRAPE_FAILURES, {"server": scraped.server.name,
                                              "cluster": scraped.server.cluster.name})
        else:
            windows[pk] = _windows(scraped, store)
            taken[pk] = scraped.taken_at
            load = sum(w.rps for w in windows[pk].values())
            loadstats.record(pk, scraped.taken_at, load, store)
        for deployment in of_server[pk]:
            waiting[deployment.pk].discard(pk)
            if not waiting[deployment.pk]:
                points += _write_points(store, deployment, windows, taken)
    return {"servers": len(servers), "points": points, "failed": failed}


def _write_points(store: redis.Redis, deployment: Deployment,
                  windows: dict[int, dict[tuple[str, str], Any]], taken: dict[int, float]) -> int:
    """One point per label of the deployment from its servers' windows, and their rollups."""
    grouped: dict[str, list[Any]] = defaultdict(list)
    for server in deployment.servers.all():
        kind = "vllm" if server.runtime == InferenceServer.Runtime.VLLM else "triton"
        name = deployment.model.name_on(server)
        for (model, version), win in windows.get(server.pk, {}).items():
            if model == name:
                grouped[_label(kind, version, model)].append(win)
    if not grouped:
        return 0
    # Stamped with when the data was read, not when the slowest scrape gave up.
    now = max(taken[s.pk] for s in deployment.servers.all() if s.pk in taken)
    routed = bool(slo_counters.routed_now(store, [deployment.pk]))  # then the router's counts go to /metrics
    pipe = store.pipeline()
    for label, parts in grouped.items():
        point = {"t": now, **_combine(parts, deployment.slo_p99_ms)}
        if not routed:
            slo_counters.add(pipe, deployment.pk, requests=point["requests"], failures=point["failures"],
                             slow=point["slow"] or 0.0)
        key = _series_key(deployment.pk, label)
        pipe.zadd(key, {json.dumps(point): now})
        pipe.zremrangebyscore(key, "-inf", now - WINDOW_S)
        pipe.expire(key, WINDOW_S)
        pipe.sadd(_labels_key(deployment.pk), label)
        pipe.expire(_labels_key(deployment.pk), WINDOW_S)
    pipe.execute()
    for label in grouped:
        _roll_up(store, deployment, label, now)
    return len(grouped)


def _points(store: redis.Redis, deployment_id: int, label: str, since: float) -> list[dict[str, Any]]:
    raw = store.zrangebyscore(_series_key(deployment_id, label), since, "+inf")
    return [json.loads(item) for item in raw]


def live_points(store: redis.Redis, deployment_id: int, since: float) -> dict[str, list[dict[str, Any]]]:
    """The scrapers' points since ``since`` in the live window, by label (version), in label
    order; a label with none is left out."""
    found: dict[str, list[dict[str, Any]]] = {}
    for label in sorted(raw.decode() for raw in store.smembers(_labels_key(deployment_id))):
        points = _points(store, deployment_id, label, since)
        if points:
            found[label] = points
    return found


def _roll_up(store: redis.Redis, deployment: Deployment, label: str, now: float) -> None:
    """Upsert the current minute of one series from its full-resolution points."""
    start = now - now % 60
    points = _points(store, deployment.pk, label, start)
    if not points:
        return
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

    LatencyRollup.objects.update_or_create(
        deployment=deployment, label=label,
        minute=datetime.fromtimestamp(start, tz=UTC),
        defaults={
            "requests": requests, "failures": failures, "slow": round(slow), "rps": requests / span,
            "error_rate": 100.0 * failures / requests if requests else 0.0,
            "avg_ms": mean("avg_ms"), "p50_ms": mean("p50_ms"), "p95_ms": worst("p95_ms"),
            "p99_ms": worst("p99_ms"), "ttft_p50_ms": mean("ttft_p50_ms"),
            "itl_p50_ms": mean("itl_p50_ms"),
            "last_sample_at": datetime.fromtimestamp(max(p["t"] for p in points), tz=UTC),
        },
    )


def prune(keep: timedelta = ROLLUP_KEEP) -> int:
    """Delete rollups older than ``keep`` (30 days)."""
    deleted, _ = LatencyRollup.objects.filter(minute__lt=timezone.now() - keep).delete()
    return deleted


ROLLUP_POINTS = 1440  # at most this many points per version from the minute rollups


def series(deployment: Deployment, window_s: int = WINDOW_S, since: float | None = None) -> dict[str, Any]:
    """The latency series of a deployment per version, newest last, in the charts' shape.

    Windows up to 15 minutes come from Redis at full resolution (``source`` "live"); longer
    ones, or when Redis has nothing (after a restart) or cannot be reached, from the minute
    rollups (``source`` "rollups"), merged into at most ``ROLLUP_POINTS`` points per version
    (7 days: one per 7 minutes). ``live_error`` says why the live window could not be read.
    Every point is dated by the scrape it comes from, so ``age_s`` grows once scraping stops.

    When the deployment's route sent samples in the window, they are used instead (``source``
    "router", see :func:`_router_series`).

    ``since`` (epoch seconds; a poller's newest point) asks only for what changed: the answer
    holds the points dated at or after its ``since``, which replace the caller's from then on
    (``since`` is moved back to the start of its slot where the newest slot is still filling:
    a router slice, a minute or a merged bucket of rollups). Versions with nothing new are left
    out; the caller keeps its points and drops those older than the window.
    """
    now = time.time()
    start = now - window_s
    versions: dict[str, dict[str, Any]] = {}
    live_error = None
    if window_s <= WINDOW_S:
        routed = _router_series(deployment, window_s, now)
        if routed is not None:
            return _since(routed, since, routed["step_s"])
        try:
            store = _redis()
            labels = sorted(label.decode() for label in store.smembers(_labels_key(deployment.pk)))
            for label in labels:
                points = _points(store, deployment.pk, label, start)
                if points:
                    versions[label] = {"label": label, "points": [_public(p) for p in points]}
        except redis.RedisError as exc:
            log.warning("latency series from Redis failed: %s", exc)
            live_error = f"the live window in Redis cannot be read: {exc}"
    source = "live" if versions else "rollups"
    step_s = 0
    if not versions:
        step_s = 60 * max(1, math.ceil(window_s / 60 / ROLLUP_POINTS))
        versions = _rollup_series(deployment, start, now, step_s)
    newest = max((v["points"][-1]["t"] for v in versions.values() if v["points"]), default=None)
    answer = {
        "deployment": deployment.pk,
        "slo_p99_ms": deployment.slo_p99_ms,
        "slo_error_rate": float(deployment.slo_error_rate),
        "window_s": window_s,
        "source": source,
        "live_error": live_error,
        "updated_at": datetime.fromtimestamp(newest, tz=UTC).isoformat() if newest else None,
        "age_s": round(now - newest, 2) if newest else None,
        "versions": dict(sorted(versions.items())),
    }
    return _since(answer, since, step_s)


def _since(answer: dict[str, Any], since: float | None, slot_s: int) -> dict[str, Any]:
    """``answer`` cut to what a poller whose newest point is dated ``since`` lacks: the points
    from the start of that point's slot on (scrapes are final: from the point itself)."""
    answer["since"] = None
    if since is None:
        return answer
    cut = since - since % slot_s if slot_s else since
    answer["since"] = cut
    for key in list(answer["versions"]):
        entry = answer["versions"][key]
        entry["points"] = [p for p in entry["points"] if p.get("slot", p["t"]) >= cut]
        if not entry["points"]:
            del answer["versions"][key]
    return answer


def _rollup_series(deployment: Deployment, start: float, now: float, step_s: int) -> dict[str, Any]:
    """Minute rollups in buckets of ``step_s`` seconds: requests summed (rate and error rate
    over the bucket), latencies request-weighted for the averages and the worst minute for
    p95 and p99. Each point is dated by its newest scrape and keeps its bucket's start as
    ``slot``."""
    rows = LatencyRollup.objects.filter(
        deployment=deployment, minute__gte=datetime.fromtimestamp(start - 60, tz=UTC)
    ).order_by("label", "minute")
    buckets: dict[tuple[str, float], list[LatencyRollup]] = {}
    for row in rows:
        # Dated by its newest scrape; rows written before that was recorded, by the end of
        # their minute (at most now).
        row.t = (row.last_sample_at.timestamp() if row.last_sample_at
                 else min(row.minute.timestamp() + 60, now))
        if row.t < start:
            continue
        slot = row.minute.timestamp() - row.minute.timestamp() % step_s
        buckets.setdefault((row.label, slot), []).append(row)
    versions: dict[str, Any] = {}
    for (label, slot), group in buckets.items():
        versions.setdefault(label, {"label": label, "points": []})["points"].append(
            {"t": max(r.t for r in group), "slot": slot, **_merged(group)})
    for entry in versions.values():  # a bucket cut by the window's start may be one too many
        entry["points"] = entry["points"][-ROLLUP_POINTS:]
    return versions


def _merged(rows: list[LatencyRollup]) -> dict[str, Any]:
    if len(rows) == 1:
        return {f: getattr(rows[0], f, None) for f in FIELDS}
    requests = sum(r.requests for r in rows)
    failures = sum(r.failures for r in rows)
    seconds = sum(r.requests / r.rps for r in rows if r.rps) or 60.0 * len(rows)

    def weighted(field: str) -> float | None:
        pairs = [(getattr(r, field, None), r.requests) for r in rows if getattr(r, field, None) is not None]
        total = sum(n for _, n in pairs)
        if not pairs:
            return None
        return sum(v * n for v, n in pairs) / total if total else sum(v for v, _ in pairs) / len(pairs)

    def worst(field: str) -> float | None:
        values = [getattr(r, field, None) for r in rows if getattr(r, field, None) is not None]
        return max(values) if values else None

    return {"rps": requests / seconds, "error_rate": 100.0 * failures / requests if requests else 0.0,
            "p50_ms": weighted("p50_ms"), "p95_ms": worst("p95_ms"), "p99_ms": worst("p99_ms"),
            "avg_ms": weighted("avg_ms"), "ttft_p50_ms": weighted("ttft_p50_ms"),
            "ttft_p99_ms": worst("ttft_p99_ms"), "itl_p50_ms": weighted("itl_p50_ms")}


def _public(point: dict[str, Any]) -> dict[str, Any]:
    return {"t": point["t"], **{f: point.get(f) for f in FIELDS}}


def _router_series(deployment: Deployment, window_s: int, now: float) -> dict[str, Any] | None:
    """The series from the route's per-request samples, or None when it has none.

    One entry per variant (its own requests, keyed by the variant's name) and one per variant
    that received mirrored copies (key ``<variant>:mirror``, labelled "... (mirror)"). Points
    cover slices of ``step_s`` seconds (1 s for windows up to 5 minutes), dated by their end,
    with exact p50/p95/p99 of the requests that ended in the slice, their rate, and the
    error rate counting every 4xx and 5xx and failed upstream (in percent). ``summary`` holds
    the same figures over the whole window (``rollouts.traffic.samples.summarize``).
    """
    step = max(1, math.ceil(window_s / ROUTER_POINTS))
    try:
        sliced = samples.buckets(deployment.pk, window_s, step, now=now)
    except redis.RedisError as exc:
        log.warning("router samples from Redis failed: %s", exc)
        return None
    if not sliced:
        return None
    versions: dict[str, dict[str, Any]] = {}
    for (variant, mirror), found in sorted(sliced.items()):
        versions[f"{variant}:mirror" if mirror else variant] = {
            "label": f"{variant} (mirror)" if mirror else variant,
            "variant": variant,
            "mirror": mirror,
            "points": [_router_point(p) for p in found["points"]],
            "summary": found["summary"],
        }
    newest = max(v["points"][-1]["t"] for v in versions.values())
    return {
        "deployment": deployment.pk,
        "slo_p99_ms": deployment.slo_p99_ms,
        "slo_error_rate": float(deployment.slo_error_rate),
        "window_s": window_s,
        "source": "router",
        "step_s": step,
        "live_error": None,
        "updated_at": datetime.fromtimestamp(newest, tz=UTC).isoformat(),
        "age_s": round(now - newest, 2),
        "versions": versions,
    }


def _router_point(point: dict[str, Any]) -> dict[str, Any]:
    figures = {**point, "requests": point["count"]}
    return {"t": point["t"], **{f: figures.get(f) for f in (*FIELDS, *ROUTER_FIELDS)}}
