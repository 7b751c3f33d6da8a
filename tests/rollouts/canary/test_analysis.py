"""The canary judge and the A/B numbers (rollouts/canary/judge.py) on simulated request samples.

Latencies are log-normal around 5 ms (sigma 0.3, like a Triton model's), errors Bernoulli; each
test draws from its own seeded generator, so every run sees the same samples.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollouts.canary.judge import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    JudgeConfig,
    ab_difference,
    compare_errors,
    hodges_lehmann,
    judge,
    samples_needed,
    spent_alpha,
)

CONFIG = JudgeConfig(planned_samples=2000, min_samples=100)
LOOKS = 10  # the judge looks every 200 requests a side


def latencies(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    return rng.lognormal(math.log(5.0), 0.3, n) * scale


def run(rng: np.random.Generator, *, scale: float = 1.0, canary_errors: float = 0.01,
        baseline_errors: float = 0.01, config: JudgeConfig = CONFIG):
    """One canary analysis looked at LOOKS times as its samples grow: the first failing
    judgement, or the last one."""
    size = config.planned_samples
    canary, baseline = latencies(rng, size, scale), latencies(rng, size)
    c_err, b_err = rng.random(size) < canary_errors, rng.random(size) < baseline_errors
    spent = 0.0
    for look in range(1, LOOKS + 1):
        n = size * look // LOOKS
        judgement = judge(canary[:n], int(c_err[:n].sum()), baseline[:n], int(b_err[:n].sum()),
                          config, spent_before=spent)
        spent = judgement.spent
        if judgement.verdict == FAIL:
            break
    return judgement


def test_spending_is_nothing_early_everything_at_the_planned_sample_and_never_shrinks():
    spent = [spent_alpha(t / 10, 0.05) for t in range(0, 11)]

    assert spent[0] == 0.0
    assert spent[1] < 1e-6  # a tenth of the sample: only overwhelming evidence fails a canary
    assert spent[10] == pytest.approx(0.05)
    assert spent == sorted(spent)
    assert spent_alpha(3.0, 0.05) == pytest.approx(0.05)


def test_identical_canaries_looked_at_ten_times_raise_no_false_alarm_and_mostly_pass():
    rng = np.random.default_rng(11)

    verdicts = [run(rng).verdict for _ in range(40)]

    # Over every look, a false alarm has at most a 5% chance per analysis; 40 analyses would
    # see 2 on average at that bound, and the union bound keeps the real rate well under it.
    assert verdicts.count(FAIL) <= 2, verdicts
    assert verdicts.count(PASS) >= 30, verdicts


def test_a_canary_30_percent_slower_fails_at_the_first_look_with_the_evidence():
    judgement = run(np.random.default_rng(12), scale=1.3)

    assert judgement.verdict == FAIL
    assert judgement.canary_samples == 200  # the first look
    shift = judgement.latency.shift_pct
    assert shift.low > 15 and shift.low < shift.estimate < shift.high
    assert 20 < shift.estimate < 40
    assert judgement.latency.p_value < judgement.level
    assert judgement.reasons[0].startswith("latency: the canary is ")
    assert judgement.to_json()["latency"]["shift_pct"]["estimate"] == shift.estimate


def test_a_canary_10_percent_slower_is_caught_before_the_planned_sample_nearly_always():
    rng = np.random.default_rng(13)

    judgements = [run(rng, scale=1.10) for _ in range(20)]

    caught = [j for j in judgements if j.verdict == FAIL]
    assert len(caught) >= 19
    assert all(j.canary_samples < CONFIG.planned_samples for j in caught)


def test_a_slower_canary_within_the_tolerance_is_not_failed():
    rng = np.random.default_rng(14)
    config = JudgeConfig(planned_samples=2000, min_samples=100, latency_tolerance_pct=20)

    judgement = run(rng, scale=1.05, config=config)

    assert judgement.verdict == PASS, judgement.reasons


def test_a_canary_failing_five_times_as_often_fails_on_errors():
    judgement = run(np.random.default_rng(15), canary_errors=0.05)

    assert judgement.verdict == FAIL
    assert judgement.reasons[0].startswith("errors: ")
    difference = judgement.errors.difference_pct
    assert difference.low > 1 and 2 < difference.estimate < 6


def test_no_verdict_before_the_minimum_sample():
    rng = np.random.default_rng(16)

    judgement = judge(latencies(rng, 99, scale=3.0), 50, latencies(rng, 500), 0, CONFIG)

    assert judgement.verdict == INCONCLUSIVE
    assert judgement.latency is None and judgement.level == 0.0
    assert "not enough requests yet: 99 canary, 500 baseline" in judgement.reasons[0]


def test_the_planned_sample_without_a_clear_answer_is_inconclusive_for_a_person():
    rng = np.random.default_rng(17)
    config = JudgeConfig(planned_samples=100, min_samples=100, latency_tolerance_pct=1)

    judgement = judge(latencies(rng, 100), 1, latencies(rng, 100), 1, config)

    assert judgement.verdict == INCONCLUSIVE
    assert "a person decides" in judgement.reasons[0]


def test_hodges_lehmann_finds_a_known_shift_and_its_interval_covers_it():
    rng = np.random.default_rng(18)
    base = latencies(rng, 800)

    shift = hodges_lehmann(base + 2.0, base[rng.permutation(800)], 0.95)
    exact = hodges_lehmann(np.array([3.0, 4.0, 5.0]), np.array([1.0, 2.0]), 0.95)

    assert shift.low < 2.0 < shift.high and shift.estimate == pytest.approx(2.0, abs=0.15)
    # Differences 1, 2, 2, 3, 3, 4: the median is 2.5.
    assert exact.estimate == 2.5


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
