"""Sweeps: which level runs next, when the list stops early, how refinement bisects, and what a
finished sweep reports. Pure functions over level results shaped like the engine's."""

from __future__ import annotations

from typing import Any

import pytest

from rollouts.benchmarks.sweep import Plan, Slo, better, next_level, stop_reason, summarize, verdict

SLO = Slo(p99_ms=100.0, error_rate=0.01)


def level(value: float, *, p99: float = 50.0, rps: float | None = None, error_rate: float = 0.0,
          ok: int = 100, refinement: bool = False, goodput: float | None = None,
          cancelled: bool = False, **extra: Any) -> dict[str, Any]:
    """A level result: by default passing, with throughput growing with the load."""
    out: dict[str, Any] = {
        "value": value, "ok": ok, "error_rate": error_rate, "cancelled": cancelled,
        "throughput_rps": rps if rps is not None else value * 10.0,
        "latency_ms": {"p50": p99 / 2, "p99": p99},
    }
    if refinement:
        out["refinement"] = True
    if goodput is not None:
        out["goodput_rps"] = goodput
    return out | extra


def run(plan: Plan, outcome, slo: Slo = SLO, limit: int = 50) -> list[dict[str, Any]]:
    """Drive a sweep to its end; ``outcome(value, refinement)`` gives each level's result."""
    results: list[dict[str, Any]] = []
    while (value := next_level(plan, results, slo)) is not None:
        listed = [r for r in results if not r.get("refinement")]
        from_list = len(listed) < len(plan.levels) and not stop_reason(plan, listed, slo)
        results.append(outcome(value, not from_list))
        assert len(results) < limit
    return results


def knee(limit: float):
    """A server that meets the SLO up to ``limit`` and fails above it (throughput flat)."""
    def outcome(value: float, refinement: bool) -> dict[str, Any]:
        if value <= limit:
            return level(value, refinement=refinement)
        return level(value, p99=500.0, rps=limit * 10.0, refinement=refinement)
    return outcome


# ----------------------------------------------------------------------------------------
# next_level


def test_the_listed_levels_run_in_order_when_all_pass():
    plan = Plan(mode="concurrency", levels=(1, 2, 4, 8))

    results = run(plan, lambda v, r: level(v, refinement=r))

    assert [r["value"] for r in results] == [1, 2, 4, 8]


def test_nothing_runs_after_a_cancelled_level():
    plan = Plan(mode="concurrency", levels=(1, 2, 4))

    assert next_level(plan, [level(1, cancelled=True)], SLO) is None


def test_refinement_bisects_between_the_last_pass_and_the_first_fail_in_whole_numbers():
    plan = Plan(mode="concurrency", levels=(1, 4, 16, 64), refine_steps=5)

    results = run(plan, knee(10))

    values = [r["value"] for r in results]
    # 16 fails but carries more than 4 did; 64 fails with no more than 16 (saturated, the
    # list's end anyway); then 4..16 is bisected: 10 passes, 13 fails, 11 fails, and 10..11
    # is one apart: done with 2 of the 5 refinement steps left.
    assert values == [1, 4, 16, 64, 10, 13, 11]
    assert all(v == int(v) for v in values)
    assert [bool(r.get("refinement")) for r in results] == [False] * 4 + [True] * 3
    assert summarize(plan, results, SLO)["max_load"] == 10


def test_refinement_stops_after_refine_steps():
    plan = Plan(mode="concurrency", levels=(1, 64), refine_steps=2)

    results = run(plan, knee(10))

    assert [r["value"] for r in results] == [1, 64, 32, 16]


def test_refinement_stops_when_the_bracket_is_one_apart():
    plan = Plan(mode="concurrency", levels=(1, 2, 3, 4), refine_steps=5)

    results = run(plan, knee(2))

    assert [r["value"] for r in results] == [1, 2, 3]  # 3 fails, saturated; 2..3 is one apart
    assert next_level(plan, results, SLO) is None


def test_refinement_without_any_pass_bisects_from_zero_and_stops_below_one():
    plan = Plan(mode="concurrency", levels=(4,), refine_steps=5)
    always_fails = lambda v, r: level(v, p99=500.0, refinement=r)  # noqa: E731

    results = run(plan, always_fails)

    assert [r["value"] for r in results] == [4, 2, 1]  # 0..1 has no whole number between


def test_rate_refinement_uses_fractional_midpoints_and_stops_within_two_percent():
    plan = Plan(mode="rate", levels=(10.0, 20.0), refine_steps=10)

    results = run(plan, knee(13.7))

    values = [r["value"] for r in results]
    assert values[:4] == [10.0, 20.0, 15.0, 12.5]
    # It stops once the bracket is within 2% of its top, however many steps are left.
    best, fail = max(v for v in values if v <= 13.7), min(v for v in values if v > 13.7)
    assert (fail - best) / fail <= 0.02
    assert len(values) < 2 + plan.refine_steps


def test_refinement_bisects_below_the_first_fail_even_if_a_higher_level_passed():
    plan = Plan(mode="concurrency", levels=(1, 2, 8, 16), refine_steps=1)
    results = [level(1), level(2), level(8, p99=500.0, rps=40.0), level(16)]  # 16 passed by noise

    assert next_level(plan, results, SLO) == 5


# ----------------------------------------------------------------------------------------
# Stopping the list early


def test_the_list_stops_early_past_the_error_limit_and_refines_below():
    plan = Plan(mode="concurrency", levels=(1, 2, 4, 8, 16), error_limit=0.5, refine_steps=1)
    results = [level(1), level(2), level(4, error_rate=0.6, ok=40)]

    assert "error rate 60%" in stop_reason(plan, results, SLO)
    assert next_level(plan, results, SLO) == 3  # not 8: bisect between 2 and 4


def test_the_list_stops_early_when_more_load_brings_no_more_throughput():
    plan = Plan(mode="rate", levels=(100, 200, 400, 800), refine_steps=0)
    results = [level(100, rps=100), level(200, rps=180, p99=300.0)]

    assert stop_reason(plan, results, SLO) == ""  # 180 is more than 5% above 100: go on
    results.append(level(400, rps=185, p99=900.0))
    reason = stop_reason(plan, results, SLO)

    assert reason.startswith("saturated: 185 req/s at 400 req/s")
    assert next_level(plan, results, SLO) is None  # no refinement steps
    assert summarize(plan, results, SLO)["stopped_early"] == reason


def test_a_passing_level_never_counts_as_saturated():
    plan = Plan(mode="concurrency", levels=(1, 2, 4))
    results = [level(1, rps=100), level(2, rps=100)]  # no more throughput, but within the SLO

    assert stop_reason(plan, results, SLO) == ""
    assert next_level(plan, results, SLO) == 4


# ----------------------------------------------------------------------------------------
# verdict, summarize, better


def test_verdict_names_every_reason_a_level_fails():
    slo = Slo(p99_ms=100, error_rate=0.01, ttft_p99_ms=200, itl_p99_ms=20)
    result = level(8, p99=150.0, error_rate=0.05, ttft_ms={"p99": 250.0}, itl_ms={"p99": 10.0})

    why = verdict(result, slo)

    assert why == ["p99 150.0 ms > 100 ms", "error rate 5.00% > 1.00%", "TTFT p99 250.0 ms > 200 ms"]
    assert verdict(level(1, ok=0), slo) == ["no request succeeded"]
    assert verdict(level(1), Slo()) == []  # no latency limit: errors only


def test_max_load_is_the_highest_pass_below_the_first_fail_even_if_a_later_level_passes():
    plan = Plan(mode="concurrency", levels=(1, 2, 4, 8))
    results = [level(1), level(2, rps=30.0), level(4, p99=150.0), level(8)]  # 8 passed by noise

    out = summarize(plan, results, SLO)

    assert out["max_load"] == 2 and out["max_load_rps"] == 30.0 and out["max_load_p99_ms"] == 50.0
    assert out["first_failing"] == 4 and out["first_failing_why"] == ["p99 150.0 ms > 100 ms"]
    assert out["peak_rps"] == 80.0
    assert out["levels_run"] == 4 and out["stopped_early"] == ""


def test_max_load_counts_refinements_in_value_order():
    plan = Plan(mode="concurrency", levels=(4, 16))
    results = [level(4), level(16, p99=300.0), level(10, refinement=True),
               level(13, p99=200.0, refinement=True)]

    out = summarize(plan, results, SLO)

    assert (out["max_load"], out["first_failing"]) == (10, 13)


def test_summarize_with_no_pass_or_no_fail():
    plan = Plan(mode="rate", levels=(5, 10))

    none_passed = summarize(plan, [level(5, p99=500.0), level(10, p99=600.0)], SLO)
    all_passed = summarize(plan, [level(5), level(10)], SLO)

    assert none_passed["max_load"] is None and none_passed["max_load_rps"] is None
    assert none_passed["first_failing"] == 5
    assert all_passed["max_load"] == 10 and all_passed["first_failing"] is None
    assert all_passed["first_failing_why"] == []


def test_goodput_is_the_highest_over_all_levels_and_none_without_any():
    plan = Plan(mode="rate", levels=(5, 10, 20))
    results = [level(5, goodput=5.0), level(10, goodput=9.5), level(20, p99=400.0, goodput=7.0)]

    assert summarize(plan, results, SLO)["goodput_rps"] == 9.5
    assert summarize(plan, [level(5)], SLO)["goodput_rps"] is None


def test_better_compares_the_load_carried_within_the_slo():
    a, b = {"max_load_rps": 120.0}, {"max_load_rps": 100.0}

    assert better(a, b) and not better(b, a)
    assert not better(a, dict(a))  # a tie is not better
    assert better(a, None) and better(a, {"max_load_rps": None})
    assert not better(None, a) and not better({"max_load_rps": None}, None)


def test_plan_from_json_sorts_levels_and_reads_its_limits():
    plan = Plan.from_json({"mode": "rate", "levels": [40, 10, 20], "refine_steps": 3,
                           "error_limit": 0.2})

    assert plan.levels == (10.0, 20.0, 40.0)
    assert (plan.refine_steps, plan.error_limit) == (3, 0.2)


def test_plan_from_json_runs_a_repeated_level_once():
    plan = Plan.from_json({"mode": "concurrency", "levels": [4, 1, 4, 2]})

    assert plan.levels == (1.0, 2.0, 4.0)


def test_slo_from_json_keeps_defaults_for_missing_values():
    slo = Slo.from_json({"p99_ms": 250, "error_rate": None})

    assert slo == Slo(p99_ms=250, error_rate=0.01)


@pytest.mark.parametrize("mode", ["concurrency", "rate"])
def test_a_sweep_with_no_levels_left_and_no_fail_is_done(mode):
    plan = Plan(mode=mode, levels=(1, 2))

    assert next_level(plan, [level(1), level(2)], SLO) is None
    assert next_level(plan, [], SLO) == 1


def test_the_last_listed_level_saturating_is_not_an_early_stop():
    plan = Plan(mode="concurrency", levels=(1, 2, 4), refine_steps=0)
    results = [level(1, rps=100), level(2, rps=180), level(4, rps=181, p99=900.0)]
    assert stop_reason(plan, results, SLO).startswith("saturated")
    assert summarize(plan, results, SLO)["stopped_early"] == ""


def test_max_load_rps_is_the_most_a_passing_level_carried_up_to_the_max_load():
    """Concurrency 6 passed but carried a little less than 4 did (noise): the figure configs
    and versions are compared by stays what the version was seen to carry within its SLO."""
    plan = Plan(mode="concurrency", levels=(2, 4, 6, 8), refine_steps=0)
    results = [level(2, rps=300.0), level(4, rps=420.0), level(6, rps=402.0),
               level(8, rps=500.0, p99=150.0)]
    out = summarize(plan, results, SLO)
    assert out["max_load"] == 6 and out["max_load_rps"] == 420.0
