"""Live latency: scrape every deployment's servers, keep a rolling window, roll up minutes.

Each tick (Celery beat, every second or two) scrapes the metrics endpoint of every server
that carries a deployment, in parallel and each with a hard timeout, so a dead server delays
nobody. Rates come from the difference with the previous scrape of the same server (kept in
Redis as the raw text, so any worker can take the next tick), counter resets included. Points
go to a Redis sorted set per (deployment, version) kept for 15 minutes at full resolution, and
the current minute is upserted into ``LatencyRollup`` (kept 30 days) on every tick.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import redis
from django.conf import settings
from django.utils import timezone

from fleet import loadstats
from fleet.adapters import metrics
from fleet.adapters.base import AdapterError
from fleet.models import InferenceServer
from rollouts.models import Deployment, LatencyRollup

log = logging.getLogger(__name__)

WINDOW_S = 15 * 60
ROLLUP_KEEP = timedelta(days=30)
MAX_PARALLEL = 32
FIELDS = (
    "rps", "error_rate", "p50_ms", "p95_ms", "p99_ms", "avg_ms", "ttft_p50_ms", "ttft_p99_ms",
    "itl_p50_ms",
)


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
        return Scraped(server, taken, metrics.fetch_text(kind, url, timeout, client))
    except AdapterError as exc:
        return Scraped(server, taken, None, exc.message)


def _label(kind: str, version: str, model: str) -> str:
    return f"v{version}" if kind == "triton" and version else model


def _windows(scraped: Scraped, store: redis.Redis) -> dict[tuple[str, str], Any]:
    """(model, version) → Window against this server's previous scrape; stores this one."""
    kind = "vllm" if scraped.server.runtime == InferenceServer.Runtime.VLLM else "triton"
    current = metrics.parse(kind, scraped.text or "")
    raw = store.get(_prev_key(scraped.server.pk))
    store.set(_prev_key(scraped.server.pk), json.dumps({"t": scraped.taken_at, "text": scraped.text}),
              ex=WINDOW_S)
    if raw is None:
        return {}
    prev = json.loads(raw)
    seconds = scraped.taken_at - float(prev["t"])
    if seconds <= 0:
        return {}
    before = metrics.parse(kind, prev["text"] or "")
    return {key: metrics.window(before.get(key), counters, seconds) for key, counters in current.items()}


def _combine(parts: list[Any]) -> dict[str, Any]:
    """One point from the windows of several servers of one deployment."""
    requests = sum(w.requests for w in parts)
    failures = sum(w.failures for w in parts)

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
        "rps": sum(w.rps for w in parts),
        "error_rate": 100.0 * failures / requests if requests else 0.0,
        "avg_ms": weighted("avg_ms"),
        "p50_ms": weighted("p50_ms"),
        "p95_ms": worst("p95_ms"),
        "p99_ms": worst("p99_ms"),
        "ttft_p50_ms": weighted("ttft_p50_ms"),
        "ttft_p99_ms": worst("ttft_p99_ms"),
        "itl_p50_ms": weighted("itl_p50_ms"),
    }


def tick(timeout: float | None = None) -> dict[str, int]:
    """One scrape of every server that carries a deployment. Returns counts for logging."""
    timeout = timeout or settings.SWITCHYARD_SCRAPE_TIMEOUT_S
    deployments = list(Deployment.objects.prefetch_related("servers").select_related("model"))
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


def _tick(store: redis.Redis, deployments: list[Deployment], servers: dict[int, InferenceServer],
          timeout: float) -> dict[str, int]:
    limits = httpx.Limits(max_connections=MAX_PARALLEL, max_keepalive_connections=MAX_PARALLEL)
    with httpx.Client(limits=limits) as client, ThreadPoolExecutor(
        max_workers=min(MAX_PARALLEL, len(servers))
    ) as pool:
        results = list(pool.map(lambda s: _scrape(s, timeout, client), servers.values()))
    windows: dict[int, dict[tuple[str, str], Any]] = {}
    for scraped in results:
        if scraped.text is None:
            # The previous scrape stays: the next success spans the gap at the right rate.
            log.info("metrics of %s: %s", scraped.server, scraped.error)
            continue
        windows[scraped.server.pk] = _windows(scraped, store)
        load = sum(w.rps for w in windows[scraped.server.pk].values())
        loadstats.record(scraped.server.pk, scraped.taken_at, load, store)
    # Points are stamped with when the data was read, not when the slowest scrape gave up.
    now = max((r.taken_at for r in results if r.text is not None), default=time.time())
    points = 0
    pipe = store.pipeline()
    rollups: list[tuple[Deployment, str, dict[str, Any]]] = []
    for deployment in deployments:
        grouped: dict[str, list[Any]] = defaultdict(list)
        for server in deployment.servers.all():
            kind = "vllm" if server.runtime == InferenceServer.Runtime.VLLM else "triton"
            for (model, version), win in windows.get(server.pk, {}).items():
                if model == deployment.model.name:
                    grouped[_label(kind, version, model)].append(win)
        for label, parts in grouped.items():
            point = {"t": now, **_combine(parts)}
            key = _series_key(deployment.pk, label)
            pipe.zadd(key, {json.dumps(point): now})
            pipe.zremrangebyscore(key, "-inf", now - WINDOW_S)
            pipe.expire(key, WINDOW_S)
            pipe.sadd(_labels_key(deployment.pk), label)
            pipe.expire(_labels_key(deployment.pk), WINDOW_S)
            rollups.append((deployment, label, point))
            points += 1
    pipe.execute()
    for deployment, label, _ in rollups:
        _roll_up(store, deployment, label, now)
    return {"servers": len(servers), "points": points, "failed": sum(r.text is None for r in results)}


def _points(store: redis.Redis, deployment_id: int, label: str, since: float) -> list[dict[str, Any]]:
    raw = store.zrangebyscore(_series_key(deployment_id, label), since, "+inf")
    return [json.loads(item) for item in raw]


def _roll_up(store: redis.Redis, deployment: Deployment, label: str, now: float) -> None:
    """Upsert the current minute of one series from its full-resolution points."""
    start = now - now % 60
    points = _points(store, deployment.pk, label, start)
    if not points:
        return
    requests = sum(p["requests"] for p in points)
    failures = sum(p["failures"] for p in points)
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
            "requests": requests, "failures": failures, "rps": requests / span,
            "error_rate": 100.0 * failures / requests if requests else 0.0,
            "avg_ms": mean("avg_ms"), "p50_ms": mean("p50_ms"), "p95_ms": worst("p95_ms"),
            "p99_ms": worst("p99_ms"), "ttft_p50_ms": mean("ttft_p50_ms"),
            "itl_p50_ms": mean("itl_p50_ms"),
        },
    )


def prune(keep: timedelta = ROLLUP_KEEP) -> int:
    """Delete rollups older than ``keep`` (30 days)."""
    deleted, _ = LatencyRollup.objects.filter(minute__lt=timezone.now() - keep).delete()
    return deleted


def series(deployment: Deployment, window_s: int = WINDOW_S) -> dict[str, Any]:
    """The latency series of a deployment per version, newest last, in the charts' shape.

    Windows up to 15 minutes come from Redis at full resolution; longer ones, or when Redis
    has nothing (after a restart), from the minute rollups.
    """
    now = time.time()
    since = now - window_s
    versions: dict[str, dict[str, Any]] = {}
    try:
        store = _redis()
        labels = sorted(label.decode() for label in store.smembers(_labels_key(deployment.pk)))
        if window_s <= WINDOW_S:
            for label in labels:
                points = _points(store, deployment.pk, label, since)
                if points:
                    versions[label] = {"label": label, "points": [_public(p) for p in points]}
    except redis.RedisError as exc:
        log.warning("latency series from Redis failed: %s", exc)
    if not versions:
        rows = LatencyRollup.objects.filter(
            deployment=deployment, minute__gte=datetime.fromtimestamp(since, tz=UTC)
        ).order_by("minute")
        for row in rows:
            versions.setdefault(row.label, {"label": row.label, "points": []})["points"].append(
                {"t": min(row.minute.timestamp() + 60, now),
                 **{f: getattr(row, f, None) for f in FIELDS}}
            )
    newest = max((v["points"][-1]["t"] for v in versions.values() if v["points"]), default=None)
    return {
        "deployment": deployment.pk,
        "slo_p99_ms": deployment.slo_p99_ms,
        "slo_error_rate": float(deployment.slo_error_rate),
        "window_s": window_s,
        "updated_at": datetime.fromtimestamp(newest, tz=UTC).isoformat() if newest else None,
        "age_s": round(now - newest, 2) if newest else None,
        "versions": dict(sorted(versions.items())),
    }


def _public(point: dict[str, Any]) -> dict[str, Any]:
    return {"t": point["t"], **{f: point.get(f) for f in FIELDS}}
