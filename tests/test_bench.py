"""bench/loads.py runs end to end and reports sane numbers (a smoke test, not a speed goal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
KEYS = (
    "load_s_median",
    "load_warm_s_median",
    "bare_load_s_median",
    "unload_s_median",
    "bare_unload_s_median",
)


@pytest.mark.triton
def test_the_load_bench_runs_and_reports_positive_timings():
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}

    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "loads.py"), "--runs", "1", "--json"],
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
    assert result["runs"] == 1
    # Switchyard does the bare calls and more: far below half of bare means it measured nothing.
    assert result["load_s_median"] >= result["bare_load_s_median"] * 0.5
