"""bench/looks.py runs end to end and reports sane numbers (a smoke test, not a speed goal)."""

from __future__ import annotations

import uuid

from tests.bench_run import run_bench


def test_the_looks_bench_runs_and_the_cache_parses_only_what_arrived():
    # The suite's Redis (REDIS_URL) is handed on: the bench writes under a prefix of its own
    # and deletes it; its database is a SQLite file of its own.
    result = run_bench("looks.py", "--rollouts", "3", "--rounds", "2", "--history", "20",
                       leave_out=("DATABASE_URL",))
    assert (result["rollouts"], result["rounds"]) == (3, 2)
    cached, full = result["cached"], result["full"]
    for way in (cached, full):
        assert way["looks_per_s"] > 0 and way["cpu_ms_per_look"] > 0, way
    # A look reads the route's whole window (75 a second for 20 s and more) in full, and in
    # the cache only the last seconds (LATE_S and the one that passed).
    assert full["parsed_per_look"] >= 75 * 20 * 0.8, full
    assert 0 < cached["parsed_per_look"] < full["parsed_per_look"] / 2, cached


def test_worker_processes_share_the_rollouts_and_look_at_each_once_a_second():
    """With --processes, the rollouts are split between worker processes on a PostgreSQL
    database of the bench's own (made and dropped), each looking once a second."""
    name = f"switchyard_bench_looks_{uuid.uuid4().hex[:8]}"
    result = run_bench("looks.py", "--rollouts", "4", "--rounds", "2", "--history", "10",
                       "--processes", "2", "--database-url",
                       f"postgres://postgres@127.0.0.1:5432/{name}", leave_out=("DATABASE_URL",))
    assert (result["rollouts"], result["rounds"], result["processes"]) == (4, 2, 2)
    assert len(result["wall_s_per_round"]) == 2
    # A round a second at most: 4 rollouts make at most 4 looks a second, and they could
    # make more than they did whenever a round took less than its second.
    assert 0 < result["looks_per_s"] <= 4.0, result
    assert result["capacity_looks_per_s"] > 0 and result["cpu_ms_per_look"] > 0, result
