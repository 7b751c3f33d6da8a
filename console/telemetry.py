"""Switchyard's own counters and histograms, shared by every process through Redis.

The web server's processes, the Celery workers and beat each count what they do (requests
by view, tasks by name, reconcile ticks, failed scrapes); ``/metrics`` (console.metrics) is
answered by any one web process, so the counts live where all of them can add to them and
read them: one Redis hash per metric. A field is one label set (and, for a histogram, one
bucket), so a scrape reads every metric with one ``HGETALL`` each.

Recording never fails the caller: a Redis that is away or slow costs at most
:data:`TIMEOUT_S` once, then recording is skipped for :data:`BACKOFF_S` (logged once per
outage), and the counts resume when it is back. Counters only ever grow, as Prometheus
expects; a Redis that lost its data reads as a counter reset, which ``rate()`` handles.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis
from django.conf import settings

log = logging.getLogger(__name__)

#: The metrics recorded here (names as Prometheus shows them).
HTTP_REQUESTS = "switchyard_http_requests_total"
HTTP_DURATION = "switchyard_http_request_duration_seconds"
TASKS = "switchyard_celery_tasks_total"
TASK_DURATION = "switchyard_celery_task_duration_seconds"
TICK_DURATION = "switchyard_reconcile_tick_duration_seconds"
SCRAPE_FAILURES = "switchyard_scrape_failures_total"
COUNTERS = (HTTP_REQUESTS, TASKS, SCRAPE_FAILURES)
HISTOGRAMS = (HTTP_DURATION, TASK_DURATION, TICK_DURATION)

TIMEOUT_S = 0.25
BACKOFF_S = 5.0

#: Upper bounds (seconds) of the duration buckets: from a fast API answer to a slow tick.
BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
_INF = "+Inf"
_SUM = "sum"
_COUNT = "count"

_lock = threading.Lock()
_clients: dict[str, redis.Redis] = {}
_skip_until = 0.0


def _key(name: str) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:telemetry:{name}"


def _labels_field(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":"))


def _connection() -> redis.Redis | None:
    """The process's client, or None while a recent failure says Redis is away."""
    if time.monotonic() < _skip_until:
        return None
    url = settings.REDIS_URL
    with _lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(
                url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
            )
        return _clients[url]


def _failed(exc: Exception) -> None:
    global _skip_until
    first = time.monotonic() >= _skip_until
    _skip_until = time.monotonic() + BACKOFF_S
    if first:
        log.warning("telemetry is not recorded for %.0f s: Redis is unreachable (%s)",
                    BACKOFF_S, exc)


def _bucket_of(seconds: float) -> str:
    for bound in BUCKETS:
        if seconds <= bound:
            return repr(bound)
    return _INF


def record(counts: Iterable[tuple[str, Mapping[str, str], int]] = (),
           durations: Iterable[tuple[str, Mapping[str, str], float]] = ()) -> None:
    """Add to counters (``(name, labels, n)``) and histograms (``(name, labels, seconds)``)
    in one round trip. Never raises."""
    client = _connection()
    if client is None:
        return
    try:
        pipe = client.pipeline(transaction=False)
        for name, labels, n in counts:
            pipe.hincrby(_key(name), _labels_field(labels), n)
        for name, labels, seconds in durations:
            field = _labels_field(labels)
            key = _key(name)
            pipe.hincrby(key, f"{field}|{_bucket_of(seconds)}", 1)
            pipe.hincrbyfloat(key, f"{field}|{_SUM}", max(seconds, 0.0))
            pipe.hincrby(key, f"{field}|{_COUNT}", 1)
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        _failed(exc)


def count(name: str, labels: Mapping[str, str], n: int = 1) -> None:
    """Add ``n`` to counter ``name`` for ``labels``. Never raises."""
    record(counts=[(name, labels, n)])


@dataclass
class Histogram:
    """One label set's histogram: cumulative bucket counts, ready for exposition."""

    labels: dict[str, str]
    buckets: list[tuple[str, float]]
    total: float
    count: float


def read_counter(name: str) -> list[tuple[dict[str, str], float]]:
    """Every label set of counter ``name`` and its count. Raises redis errors (the caller,
    /metrics, says the figures are missing rather than showing zeros)."""
    raw = _reader().hgetall(_key(name))
    return [(json.loads(field), float(value)) for field, value in sorted(raw.items())]


def read_histogram(name: str) -> list[Histogram]:
    """Every label set of histogram ``name``, its buckets made cumulative. Raises redis
    errors, as :func:`read_counter`."""
    raw = _reader().hgetall(_key(name))
    parts: dict[str, dict[str, float]] = {}
    for field, value in raw.items():
        labels, _, part = field.decode().rpartition("|")
        parts.setdefault(labels, {})[part] = float(value)
    found = []
    for labels, values in sorted(parts.items()):
        running = 0.0
        cumulative = []
        for bound in (*map(repr, BUCKETS), _INF):
            running += values.get(bound, 0.0)
            cumulative.append((bound, running))
        found.append(Histogram(json.loads(labels), cumulative, values.get(_SUM, 0.0),
                               values.get(_COUNT, running)))
    return found


def _reader() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def resume() -> None:
    """Record again at once, without waiting out the pause after a failure (tests)."""
    global _skip_until
    _skip_until = 0.0
