"""bench/rollback.py runs end to end and reports sane numbers (a smoke test, not its goals:
the rollback time, false rollbacks and detection rate are measured, not unit-tested)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_bench

# The smallest run that still goes through every part: one slower canary rolled back, one
# identical canary judged, the offline judge, on 2 s of baseline latencies (at least 100
# requests) and a 200-request planned sample (a 40% slower canary fails within its first looks).
SMOKE = {"regressions": 1, "aa_runs": 1, "simulations": 20, "baseline_seconds": 2,
         "planned_samples": 200}


@pytest.mark.triton
def test_the_rollback_bench_runs_and_reports_sane_numbers():
    # The bench starts its own database and Redis: none of the caller's may leak in.
    args = [f"--{key.replace('_', '-')}={value}" for key, value in SMOKE.items()]
    result = run_bench("rollback.py", *args, timeout=400)
    assert result["regressions"] == SMOKE["regressions"]
    assert result["aa_runs"] == SMOKE["aa_runs"]
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
    assert result["simulations"] == SMOKE["simulations"]
    assert result["route_rps"] > 0 and result["baseline_samples"] >= 100
    assert result["analysis"]["planned_samples"] == SMOKE["planned_samples"]
    assert result["analysis"]["planned_samples"] >= result["analysis"]["min_samples"] >= 10
    assert result["reconciler"] and result["load_tool"]
    assert len(result["loadavg_start"]) == 3 and len(result["loadavg_end"]) == 3
