"""bench/rollback.py runs end to end and reports sane numbers (a smoke test, not its goals:
the rollback and promotion times are measured, not unit-tested)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_bench

# The smallest run that still goes through every part the bench measures with: a +160% canary
# rolled back at the demo's rate (75 requests a second). Not faster: at 200 a second the stable
# version's one Triton instance is ~95% busy, its queue makes it as slow as the canary on a busy
# machine, and the canary rightly passes its first step. No identical canary (its proof takes a
# few thousand canary requests, over a minute at this rate: promotion is tested on the real stack
# in tests/rollouts/canary) and no late onset (it needs a minute on its own).
SMOKE = ["--runs=1", "--slowdowns=2.6", "--late-runs=0", "--aa-runs=0", "--rate=75"]


@pytest.mark.triton
def test_the_rollback_bench_runs_and_reports_sane_numbers():
    # The bench starts its own database and Redis: none of the caller's may leak in.
    result = run_bench("rollback.py", *SMOKE, timeout=500)
    (regression,) = result["regressions"]["+160%"]
    assert regression["outcome"] == "rolled_back", regression
    back = result["rollback_s_median_160"]
    assert isinstance(back, float) and 0 < back < 60, back
    assert regression["weight"] == 5  # caught at the first step
    assert result["aa_runs"] == 0 and result["promote_s_median"] is None
    assert result["rollback_s_median_20"] is None and result["late_runs"] == []
    assert result["route_rps"] > 50 and result["baseline_samples"] >= 50
    assert result["analysis"]["planned_samples"] >= result["analysis"]["min_samples"] >= 10
    assert result["reconciler"] and result["load_tool"]
    assert len(result["loadavg_start"]) == 3 and len(result["loadavg_end"]) == 3
