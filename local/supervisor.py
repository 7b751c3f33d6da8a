"""A tiny process supervisor for the demo: start children, watch them, stop them all.

Each child runs in its own process group, so stopping it also stops what it started
(Triton's python-backend stubs, Celery's pool processes). A child that dies stops the demo:
half a product running is worse than a clear message.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.running():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop_all(children: Sequence[Child], timeout: float = 20.0) -> None:
    """SIGTERM every child (last started first), then SIGKILL what is left after ``timeout``."""
    for child in reversed(children):
        child.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(c.running() for c in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    for child in children:
        if child.running():
            child.signal(signal.SIGKILL)
        if child.popen is not None:
            child.popen.wait()


def first_dead(children: Sequence[Child]) -> Child | None:
    return next((c for c in children if c.popen is not None and not c.running()), None)
