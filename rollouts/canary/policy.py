"""How an analysis step ends, as pure functions over samples and a config: which requests are
evidence (every analysis step of the attempt so far, each less its warm-up after the weight
change) and what a look's judgement means for the step (go on, go back, wait, or ask a person).
:func:`rollouts.canary.analysis.look` applies it to the database rows; ``bench/judge.py`` to
simulated rollouts, so both run the same decision.

An analysis step ends:

* ``fail`` the moment the judge shows a metric beyond its tolerance (or a gate beyond its
  ceiling), whatever the step; besides all the evidence so far, the median of the current
  block of ``window_s`` seconds alone is judged too (each block at its own share of the
  budget), so a version that turns slow minutes in is not hidden by what it served before;
* ``pass`` once the step has seen ``min_samples`` canary requests at its weight and either the
  judge shows every metric within its tolerance (the canary is at most that much worse), or,
  for an analysis step that is not the rollout's last, nothing is shown beyond a tolerance (the
  weight goes up while no harm is shown; the proof is left to the last analysis step, on
  all the evidence gathered by then, which also waits until the canary's share of requests
  past the baseline's p99 is shown at most twice the baseline's: :func:`tail_bounded`);
* ``inconclusive`` (a person decides) when the attempt's canary requests reach
  ``planned_samples`` or ``timeout_s`` passes without either;
* otherwise it keeps looking.

The evidence is cumulative across the steps of an attempt so that the error budget is spent once
for the whole rollout (the bounds are valid at every look, however many steps look), and so
that a version proven at 25% need not be proven again from scratch at 50%.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rollouts.canary.arms import Arm
from rollouts.canary.judge import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    SHARE_HOLD_PCT,
    JudgeConfig,
    Judgement,
    block_alpha,
    judge,
)
from rollouts.traffic.columns import Columns

RUNNING = "running"
SHARE_HOLD = math.log1p(SHARE_HOLD_PCT / 100)

# How analyses judge, unless the rollout (or the step) says otherwise (see
# rollouts.canary.judge and this module for what each means). ``max_p99_ms`` and
# ``max_error_rate`` default to the deployment's SLO.
ANALYSIS_DEFAULTS: dict[str, Any] = {
    # Enough that an identical version, held at the last step until its share past the
    # baseline's p99 is bounded, has its errors shown within too (at 10,000, 10.5% of
    # simulated A/A rollouts ended inconclusive on the errors; at 20,000, none of 600).
    "planned_samples": 20000,
    "min_samples": 100,
    "latency_tolerance_pct": 5.0,
    "tail_tolerance_pct": 10.0,
    "error_tolerance_pct": 0.2,
    "error_ratio_pct": 100.0,
    "ttft_tolerance_pct": 10.0,
    "generation_tolerance_pct": 10.0,
    "alpha": 0.05,
    "warmup_s": 2.0,
    "window_s": 60,
    "failure_limit": 0,
    "inconclusive_limit": 0,
    "timeout_s": 3600,
    "max_p50_ms": None,
    "max_p95_ms": None,
    "max_p99_ms": None,
    "max_error_rate": None,
    "bake_s": 0,
}
# The range and type of each analysis setting: parse_analysis refuses outside them, and the
# API's schema states them.
ANALYSIS_LIMITS: dict[str, tuple[float, float, type]] = {
    "planned_samples": (10, 10_000_000, int),
    "min_samples": (10, 10_000_000, int),
    "latency_tolerance_pct": (0, 1000, float),
    "tail_tolerance_pct": (0, 1000, float),
    "error_tolerance_pct": (0, 100, float),
    "error_ratio_pct": (0, 10_000, float),
    "ttft_tolerance_pct": (0, 1000, float),
    "generation_tolerance_pct": (0, 1000, float),
    "alpha": (0.0001, 0.4999, float),
    "warmup_s": (0, 3600, float),
    "window_s": (0, 86400, int),
    "failure_limit": (0, 1000, int),
    "inconclusive_limit": (0, 1000, int),
    "timeout_s": (1, 7 * 24 * 3600, int),
    "max_p50_ms": (0.001, 3_600_000, float),
    "max_p95_ms": (0.001, 3_600_000, float),
    "max_p99_ms": (0.001, 3_600_000, float),
    "max_error_rate": (0, 100, float),
    "bake_s": (0, 7 * 24 * 3600, int),
}
# Settings of the whole rollout, refused on a step: the bake after 100% and the rollback
# webhook (``{"webhook": NAME, "every_s": N}``, checked by rollouts.canary.specs).
ROLLOUT_ONLY = frozenset({"bake_s", "rollback"})


def is_number(value: object) -> bool:
    """A finite int or float, not a bool: what a number in a request body may be."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def judge_config(config: dict[str, Any]) -> JudgeConfig:
    """The judge's settings from an analysis's."""
    return JudgeConfig(
        latency_tolerance_pct=config["latency_tolerance_pct"],
        tail_tolerance_pct=config["tail_tolerance_pct"],
        error_tolerance_pct=config["error_tolerance_pct"],
        error_ratio_pct=config["error_ratio_pct"], alpha=config["alpha"],
        fresh_starts=fresh_starts(config),
        max_p50_ms=config.get("max_p50_ms"), max_p95_ms=config.get("max_p95_ms"),
        max_p99_ms=config.get("max_p99_ms"), max_error_rate=config.get("max_error_rate"),
        streamed=bool(config.get("streamed")),
        ttft_tolerance_pct=config.get("ttft_tolerance_pct", 10.0),
        generation_tolerance_pct=config.get("generation_tolerance_pct", 10.0),
    )


def fresh_starts(config: dict[str, Any]) -> int:
    """How many times an analysis may judge on fresh evidence: once, and again after each
    failed look ``failure_limit`` allows and each inconclusive end ``inconclusive_limit``
    allows. The error budget is split over them."""
    return int(config["failure_limit"]) + int(config.get("inconclusive_limit", 0)) + 1


@dataclass(frozen=True)
class StepWindow:
    """An analysis step's stretch of time: from ``start`` (when its weight took effect) to
    ``end`` (None while it runs); its first ``warmup_s`` seconds are not evidence."""

    start: float
    end: float | None
    warmup_s: float

    def holds(self, t: float) -> bool:
        return t >= self.start + self.warmup_s and (self.end is None or t < self.end)


def recent_block(windows: Sequence[StepWindow], now: float, seconds: float) -> tuple[float, int]:
    """The current block of a sliding look: blocks of ``seconds`` from the first window's
    start; (its start, its number from 1)."""
    first = windows[0].start
    block = int(max(now - first, 0.0) // seconds) + 1
    return first + (block - 1) * seconds, block


def evidence(samples: Iterable[Any] | Columns, windows: Sequence[StepWindow]) -> list[Any] | Columns:
    """The samples (anything with a finish time ``t``, or columns of them) inside one of the
    windows, past its warm-up."""
    if isinstance(samples, Columns):
        inside = np.zeros(len(samples), dtype=bool)
        for w in windows:
            inside |= (samples.t >= w.start + w.warmup_s) & (
                samples.t < (math.inf if w.end is None else w.end))
        return samples.where(inside)
    return [s for s in samples if any(w.holds(s.t) for w in windows)]


def step_end(judgement: Judgement, *, step_samples: int, min_samples: int, last: bool,
             planned_samples: int, elapsed_s: float, timeout_s: float,
             shadow: bool = False) -> tuple[str, str]:
    """What a look means for the analysis step: (``pass``/``fail``/``inconclusive``/
    ``running``, why in one line; the judgement's reasons give the numbers).
    ``step_samples``: canary requests at this step's weight (past the warm-up), or on a
    ``shadow`` the copies paired with the baseline's requests;
    ``judgement.canary_samples``: those of every step so far."""
    what, at = ("copies", "") if shadow else ("canary requests", " at this weight")
    if judgement.verdict == FAIL:
        return FAIL, "a regression is shown beyond what is allowed"
    seen = step_samples >= min_samples
    held = last and not shadow and not tail_bounded(judgement)
    if seen and judgement.within and held:
        if judgement.canary_samples >= planned_samples:
            return INCONCLUSIVE, (f"{judgement.canary_samples} of {planned_samples} planned "
                                  f"{what}, and the share slower than the baseline's p99 is "
                                  "not shown at most twice the baseline's")
        return RUNNING, ("median and errors within; waiting until the share of requests slower "
                         "than the baseline's p99 is shown at most twice the baseline's")
    if seen and judgement.within:
        return PASS, (f"{judgement.canary_samples} {what} show "
                      f"{'the time of each request' if shadow else 'its median latency'} "
                      "and errors within their tolerances, and its slowest requests not beyond")
    if seen and not last:
        return PASS, (f"{step_samples} {what}{at} show no regression; "
                      "the last analysis step is to show it within the tolerances")
    if judgement.canary_samples >= planned_samples:
        return INCONCLUSIVE, (f"{judgement.canary_samples} of {planned_samples} planned "
                              f"{what}, and the bounds do not settle it")
    if elapsed_s >= timeout_s:
        return INCONCLUSIVE, (f"{elapsed_s:.0f} s passed without a verdict (timeout "
                              f"{timeout_s:g} s)")
    if not seen:
        return RUNNING, f"{step_samples} of {min_samples} {what}{at}"
    return RUNNING, "not settled yet: looking again"


def tail_bounded(judgement: Judgement) -> bool:
    """Whether the judgement shows the canary's share of requests slower than the baseline's
    p99 at most :data:`~rollouts.canary.judge.SHARE_HOLD_PCT` above the baseline's own (true
    when the look has no such metric: all the traffic on one version)."""
    share = next((m for m in judgement.metrics if m.name == "tail99"), None)
    return share is None or (share.high is not None and share.high <= SHARE_HOLD)


def bake_look(samples: Sequence[Any], start: float, now: float, config: dict[str, Any]) -> Judgement:
    """A look during the bake after 100% (``start``: when the candidate got all the traffic).
    With no baseline beside it, the candidate is judged against itself: the requests of the
    current block of ``window_s`` seconds (past the warm-up) against every earlier request of
    the bake (median, tail, errors: a version that degrades minutes in shows here), and the
    current block against the SLO gates (:func:`bake_judge`)."""
    block_from, block = bake_block(start, now, config)
    kept = [s for s in samples if s.t >= start + config["warmup_s"]]
    recent = Arm.of([s for s in kept if s.t >= block_from])
    earlier = Arm.of([s for s in kept if s.t < block_from])
    return bake_judge(recent, earlier, block, config)


def bake_block(start: float, now: float, config: dict[str, Any]) -> tuple[float, int]:
    """The bake's current block: blocks of ``window_s`` (the whole bake when 0) from the end
    of the warm-up after ``start``; (its start, its number from 1)."""
    seconds = config["window_s"] or max(config["bake_s"], 1)
    warm = start + config["warmup_s"]
    return recent_block([StepWindow(warm, None, 0.0)], now, seconds)


def bake_judge(recent: Arm, earlier: Arm, block: int, config: dict[str, Any]) -> Judgement:
    """The bake's judgement of the current block (``recent``) against the bake's earlier
    requests (from the second block on), and against the SLO gates. Each block spends its
    own share of ``alpha`` (:func:`block_alpha`), so the whole bake, however long, fails a
    steady version at most ``alpha`` of the time (measured: ``bench/judge.py``, ``bake-``)."""
    judged = replace(judge_config(config), alpha=block_alpha(config["alpha"], block),
                     fresh_starts=1)
    return judge(recent, earlier if block >= 2 else None, judged)
