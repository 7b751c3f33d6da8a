"""A running canary's analyses on its page: the live part's "Latest analysis" and the Analyses
panel come from the same rows in the same answer, so they never disagree; an SLO gate reads
"waiting (4 of 100)" until the canary has the requests its step asks for; tiny numbers (an
error budget, a p-value) print in scientific notation instead of rounding to 0.0000."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from console.templatetags.switchyard import NO_VALUE, gate_badge, sig
from rollouts.canary import analysis as canary_analysis
from rollouts.canary import judge
from rollouts.models import RolloutAnalysis
from tests.console import test_rollout_pages as pages
from tests.console.test_rollout_pages import browser, make, url

setup = pages.setup  # fraud: v1 ready on its server, v2 and v3 registered


def analysis_of(rollout, canary_requests: int, **fields) -> RolloutAnalysis:
    rng = np.random.default_rng(7)
    canary = judge.Arm(rng.lognormal(math.log(4.0), 0.3, canary_requests), 0, 0)
    baseline = judge.Arm(rng.lognormal(math.log(4.0), 0.3, 3 * canary_requests), 0, 0)
    judgement = judge.judge(canary, baseline, judge.JudgeConfig(max_p99_ms=50.0, max_error_rate=1.0))
    config = {**canary_analysis.ANALYSIS_DEFAULTS, "max_p99_ms": 50.0, "max_error_rate": 1.0,
              "min_samples": 100}
    return RolloutAnalysis.objects.create(**{
        "rollout": rollout, "step_index": 1, "weight": 25, "verdict": "running",
        "window_start": 0, "looks": 1, "spent": 0.0, "config": config,
        "judgement": judgement.to_json(), "slo": canary_analysis.gates_json(judgement),
        **fields})


def blocks(body: str, pk: int) -> list[str]:
    return re.findall(rf'<div class="analysis" data-analysis="{pk}">.*?</table>', body, re.S)


def test_the_live_part_carries_the_analyses_panel_so_both_show_the_same_look(setup, dave):
    rollout = make(setup, dave)
    row = analysis_of(rollout, 40)
    page = browser(dave).get(url("rollout", rollout)).content.decode()
    assert len(blocks(page, row.pk)) == 2

    # A later look: more requests judged, one more look.
    later = analysis_of(rollout, 400, step_index=2)
    RolloutAnalysis.objects.filter(pk=row.pk).update(judgement=later.judgement, looks=7)
    later.delete()
    response = browser(dave).get(url("rollout-status", rollout), headers={"HX-Request": "true"})

    body = response.content.decode()
    assert 'id="analyses" hx-swap-oob="true"' in body
    latest, in_panel = blocks(body, row.pk)
    assert latest == in_panel
    assert "7 looks" in latest and 'data-canary-samples>400<' in latest


@pytest.mark.parametrize(("requests", "badge"), [(4, "waiting (4 of 100)"), (400, None)])
def test_an_slo_gate_waits_until_the_canary_has_its_sample(setup, dave, requests, badge):
    rollout = make(setup, dave)
    analysis_of(rollout, requests)

    body = browser(dave).get(url("rollout", rollout)).content.decode()

    badges = re.findall(r'data-gate-badge>([^<]+)<', body)
    assert badges, body
    if badge:
        assert set(badges) == {badge}
    else:
        assert not any(re.match(r"waiting \(\d+ of", b) for b in badges), badges


def test_a_gate_badge_says_over_once_it_fails_whatever_the_sample():
    row = RolloutAnalysis(judgement={"canary_samples": 3}, config={"min_samples": 100})
    assert gate_badge({"state": "fail"}, row) == "over"
    assert gate_badge({"state": "within"}, row) == "waiting (3 of 100)"
    assert gate_badge({"state": "within"}, RolloutAnalysis(
        judgement={"canary_samples": 300}, config={"min_samples": 100})) == "within"


@pytest.mark.parametrize(("value", "shown"), [
    (0.000012, "1.2e-05"), (0.0, "0"), (0.05, "0.05"), (0.012345, "0.0123"), (12.3456, "12.3"),
    (None, NO_VALUE), (4567.8, "4568"),
])
def test_tiny_numbers_print_in_scientific_notation(value, shown):
    assert sig(value) == shown


def test_a_tiny_error_budget_is_never_shown_as_zero(setup, dave):
    rollout = make(setup, dave)
    analysis_of(rollout, 400, spent=0.000012)

    body = browser(dave).get(url("rollout", rollout)).content.decode()

    assert "error budget 1.2e-05 (of 0.05)" in body
    assert "0.0000" not in body
