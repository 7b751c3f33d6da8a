"""The numbers of an A/B split: each variant against the reference, with p50, p95 and error-rate
differences, their intervals, and whether the sample could see the effect the team set; and the
verdict they add up to (:func:`verdict`), where a difference counts only when its interval lies
beyond the minimum effect the team set. Plain numpy and scipy; the A/B verdict of a rollout
(:func:`rollouts.canary.analysis.ab_verdict`) applies them.

An A/B split is judged once, at its end, so its intervals are fixed-sample ones; each is drawn
at ``1 - alpha / (3 x comparisons)`` (three metrics per variant against the reference), so an
A/A split says "no difference" at least ``1 - alpha`` of the time, whatever the sample.

Here every request is a draw of its own. A split by a sticky header is judged per user instead
(:mod:`rollouts.canary.clustered`): one user's requests are alike and all reach one variant."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from rollouts.canary import sequential
from rollouts.canary.verdicts import Interval


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class ErrorComparison:
    """Canary against baseline error rates (percent); ``difference_pct`` > 0: more errors."""

    p_value: float  # one-sided: the canary fails more often
    canary_rate_pct: float
    baseline_rate_pct: float
    difference_pct: Interval


def compare_errors(canary_errors: int, canary_total: int, baseline_errors: int,
                   baseline_total: int, confidence: float = 0.95) -> ErrorComparison:
    """Canary against baseline error counts at one look: Fisher's exact test (one-sided) and
    Newcombe's interval for the difference of the rates, in percentage points."""
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
    return ErrorComparison(p_value, 100 * p1, 100 * p2, Interval(100 * diff, 100 * low, 100 * high))


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
    # "request", or "user" for a sticky split judged per user (rollouts.canary.clustered), which
    # also says the users of each side, the design effect of the medians' difference (the
    # sample needed is this many times larger than per request) and the users still needed.
    unit: str = "request"
    users: int | None = None
    reference_users: int | None = None
    design_effect: float = 1.0
    more_users_needed: int | None = None


def quantile_difference(a: sequential.Sorted, b: sequential.Sorted, q: float,
                        confidence: float) -> Interval:
    """The difference of the ``q`` quantiles (a - b), resolution-aware, with a normal interval
    on Woodruff's standard errors (for any sample size, without resampling it)."""
    estimate = a.quantile(q) - b.quantile(q)
    se_a, se_b = a.quantile_se(q), b.quantile_se(q)
    if se_a is None or se_b is None:
        return Interval(estimate, -math.inf, math.inf)
    half = stats.norm.isf((1 - confidence) / 2) * math.hypot(se_a, se_b)
    return Interval(estimate, estimate - half, estimate + half)


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
    confidence: float = 0.95,
) -> VariantDifference:
    """The A/B verdict's numbers for ``variant`` against ``reference``: differences of p50,
    p95 and error rate with intervals at ``confidence``, and whether the sample was large
    enough to see an ``effect_pct`` shift (and how many more requests a variant it needs if
    not). ``*_ms``: the answered requests' latencies; ``*_errors``: the failed requests."""
    a = np.asarray(variant_ms, dtype=float)
    b = np.asarray(reference_ms, dtype=float)
    if len(a) < 2 or len(b) < 2:
        raise ValueError("each variant needs at least 2 samples")
    step = max(sequential.resolution(a), sequential.resolution(b))
    sa, sb = sequential.Sorted(a, step), sequential.Sorted(b, step)
    errors = compare_errors(variant_errors, len(a) + variant_errors, reference_errors,
                            len(b) + reference_errors, confidence)
    test = stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic")
    needed = samples_needed(b, effect_pct, alpha, power)
    have = min(len(a), len(b))
    return VariantDifference(
        variant=variant, reference=reference, samples=len(a), reference_samples=len(b),
        p50_diff_ms=quantile_difference(sa, sb, 0.50, confidence),
        p95_diff_ms=quantile_difference(sa, sb, 0.95, confidence),
        error_diff_pct=errors.difference_pct,
        latency_p_value=float(test.pvalue),
        enough=have >= needed,
        more_needed=max(needed - have, 0),
    )


def classify(diff: VariantDifference, reference_p50_ms: float, reference_p95_ms: float,
             min_effect_pct: float, min_error_points: float) -> str:
    """``better``, ``worse``, ``mixed`` or ``none``: a metric counts as better (worse) only when
    its whole interval lies beyond the minimum effect: ``min_effect_pct`` of the reference's
    p50 or p95, ``min_error_points`` percentage points of errors."""
    p50_margin = min_effect_pct / 100 * reference_p50_ms
    p95_margin = min_effect_pct / 100 * reference_p95_ms
    p50, p95, err = diff.p50_diff_ms, diff.p95_diff_ms, diff.error_diff_pct
    slower = p50.low > p50_margin or p95.low > p95_margin
    faster = p50.high < -p50_margin or p95.high < -p95_margin
    more_errors, fewer_errors = err.low > min_error_points, err.high < -min_error_points
    if (slower or more_errors) and not (faster or fewer_errors):
        return "worse"
    if (faster or fewer_errors) and not (slower or more_errors):
        return "better"
    if slower or faster or more_errors or fewer_errors:
        return "mixed"
    return "none"
