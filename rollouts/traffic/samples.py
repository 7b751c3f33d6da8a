"""Per-request samples from the traffic router: parsed, kept in Redis, summarised.

Every request through a deployment's route makes nginx write one JSON access-log line (and
one more for a mirrored copy, ``"mirror": true``), sent as a UDP syslog message
(``<190>Jan  1 00:00:00 switchyard: {json}``) to the collector (``manage.py
collect_samples``, :mod:`rollouts.traffic.collector`). The collector hands batches of those lines to
:func:`record`, which validates them and stores one sample per line in Redis:

    <prefix>:samples:<deployment>:p:<variant>   sorted set, the variant's own requests
    <prefix>:samples:<deployment>:m:<variant>   sorted set, the copies mirrored to it
    <prefix>:samples:<deployment>:variants      sorted set of "p:<variant>" / "m:<variant>",
                                                scored by when each last had a sample
    <prefix>:samples:collector                  hash: the collector's counters and heartbeat

Besides what the client and the server took (``request_time``, ``upstream_response_time``), a
line carries the server's time to its response header (``upstream_header_time``: for a streamed
answer, the time to its first token) and the answer's ``content_type`` (kept as the sample's
``stream`` flag: ``text/event-stream``); on an LLM route of an nginx with its Lua module, the
streamed answer's ``first_token`` time and ``tokens`` count (``first_ms``, ``tokens``); and, on a sticky route, the sticky header's value as
``key``: what the sample keeps of it is a keyed hash (``sample_types.split_key``), never the
value, so user identifiers do not sit in Redis. These three may be missing (a route file
written before them): they are then "", None and False.

A sample's score is the time nginx finished the request (its ``msec``). Each write trims
the sets it touches to the last ``keep_s`` seconds (15 minutes) and to at most
``max_per_variant`` samples (the oldest go first), and gives them a TTL of ``keep_s``: a
deployment that stops receiving traffic leaves nothing behind. So memory is bounded by
variants x ``max_per_variant`` samples of about 150 bytes.

Readers: :func:`window` (the raw samples of a window, per variant) and :func:`summary`
(exact p50/p95/p99 by nearest rank, rate, error rate, 4xx, 5xx, upstream errors and bytes per
variant, mirrored copies apart); :func:`buckets` gives the same figures per time step for the
live-latency charts (``rollouts.traffic.latency.series``).

A route's name is ``dep-<deployment id>`` and a variant's name is the route's variant name
(``v<version>-<server>``): nginx's samples carry both, so no database lookup is needed to store
them. An Envoy gateway's lines (routes on Kubernetes) carry the gateway's own names instead:
:mod:`rollouts.traffic.envoy_samples` maps them to the route's variants through the route in force
(cached, not read per line), and a line it cannot map is counted ``unmapped`` and dropped.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings

from rollouts.traffic import envoy_samples
from rollouts.traffic.envoy_samples import RouteResolver
from rollouts.traffic.sample_types import (
    MAX_PATH,
    ROUTE_NAME,
    VARIANT_NAME,
    Sample,
    SampleError,
    Unmapped,
    Unrouted,
    split_key,
)

log = logging.getLogger(__name__)

# An hour: the longest an analysis runs by default (its timeout_s), so its evidence is kept.
KEEP_S = 60 * 60
MAX_PER_VARIANT = 100_000
MAX_TOKENS = 10_000_000  # more than any answer's tokens: a count beyond it is capped
MAX_FUTURE_S = 60.0  # a sample dated further ahead comes from a clock that is wrong
PERCENTILES = (("p50_ms", 0.50), ("p95_ms", 0.95), ("p99_ms", 0.99))
COUNTERS = (
    "received", "stored", "malformed", "unrouted", "foreign_route", "unmapped", "stale",
    "dropped_redis",
)


def keep_s() -> int:
    """Seconds of samples kept (SWITCHYARD_SAMPLES_KEEP_S, default 3600)."""
    return int(getattr(settings, "SWITCHYARD_SAMPLES_KEEP_S", KEEP_S))


def max_per_variant() -> int:
    """Samples kept per variant at most (SWITCHYARD_SAMPLES_MAX_PER_VARIANT, default 100000)."""
    return int(getattr(settings, "SWITCHYARD_SAMPLES_MAX_PER_VARIANT", MAX_PER_VARIANT))


def connect() -> redis.Redis:
    """A Redis client with short timeouts: a stalled Redis delays a flush by a second at most."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)


def _prefix() -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:samples"


def key(deployment_id: int, variant: str, mirror: bool) -> str:
    return f"{_prefix()}:{deployment_id}:{'m' if mirror else 'p'}:{variant}"


def index_key(deployment_id: int) -> str:
    """The sorted set of a route's (kind, variant) pairs, scored by their last write."""
    return f"{_prefix()}:{deployment_id}:variants"


def stats_key() -> str:
    """The hash holding the collector's counters (:data:`COUNTERS`) and ``heartbeat``."""
    return f"{_prefix()}:collector"


# --------------------------------------------------------------------------------------------
# Samples and parsing
# --------------------------------------------------------------------------------------------


def _seconds_sum(text: str) -> float | None:
    """nginx's ``upstream_response_time`` (``"0.004"``, ``"0.004, 0.002"``, ``"-"``) in ms."""
    values = [float(part) for part in re.split(r"[,:\s]+", text) if re.fullmatch(r"\d+(?:\.\d+)?", part)]
    return round(sum(values) * 1000.0, 3) if values else None


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in data:
        raise SampleError(f"{name} is missing")
    value = data[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise SampleError(f"{name} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _optional(data: Mapping[str, Any], name: str) -> str:
    """A string field a line may lack ("" then)."""
    return _field(data, name, str) if name in data else ""


def parse_line(line: bytes | str, *, resolver: RouteResolver | None = None) -> Sample | Unrouted:
    """One syslog message (RFC 3164 or 5424, or a bare JSON line) of a route's access log as a
    sample: nginx's format, or an Envoy gateway's (:mod:`rollouts.traffic.envoy_samples`, mapped to
    variants by ``resolver``, default the process's
    :func:`~rollouts.traffic.envoy_samples.default_resolver`).

    Raises SampleError naming what is wrong: not syslog or JSON, a field missing or of the
    wrong type, a route that is not ``dep-<id>`` (``foreign route``), a bad variant name;
    Unmapped for a gateway's line that is no variant's of a route in force.
    """
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    text = text.strip()
    if text.startswith("<"):
        start = text.find("{")
        if not re.match(r"^<\d{1,3}>", text) or start < 0:
            raise SampleError("not a syslog message carrying a JSON object")
        text = text[start:]
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SampleError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SampleError("not a JSON object")
    if "route" not in data and "response_code" in data:  # an Envoy gateway's line

        return (resolver or envoy_samples.default_resolver()).sample(data)
    route = _field(data, "route", str)
    match = ROUTE_NAME.match(route)
    if match is None:
        raise SampleError(f"foreign route {route[:80]!r}")
    deployment_id = int(match.group(1))
    variant = _field(data, "variant", str)
    msec = _field(data, "msec", (int, float))
    status = _field(data, "status", int)
    request_time = _field(data, "request_time", (int, float))
    size = _field(data, "bytes_sent", int)
    mirror = _field(data, "mirror", bool)
    upstream_status = _field(data, "upstream_status", str)
    upstream_time = _field(data, "upstream_response_time", str)
    upstream_addr = _field(data, "upstream_addr", str)
    method = _field(data, "method", str)
    path = _field(data, "path", str)
    request_id = _field(data, "request_id", str)
    if not 100 <= status <= 599:
        raise SampleError(f"status must be an HTTP status, got {status}")
    if not (math.isfinite(msec) and math.isfinite(request_time)):
        raise SampleError("msec and request_time must be finite numbers")
    if msec <= 0 or request_time < 0 or size < 0:
        raise SampleError("msec, request_time and bytes_sent must be positive")
    if not variant:
        return Unrouted(deployment_id)
    if not VARIANT_NAME.match(variant):
        raise SampleError(f"variant {variant[:80]!r} is not a variant name")
    # Lines of a route file written before these fields existed lack them.
    key = _optional(data, "key")
    header_time = _optional(data, "upstream_header_time")
    content_type = _optional(data, "content_type")
    first_token, tokens = _optional(data, "first_token"), _optional(data, "tokens")
    return Sample(
        t=float(msec),
        deployment_id=deployment_id,
        variant=variant,
        mirror=mirror,
        status=status,
        latency_ms=round(float(request_time) * 1000.0, 3),
        upstream_ms=_seconds_sum(upstream_time),
        bytes=size,
        upstream_status=upstream_status[:64],
        upstream_addr=upstream_addr[:256],
        method=method[:16],
        path=path[:MAX_PATH],
        request_id=request_id[:128],
        key=split_key(deployment_id, key, settings.SECRET_KEY),
        header_ms=_seconds_sum(header_time),
        stream=content_type[:64].lower().lstrip().startswith("text/event-stream"),
        first_ms=_seconds_sum(first_token),
        tokens=_count(tokens),
    )


def _count(text: str) -> int | None:
    """A token count as the router logs it ("12"; "" when it counted none), capped at what
    an answer can hold."""
    if not text.isascii() or not text.isdigit():
        return None
    return min(int(text[:9]), MAX_TOKENS)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


@dataclass
class RecordResult:
    """What :func:`record` did with a batch: counts per :data:`COUNTERS` name, and one example
    of a malformed line's problem (for the collector's log)."""

    counts: Counter[str] = field(default_factory=Counter)
    problem: str = ""


def record(
    lines: Iterable[bytes | str],
    *,
    store: redis.Redis | None = None,
    now: float | None = None,
    extra: Mapping[str, int] | None = None,
    keep: int | None = None,
    cap: int | None = None,
    resolver: RouteResolver | None = None,
) -> RecordResult:
    """Parse ``lines`` and store their samples in one Redis pipeline; trim what they touch
    to the last ``keep`` seconds and ``cap`` samples per variant (default :func:`keep_s`,
    :func:`max_per_variant`). ``resolver`` maps a gateway's lines to variants
    (:class:`rollouts.traffic.envoy_samples.RouteResolver`; default the process's).

    ``extra`` counters (samples dropped while Redis was away) are added to the collector's
    hash in the same round trip. Raises ``redis.RedisError`` when Redis cannot be written
    (nothing of the batch is then counted as stored).
    """
    now = time.time() if now is None else now
    keep = keep or keep_s()
    cap = cap or max_per_variant()
    oldest = now - keep
    result = RecordResult()
    grouped: dict[tuple[int, str, bool], dict[str, float]] = defaultdict(dict)
    failed = False
    for line in lines:
        result.counts["received"] += 1
        try:
            sample = parse_line(line, resolver=resolver)
        except SampleError as exc:
            if isinstance(exc, Unmapped):
                kind = "unmapped"
            else:
                kind = "foreign_route" if str(exc).startswith("foreign route") else "malformed"
            result.counts[kind] += 1
            result.problem = result.problem or str(exc)
            continue
        except Exception as exc:  # a line must never stop the collector: count it, say why
            if not failed:
                log.exception("a line could not be read")
            failed = True
            result.counts["malformed"] += 1
            result.problem = result.problem or f"could not be read: {exc!r}"[:300]
            continue
        if isinstance(sample, Unrouted):
            result.counts["unrouted"] += 1
            continue
        score = sample.t
        if score < oldest:
            result.counts["stale"] += 1
            continue
        if score > now + MAX_FUTURE_S:
            score = now  # a clock far ahead: kept, dated when it arrived
        grouped[(sample.deployment_id, sample.variant, sample.mirror)][sample.to_member()] = score
        result.counts["stored"] += 1
    store = store or connect()
    pipe = store.pipeline(transaction=False)
    for (deployment_id, variant, mirror), members in grouped.items():
        name = key(deployment_id, variant, mirror)
        pipe.zadd(name, members)
        pipe.zremrangebyscore(name, "-inf", f"({oldest}")
        pipe.zremrangebyrank(name, 0, -cap - 1)
        pipe.expire(name, keep)
        index = index_key(deployment_id)
        pipe.zadd(index, {f"{'m' if mirror else 'p'}:{variant}": now})
        pipe.zremrangebyscore(index, "-inf", f"({oldest}")
        pipe.expire(index, keep)
    totals = Counter(result.counts)
    totals.update(extra or {})
    for name, value in totals.items():
        if value:
            pipe.hincrby(stats_key(), name, value)
    pipe.hset(stats_key(), "heartbeat", repr(now))
    pipe.execute()
    return result


def heartbeat(store: redis.Redis, now: float | None = None) -> None:
    """Say the collector is alive (and so an empty window means no traffic, not no data)."""
    store.hset(stats_key(), "heartbeat", repr(time.time() if now is None else now))


def collector_stats(store: redis.Redis | None = None) -> dict[str, float]:
    """The collector's counters since its first start, and ``heartbeat`` (epoch s; absent
    when no collector ever wrote)."""
    raw = (store or connect()).hgetall(stats_key())
    out: dict[str, float] = {name: 0 for name in COUNTERS}
    for name, value in raw.items():
        key = name.decode()
        out[key] = float(value) if key == "heartbeat" else int(value)
    return out


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def variants(store: redis.Redis, deployment_id: int, since: float) -> list[tuple[str, bool]]:
    """The (variant, mirror) pairs with samples from ``since`` on, from the route's index."""
    found = []
    for raw in store.zrangebyscore(index_key(deployment_id), since, "+inf"):
        kind, _, variant = raw.decode().partition(":")
        found.append((variant, kind == "m"))
    return sorted(found)


def _read(store: redis.Redis, deployment_id: int, since: float,
          mirror: bool | None) -> dict[tuple[str, bool], list[Sample]]:
    """Samples from ``since`` on (a clock a little ahead of ours included)."""
    pairs = [p for p in variants(store, deployment_id, since) if mirror is None or p[1] == mirror]
    pipe = store.pipeline(transaction=False)
    for variant, is_mirror in pairs:
        pipe.zrangebyscore(key(deployment_id, variant, is_mirror), since, "+inf")
    out = {}
    for (variant, is_mirror), raws in zip(pairs, pipe.execute(), strict=True):
        samples = [Sample.from_member(raw, deployment_id, variant, is_mirror) for raw in raws]
        if samples:
            out[(variant, is_mirror)] = sorted(samples, key=lambda s: s.t)
    return out


def window(
    deployment_id: int,
    seconds: float,
    *,
    mirror: bool = False,
    now: float | None = None,
    store: redis.Redis | None = None,
) -> dict[str, list[Sample]]:
    """The samples of the last ``seconds`` per variant, oldest first: the variants' own
    requests, or with ``mirror`` the copies mirrored to them. Raises ``redis.RedisError``."""
    now = time.time() if now is None else now
    read = _read(store or connect(), deployment_id, now - seconds, mirror)
    return {variant: samples for (variant, _), samples in read.items()}


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The nearest-rank percentile: the smallest value with at least ``q`` of the values at
    or below it (always one of the values; None for none)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(samples: list[Sample], seconds: float) -> dict[str, Any]:
    """Count, rate (per s over ``seconds``), exact percentiles and errors of ``samples``.

    ``error_rate`` is in percent of requests (as ``slo_error_rate``): 4xx and 5xx answers and
    requests whose server failed (5xx or no answer). ``bytes`` is what nginx sent clients.
    """
    latencies = sorted(s.latency_ms for s in samples)
    count = len(samples)
    errors = sum(1 for s in samples if s.is_error)
    out: dict[str, Any] = {
        "count": count,
        "rps": count / seconds if seconds > 0 else 0.0,
        **{name: percentile(latencies, q) for name, q in PERCENTILES},
        "avg_ms": sum(latencies) / count if count else None,
        "max_ms": latencies[-1] if latencies else None,
        "errors": errors,
        "error_rate": 100.0 * errors / count if count else 0.0,
        "errors_4xx": sum(1 for s in samples if 400 <= s.status < 500),
        "errors_5xx": sum(1 for s in samples if s.status >= 500),
        "upstream_errors": sum(1 for s in samples if s.upstream_failed),
        "bytes": sum(s.bytes for s in samples),
    }
    return out


def _covered(samples: list[Sample], seconds: float, now: float) -> float:
    """The seconds a window's samples stand for: all of it, unless the cap cut its start."""
    if len(samples) >= max_per_variant():
        return max(min(seconds, now - samples[0].t), 1e-3)
    return seconds


def summary(
    deployment_id: int,
    seconds: float,
    *,
    now: float | None = None,
    store: redis.Redis | None = None,
) -> dict[str, dict[str, Any]]:
    """Per variant over the last ``seconds``: :func:`summarize` of its own requests, with
    ``mirror`` holding the same figures for the copies mirrored to it (count 0 when none).
    A variant appears when it had requests or mirrored copies. Raises ``redis.RedisError``."""
    now = time.time() if now is None else now
    read = _read(store or connect(), deployment_id, now - seconds, None)
    out: dict[str, dict[str, Any]] = {}
    for variant in sorted({v for v, _ in read}):
        own = read.get((variant, False), [])
        copies = read.get((variant, True), [])
        out[variant] = {
            **summarize(own, _covered(own, seconds, now)),
            "mirror": summarize(copies, _covered(copies, seconds, now)),
        }
    return out


class RouteSampleSource:
    """A deployment's route samples as a ``fleet.adapters.metrics.values.RequestLogSource``: its
    variants' own requests (or, with ``mirror``, the copies mirrored to them)."""

    def __init__(self, deployment_id: int, *, mirror: bool = False) -> None:
        self.deployment_id = deployment_id
        self.mirror = mirror

    def samples(self, since: float) -> list[tuple[str, float, bool]]:
        """Requests finished after ``since``, oldest first, as ``(variant, latency_ms, ok)``;
        ``ok`` is False for every error :attr:`Sample.is_error` names (4xx included)."""
        read = _read(connect(), self.deployment_id, since, self.mirror)
        found = sorted((s for samples in read.values() for s in samples), key=lambda s: s.t)
        return [(s.variant, s.latency_ms, not s.is_error) for s in found if s.t > since]


def buckets(
    deployment_id: int,
    seconds: float,
    step: float,
    *,
    now: float | None = None,
    store: redis.Redis | None = None,
) -> dict[tuple[str, bool], dict[str, Any]]:
    """Per (variant, mirrored): ``points``, the figures of each ``step``-second slice of the
    window, and ``summary``, :func:`summarize` over the whole window.

    Slices are aligned to multiples of ``step``; only complete ones are given, each dated by
    its end (``t``), from the first slice with a sample up to the last one that ended before
    the collector's latest heartbeat (so a stopped collector shows as data growing old, not
    as traffic falling to zero). Empty slices have rps 0 and no percentiles. Pairs without a
    complete slice yet are left out. Raises ``redis.RedisError``.
    """
    store = store or connect()
    now = time.time() if now is None else now
    raw_beat = store.hget(stats_key(), "heartbeat")
    fresh_until = min(now, float(raw_beat)) if raw_beat else now
    start = math.floor((now - seconds) / step) * step  # the first slice whole
    read = _read(store, deployment_id, start, None)
    out = {}
    for pair, found in read.items():
        sliced: dict[int, list[Sample]] = defaultdict(list)
        for sample in found:
            sliced[math.floor(sample.t / step)].append(sample)
        last = math.floor(fresh_until / step) - 1  # the last slice that has ended
        points = [
            {"t": (index + 1) * step, **summarize(sliced.get(index, []), step)}
            for index in range(min(sliced), last + 1)
        ]
        if points:
            in_window = [s for s in found if s.t >= now - seconds]
            covered = _covered(in_window, seconds, now)
            out[pair] = {"points": points, "summary": summarize(in_window, covered)}
    return out
