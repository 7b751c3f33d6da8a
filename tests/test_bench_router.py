"""bench/router.py runs end to end and reports sane numbers (a smoke test, not a speed goal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
KEYS = (
    "direct_p50_ms_c1",
    "route_p50_ms_c1",
    "direct_p50_ms_c16",
    "route_p50_ms_c16",
    "route_p99_ms_c16",
    "weight_change_s_median",
    "apply_s_median",
)


@pytest.mark.triton
def test_the_router_bench_runs_and_reports_sane_numbers():
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}

    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "router.py"),
         "--requests", "64", "--changes", "2", "--reloads", "2", "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    for key in KEYS:
        assert isinstance(result.get(key), float) and result[key] > 0, (key, result.get(key))
    for key in ("overhead_p50_ms_c1", "overhead_p50_ms_c16", "overhead_p99_ms_c16"):
        assert isinstance(result.get(key), float), (key, result.get(key))
    assert result["requests_c1"] == result["requests_c16"] == 64
    assert result["weight_changes"] == 2
    # A change is in force once nginx serves it, which apply() waits for: seconds at most.
    assert result["weight_change_s_median"] <= result["apply_s_median"] + 1 < 15
    assert result["reloads"] == 2 and result["requests_during_reloads"] > 0
    # What failed was only ever a keep-alive request that never reached nginx, and its retry
    # on a new connection succeeded.
    assert result["failed_during_reloads"] == 0, result["reload_failures"]
    assert result["retried_requests_that_reached_nginx"] == 0
