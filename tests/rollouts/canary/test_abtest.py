"""The numbers of an A/B split (rollouts/canary/abtest.py) on simulated request samples: log-normal
latencies around 5 ms (sigma 0.3), each test from its own seeded generator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollouts.canary.abtest import ab_difference, classify, samples_needed
from rollouts.canary.judge import compare_errors


def latencies(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    return rng.lognormal(math.log(5.0), 0.3, n) * scale


def test_the_error_interval_and_test_agree_with_the_counts():
    worse = compare_errors(50, 1000, 10, 1000)
    same = compare_errors(10, 1000, 10, 1000)

    assert worse.canary_rate_pct == 5.0 and worse.baseline_rate_pct == 1.0
    assert worse.difference_pct.low > 0 and worse.p_value < 1e-6
    assert same.difference_pct.low < 0 < same.difference_pct.high and same.p_value > 0.4


def test_an_ab_split_between_equal_variants_shows_no_difference():
    rng = np.random.default_rng(19)

    result = ab_difference("v2", latencies(rng, 3000), 30, "v1", latencies(rng, 3000), 30)

    assert result.p50_diff_ms.low < 0 < result.p50_diff_ms.high
    assert result.p95_diff_ms.low < 0 < result.p95_diff_ms.high
    assert result.error_diff_pct.low < 0 < result.error_diff_pct.high
    assert result.latency_p_value > 0.01
    assert result.enough and result.more_needed == 0


def test_an_ab_split_with_a_real_difference_has_its_sign_and_an_interval_without_zero():
    rng = np.random.default_rng(20)

    faster = ab_difference("v2", latencies(rng, 3000, 0.8), 30, "v1", latencies(rng, 3000), 30)

    assert faster.p50_diff_ms.high < 0  # v2 is faster: its p50 minus v1's is negative
    assert faster.p50_diff_ms.estimate == pytest.approx(-1.0, abs=0.2)
    assert faster.latency_p_value < 1e-6


def test_too_small_an_ab_sample_says_how_many_more_requests_it_needs():
    rng = np.random.default_rng(21)
    baseline = latencies(rng, 200)

    small = ab_difference("v2", latencies(rng, 200), 2, "v1", baseline, 2, effect_pct=2)
    needed = samples_needed(baseline, 2)

    assert not small.enough
    assert small.more_needed == needed - 200 > 0
    # Half the effect needs about four times the sample.
    assert samples_needed(baseline, 1) == pytest.approx(4 * needed, rel=0.01)


def _rounded(rng, n, scale=1.0):
    x = latencies(rng, n, scale)
    return np.floor(x + rng.random(n))


def test_an_aa_split_says_no_difference_at_the_stated_rate_on_millisecond_samples():
    """300 A/A splits of 2,000 requests a variant, recorded in whole milliseconds, judged as
    the rollout does (each interval at 1 - alpha/3): "none" at least 1 - alpha of the time,
    where intervals without the minimum effect said "better" or "worse" far more often."""
    rng = np.random.default_rng(30)
    verdicts, naive = [], 0
    for _ in range(300):
        a, b = _rounded(rng, 2000), _rounded(rng, 2000)
        diff = ab_difference("v2", a, 2, "v1", b, 2, confidence=1 - 0.05 / 3)
        verdicts.append(classify(diff, float(np.median(b)), float(np.quantile(b, 0.95)), 5.0, 0.2))
        loose = ab_difference("v2", a, 2, "v1", b, 2, confidence=0.95)
        naive += classify(loose, 1.0, 1.0, 0.0, 0.0) != "none"
    assert verdicts.count("none") >= 0.95 * 300, {v: verdicts.count(v) for v in set(verdicts)}
    assert naive > verdicts.count("better") + verdicts.count("worse")


def test_a_difference_counts_only_beyond_the_minimum_effect():
    rng = np.random.default_rng(31)
    b = _rounded(rng, 20000)

    faster = ab_difference("v2", _rounded(rng, 20000, 0.8), 10, "v1", b, 10, confidence=0.98)
    slightly = ab_difference("v2", _rounded(rng, 20000, 0.98), 10, "v1", b, 10, confidence=0.98)
    errors = ab_difference("v2", _rounded(rng, 20000), 400, "v1", b, 10, confidence=0.98)

    ref = float(np.median(b)), float(np.quantile(b, 0.95))
    assert classify(faster, *ref, 5.0, 0.2) == "better"
    assert classify(slightly, *ref, 5.0, 0.2) == "none"  # 2% faster: below the 5% that counts
    assert classify(slightly, *ref, 0.0, 0.2) == "better"  # ... which a zero minimum would call
    assert classify(errors, *ref, 5.0, 0.2) == "worse"  # 2% errors against 0.05%
