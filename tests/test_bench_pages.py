"""bench/pages.py runs end to end and reports sane numbers (a smoke test at a tiny size, not a
speed goal). It needs the PostgreSQL server on 127.0.0.1:5432 (trust authentication) that CI
runs, and Redis at REDIS_URL; it is skipped where no PostgreSQL answers."""

from __future__ import annotations

import pytest

from tests.bench_run import run_bench
from tests.test_bench_api import _postgres

PAGES = {"dashboard", "fleet", "fleet servers (live)", "deployments", "audit log",
         "audit log, older page", "audit log, by action", "loads", "loads, older page",
         "loads, failed"}


@pytest.mark.triton
def test_the_pages_bench_runs_and_reports_sane_numbers():
    admin = _postgres()
    if admin is None:
        pytest.skip("no PostgreSQL on 127.0.0.1:5432 with trust authentication")

    result = run_bench("pages.py", "--audit-events", "300", "--gpus", "16", "--servers", "4",
                       "--deployments", "6", "--loads", "60", "--requests", "2",
                       "--clients", "2", "--seconds", "1", "--warmup", "0.5", "--no-compress",
                       leave_out=("DATABASE_URL",))

    assert set(result["page_p95_ms"]) == PAGES
    assert all(ms > 0 for ms in result["page_p95_ms"].values())
    for persona in ("tenant member", "platform admin"):
        pages = result["pages"][persona]
        assert all(p["p50_ms"] <= p["p95_ms"] and p["queries"] >= 3 for p in pages.values())
    assert result["api_p99_ms_c2"] > 0 and result["api"]["errors"] == 0
    assert {"loads list", "audit-events list"} <= set(result["api"]["endpoints"])
    assert result["seeded"]["audit_events"] == 300 and result["seed_s"] >= 0
    with admin:
        left = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                             [result["database"]]).fetchone()
    assert left is None
