"""Running a bench script the way its smoke tests do: a child process with ``--json``, whose
one JSON object on stdout is the result."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


LEAVE_OUT = ("DATABASE_URL", "REDIS_URL")
MIGRATED_SQLITE_ENV = "SWITCHYARD_BENCH_MIGRATED_SQLITE"  # bench/loads.py's migrate()
SQLITE_BENCHES = ("loads.py", "router.py", "rollback.py", "freshness.py", "looks.py")


@functools.cache
def migrated_sqlite() -> Path:
    """A SQLite database migrated once for this test process, removed at its exit: the
    benches that make a SQLite database of their own copy it instead of running every
    migration from nothing (~7 s of CPU each, six bench runs)."""
    folder = Path(tempfile.mkdtemp(prefix="switchyard-bench-migrated-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "migrated.sqlite3"
    env = {k: v for k, v in os.environ.items() if k not in LEAVE_OUT}
    env["DATABASE_URL"] = f"sqlite:///{path}"
    done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return path


def run_bench(script: str, *args: str, leave_out: tuple[str, ...] = LEAVE_OUT,
              timeout: float = 300) -> dict[str, Any]:
    """``bench/<script> <args> --json``, with the caller's environment less ``leave_out`` (a
    bench that starts its own database or Redis must not be handed the suite's). Fails the
    test with the end of the bench's stderr when it does not exit 0."""
    return run_bench_logged(script, *args, leave_out=leave_out, timeout=timeout)[0]


def run_bench_logged(script: str, *args: str, leave_out: tuple[str, ...] = LEAVE_OUT,
                     timeout: float = 300) -> tuple[dict[str, Any], str]:
    """:func:`run_bench`, and the progress the bench wrote to stderr."""
    env = {k: v for k, v in os.environ.items() if k not in leave_out}
    if script in SQLITE_BENCHES:
        env[MIGRATED_SQLITE_ENV] = str(migrated_sqlite())
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / script), *args, "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout), done.stderr
