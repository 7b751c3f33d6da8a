"""Two scrapes into rates: the Window of one (model, version), counter-reset aware, with
latency quantiles from histogram bucket deltas (as PromQL's ``histogram_quantile``) or from
Triton's summary quantiles."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from fleet.adapters.metrics.values import (
    CUMULATIVE_FIELDS,
    Counters,
    Histogram,
    SeriesKey,
    Snapshot,
    Window,
)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Estimate the ``q`` quantile from cumulative ``(le, count)`` buckets, as PromQL's
    ``histogram_quantile`` does: find the bucket holding rank ``q * total`` and interpolate
    linearly inside it (the lowest bucket starts at 0). A rank in the ``+Inf`` bucket gives
    the highest finite bound.

    Buckets may come in any order; counts are made monotonic. None without a ``+Inf`` bucket,
    with fewer than two buckets, or with no observations. ValueError for ``q`` outside [0, 1].
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    ordered = sorted((float(le), float(count)) for le, count in buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return None
    monotonic: list[tuple[float, float]] = []
    highest = 0.0
    for le, count in ordered:
        highest = max(highest, count)
        monotonic.append((le, highest))
    total = monotonic[-1][1]
    if total <= 0:
        return None
    rank = q * total
    index = next((i for i, (_, c) in enumerate(monotonic[:-1]) if c >= rank), len(monotonic) - 1)
    if index == len(monotonic) - 1:
        return monotonic[-2][0]
    upper, count = monotonic[index]
    if index == 0:
        if upper <= 0:
            return upper
        lower, below = 0.0, 0.0
    else:
        lower, below = monotonic[index - 1]
    in_bucket = count - below
    if in_bucket <= 0:
        return lower
    return lower + (upper - lower) * (rank - below) / in_bucket


def share_over(cdf: Sequence[tuple[float, float]], threshold_ms: float) -> float | None:
    """The share of requests slower than ``threshold_ms`` read off a window's ``latency_cdf``
    (points of (ms, share at or below)), interpolated linearly between its points and from
    (0, 0) up to the first. A histogram's last point is its +Inf bucket, so what is past its
    last finite bound counts as slower; past a summary's last point (p99: less than 1% of the
    requests) nothing is known, and nothing counts as slower. None without a distribution."""
    if not cdf:
        return None
    below_ms, below_share = 0.0, 0.0
    for ms, share in cdf:
        if threshold_ms < ms:
            if math.isinf(ms):
                return max(0.0, 1.0 - below_share)
            fraction = (threshold_ms - below_ms) / (ms - below_ms) if ms > below_ms else 1.0
            return max(0.0, 1.0 - (below_share + (share - below_share) * fraction))
        below_ms, below_share = ms, share
    return 0.0


def nearest_quantile(target: float, available: Iterable[float]) -> float | None:
    """The quantile in ``available`` closest to ``target`` (the higher one on a tie)."""
    choices = sorted(available)
    if not choices:
        return None
    return min(choices, key=lambda q: (round(abs(q - target), 9), -q))


def _decreased(prev: Counters, cur: Counters) -> bool:
    """True when any cumulative figure of ``cur`` is lower than in ``prev`` (a restart)."""
    if any(getattr(cur, name) < getattr(prev, name) for name in CUMULATIVE_FIELDS):
        return True
    if any(cur.failure_reasons.get(r, 0.0) < v for r, v in prev.failure_reasons.items()):
        return True
    return any(
        name in cur.histograms and cur.histograms[name].decreased_from(hist)
        for name, hist in prev.histograms.items()
    )


def _per_series_delta(prev: float | None, cur: float) -> float:
    """Prometheus-style delta of one counter: a drop means it restarted from zero."""
    if prev is None or cur < prev:
        return cur
    return cur - prev


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _histogram_cdf(hist: Histogram) -> tuple[tuple[float, float], ...]:
    """(ms, share at or below) at each bucket bound of a histogram's observations."""
    total = max((count for _, count in hist.buckets), default=0.0)
    if total <= 0:
        return ()
    highest, points = 0.0, []
    for le, count in sorted(hist.buckets):
        highest = max(highest, count)
        points.append((le * 1000.0, highest / total))  # +Inf stays: what is past the last bound
    return tuple(points)


def window(prev: Counters | None, cur: Counters, seconds: float) -> Window:
    """Rates, error rate and latencies of one (model, version) between two scrapes.

    Counter-reset aware: when any cumulative figure decreased (a reload or restart), or with
    no ``prev``, ``cur`` is taken as counted from zero (delta = cur) and ``reset`` is True.
    Failures are the exception: their delta is taken per series (a drop restarts that series
    only), because Triton keeps its failure counters across an unload and load while the
    others restart. ``seconds`` is the time between the scrapes (rates are 0 when it is not
    positive).
    """
    reset = prev is None or _decreased(prev, cur)
    base = None if reset else prev

    def delta(name: str) -> float:
        now = getattr(cur, name)
        return now - getattr(base, name) if base is not None else now

    success = delta("success")
    if prev is None:
        failures = cur.failure
    else:
        reasons = set(cur.failure_reasons) | set(prev.failure_reasons)
        if reasons:
            failures = sum(
                _per_series_delta(prev.failure_reasons.get(r), cur.failure_reasons.get(r, 0.0))
                for r in reasons
            )
        else:
            failures = _per_series_delta(prev.failure, cur.failure)
    requests = success + failures
    rps = requests / seconds if seconds > 0 else 0.0
    error_rate = failures / requests if requests > 0 else 0.0
    timed = delta("timed")
    measured = timed if timed > 0 else success  # requests whose durations were summed
    request_us = delta("request_us")
    avg_ms = request_us / measured / 1000.0 if measured > 0 else None
    # The mean time the window's requests waited in the server's queue (same denominator).
    queue_ms = delta("queue_us") / measured / 1000.0 if measured > 0 else None

    hist_delta: dict[str, Histogram] = {
        name: hist.minus(None if base is None else base.histograms.get(name))
        for name, hist in cur.histograms.items()
    }

    def hist_q(name: str, q: float) -> float | None:
        hist = hist_delta.get(name)
        return _ms(histogram_quantile(q, hist.buckets)) if hist else None

    p50 = p95 = p99 = None
    source: dict[str, float] = {}
    available = tuple(sorted(cur.quantiles_us))
    cdf: tuple[tuple[float, float], ...] = ()
    if "e2e" in hist_delta:
        p50, p95, p99 = hist_q("e2e", 0.5), hist_q("e2e", 0.95), hist_q("e2e", 0.99)
        cdf = _histogram_cdf(hist_delta["e2e"])
    elif available and measured > 0:
        # A summary's quantiles can cross by a hair (each is estimated on its own).
        values = [cur.quantiles_us[q] / 1000.0 for q in available]
        cdf = tuple((max(values[: i + 1]), q) for i, q in enumerate(available))
        picked = []
        for label, target in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            q = nearest_quantile(target, available)
            assert q is not None
            source[label] = q
            picked.append(cur.quantiles_us[q] / 1000.0)
        p50, p95, p99 = picked

    generation = delta("generation_tokens")
    tokens_per_s = None
    if cur.engine == "vllm":
        tokens_per_s = generation / seconds if seconds > 0 else 0.0
    return Window(
        seconds=seconds,
        requests=requests,
        failures=failures,
        rps=rps,
        error_rate=error_rate,
        avg_ms=avg_ms,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        ttft_p50_ms=hist_q("ttft", 0.5),
        ttft_p99_ms=hist_q("ttft", 0.99),
        itl_p50_ms=hist_q("itl", 0.5),
        itl_p99_ms=hist_q("itl", 0.99),
        queue_ms=queue_ms,
        tokens_per_s=tokens_per_s,
        running=cur.gauges.get("running"),
        waiting=cur.gauges.get("waiting", cur.gauges.get("pending")),
        reset=reset,
        quantile_source=source,
        quantiles_available=available,
        latency_cdf=cdf,
    )


def windows(prev: Snapshot | None, cur: Snapshot) -> dict[SeriesKey, Window]:
    """:func:`window` for every series of ``cur`` (a series new in ``cur`` counts as reset)."""
    seconds = cur.taken_at - prev.taken_at if prev is not None else 0.0
    before = prev.series if prev is not None else {}
    return {key: window(before.get(key), counters, seconds) for key, counters in cur.series.items()}
