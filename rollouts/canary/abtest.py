"""The numbers of an A/B split: each variant against the reference, with p50, p95 and error-rate
differences, their intervals, and whether the sample could see the effect the team set. Plain
numpy and scipy; the A/B verdict (:func:`rollouts.canary.analysis.ab_verdict`) reads them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from rollouts.canary.judge import Interval, compare_errors


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
