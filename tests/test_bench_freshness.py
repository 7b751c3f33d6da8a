"""bench/freshness.py runs end to end and reports sane numbers (a smoke test, not a speed goal)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_bench

KEYS = (
    "freshness_s_median",
    "freshness_s_p90",
    "tick_s_50_servers",
    "tick_s_50_servers_with_5_dead",
)


@pytest.mark.triton
def test_the_freshness_bench_runs_and_reports_sane_numbers():
    # The bench starts its own database and Redis: none of the caller's may leak in.
    # 3 bursts, and 2 timed ticks for each fleet (live, 5 dead, 5 hung) instead of 10.
    result = run_bench("freshness.py", "--samples", "3", "--ticks", "2")
    for key in KEYS:
        assert isinstance(result.get(key), float) and result[key] > 0, (key, result.get(key))
    assert result["samples"] == 3 and result["tick_samples"] == 2
    # Sanity bounds only: a burst shows within seconds, a tick ends within a minute.
    assert result["freshness_s_median"] <= result["freshness_s_p90"] < 30
    assert result["detections_exact"] == 3  # every burst counted once, not twice or in part
    for key in ("tick_s_50_servers", "tick_s_50_servers_with_5_dead"):
        assert result[key] < 60, (key, result[key])
