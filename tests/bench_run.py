"""Running a bench script the way its smoke tests do: a child process with ``--json``, whose
one JSON object on stdout is the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


LEAVE_OUT = ("DATABASE_URL", "REDIS_URL")


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
