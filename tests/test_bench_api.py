"""bench/api.py runs end to end and reports sane numbers (a smoke test, not a speed goal).

It needs the PostgreSQL server on 127.0.0.1:5432 (trust authentication) that CI runs, and
Redis at REDIS_URL; it is skipped where no PostgreSQL answers. Marked like the other benches'
smoke tests, which it runs with (slow, end to end), though it needs no Triton.
"""

from __future__ import annotations

import pytest

from tests.bench_run import run_bench

ENDPOINTS = {f"{resource} {kind}" for resource in (
    "models", "versions", "deployments", "loads", "quotas", "audit-events")
    for kind in ("list", "detail")}


def _postgres() -> object | None:
    import psycopg

    for user in ("postgres", "root"):
        try:
            return psycopg.connect(host="127.0.0.1", port=5432, user=user, dbname="postgres",
                                   autocommit=True, connect_timeout=3)
        except psycopg.OperationalError:
            continue
    return None


@pytest.mark.triton
def test_the_api_bench_runs_and_reports_sane_numbers():
    admin = _postgres()
    if admin is None:
        pytest.skip("no PostgreSQL on 127.0.0.1:5432 with trust authentication")

    # The bench makes its own database; the caller's must not leak in (its Redis may).
    result = run_bench("api.py", "--versions", "20", "--audit", "200", "--clients", "2",
                       "--ci-clients", "2", "--think-ms", "50", "--floor-clients", "2",
                       "--seconds", "1", "--warmup", "0.5", leave_out=("DATABASE_URL",))
    assert result["errors"] == 0, [level["first_errors"] for level in result["levels"]]
    # Closed loop, CI-like (pausing between requests), and the floor (no token: every answer a
    # 401, or it counts as an error, and no SQL before it).
    for tag in ("c2", "ci2", "floor2"):
        assert isinstance(result[f"p99_ms_{tag}"], float) and result[f"p99_ms_{tag}"] > 0
        assert result[f"rps_{tag}"] > 0 and result[f"requests_{tag}"] > 0
        assert result[f"p50_ms_{tag}"] <= result[f"p99_ms_{tag}"] <= result[f"max_ms_{tag}"]
    assert result["think_ms"] == 50
    assert set(result["endpoints"]) <= ENDPOINTS and set(result["queries"]) == ENDPOINTS
    assert all(count >= 2 for count in result["queries"].values())
    assert result["floor_queries"] == 0
    assert [level["kind"] for level in result["levels"]] == ["closed", "ci", "floor"]
    assert all(share >= 0 for level in result["levels"] for share in level["cpu_share"].values())
    assert result["seeded"]["versions"] == 20 and result["seeded"]["audit_events"] == 200
    assert result["gunicorn"]["command"][:2] == ["gunicorn", "console.wsgi"]
    # Its database is gone again.
    with admin:
        left = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                             [result["database"]]).fetchone()
    assert left is None
