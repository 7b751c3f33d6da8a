"""bench/loads.py runs end to end and reports sane numbers (a smoke test, not a speed goal)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_bench

KEYS = (
    "load_s_median",
    "load_warm_s_median",
    "bare_load_s_median",
    "unload_s_median",
    "bare_unload_s_median",
)


@pytest.mark.triton
def test_the_load_bench_runs_and_reports_positive_timings():
    result = run_bench("loads.py", "--runs", "1", leave_out=("DATABASE_URL",))
    for key in KEYS:
        assert isinstance(result.get(key), float) and result[key] > 0, (key, result.get(key))
    assert result["runs"] == 1
    # Switchyard does the bare calls and more: far below half of bare means it measured nothing.
    assert result["load_s_median"] >= result["bare_load_s_median"] * 0.5
