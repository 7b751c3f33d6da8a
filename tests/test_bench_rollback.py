"""bench/rollback.py runs end to end and reports sane numbers (a smoke test, not its goals:
the rollback time, false rollbacks and detection rate are measured, not unit-tested)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_bench

QUICK = {"regressions": 2, "aa_runs": 3, "simulations": 60}  # bench/rollback.py's --quick


@pytest.mark.triton
def test_the_rollback_bench_runs_and_reports_sane_numbers():
    # The bench starts its own database and Redis: none of the caller's may leak in.
    result = run_bench("rollback.py", "--quick", timeout=400)
    assert result["regressions"] == QUICK["regressions"]
    assert result["aa_runs"] >= QUICK["aa_runs"]
    # Every canary ran to an end the bench recognises.
    assert sum(result["regression_outcomes"].values()) == result["regressions"]
    assert sum(result["aa_outcomes"].values()) == result["aa_runs"]
    assert 0 <= result["false_rollbacks"] <= result["aa_runs"]
    # At least one slower canary was rolled back and timed from its onset to the way back.
    assert result["regressions_rolled_back"] >= 1
    median = result["rollback_s_median"]
    assert isinstance(median, float) and 0 < median < 120, median
    assert result["rollback_s_min"] <= median <= result["rollback_s_max"]
    for key in ("detection_rate", "false_alarm_rate"):
        assert isinstance(result[key], float) and 0.0 <= result[key] <= 1.0, (key, result[key])
    assert result["simulations"] == QUICK["simulations"]
    assert result["route_rps"] > 0 and result["baseline_samples"] >= 100
    assert result["analysis"]["planned_samples"] >= result["analysis"]["min_samples"] >= 10
    assert result["reconciler"] and result["load_tool"]
    assert len(result["loadavg_start"]) == 3 and len(result["loadavg_end"]) == 3
