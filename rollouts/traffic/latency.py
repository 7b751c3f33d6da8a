"""Live latency: a rolling window of points per deployment and version, and minute rollups.

The scrape tick (``rollouts.traffic.scrape_tick``, beat every second, sharded over the
workers) scrapes the metrics endpoint of every server that carries a deployment. Rates come
from the difference with the previous scrape of the same server, counter resets included.
Points go to a Redis sorted set per (deployment, version) kept for 15 minutes at full
resolution (``rollouts.traffic.live_window``), and the current minute is upserted into
``LatencyRollup`` (kept 30 days). This module reads them back for the charts and the API.

Where a deployment's traffic goes through its route, the router's per-request samples
(``rollouts.traffic.samples``) replace that estimate in :func:`series`: exact percentiles and every
4xx and 5xx, per variant, with the copies mirrored to a candidate shown apart.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.utils import timezone

from rollouts.models import Deployment, LatencyRollup
from rollouts.traffic import live_window, samples
from rollouts.traffic.scrape_tick import TICK_GRACE_S, tick

__all__ = ["TICK_GRACE_S", "WINDOW_S", "live_points", "prune", "series", "tick"]

log = logging.getLogger(__name__)

WINDOW_S = live_window.WINDOW_S
ROLLUP_KEEP = timedelta(days=30)
FIELDS = (
    "rps", "error_rate", "p50_ms", "p95_ms", "p99_ms", "avg_ms", "ttft_p50_ms", "ttft_p99_ms",
    "itl_p50_ms",
)
ROUTER_POINTS = 300  # at most this many points per variant from router samples (1 s up to 5 min)
ROUTER_FIELDS = ("requests", "errors", "errors_4xx", "errors_5xx", "upstream_errors", "max_ms")


_redis = live_window.connect
_series_key = live_window.series_key
_labels_key = live_window.labels_key
_points = live_window.points


def live_points(store: redis.Redis, deployment_id: int, since: float) -> dict[str, list[dict[str, Any]]]:
    """The scrapers' points since ``since`` in the live window, by label (version), in label
    order; a label with none is left out."""
    found: dict[str, list[dict[str, Any]]] = {}
    for label in sorted(raw.decode() for raw in store.smembers(_labels_key(deployment_id))):
        points = _points(store, deployment_id, label, since)
        if points:
            found[label] = points
    return found


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
