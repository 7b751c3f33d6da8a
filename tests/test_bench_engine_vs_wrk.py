"""bench/engine_vs_wrk.py runs end to end and reports sane numbers (a smoke test, not a speed
goal: the 80% and 10% goals are the bench's to report, on a quiet machine)."""

from __future__ import annotations

import shutil

import pytest

from tests.bench_run import run_bench_logged


@pytest.mark.triton
def test_the_engine_vs_wrk_bench_runs_and_reports_both_rates():
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (scripts/test installs Debian's wrk)")

    result, progress = run_bench_logged("engine_vs_wrk.py", "--duration", "1", "--runs", "1",
                                        "--concurrency", "4")
    assert [row["concurrency"] for row in result["levels"]] == [4]
    row = result["levels"][0]
    for key in ("engine_rps", "wrk_rps", "engine_p50_ms", "wrk_p50_ms", "engine_cpu_us",
                "wrk_cpu_us"):
        assert isinstance(row[key], float) and row[key] > 0, (key, row[key])
    # Both clients really sent: at least a few hundred requests in 1 s on a server answering at
    # once, and the figures agree with each other within an order of magnitude.
    assert row["engine_requests"] > 100 and row["wrk_requests"] > 100
    assert 0.1 < row["rps_share"] < 10 and -0.9 < row["p50_diff"] < 9
    assert row["rps_share"] == round(row["engine_rps"] / row["wrk_rps"], 3)
    assert isinstance(row["rps_ok"], bool) and isinstance(row["p50_ok"], bool)
    assert result["passed"] == (row["rps_ok"] and row["p50_ok"])
    assert result["duration_s"] == 1 and result["runs"] == 1
    assert result["triton_version"] and result["wrk_version"].startswith("wrk")
    assert "c=4 run 1/1 engine" in progress and "c=4 run 1/1 wrk" in progress
