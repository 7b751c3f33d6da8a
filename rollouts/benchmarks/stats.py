"""The statistics of one measured level: latency percentiles, goodput (the requests that met
every latency limit) and :func:`summarize`, the level's result as plain JSON."""

from __future__ import annotations

import math
from typing import Any

from rollouts.benchmarks.level import Level, Tally

PERCENTILES = (50, 90, 95, 99)


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50/p90/p95/p99 (nearest rank), mean and max of ``values`` times ``scale``."""
    if not values:
        return {**{f"p{p}": None for p in PERCENTILES}, "mean": None, "max": None}
    ordered = sorted(values)
    n = len(ordered)
    out: dict[str, float | None] = {
        f"p{p}": round(ordered[max(math.ceil(p / 100 * n) - 1, 0)] * scale, 3) for p in PERCENTILES
    }
    out["mean"] = round(sum(ordered) / n * scale, 3)
    out["max"] = round(ordered[-1] * scale, 3)
    return out


def goodput_count(tally: Tally, slo: dict[str, float | None]) -> int:
    """Requests that met every latency limit in ``slo`` one by one (``latency_ms``, and for
    LLMs ``ttft_ms`` and ``itl_ms``, the request's mean gap between tokens)."""
    latency, ttft, itl = (slo.get(k) for k in ("latency_ms", "ttft_ms", "itl_ms"))
    llm = len(tally.ttft) == len(tally.latencies) and bool(tally.ttft)
    count = 0
    for i, value in enumerate(tally.latencies):
        if latency is not None and value * 1000.0 > latency:
            continue
        if llm and ttft is not None and tally.ttft[i] * 1000.0 > ttft:
            continue
        if llm and itl is not None and i < len(tally.tpot) and tally.tpot[i] * 1000.0 > itl:
            continue
        count += 1
    return count


def summarize(level: Level, tally: Tally, goodput: dict[str, float | None] | None = None) -> dict[str, Any]:
    """The level's result as plain JSON: throughput, latency percentiles, errors by kind, and
    goodput (requests per second that met ``goodput``'s latency limits) when it is given."""
    ok = len(tally.latencies)
    failed = sum(tally.errors.values())
    total = ok + failed
    window = tally.window_s or level.duration_s
    # What the server delivered inside the window: in an overloaded open loop, requests sent in
    # the window are still being answered long after it, so counting them would report the
    # offered rate instead of the server's.
    delivered = ok if tally.answered_in_window is None else tally.answered_in_window
    result: dict[str, Any] = {
        "mode": level.mode,
        "value": level.value,
        "requests": total,
        "ok": ok,
        "errors": dict(tally.errors),
        "error_rate": round(failed / total, 6) if total else 0.0,
        "first_error": tally.first_error,
        "window_s": round(window, 3),
        "throughput_rps": round(delivered / window, 3) if window > 0 else 0.0,
        "offered_rps": level.value if level.mode == "rate" else None,
        "latency_ms": percentiles(tally.latencies),
        "cancelled": tally.cancelled,
    }
    if goodput and any(v is not None for v in goodput.values()):
        result["goodput_rps"] = round(goodput_count(tally, goodput) / window, 3) if window > 0 else 0.0
    if tally.ttft or tally.output_tokens:
        result["ttft_ms"] = percentiles(tally.ttft)
        result["itl_ms"] = percentiles(tally.itl)
        result["output_tokens"] = tally.output_tokens
        result["output_tokens_per_s"] = round(tally.output_tokens / window, 3) if window > 0 else 0.0
    return result
