"""bench/router.py runs end to end and reports sane numbers (a smoke test, not a speed goal)."""

from __future__ import annotations

import shutil

import pytest

from tests.bench_run import run_bench

KEYS = (
    "direct_p50_ms_c1",
    "route_p50_ms_c1",
    "direct_p50_ms_c16",
    "route_p50_ms_c16",
    "route_p99_ms_c16",
    "weight_change_s_median",
    "apply_s_median",
    "adapter_weight_change_s_median",
    "adapter_apply_s_median",
)


@pytest.mark.triton
@pytest.mark.parametrize("tool", ["wrk", "python"])
def test_the_router_bench_runs_and_reports_sane_numbers(tool):
    if tool == "wrk" and shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (scripts/test installs Debian's wrk)")
    extra = ["--seconds", "1"] if tool == "wrk" else ["--no-wrk", "--requests", "64"]

    # 2 overhead rounds (not 4): each target first once.
    result = run_bench("router.py", *extra, "--rounds", "2", "--changes", "2", "--reloads", "2")
    assert result["load_tool"].startswith("wrk" if tool == "wrk" else "python")
    assert result["overhead_rounds"] == 2
    for key in KEYS:
        assert isinstance(result.get(key), float) and result[key] > 0, (key, result.get(key))
    for key in ("overhead_p50_ms_c1", "overhead_p50_ms_c16", "overhead_p99_ms_c16"):
        assert isinstance(result.get(key), float), (key, result.get(key))
    if tool == "python":
        assert result["requests_c1"] == result["requests_c16"] == 64
    else:  # 2 rounds of 1 s on each target: hundreds of requests at least, even on a busy box
        assert result["requests_c1"] > 100 and result["requests_c16"] > 100
    assert result["weight_changes"] == 2
    # A change is in force once nginx serves it, which the API's answer and apply() wait for.
    assert result["weight_change_s_median"] <= result["apply_s_median"] + 1 < 15
    assert result["adapter_weight_change_s_median"] <= result["adapter_apply_s_median"] + 1 < 15
    assert result["reloads"] == 2 and result["requests_during_reloads"] > 0
    # What failed was only ever a keep-alive request that never reached nginx, and its retry
    # on a new connection succeeded.
    assert result["failed_during_reloads"] == 0, result["reload_failures"]
    assert result["retried_requests_that_reached_nginx"] == 0
