"""The canary judge (rollouts/canary/judge.py, rollouts/canary/sequential.py) on simulated
requests shaped like a Triton model's: log-normal latencies around 5 ms (sigma 0.3), on
continuous data and as nginx records them (whole milliseconds between two clock reads, so
ties and rounding are exercised). Each test draws from its own seeded generator.

The error rates the judge claims are measured by ``bench/judge.py`` (1,000 runs a scenario);
these tests pin the behaviour each of them rests on.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from rollouts.canary import sequential
from rollouts.canary.judge import (
    FAIL,
    GUARDS,
    INCONCLUSIVE,
    Arm,
    JudgeConfig,
    Recent,
    block_alpha,
    judge,
    judge_samples,
)
from rollouts.traffic.sample_types import Sample

CONFIG = JudgeConfig()


def latencies(rng: np.random.Generator, n: int, scale: float = 1.0, *, median: float = 5.0,
              rounded: bool = True) -> np.ndarray:
    x = rng.lognormal(math.log(median), 0.3, n) * scale
    return np.floor(x + rng.random(n)) if rounded else x


def arm(values: np.ndarray, errors: int = 0, client_errors: int = 0) -> Arm:
    return Arm(np.asarray(values, dtype=float), errors, client_errors)


def metric(judgement, name):
    return next(m for m in judgement.metrics + judgement.gates if m.name == name)


def looks(rng, *, canary_n, baseline_n, scale=1.0, rounded=True, config=CONFIG, steps=10,
          canary_errors=0.0, baseline_errors=0.0, median=5.0):
    """A canary looked at ``steps`` times as its requests grow: every judgement."""
    c = latencies(rng, canary_n, scale, median=median, rounded=rounded)
    b = latencies(rng, baseline_n, median=median, rounded=rounded)
    ce, be = rng.random(canary_n) < canary_errors, rng.random(baseline_n) < baseline_errors
    out = []
    for k in range(1, steps + 1):
        nc, nb = canary_n * k // steps, baseline_n * k // steps
        out.append(judge(Arm(c[:nc][~ce[:nc]], int(ce[:nc].sum()), 0),
                         Arm(b[:nb][~be[:nb]], int(be[:nb].sum()), 0), config))
    return out


# --------------------------------------------------------------------------------------------
# The bounds
# --------------------------------------------------------------------------------------------


def test_the_anytime_bound_lies_where_the_mixture_reaches_one_over_alpha_and_costs_more_than_one_look():
    for variance, tau, alpha in ((1.0, 1.0, 0.05), (0.01, 0.5, 0.01), (1e-4, 0.1, 0.0167)):
        z = sequential.bound_multiplier(variance, tau, alpha)
        rho = tau * tau / variance
        rounded_rho = math.exp(round(math.log(rho) * 20) / 20)
        assert sequential.log_mixture_ratio(z, rounded_rho) == pytest.approx(math.log(1 / alpha), abs=1e-4)
        # Valid at every look, it is wider than a bound for one planned look.
        assert z > 1.6449 if alpha == 0.05 else z > 2.3263
    assert sequential.bound_multiplier(1.0, 1.0, 0.01) > sequential.bound_multiplier(1.0, 1.0, 0.05)


def test_a_random_walk_looked_at_every_step_crosses_the_bound_at_most_alpha_of_the_time():
    """The property the whole judge rests on, checked on its own: the running mean of
    standard normal increments, looked at after each of 400 of them, crosses its anytime
    lower bound (above 0) in at most alpha of 2,000 runs (about 1% is expected: the bound is
    conservative), where a fixed 1.645 would cross most of the time."""
    rng = np.random.default_rng(1)
    runs, steps, alpha = 2000, 400, 0.05
    sums = np.cumsum(rng.standard_normal((runs, steps)), axis=1)
    n = np.arange(1, steps + 1)
    z = np.array([sequential.bound_multiplier(1.0 / k, 0.5, alpha) for k in n])
    crossed = ((sums / n - z / np.sqrt(n)) > 0).any(axis=1).mean()
    naive = ((sums / n - 1.645 / np.sqrt(n)) > 0).any(axis=1).mean()
    assert crossed <= alpha, crossed
    assert naive > 3 * alpha, naive


def test_the_recording_step_is_found_and_ties_are_spread_over_it():
    ms = np.array([4.0, 5.0, 5.0, 5.0, 6.0, 5.0, 4.0, 7.0])
    ordered = sequential.Sorted(ms)

    assert ordered.step == 1.0
    assert sequential.resolution(np.array([1.234, 5.678, 2.5])) == 0.0  # continuous
    # Two of eight below 4.5, four of eight on 5 (spread over 4.5-5.5): the median is 5.0.
    assert ordered.quantile(0.5) == pytest.approx(5.0)
    assert ordered.quantile(0.25) == pytest.approx(4.5)
    # A sample median of tied data would not move; the spread quantile does.
    slower = sequential.Sorted(np.array([4.0, 5.0, 5.0, 6.0, 6.0, 5.0, 5.0, 7.0]))
    assert slower.quantile(0.5) > ordered.quantile(0.5)


# --------------------------------------------------------------------------------------------
# Latency
# --------------------------------------------------------------------------------------------


def test_a_7_percent_slowdown_at_a_5_ms_median_in_whole_milliseconds_fails_and_never_passes():
    # 2% beyond a 5% tolerance takes thousands of canary requests to show.
    judgements = looks(np.random.default_rng(2), canary_n=15000, baseline_n=60000, scale=1.07)

    assert not any(j.within for j in judgements)
    assert judgements[-1].verdict == FAIL
    median = metric(judgements[-1], "median")
    assert judgements[-1].resolution_ms == 1.0
    assert median.state == FAIL and median.low > math.log(1.05)
    assert "slower" in judgements[-1].reasons[0] and "beyond it" in judgements[-1].reasons[0]


def test_identical_versions_in_whole_milliseconds_are_shown_within_and_never_failed():
    rng = np.random.default_rng(3)
    ends = []
    for _ in range(30):
        judgements = looks(rng, canary_n=3000, baseline_n=6000, steps=6)
        assert all(j.verdict != FAIL for j in judgements)
        ends.append(judgements[-1].within)
    assert sum(ends) >= 27, ends


def test_a_gross_regression_is_failed_after_a_handful_of_requests():
    rng = np.random.default_rng(4)
    canary, baseline = latencies(rng, 200, 2.6), latencies(rng, 4000)

    first = next(n for n in range(10, 201) if judge(arm(canary[:n]), arm(baseline), CONFIG).verdict == FAIL)

    assert first <= 25, first


def test_a_tolerance_finer_than_the_recording_step_is_said_and_never_passes():
    """Sub-millisecond latencies recorded in whole milliseconds: the baseline's median is
    below 1 ms, and 5% of it cannot be seen."""
    rng = np.random.default_rng(5)
    judgement = looks(rng, canary_n=5000, baseline_n=5000, median=0.6)[-1]

    median = metric(judgement, "median")
    assert median.state == "unresolved" and not judgement.within
    assert "finer than the 1 ms the samples are recorded in" in median.note
    assert judgement.verdict == INCONCLUSIVE


def test_a_p99_regression_with_the_median_and_p95_unchanged_fails_on_the_tail():
    rng = np.random.default_rng(6)
    z_c = rng.standard_normal(8000)
    ramp = np.clip((z_c - 1.81) / (2.326 - 1.81), 0, None)  # p96.5 upwards, +50% at p99
    canary = 5.0 * np.exp(0.3 * z_c) * (1 + 0.5 * ramp)
    baseline = latencies(rng, 30000, rounded=False)

    judgement = judge(arm(canary), arm(baseline), CONFIG)

    assert metric(judgement, "median").state != FAIL
    assert np.quantile(canary, 0.95) == pytest.approx(np.quantile(baseline, 0.95), rel=0.03)
    tail = metric(judgement, "tail")
    assert judgement.verdict == FAIL and tail.state == FAIL and tail.low > math.log(1.1)
    assert "slowest requests (above the baseline's p95)" in judgement.reasons[0]


def test_a_slower_slowest_hundredth_fails_on_the_share_past_the_baselines_p99():
    """p99 50% slower from p96.5 up, on whole milliseconds, with 3,000 canary requests: about
    twice the baseline's share is past its p99, shown beyond the 10% tolerance; an identical
    version's share stays within its bounds."""
    rng = np.random.default_rng(16)
    z_c = rng.standard_normal(3000)
    ramp = np.clip((z_c - 1.81) / (2.326 - 1.81), 0, None)
    canary = np.floor(5.0 * np.exp(0.3 * z_c) * (1 + 0.5 * ramp) + rng.random(3000))
    baseline = latencies(rng, 40000)

    share = metric(judge(arm(canary), arm(baseline), CONFIG), "tail99")

    assert share.state == FAIL and share.low > math.log(1.1), share
    assert share.canary > 1.7 * share.baseline
    same = metric(judge(arm(latencies(rng, 3000)), arm(baseline), CONFIG), "tail99")
    assert same.state != FAIL and same.low < 0 < same.high
    assert "tail99" in GUARDS  # it fails a canary, never holds a pass


def test_bounds_use_every_sample_so_they_narrow_as_requests_grow():
    rng = np.random.default_rng(7)
    widths = []
    for n in (2000, 20000):
        m = metric(judge(arm(latencies(rng, n)), arm(latencies(rng, n)), CONFIG), "median")
        widths.append(m.high - m.low)
    # Ten times the requests: about sqrt(10) narrower (the bound's log term grows a little).
    assert 2.2 < widths[0] / widths[1] < 3.6, widths


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def test_ten_times_the_errors_fails_though_the_rates_are_both_small():
    judgements = looks(np.random.default_rng(8), canary_n=10000, baseline_n=40000,
                       canary_errors=0.01, baseline_errors=0.001)

    assert judgements[-1].verdict == FAIL
    errors = metric(judgements[-1], "errors")
    assert errors.state == FAIL and errors.low > CONFIG.error_tolerance_pct / 100
    assert errors.canary == pytest.approx(0.01, abs=0.003)


def test_a_few_requests_errors_are_bounded_by_what_the_excess_can_be():
    """14 canary requests and no errors: the anytime-valid bounds of the excess over twice the
    baseline's rate reach far past what it can be (-270 to +200 points were shown); they are
    shown within it, from every baseline request failing (-200 points) to every canary one
    (+100), and the state is what the bounds say."""
    rng = np.random.default_rng(10)
    found = metric(judge(arm(latencies(rng, 14)), arm(latencies(rng, 439)), CONFIG), "errors")
    assert found.low == -2.0 and found.high == 1.0, found
    assert found.state == "open" and found.shown()["low"] == -200.0 and found.shown()["high"] == 100.0


def _sample(status: int, latency: float, upstream: str = "200") -> Sample:
    return Sample(0.0, 1, "v", False, status, latency, latency, 10, upstream, "a", "POST", "/", "r")


def test_fast_failures_stay_out_of_the_latency_and_4xx_answers_are_counted_apart():
    rng = np.random.default_rng(9)
    base = [_sample(200, float(v)) for v in latencies(rng, 3000)]
    # The canary: as fast as the baseline when it answers, and 20% of its requests fail in
    # 1 ms; 10% more are the client's own 400s.
    canary = ([_sample(200, float(v)) for v in latencies(rng, 2100)]
              + [_sample(500, 1.0, "500")] * 600 + [_sample(400, 1.0, "400")] * 300)

    judgement = judge_samples(canary, base, CONFIG)

    median = metric(judgement, "median")
    assert abs(median.estimate) < math.log(1.05)  # not "faster": failures are not latencies
    errors = metric(judgement, "errors")
    assert errors.canary == pytest.approx(600 / 3000) and errors.state == FAIL
    assert judgement.client_errors == {"canary": 300, "baseline": 0}
    # A timeout is an error, and a slow request too (at least as slow as it waited).
    timeouts = Arm.of([_sample(499, 30000.0, ""), _sample(200, 5.0), _sample(404, 2.0, "404")])
    assert (timeouts.errors, timeouts.client_errors) == (1, 1)
    assert sorted(timeouts.latencies) == [5.0, 30000.0]


def test_requests_that_time_out_count_as_slow_so_a_hanging_canary_fails_on_latency_too():
    """A canary whose slowest 8% run into the router's 60 s deadline (504): with the error
    budget opened wide, only the latency metrics can see it, and they do."""
    rng = np.random.default_rng(21)
    base = [_sample(200, float(v)) for v in latencies(rng, 3000)]
    canary = ([_sample(200, float(v)) for v in latencies(rng, 2760)]
              + [_sample(504, 60000.0, "504")] * 240)
    lenient = JudgeConfig(error_tolerance_pct=50)

    judgement = judge_samples(canary, base, lenient)

    assert metric(judgement, "errors").state != FAIL
    assert judgement.verdict == FAIL and metric(judgement, "tail").state == FAIL
    dropped = judge(Arm(Arm.of(canary).latencies[Arm.of(canary).latencies < 60000], 240, 0),
                    Arm.of(base), lenient)
    assert dropped.verdict != FAIL  # what dropping them would have shown


def _streamed(rng, n: int, ttft_scale: float, *, stream: bool = True) -> list[Sample]:
    first = latencies(rng, n, ttft_scale, median=40.0)
    rest = latencies(rng, n, median=400.0)
    return [Sample(0.0, 1, "v", False, 200, f + r + 1, f + r, 900, "200", "a", "POST",
                   "/v1/completions", f"r{i}", "", f, stream)
            for i, (f, r) in enumerate(zip(first, rest, strict=True))]


def test_an_llm_route_judges_the_time_to_first_token_and_the_generation_apart():
    """First tokens 40% slower are hidden in the total time of 440 ms answers (+4%, within
    5%), and found on ``ttft``; only streamed answers are read, and only on a streamed route."""
    rng = np.random.default_rng(22)
    base, canary = _streamed(rng, 1500, 1.0), _streamed(rng, 1500, 1.4)
    llm = JudgeConfig(streamed=True)

    judgement = judge_samples(canary, base, llm)

    assert llm.alpha_per_test() == pytest.approx(0.05 / 7)
    assert metric(judgement, "ttft").state == FAIL and judgement.verdict == FAIL
    assert metric(judgement, "generation").state != FAIL
    assert "ttft" in GUARDS and "generation" in GUARDS
    assert not any(m.name == "ttft" for m in judge_samples(canary, base, CONFIG).metrics)
    unstreamed = Arm.of(_streamed(rng, 10, 1.0, stream=False))
    assert len(unstreamed.ttft) == 0 and len(unstreamed.latencies) == 10


def _tokened(rng, n: int, per_token_ms: float, tokens: int, *, timed: bool = True) -> list[Sample]:
    """Streamed answers of ``tokens`` tokens each, ``per_token_ms`` apart (lognormal), after a
    40 ms first token; ``timed``: the router counted the tokens (first_ms, tokens)."""
    first = latencies(rng, n, median=40.0)
    gap = rng.lognormal(math.log(per_token_ms), 0.2, n)
    return [Sample(0.0, 1, "v", False, 200, f + g * (tokens - 1) + 1, f + g * (tokens - 1),
                   900, "200", "a", "POST", "/v1/completions", f"r{i}", "", f, True,
                   f if timed else None, tokens if timed else None)
            for i, (f, g) in enumerate(zip(first, gap, strict=True))]


def test_where_the_router_counts_tokens_the_time_per_output_token_is_judged():
    """A version that writes each token 30% slower but answers 30% shorter takes as long per
    answer (its generation time is the baseline's): the time per output token finds it,
    where the router counts tokens; without counts the generation time is judged in its place,
    in the same slot of the budget."""
    rng = np.random.default_rng(23)
    llm = JudgeConfig(streamed=True)
    base, canary = _tokened(rng, 1500, 10.0, 100), _tokened(rng, 1500, 13.0, 77)

    judgement = judge_samples(canary, base, llm)

    tpot = metric(judgement, "tpot")
    assert tpot.state == FAIL and judgement.verdict == FAIL
    assert 0.22 < math.expm1(tpot.estimate) < 0.38  # the 30% it is
    assert re.search(r"median time per output token \d+\.\d% slower \(13\.\d ms against "
                     r"10\.\d ms\)", " ".join(judgement.reasons))
    assert not any(m.name == "generation" for m in judgement.metrics)
    assert "tpot" in GUARDS
    untimed = judge_samples(_tokened(rng, 1500, 13.0, 77, timed=False),
                            _tokened(rng, 1500, 10.0, 100, timed=False), llm)
    assert not any(m.name == "tpot" for m in untimed.metrics)
    assert metric(untimed, "generation").state != FAIL and untimed.verdict != FAIL
    assert len(judgement.metrics) == len(untimed.metrics)


# --------------------------------------------------------------------------------------------
# The SLO gates and the verdict's consistency
# --------------------------------------------------------------------------------------------


def test_slo_gates_decide_on_bounds_not_on_a_noisy_point_estimate():
    """A p99 ceiling 15% above the true p99 and 0.6% errors under a 1% ceiling: at 100
    requests a look the point estimates cross them often; the bounds never do."""
    rng = np.random.default_rng(10)
    true_p99 = 5.0 * math.exp(0.3 * 2.326)
    config = JudgeConfig(max_p99_ms=1.15 * true_p99, max_error_rate=1.0)
    crossed_by_estimate = 0
    for _ in range(200):
        canary = latencies(rng, 100, rounded=False)
        errors = int((rng.random(100) < 0.006).sum())
        judgement = judge(arm(canary, errors), arm(latencies(rng, 1900, rounded=False)), config)
        assert all(g.state != FAIL for g in judgement.gates), judgement.reasons
        crossed_by_estimate += np.quantile(canary, 0.99) > 1.15 * true_p99 or errors > 1
    assert crossed_by_estimate > 20
    # A canary well over its ceiling is failed by the gate.
    over = judge(arm(latencies(np.random.default_rng(11), 500, 2.0)), None, config)
    assert over.verdict == FAIL and metric(over, "p99").state == FAIL
    assert "SLO p99" in over.reasons[0]


def test_every_verdict_agrees_with_its_own_bounds_on_tied_and_continuous_data():
    rng = np.random.default_rng(12)
    seen = set()
    for scale in (0.9, 1.0, 1.03, 1.05, 1.07, 1.2):
        for rounded in (True, False):
            for j in looks(rng, canary_n=2000, baseline_n=8000, scale=scale, rounded=rounded,
                           steps=5, canary_errors=0.002, baseline_errors=0.002):
                shown = [m for m in j.metrics if m.low is not None]
                if j.within:
                    # Shown within: the median's and the errors' upper bounds are; the tail
                    # (a guard) is at least not shown beyond.
                    assert all(m.high <= m.tolerance for m in shown if m.name not in GUARDS)
                    assert all(m.low <= m.tolerance for m in shown)
                    assert j.verdict != FAIL
                if j.verdict == FAIL:
                    assert any(m.low > m.tolerance for m in shown + j.gates if m.low is not None)
                    assert not j.within
                seen.add((j.verdict, j.within))
    assert {(FAIL, False), (INCONCLUSIVE, True)} <= seen


def test_the_budget_is_split_over_the_tests_and_the_fresh_starts():
    plain = JudgeConfig()
    gated = JudgeConfig(max_p99_ms=50, max_error_rate=1, fresh_starts=2)

    # The median, the tail, the share past the p99, the errors and the recent window; then
    # each gate.
    assert plain.alpha_per_test() == pytest.approx(0.05 / 5)
    assert gated.alpha_per_test() == pytest.approx(0.05 / 2 / 7)
    assert gated.alpha_per_test(with_baseline=False) == pytest.approx(0.05 / 2 / 2)
    judgement = judge(arm(latencies(np.random.default_rng(13), 50)), None, gated)
    assert judgement.alpha_per_test == pytest.approx(0.0125)
    assert judgement.to_json()["gates"][0]["name"] == "p99"


def test_a_pass_needs_every_upper_bound_within_so_each_is_drawn_at_alpha_alone():
    """Any one lower bound beyond fails the canary, so the lower bounds share the budget; a
    pass needs every metric within, so a version beyond one tolerance passes only if that
    metric's own upper bound is wrong, and each upper bound is drawn at ``alpha`` (over the
    fresh starts). Identical errors (0.1% a side, the demo's) are shown within at 6,000
    requests a side; at the budget's share per test they needed about 7,000."""
    config = JudgeConfig(max_p99_ms=50, max_error_rate=1, fresh_starts=2)
    assert config.alpha_within() == pytest.approx(0.05 / 2)
    rng = np.random.default_rng(5)
    n = 6000
    found = judge(arm(latencies(rng, n - 6), errors=6), arm(latencies(rng, n - 6), errors=6),
                  JudgeConfig(max_p99_ms=50, max_error_rate=1))
    errors = metric(found, "errors")
    assert (found.alpha_per_test, found.alpha_within) == (pytest.approx(0.05 / 7), 0.05)
    assert errors.state == "within", errors
    assert errors.high - errors.estimate < errors.estimate - errors.low
    # Drawn at the fail side's level (the lower bound mirrored), it would not be within yet.
    assert errors.estimate + (errors.estimate - errors.low) > errors.tolerance


def test_a_handful_of_wildly_spread_requests_gives_numbers_not_an_overflow():
    """Bounds on the log scale can be huge at a handful of requests; the words and the
    numbers shown for them stay finite."""
    canary = arm(np.array([1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 5000.0, 60000.0, 1.0, 2.0, 90000.0]))
    judgement = judge(canary, arm(np.full(50, 1.0)), JudgeConfig(max_p50_ms=10.0))

    assert judgement.to_json()["gates"][0]["shown"]["high"] is not None
    assert all(isinstance(r, str) for r in judgement.reasons)


def test_a_version_that_turns_slow_late_is_failed_by_its_recent_window():
    """Ten minutes of identical requests, then one minute 30% slower: over everything the
    median barely moves, but the current window's does (the minute's slow requests also
    push the canary's share past the baseline's p99 up, a guard of its own)."""
    rng = np.random.default_rng(14)
    before_c, before_b = latencies(rng, 12000), latencies(rng, 12000)
    late_c, late_b = latencies(rng, 1200, 1.3), latencies(rng, 1200)
    canary = arm(np.concatenate([before_c, late_c]))
    baseline = arm(np.concatenate([before_b, late_b]))

    plain = judge(canary, baseline, CONFIG)
    windowed = judge(canary, baseline, CONFIG, Recent(arm(late_c), arm(late_b), 11, 60))

    assert metric(plain, "median").state != FAIL
    recent = metric(windowed, "recent")
    assert windowed.verdict == FAIL and recent.state == FAIL
    assert "the last 60 s window (number 11)" in recent.note
    assert any("current window" in reason for reason in windowed.reasons)
    # Each window spends its own share: the eleventh's is alpha * 6 / (pi^2 121).
    assert block_alpha(0.01, 11) == pytest.approx(0.01 * 6 / (math.pi ** 2 * 121))


# --------------------------------------------------------------------------------------------
# A shadow: each copy against its own original
# --------------------------------------------------------------------------------------------


def shadow_requests(rng, n: int, scale: float, *, spread: float = 0.5, own: float = 0.05):
    """``n`` requests served on both sides, as a busy server serves them: each request's own
    cost (its size, the load at that moment) varies widely (log sd ``spread``) and is shared
    by its copy; each side adds a little noise of its own (``own``). Whole milliseconds."""
    shared = rng.lognormal(math.log(5.0), spread, n)
    base = shared * rng.lognormal(0, own, n)
    cand = shared * rng.lognormal(0, own, n) * scale
    return (np.floor(cand + rng.random(n)), np.floor(base + rng.random(n)))


def test_a_shadow_sees_a_10_percent_slowdown_in_pairs_that_two_samples_cannot_yet_see():
    """The same 600 requests on both sides, each 10% slower on the canary: judged as pairs,
    the slowdown is shown beyond the 5% allowed (whole milliseconds at a 5 ms mean leave each
    pair +-20% of rounding, so it takes hundreds); judged as two independent samples, the
    spread of the requests' own costs hides it."""
    rng = np.random.default_rng(21)
    cand, base = shadow_requests(rng, 600, 1.10)
    paired = judge(arm(cand), arm(base), CONFIG, pairs=(cand, base))
    alone = judge(arm(cand), arm(base), CONFIG)

    shown = metric(paired, "paired")
    assert paired.verdict == FAIL and shown.state == FAIL, paired.reasons
    assert shown.low > math.log(1.05) and shown.estimate == pytest.approx(math.log(1.10), abs=0.03)
    assert metric(alone, "median").state != FAIL and alone.verdict != FAIL


def test_a_shadow_reads_a_5_percent_slowdown_in_whole_milliseconds_as_5_percent():
    """Whole milliseconds at a 5 ms median: the pairs' ratio reads the slowdown at its size
    (a 0 ms time read as half a step, the rest as recorded). Half a step added to every time
    would pull each ratio towards 1 and read +5% as +4.6%, and a version exactly at the
    tolerance would pass far more often than alpha."""
    rng = np.random.default_rng(23)
    cand, base = shadow_requests(rng, 200_000, 1.05)
    found = metric(judge(arm(cand), arm(base), CONFIG, pairs=(cand, base)), "paired")
    assert 100 * math.expm1(found.estimate) == pytest.approx(5.0, abs=0.25), found
    assert found.state == "open" and found.low < found.tolerance < found.high


def test_a_shadow_of_an_identical_version_is_shown_within_and_never_at_zero_width():
    rng = np.random.default_rng(22)
    cand, base = shadow_requests(rng, 2000, 1.0)
    for n in (10, 100, 2000):
        found = metric(judge(arm(cand[:n]), arm(base[:n]), CONFIG, pairs=(cand[:n], base[:n])),
                       "paired")
        assert found.state != FAIL and found.high > found.low, (n, found)
    assert found.state == "within"
    # 40 pairs in whole milliseconds, every one the same on both sides: the rounding still
    # leaves each pair +-0.4 ms of doubt, so the bounds keep a width (+-4%, not 0: had the
    # times differed by 5%, 40 pairs would almost never all round alike); and when every
    # request took the very same time, nothing is bounded at all.
    tied_ms = np.floor(np.linspace(4, 6.9, 40))
    tied = metric(judge(arm(tied_ms), arm(tied_ms), CONFIG, pairs=(tied_ms, tied_ms)), "paired")
    assert tied.high > 0.03 and tied.low < -0.03, tied
    same = np.full(20, 5.0)
    flat = metric(judge(arm(same), arm(same), CONFIG, pairs=(same, same)), "paired")
    assert flat.state == "waiting" and flat.low is None, flat


def _copy(rid: str, t: float, upstream_ms: float | None, status: int = 200,
          mirror: bool = True) -> Sample:
    up = "" if upstream_ms is None else str(status)
    return Sample(t, 1, "v", mirror, status, 1.0, upstream_ms, 10, up, "a", "POST", "/", rid)


def test_shadow_pairs_match_by_request_id_and_drop_ids_seen_twice():
    from rollouts.canary.analysis import shadow_pairs

    originals = [_copy("a", 1.0, 5.0, mirror=False), _copy("b", 2.0, 6.0, mirror=False),
                 _copy("dup", 3.0, 5.0, mirror=False), _copy("dup", 3.5, 5.0, mirror=False),
                 _copy("lonely", 4.0, 5.0, mirror=False)]
    copies = [_copy("b", 2.1, 9.0), _copy("a", 1.1, 7.0), _copy("dup", 3.1, 5.0),
              _copy("never-sent", 5.0, 5.0)]
    canary, baseline = shadow_pairs(copies, originals)
    assert [(c.request_id, b.request_id) for c, b in zip(canary, baseline)] == [("a", "a"), ("b", "b")]
    assert [c.upstream_ms for c in canary] == [7.0, 9.0]


def test_a_shadow_judges_the_servers_own_times_and_counts_failed_copies_as_errors():
    from rollouts.canary.judge import judge_pairs

    own = [4.0 + (i * 37 % 100) / 50 for i in range(200)]  # 4-6 ms, in microseconds
    originals = [_copy(str(i), i, own[i], mirror=False) for i in range(200)]
    # The copies: the server's own time twice as long; ten of them failed with no answer.
    copies = [_copy(str(i), i, 2 * own[i]) for i in range(190)] + [
        _copy(str(i), i, None, status=502) for i in range(190, 200)]
    found = judge_pairs(copies, originals, CONFIG)
    paired = metric(found, "paired")
    assert paired.estimate == pytest.approx(math.log(2.0), abs=0.01) and paired.state == FAIL
    assert metric(found, "errors").canary == pytest.approx(10 / 200)
    assert found.canary_samples == 200


def test_the_judge_bench_runs_the_bake_and_reports_the_issues_keys():
    """``bench/judge.py --json`` on a few bake runs: the keys the issue names, a steady
    version baked through, one that turns 20% slower 150 s in sent back soon after."""
    from tests.bench_run import run_bench

    found = run_bench("judge.py", "--runs", "3", "--jobs", "1",
                      "--scenarios", "bake-aa,bake-late-onset-150s+20%")

    assert {"aa_false_fail_rate", "aa_false_fail_upper95", "aa_inconclusive_rate", "detection",
            "time_to_verdict_s", "contradictions"} <= set(found)
    assert found["scenarios"]["bake-aa"]["pass"] == 1.0
    assert found["detection"]["bake-late-onset-150s+20%"] == 1.0
    assert 150 < found["time_to_verdict_s"]["bake-late-onset-150s+20%"] < 180
    assert found["contradictions"] == 0
