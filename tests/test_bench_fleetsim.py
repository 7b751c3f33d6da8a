"""bench/fleetsim.py runs end to end and reports sane numbers (a smoke test, not a speed goal)."""

from __future__ import annotations

from tests.bench_run import run_bench


def test_the_fleet_simulator_bench_runs_and_reports_sane_numbers():
    result = run_bench("fleetsim.py", "--servers", "30", "--hung", "3", "--rounds", "2",
                       "--in-flight", "10", timeout=120)
    assert (result["servers"], result["hung"], len(result["rounds"])) == (30, 3, 2)
    assert 0 < result["start_s"] < 30 and result["rss_mib"] > 0
    for measured in result["rounds"]:
        assert measured["errors"] == 0 and measured["page_bytes"] > 1000
        assert 0 < measured["wall_s"] < 30 and measured["cpu_ms_per_scrape"] >= 0
