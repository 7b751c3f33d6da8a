"""Sweeps: which load level to run next, when to stop, and what the levels add up to.

Plain functions over the level results the engine returns (no Django, no I/O), so the
planning is tested directly:

- the listed levels run in ascending order; a level *passes* when its p99 latency and error
  rate meet the SLO (and, for LLMs, its p99 TTFT and inter-token latency where those are set);
- the sweep stops early when the server saturates (a level that adds load but not throughput:
  less than ``saturation_gain`` more than the best so far, while failing the SLO) or when the
  error rate passes ``error_limit``;
- then it refines between the last passing and the first failing level by bisection
  (``refine_steps`` times; whole numbers for concurrency);
- **max load within SLO** is the highest level that passed below the first one that failed,
  with the throughput it carried; **goodput** the highest rate of requests that met the
  latency SLO one by one, over all levels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEFAULT_REFINE_STEPS = 2
DEFAULT_ERROR_LIMIT = 0.5
DEFAULT_SATURATION_GAIN = 0.05


@dataclass(frozen=True)
class Slo:
    """What a level must meet: p99 latency and error rate (a fraction); LLM extras."""

    p99_ms: float | None = None
    error_rate: float = 0.01
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Slo:
        return cls(**{k: data[k] for k in ("p99_ms", "error_rate", "ttft_p99_ms", "itl_p99_ms")
                      if data.get(k) is not None})


@dataclass(frozen=True)
class Plan:
    """How a sweep runs: ``levels`` ascending concurrencies or request rates."""

    mode: str
    levels: tuple[float, ...]
    refine_steps: int = DEFAULT_REFINE_STEPS
    error_limit: float = DEFAULT_ERROR_LIMIT
    saturation_gain: float = DEFAULT_SATURATION_GAIN

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(
            mode=data["mode"],
            levels=tuple(sorted({float(v) for v in data["levels"]})),  # each level once
            refine_steps=int(data.get("refine_steps", DEFAULT_REFINE_STEPS)),
            error_limit=float(data.get("error_limit", DEFAULT_ERROR_LIMIT)),
            saturation_gain=float(data.get("saturation_gain", DEFAULT_SATURATION_GAIN)),
        )


def verdict(level: dict[str, Any], slo: Slo) -> list[str]:
    """Why a level fails the SLO (empty: it passes)."""
    why: list[str] = []
    if level.get("ok", 0) == 0:
        why.append("no request succeeded")
        return why
    p99 = (level.get("latency_ms") or {}).get("p99")
    if slo.p99_ms is not None and p99 is not None and p99 > slo.p99_ms:
        why.append(f"p99 {p99:.1f} ms > {slo.p99_ms:g} ms")
    rate = level.get("error_rate", 0.0)
    if rate > slo.error_rate:
        why.append(f"error rate {rate:.2%} > {slo.error_rate:.2%}")
    for key, limit, label in (("ttft_ms", slo.ttft_p99_ms, "TTFT"), ("itl_ms", slo.itl_p99_ms, "ITL")):
        value = (level.get(key) or {}).get("p99")
        if limit is not None and value is not None and value > limit:
            why.append(f"{label} p99 {value:.1f} ms > {limit:g} ms")
    return why


def passes(level: dict[str, Any], slo: Slo) -> bool:
    return not verdict(level, slo)


def _bracket(results: list[dict[str, Any]], slo: Slo) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(highest passing level below the first failing one, lowest failing level)."""
    ordered = sorted(results, key=lambda r: r["value"])
    best = None
    for level in ordered:
        if not passes(level, slo):
            return best, level
        best = level
    return best, None


def stop_reason(plan: Plan, results: list[dict[str, Any]], slo: Slo) -> str:
    """Why the listed levels stop early ('' while they go on): errors or saturation."""
    if not results:
        return ""
    last = results[-1]
    if last.get("error_rate", 0.0) > plan.error_limit:
        return f"error rate {last['error_rate']:.0%} passed the limit of {plan.error_limit:.0%}"
    if len(results) >= 2 and not passes(last, slo):
        best_before = max(r.get("throughput_rps", 0.0) for r in results[:-1])
        if last.get("throughput_rps", 0.0) < best_before * (1 + plan.saturation_gain):
            return (f"saturated: {last['throughput_rps']:.0f} req/s at {_fmt(plan, last['value'])}, "
                    f"no more than {best_before:.0f} req/s before")
    return ""


def _fmt(plan: Plan, value: float) -> str:
    return f"concurrency {value:g}" if plan.mode == "concurrency" else f"{value:g} req/s"


def _midpoint(plan: Plan, low: float, high: float) -> float | None:
    if plan.mode == "concurrency":
        mid = float(math.floor((low + high) / 2))
        return mid if low < mid < high else None
    mid = round((low + high) / 2, 3)
    # Rates closer than 2% are within the noise of one level: stop refining.
    return mid if (high - low) / max(high, 1e-9) > 0.02 else None


def next_level(plan: Plan, results: list[dict[str, Any]], slo: Slo) -> float | None:
    """The next level to run, or None when the sweep is done.

    ``results`` are the levels run so far, in the order they ran: first the listed levels
    (until one stops the list), then refinements.
    """
    listed = [r for r in results if not r.get("refinement")]
    if any(r.get("cancelled") for r in results):
        return None
    if len(listed) < len(plan.levels) and not stop_reason(plan, listed, slo):
        return plan.levels[len(listed)]
    refinements = len(results) - len(listed)
    if refinements >= plan.refine_steps:
        return None
    best, first_fail = _bracket(results, slo)
    if first_fail is None:
        return None
    low = best["value"] if best is not None else 0.0
    mid = _midpoint(plan, low, first_fail["value"])
    if mid is None or any(r["value"] == mid for r in results):
        return None
    return mid


def summarize(plan: Plan, results: list[dict[str, Any]], slo: Slo) -> dict[str, Any]:
    """What a finished sweep found."""
    best, first_fail = _bracket(results, slo)
    listed = [r for r in results if not r.get("refinement")]
    reason = ""
    for i in range(1, len(listed) + 1):
        reason = stop_reason(plan, listed[:i], slo)
        if reason:
            # Early only when levels were left out; the last listed one saturating is not.
            reason = reason if i < len(plan.levels) else ""
            break
    # The load carried within the SLO: the most any passing level up to the max load carried
    # (a higher level can carry a little less by noise; it does not lower the figure).
    carried = [r.get("throughput_rps", 0.0) for r in results
               if best is not None and r["value"] <= best["value"] and passes(r, slo)]
    goodputs = [r.get("goodput_rps") for r in results if r.get("goodput_rps") is not None]
    return {
        "mode": plan.mode,
        "max_load": best["value"] if best else None,
        "max_load_rps": max(carried) if carried else None,
        "max_load_p99_ms": (best.get("latency_ms") or {}).get("p99") if best else None,
        "first_failing": first_fail["value"] if first_fail else None,
        "first_failing_why": verdict(first_fail, slo) if first_fail else [],
        "peak_rps": max((r.get("throughput_rps", 0.0) for r in results), default=0.0),
        "goodput_rps": max(goodputs) if goodputs else None,
        "stopped_early": reason,
        "levels_run": len(results),
    }


def better(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether sweep summary ``a`` carries more load within the SLO than ``b``."""
    if a is None or a.get("max_load_rps") is None:
        return False
    if b is None or b.get("max_load_rps") is None:
        return True
    return a["max_load_rps"] > b["max_load_rps"]
