"""The judge: is a canary worse than its baseline, on the same window of real requests?

Plain Python over per-request samples (latencies in ms and error flags), no Django: an analysis
look (``rollouts.canary.analysis.look``, where the rest of the canary decision lives) hands it the
route samples of the canary and of the baseline over one window (``rollouts.traffic.samples.window``)
and keeps everything it answers.

Latency. A one-sided Mann-Whitney U test (scipy) asks whether the canary's latencies tend to
be larger than the baseline's; the effect is the Hodges-Lehmann shift (the median of all
canary-minus-baseline differences) with its distribution-free confidence interval, also given
relative to the baseline's median.

Errors. A one-sided Fisher exact test (scipy) asks whether the canary's error rate is higher;
the effect is the difference of the two rates with Newcombe's hybrid score interval.

Looking repeatedly. The judge runs every tick while samples accumulate: testing each look at
the full level would raise false alarms (peeking). The overall false-alarm probability is
spent over the looks with the O'Brien-Fleming-type spending function of Lan and DeMets,
alpha(t) = 2 - 2 Phi(z_{alpha/2} / sqrt(t)), t being the fraction of the planned sample seen so
far; each look is tested at the level it adds, so by the union bound the chance of any false
alarm over all looks stays below ``alpha`` however often the judge looks. Early looks spend
almost nothing, so a canary is failed early only on overwhelming evidence.

Verdicts, per look:

* ``fail``: a test rejects at this look's level and the effect is larger than the tolerance
  (a real regression, not a statistically significant trifle);
* ``pass``: the planned sample is reached and the confidence intervals exclude a regression
  larger than the tolerance (the canary is at most that much worse);
* ``inconclusive``: not enough samples yet (fewer than ``min_samples`` per side), or the
  planned sample is reached and neither holds: a person decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

PASS = "pass"
FAIL = "fail"
INCONCLUSIVE = "inconclusive"

# The Hodges-Lehmann interval sorts every pairwise difference; beyond this many samples a side
# an evenly spaced subsample of the sorted latencies stands for it (quantiles kept exactly).
MAX_PAIRWISE_SIDE = 1000


@dataclass(frozen=True)
class JudgeConfig:
    """How a canary is judged.

    ``planned_samples``: requests per side at which the judge must decide (the information
    fraction is the smaller side's count over it). ``min_samples``: per side, before any
    verdict. ``latency_tolerance_pct``: how much slower (Hodges-Lehmann shift over the
    baseline's median) the canary may be. ``error_tolerance_pct``: how many percentage points
    more errors it may have. ``alpha``: the chance of failing a canary that is no worse, over
    every look. ``confidence``: of the reported intervals.
    """

    planned_samples: int = 2000
    min_samples: int = 100
    latency_tolerance_pct: float = 5.0
    error_tolerance_pct: float = 1.0
    alpha: float = 0.05
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.min_samples < 10:
            raise ValueError("min_samples must be at least 10")
        if self.planned_samples < self.min_samples:
            raise ValueError("planned_samples must be at least min_samples")
        if not 0 < self.alpha < 0.5:
            raise ValueError("alpha must be between 0 and 0.5")
        if not 0.5 < self.confidence < 1:
            raise ValueError("confidence must be between 0.5 and 1")
        if self.latency_tolerance_pct < 0 or self.error_tolerance_pct < 0:
            raise ValueError("tolerances cannot be negative")


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float


@dataclass(frozen=True)
class LatencyComparison:
    """Canary against baseline latency; ``shift_ms`` > 0 means the canary is slower."""

    p_value: float  # one-sided: the canary is slower
    shift_ms: Interval  # Hodges-Lehmann shift, canary - baseline
    shift_pct: Interval  # the same, in percent of the baseline's median
    canary_p50_ms: float
    baseline_p50_ms: float
    canary_p95_ms: float
    baseline_p95_ms: float
    canary_p99_ms: float
    baseline_p99_ms: float


@dataclass(frozen=True)
class ErrorComparison:
    """Canary against baseline error rates (percent); ``difference_pct`` > 0: more errors."""

    p_value: float  # one-sided: the canary fails more often
    canary_rate_pct: float
    baseline_rate_pct: float
    difference_pct: Interval


@dataclass(frozen=True)
class Judgement:
    """One look's verdict with every number behind it."""

    verdict: str
    reasons: list[str]
    canary_samples: int
    baseline_samples: int
    information: float  # the fraction of the planned sample seen
    level: float  # the false-alarm level this look was tested at
    spent: float  # the false-alarm probability spent up to and including this look
    latency: LatencyComparison | None = None
    errors: ErrorComparison | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def spent_alpha(information: float, alpha: float) -> float:
    """O'Brien-Fleming-type spending (Lan-DeMets): the false-alarm probability that may be
    spent once ``information`` (0..1) of the planned sample has been seen."""
    if information <= 0:
        return 0.0
    t = min(information, 1.0)
    z = stats.norm.isf(alpha / 2)
    return float(min(alpha, 2.0 - 2.0 * stats.norm.cdf(z / math.sqrt(t))))


def hodges_lehmann(canary: np.ndarray, baseline: np.ndarray, confidence: float) -> Interval:
    """The Hodges-Lehmann shift (canary - baseline) with its distribution-free interval: the
    order statistics of the pairwise differences that the Mann-Whitney distribution (normal
    approximation) puts at the interval's ends."""
    a = _thin(np.sort(canary))
    b = _thin(np.sort(baseline))
    n, m = len(a), len(b)
    diffs = (a[:, None] - b[None, :]).ravel()
    total = diffs.size
    z = stats.norm.isf((1 - confidence) / 2)
    k = math.floor(total / 2 - z * math.sqrt(n * m * (n + m + 1) / 12))
    k = min(max(k, 0), total - 1)
    hi_index = total - 1 - k
    middle = (total - 1) // 2, total // 2
    picked = np.partition(diffs, sorted({k, hi_index, *middle}))
    estimate = float((picked[middle[0]] + picked[middle[1]]) / 2)
    return Interval(estimate, float(picked[k]), float(picked[hi_index]))


def _thin(ordered: np.ndarray) -> np.ndarray:
    if len(ordered) <= MAX_PAIRWISE_SIDE:
        return ordered
    picks = np.linspace(0, len(ordered) - 1, MAX_PAIRWISE_SIDE).round().astype(int)
    return ordered[picks]


def compare_latency(canary: Sequence[float], baseline: Sequence[float],
                    confidence: float = 0.95) -> LatencyComparison:
    """Canary against baseline latencies (ms); both need at least one sample."""
    a = np.asarray(canary, dtype=float)
    b = np.asarray(baseline, dtype=float)
    if not len(a) or not len(b):
        raise ValueError("both sides need samples")
    test = stats.mannwhitneyu(a, b, alternative="greater", method="asymptotic")
    shift = hodges_lehmann(a, b, confidence)
    base = float(np.median(b))
    scale = 100.0 / base if base > 0 else 0.0
    return LatencyComparison(
        p_value=float(test.pvalue),
        shift_ms=shift,
        shift_pct=Interval(shift.estimate * scale, shift.low * scale, shift.high * scale),
        canary_p50_ms=float(np.quantile(a, 0.50)),
        baseline_p50_ms=base,
        canary_p95_ms=float(np.quantile(a, 0.95)),
        baseline_p95_ms=float(np.quantile(b, 0.95)),
        canary_p99_ms=float(np.quantile(a, 0.99)),
        baseline_p99_ms=float(np.quantile(b, 0.99)),
    )


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def compare_errors(canary_errors: int, canary_total: int, baseline_errors: int,
                   baseline_total: int, confidence: float = 0.95) -> ErrorComparison:
    """Canary against baseline error counts: Fisher's exact test (one-sided) and Newcombe's
    interval for the difference of the rates, in percentage points."""
    if canary_total <= 0 or baseline_total <= 0:
        raise ValueError("both sides need samples")
    table = [[canary_errors, canary_total - canary_errors],
             [baseline_errors, baseline_total - baseline_errors]]
    p_value = float(stats.fisher_exact(table, alternative="greater").pvalue)
    z = stats.norm.isf((1 - confidence) / 2)
    p1, p2 = canary_errors / canary_total, baseline_errors / baseline_total
    l1, u1 = _wilson(canary_errors, canary_total, z)
    l2, u2 = _wilson(baseline_errors, baseline_total, z)
    diff = p1 - p2
    low = diff - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = diff + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return ErrorComparison(
        p_value=p_value,
        canary_rate_pct=100 * p1,
        baseline_rate_pct=100 * p2,
        difference_pct=Interval(100 * diff, 100 * low, 100 * high),
    )


def judge(
    canary_ms: Sequence[float],
    canary_errors: int,
    baseline_ms: Sequence[float],
    baseline_errors: int,
    config: JudgeConfig,
    *,
    spent_before: float = 0.0,
) -> Judgement:
    """One look at a canary against its baseline over the same window.

    ``canary_ms`` and ``baseline_ms`` are the latencies of every request of each side in the
    window; ``*_errors`` how many of them failed. ``spent_before`` is the false-alarm
    probability earlier looks of this analysis spent (the previous judgement's ``spent``).
    """
    n, m = len(canary_ms), len(baseline_ms)
    information = min(n, m) / config.planned_samples
    if min(n, m) < config.min_samples:
        return Judgement(
            INCONCLUSIVE, [f"not enough requests yet: {n} canary, {m} baseline "
                           f"(at least {config.min_samples} each)"],
            n, m, information, 0.0, spent_before,
        )
    spent = max(spent_alpha(information, config.alpha), spent_before)
    # Each look may spend what the spending function has added since the last one; the two
    # tests (latency, errors) share it.
    level = max(spent - spent_before, 0.0) / 2
    latency = compare_latency(canary_ms, baseline_ms, config.confidence)
    errors = compare_errors(canary_errors, n, baseline_errors, m, config.confidence)
    reasons = []
    if latency.p_value < level and latency.shift_pct.estimate > config.latency_tolerance_pct:
        reasons.append(
            f"latency: the canary is {latency.shift_pct.estimate:.1f}% slower (interval "
            f"{latency.shift_pct.low:.1f}% to {latency.shift_pct.high:.1f}%, p = "
            f"{latency.p_value:.2g} < {level:.2g}), beyond the {config.latency_tolerance_pct:g}% "
            "allowed")
    if errors.p_value < level and errors.difference_pct.estimate > config.error_tolerance_pct:
        reasons.append(
            f"errors: {errors.canary_rate_pct:.2f}% against {errors.baseline_rate_pct:.2f}% "
            f"(+{errors.difference_pct.estimate:.2f} points, p = {errors.p_value:.2g} < "
            f"{level:.2g}), beyond the {config.error_tolerance_pct:g} points allowed")
    if reasons:
        verdict = FAIL
    elif information < 1:
        verdict = INCONCLUSIVE
        reasons.append(f"{min(n, m)} of {config.planned_samples} planned requests a side: "
                       "no regression shown yet")
    elif (latency.shift_pct.high <= config.latency_tolerance_pct
          and errors.difference_pct.high <= config.error_tolerance_pct):
        verdict = PASS
        reasons.append(
            f"at most {max(latency.shift_pct.high, 0):.1f}% slower and "
            f"{max(errors.difference_pct.high, 0):.2f} points more errors "
            f"({config.confidence:.0%} intervals), within what is allowed")
    else:
        verdict = INCONCLUSIVE
        reasons.append("the planned sample is reached but the intervals do not rule out a "
                       "regression beyond the tolerance: a person decides")
    return Judgement(verdict, reasons, n, m, information, level, spent, latency, errors)


def judge_samples(canary: Sequence[Any], baseline: Sequence[Any], config: JudgeConfig, *,
                  spent_before: float = 0.0) -> Judgement:
    """:func:`judge` over per-request samples (``rollouts.traffic.sample_types.Sample``: ``latency_ms``
    and ``is_error``) of the canary and the baseline, taken over the same window."""
    return judge(
        [s.latency_ms for s in canary], sum(1 for s in canary if s.is_error),
        [s.latency_ms for s in baseline], sum(1 for s in baseline if s.is_error),
        config, spent_before=spent_before,
    )


@dataclass(frozen=True)
class VariantDifference:
    """An A/B comparison of one variant against the reference variant."""

    variant: str
    reference: str
    samples: int
    reference_samples: int
    p50_diff_ms: Interval
    p95_diff_ms: Interval
    error_diff_pct: Interval
    latency_p_value: float  # two-sided Mann-Whitney U
    enough: bool  # the sample detects the target effect with the target power
    more_needed: int  # requests per variant still needed for that (0 when enough)


def bootstrap_quantile_difference(a: np.ndarray, b: np.ndarray, q: float, confidence: float,
                                  rng: np.random.Generator, rounds: int = 400) -> Interval:
    """The difference of the ``q`` quantiles (a - b) with a percentile bootstrap interval."""
    estimate = float(np.quantile(a, q) - np.quantile(b, q))
    ra = rng.choice(a, size=(rounds, len(a)), replace=True)
    rb = rng.choice(b, size=(rounds, len(b)), replace=True)
    diffs = np.quantile(ra, q, axis=1) - np.quantile(rb, q, axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(diffs, [tail, 1 - tail])
    return Interval(estimate, float(low), float(high))


def samples_needed(baseline_ms: Sequence[float], effect_pct: float, alpha: float = 0.05,
                   power: float = 0.8) -> int:
    """Requests per variant for a two-sided Mann-Whitney test to detect a shift of
    ``effect_pct`` of the baseline's median with ``power``: the t-test sample size for the
    shift over the latencies' spread, inflated by the test's worst-case efficiency (0.864)."""
    b = np.asarray(baseline_ms, dtype=float)
    if len(b) < 2:
        raise ValueError("the baseline needs at least 2 samples")
    shift = abs(effect_pct) / 100 * float(np.median(b))
    # A robust spread: the interquartile range of a normal distribution is 1.349 sigma.
    spread = float(np.subtract(*np.quantile(b, [0.75, 0.25]))) / 1.349 or float(np.std(b))
    if shift <= 0 or spread <= 0:
        return 0
    z = stats.norm.isf(alpha / 2) + stats.norm.ppf(power)
    return math.ceil(2 * (z * spread / shift) ** 2 / 0.864)


def ab_difference(
    variant: str, variant_ms: Sequence[float], variant_errors: int,
    reference: str, reference_ms: Sequence[float], reference_errors: int,
    *, effect_pct: float = 5.0, alpha: float = 0.05, power: float = 0.8,
    confidence: float = 0.95, seed: int = 0,
) -> VariantDifference:
    """The A/B verdict's numbers for ``variant`` against ``reference``: differences of p50,
    p95 and error rate with intervals, and whether the sample was large enough to see an
    ``effect_pct`` shift (and how many more requests a variant it needs if not)."""
    a = np.asarray(variant_ms, dtype=float)
    b = np.asarray(reference_ms, dtype=float)
    if len(a) < 2 or len(b) < 2:
        raise ValueError("each variant needs at least 2 samples")
    rng = np.random.default_rng(seed)
    errors = compare_errors(variant_errors, len(a), reference_errors, len(b), confidence)
    test = stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic")
    needed = samples_needed(b, effect_pct, alpha, power)
    have = min(len(a), len(b))
    return VariantDifference(
        variant=variant, reference=reference, samples=len(a), reference_samples=len(b),
        p50_diff_ms=bootstrap_quantile_difference(a, b, 0.50, confidence, rng),
        p95_diff_ms=bootstrap_quantile_difference(a, b, 0.95, confidence, rng),
        error_diff_pct=errors.difference_pct,
        latency_p_value=float(test.pvalue),
        enough=have >= needed,
        more_needed=max(needed - have, 0),
    )
