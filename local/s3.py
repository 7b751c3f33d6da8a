"""A real, local S3 endpoint: moto's server mode on 127.0.0.1.

``moto[server]`` (a dev dependency) ships a werkzeug application that speaks the S3 REST API
over HTTP; ``python -m moto.server -H HOST -p PORT`` runs it (the same entry point as the
``moto_server`` console script). Clients reach it with ``endpoint_url`` and path-style
addressing, exactly as they reach MinIO or any other S3-compatible store. This module

* starts and stops such servers (:func:`start_moto`, :meth:`MotoProcess.stop`,
  :func:`stop_pid`),
* wipes their data (:func:`reset`) and switches IAM enforcement on (:func:`enable_iam`).

**Moto keeps everything in memory**: buckets and objects vanish when the process stops, and
a restarted server starts empty (seed it again). It accepts any credentials until IAM
enforcement is switched on; the demo uses :data:`DEMO_ACCESS_KEY_ID`,
:data:`DEMO_SECRET_ACCESS_KEY` and :data:`DEMO_REGION`.

It is a plain Python module: no Django, no settings; every path and port is an argument.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from local.processes import alive as _alive
from local.processes import cmdline, start_on_ports, terminate
from local.processes import tail as _tail_lines

DEMO_ACCESS_KEY_ID = "switchyard"
DEMO_SECRET_ACCESS_KEY = "switchyard-secret"
DEMO_REGION = "us-east-1"
LOG_TAIL_LINES = 20
# Moto's own API; answers JSON only when the process on the port really is moto.
_PROBE_PATH = "/moto-api/data.json"
# Environment variables of the parent that would change how the server behaves.
_SCRUBBED_ENV = ("INITIAL_NO_AUTH_ACTION_COUNT", "MOTO_PORT", "TEST_SERVER_MODE")


def _is_moto_server(pid: int) -> bool:
    args = [arg for arg in cmdline(pid) if arg]
    return "moto.server" in args or any(Path(a).name == "moto_server" for a in args[:2])


@dataclass
class MotoProcess:
    """A moto server started by :func:`start_moto`; its data lives only in its memory."""

    pid: int
    endpoint_url: str
    log_path: Path
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    _stopped: bool = field(default=False, repr=False, compare=False)

    def is_running(self) -> bool:
        """True while the server process is alive."""
        if self._popen is not None:
            return self._popen.poll() is None
        return _alive(self.pid)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log."""
        return _tail(self.log_path, lines)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after ``timeout`` s); its data is lost.

        Safe to call twice.
        """
        if self._stopped:
            return
        popen = self._popen
        if self.is_running():
            terminate(self.pid, timeout, group=False)
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(5.0)  # reap
        self._stopped = True


def stop_pid(pid: int, timeout: float = 10.0) -> bool:
    """Stop the moto server ``pid`` started by another process (e.g. from a pidfile).

    Sends SIGTERM (SIGKILL after ``timeout`` s). Returns False, doing nothing, when ``pid``
    is gone or is not a moto server (stale pidfile).
    """
    if not _alive(pid) or not _is_moto_server(pid):
        return False
    terminate(pid, timeout, group=False)
    return True


def _server_env(port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for name in _SCRUBBED_ENV:
        env.pop(name, None)
    env["MOTO_PORT"] = str(port)  # moto builds some URLs with it
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _wait_ready(popen: subprocess.Popen[bytes], endpoint_url: str, timeout: float) -> str:
    """Poll moto's own API; return "" once it answers, else a reason for the failure."""
    deadline = time.monotonic() + timeout
    url = f"{endpoint_url}{_PROBE_PATH}"
    with httpx.Client(timeout=1.0) as client:
        while True:
            code = popen.poll()
            if code is not None:
                return f"moto server exited with code {code} before it answered"
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = client.get(url)
                if response.status_code == 200 and isinstance(response.json(), dict):
                    # Someone else may own the port: make sure our process is still up.
                    time.sleep(0.05)
                    if popen.poll() is None:
                        return ""
            if time.monotonic() >= deadline:
                return f"moto server did not answer at {endpoint_url} after {timeout:.0f} s"
            time.sleep(0.05)


def start_moto(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    log_path: Path,
    ready_timeout: float = 30.0,
) -> MotoProcess:
    """Start ``python -m moto.server`` on ``host:port`` and wait until it answers HTTP.

    A port of 0 means "pick a free one" (if such a port is taken before the server binds it,
    the start is retried up to twice). The server runs in its own session with stdout and
    stderr going to ``log_path``, with IAM enforcement off (any credentials work; see
    :func:`enable_iam`). Data is kept in memory only. On an early exit or timeout the server
    is stopped and a RuntimeError carrying the last lines of the log is raised.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def launch(ports: list[int]) -> tuple[MotoProcess, str]:
        endpoint_url = f"http://{host}:{ports[0]}"
        cmd = [sys.executable, "-m", "moto.server", "-H", host, "-p", str(ports[0])]
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_server_env(ports[0]),
                start_new_session=True,
            )
        proc = MotoProcess(
            pid=popen.pid, endpoint_url=endpoint_url, log_path=log_path, _popen=popen
        )
        return proc, _wait_ready(popen, endpoint_url, ready_timeout)

    return start_on_ports(host, (port,), launch, log_path, LOG_TAIL_LINES)


def reset(endpoint_url: str, timeout: float = 5.0) -> None:
    """Delete every bucket, object and IAM entity the moto server at ``endpoint_url`` holds."""
    response = httpx.post(f"{endpoint_url.rstrip('/')}/moto-api/reset", timeout=timeout)
    response.raise_for_status()


def enable_iam(endpoint_url: str, *, after_requests: int = 0, timeout: float = 5.0) -> None:
    """Make the moto server at ``endpoint_url`` check signatures and IAM policies.

    From then on (after ``after_requests`` more unchecked requests) an unknown access key
    gets ``InvalidAccessKeyId``, a wrong secret ``SignatureDoesNotMatch`` and a user without
    a matching policy ``AccessDenied``, as real S3 answers. Only access keys created through
    moto's IAM API are known, so seed users, keys and objects *before* calling this. The
    switch is global to the process: use a server of its own for such tests.
    """
    response = httpx.post(
        f"{endpoint_url.rstrip('/')}/moto-api/reset-auth",
        content=str(after_requests).encode(),
        timeout=timeout,
    )
    response.raise_for_status()


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return _tail_lines(path, lines)
