"""How an analysis step ends (rollouts/canary/policy.py): the evidence windows with their
warm-up, and what a look's judgement means for the step."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from rollouts.canary import policy
from rollouts.canary.arms import Arm
from rollouts.canary.judge import FAIL, INCONCLUSIVE, PASS, JudgeConfig, Judgement, judge

OPEN = Judgement(INCONCLUSIVE, False, ["median: not yet shown within"], 500, 9000, 0.0167, 1.0)
WITHIN = replace(OPEN, within=True, reasons=["every metric is within its tolerance"])
FAILED = replace(OPEN, verdict=FAIL, reasons=["median latency 40% slower: beyond it"])


def end(judgement, **kw):
    args = {"step_samples": 150, "min_samples": 100, "last": True, "planned_samples": 10000,
            "elapsed_s": 30.0, "timeout_s": 900.0, **kw}
    return policy.step_end(judgement, **args)


def test_a_fail_ends_the_step_at_once_whatever_it_has_seen():
    assert end(FAILED, step_samples=3)[0] == FAIL


def test_a_step_passes_when_shown_within_but_not_before_its_minimum_at_this_weight():
    assert end(WITHIN)[0] == PASS
    ended, why = end(WITHIN, step_samples=40)
    assert ended == policy.RUNNING and "40 of 100 canary requests at this weight" in why


def test_an_earlier_step_goes_on_when_no_harm_is_shown_and_the_last_step_must_show_within():
    ended, why = end(OPEN, last=False)
    assert ended == PASS and "no regression" in why
    assert end(OPEN, last=True)[0] == policy.RUNNING


def test_the_plan_or_the_timeout_without_a_verdict_asks_a_person():
    planned = replace(OPEN, canary_samples=10000)
    assert end(planned)[0] == INCONCLUSIVE
    ended, why = end(OPEN, elapsed_s=901.0)
    assert ended == INCONCLUSIVE and "timeout 900 s" in why


def test_the_evidence_leaves_out_each_steps_warm_up_and_what_fell_between_steps():
    windows = [policy.StepWindow(100.0, 160.0, 2.0), policy.StepWindow(200.0, None, 2.0)]
    samples = [SimpleNamespace(t=t) for t in (100.5, 101.9, 102.0, 159.9, 160.0, 180.0,
                                              201.0, 202.5, 999.0)]

    kept = [s.t for s in policy.evidence(samples, windows)]

    assert kept == [102.0, 159.9, 202.5, 999.0]


def test_capped_evidence_is_cut_to_the_same_span_on_both_sides_and_said(settings):
    from rollouts.canary.analysis import same_span

    settings.SWITCHYARD_SAMPLES_MAX_PER_VARIANT = 3
    settings.SWITCHYARD_SAMPLES_KEEP_S = 3600
    canary = [SimpleNamespace(t=t) for t in (100.0, 150.0, 190.0)]  # capped: kept from 100
    baseline = [SimpleNamespace(t=t) for t in (20.0, 60.0, 120.0)]

    c, b, why = same_span(canary, baseline, since=10.0, now=200.0)

    assert [s.t for s in c] == [100.0, 150.0, 190.0] and [s.t for s in b] == [120.0]
    assert "the evidence starts 100 s ago, not 190" in why
    assert same_span(canary[:2], baseline[:2], since=10.0, now=200.0)[2] == ""



def _tail_heavier(rng, n):
    """Whole-millisecond latencies around 5 ms whose slowest hundredth is 15% slower (from
    p96.5 up), the median and p95 unchanged: on whole milliseconds more than twice the
    baseline's share ends past its p99."""
    z = rng.standard_normal(n)
    ramp = np.clip((z - 1.81) / (2.326 - 1.81), 0, None)
    return np.floor(5.0 * np.exp(0.3 * z) * (1 + 0.15 * ramp) + rng.random(n))


def _same(rng, n):
    return np.floor(5.0 * np.exp(0.3 * rng.standard_normal(n)) + rng.random(n))


def test_the_last_step_holds_a_pass_until_the_share_past_the_baselines_p99_is_bounded():
    """A canary whose slowest hundredth grew slower has its median and errors within before
    the share past the baseline's p99 is shown beyond its tolerance: the last analysis step
    keeps collecting (an earlier one goes on), and the share then fails it. An identical
    version's share is bounded at twice the baseline's within the plan, and it passes."""
    rng = np.random.default_rng(4)
    baseline = Arm(_same(rng, 40000), 0, 0)
    early = judge(Arm(_tail_heavier(rng, 3000), 0, 0), baseline, JudgeConfig())
    share = next(m for m in early.metrics if m.name == "tail99")
    assert early.within and early.verdict != FAIL and share.state == "open", early.reasons
    assert not policy.tail_bounded(early)
    ended, why = end(early)
    assert ended == policy.RUNNING and "twice the baseline's" in why, why
    assert end(early, last=False)[0] == PASS
    assert end(early, shadow=True)[0] == PASS
    assert end(early, planned_samples=3000)[0] == INCONCLUSIVE

    later = judge(Arm(_tail_heavier(rng, 6000), 0, 0), baseline, JudgeConfig())
    assert end(later)[0] == FAIL, later.reasons

    same = judge(Arm(_same(rng, 12000), 0, 0), baseline, JudgeConfig())
    assert same.within and policy.tail_bounded(same), same.reasons
    assert end(same)[0] == PASS
