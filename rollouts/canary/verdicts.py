"""What a look of the canary judge says: its verdicts, each metric's numbers and state, and the
same in words and in the units people read. :mod:`rollouts.canary.judge` computes them; the
rollout page, the API and ``bench/judge.py`` read them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

PASS = "pass"
FAIL = "fail"
INCONCLUSIVE = "inconclusive"

# Metrics that fail a canary shown beyond their tolerance but need not be shown within it
# for a pass.
GUARDS = frozenset({"tail", "tail99", "recent", "ttft", "tpot", "generation"})


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float


@dataclass(frozen=True)
class Metric:
    """One metric's look: its estimate and anytime-valid bounds against its tolerance (all in
    the metric's ``unit``), what the canary and baseline showed, and the state it is in:
    ``fail`` (lower bound beyond), ``within`` (upper bound within), ``open`` (neither yet),
    ``unresolved`` (the data's step is coarser than the tolerance) or ``waiting`` (too few)."""

    name: str
    unit: str
    state: str
    estimate: float | None
    low: float | None
    high: float | None
    tolerance: float
    canary: float | None
    baseline: float | None
    evidence: float  # the fail side's evidence, as a share of what a fail needs (1.0 = fail)
    note: str = ""

    def shown(self) -> dict[str, Any]:
        """The metric in the units people read: a ratio's estimate, bounds and tolerance in
        percent slower, a rate's in percentage points (the rates in percent), a gate's
        latency in ms; ``canary`` and ``baseline`` in ms or percent."""
        if self.unit == "log-ratio":
            change, side, unit = _pct, _same, "%"
        elif self.unit == "log-ms":
            change, side, unit = _exp, _same, "ms"
        else:
            change, side, unit = _percent, _percent, "points" if self.name == "errors" else "%"
        low = change(self.low)
        if self.unit == "share" and self.name != "errors" and low is not None:
            low = max(low, 0.0)  # a rate's bound: never below no errors at all
        return {"estimate": change(self.estimate), "low": low,
                "high": change(self.high), "tolerance": change(self.tolerance), "unit": unit,
                "canary": side(self.canary), "baseline": side(self.baseline)}


@dataclass(frozen=True)
class Judgement:
    """One look's verdict with every number behind it."""

    verdict: str  # fail, or inconclusive while nothing is shown beyond a tolerance
    within: bool  # every metric is shown within its tolerance
    reasons: list[str]
    canary_samples: int
    baseline_samples: int
    alpha_per_test: float
    resolution_ms: float
    metrics: list[Metric] = field(default_factory=list)
    gates: list[Metric] = field(default_factory=list)
    client_errors: dict[str, int] = field(default_factory=dict)
    # Each upper bound's level (a pass needs every metric within: JudgeConfig.alpha_within).
    alpha_within: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Every number, and beside each metric the same in the units people read
        (``shown``: percent for ratios and rates, ms for a gate's latency)."""
        out = jsonable(asdict(self))
        for key in ("metrics", "gates"):
            for data, m in zip(out[key], getattr(self, key), strict=True):
                data["shown"] = jsonable(m.shown())
        return out


def jsonable(value: Any) -> Any:
    """``value`` with numpy scalars as Python numbers and non-finite floats as None."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


# A ratio is shown up to ten thousand times (+999,900%): a bound beyond says no more.
MAX_SHOWN_LOG_RATIO = math.log(1e4)


def _pct(log_ratio: float | None) -> float | None:
    return None if log_ratio is None else 100 * math.expm1(min(log_ratio, MAX_SHOWN_LOG_RATIO))


def _exp(value: float | None) -> float | None:
    return None if value is None else math.exp(min(value, 700.0))


def _percent(share: float | None) -> float | None:
    return None if share is None else 100 * share


def _same(value: float | None) -> float | None:
    return value


def describe(m: Metric, error_ratio_pct: float) -> str:
    """One metric's state in words, with its numbers (``error_ratio_pct``: the errors allowed
    above the baseline's rate, as the judge's config says)."""
    if m.state == "waiting":
        return f"{m.name}: {m.note}"
    if m.name == "tail99":
        pct = _pct(m.estimate)
        text = (f"requests slower than the baseline's p99: {m.canary:.2f}% of the canary's "
                f"against {m.baseline:.2f}% of the baseline's, {abs(pct):.0f}% "
                f"{'more' if pct >= 0 else 'fewer'}, bounds {_pct(m.low):+.0f}% to "
                f"{_pct(m.high):+.0f}%, tolerance {_pct(m.tolerance):g}%")
    elif m.unit == "log-ratio":
        what = {"median": "median latency", "recent": "median latency in the current window",
                "ttft": "median time to first token (streamed answers)",
                "generation": "median generation time after the first token",
                "tpot": "median time per output token",
                "paired": "the same requests on the canary (geometric mean of each one's "
                          "ratio)"}.get(
            m.name, "the slowest requests (above the baseline's p95)")
        pct = _pct(m.estimate)
        text = (f"{what} {abs(pct):.1f}% {'slower' if pct >= 0 else 'faster'} "
                f"({m.canary:.3g} ms against "
                f"{m.baseline:.3g} ms), bounds {_pct(m.low):+.1f}% to {_pct(m.high):+.1f}%, "
                f"tolerance {_pct(m.tolerance):g}%")
    elif m.unit == "log-ms":
        text = (f"SLO {m.name} {_exp(m.estimate):.4g} ms, bounds {_exp(m.low):.4g} to "
                f"{_exp(m.high):.4g} ms, ceiling {_exp(m.tolerance):g} ms")
    elif m.name == "errors":
        text = (f"errors {100 * m.canary:.2f}% against {100 * m.baseline:.2f}%: "
                f"{100 * m.estimate:+.2f} points over the {error_ratio_pct:g}% allowed "
                f"above the baseline's rate, bounds {100 * m.low:+.2f} to {100 * m.high:+.2f}, "
                f"tolerance {100 * m.tolerance:g} points")
    else:
        shown = m.shown()
        text = (f"SLO {m.name} {shown['estimate']:.2f}%, bounds {shown['low']:.2f}% "
                f"to {shown['high']:.2f}%, ceiling {shown['tolerance']:g}%")
    if m.state == FAIL:
        return f"{text}: beyond it"
    if m.state == "unresolved":
        return f"{text}: {m.note}"
    if m.state == "open" and m.name in GUARDS:
        return f"{text}: not shown beyond it (a guard: it can fail the canary, not hold a pass)"
    if m.state == "open":
        return f"{text}: not yet shown within"
    return f"{text}: within"
