"""bench/rollback.py runs end to end and reports sane numbers (a smoke test, not its goals:
the rollback and promotion times are measured, not unit-tested)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_bench

# The smallest run that still goes through every part: a +160% canary rolled back, and an
# identical one promoted at 200 requests a second (its proof takes a few thousand canary
# requests); no late onset (it needs a minute on its own).
SMOKE = ["--runs=1", "--slowdowns=2.6", "--late-runs=0", "--aa-runs=1", "--rate=200"]


@pytest.mark.triton
def test_the_rollback_bench_runs_and_reports_sane_numbers():
    # The bench starts its own database and Redis: none of the caller's may leak in.
    result = run_bench("rollback.py", *SMOKE, timeout=500)
    (regression,) = result["regressions"]["+160%"]
    assert regression["outcome"] == "rolled_back", regression
    back = result["rollback_s_median_160"]
    assert isinstance(back, float) and 0 < back < 60, back
    assert regression["weight"] == 5  # caught at the first step
    aa = result["aa_outcomes"]
    assert result["aa_runs"] == 1 and sum(aa.values()) == 1
    if aa.get("succeeded"):
        assert 0 < result["promote_s_median"] < 400
    assert result["rollback_s_median_20"] is None and result["late_runs"] == []
    assert result["route_rps"] > 50 and result["baseline_samples"] >= 50
    assert result["analysis"]["planned_samples"] >= result["analysis"]["min_samples"] >= 10
    assert result["reconciler"] and result["load_tool"]
    assert len(result["loadavg_start"]) == 3 and len(result["loadavg_end"]) == 3
