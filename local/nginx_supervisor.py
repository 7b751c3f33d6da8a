"""Keep the local nginx running: start it, and start it again from the last good config
whenever it dies.

:class:`NginxSupervisor` runs :func:`local.nginx.start_nginx` on one prefix and
one status port, then watches the master process. When it exits (killed, crashed), what is
left of it (workers still holding ports) is stopped, and nginx is started again on the same
prefix: its main configuration includes the router's directory, where the traffic router
only ever leaves configuration that nginx accepted, so the restarted nginx serves the routes
last put in force, on the same ports. Restarts back off (0.5 s, doubling, at most 30 s) while
nginx keeps dying or cannot start, and the back-off resets once it has run for a minute.

The supervisor writes its state to ``<prefix>/run/supervisor.json`` (``state``: starting,
running, restarting or stopped; ``pid``, ``status_url``, ``started_at``, ``restarts``,
``last_exit``, ``last_exit_at``, ``last_error``) so that other processes can show it.

Plain Python: no Django, no settings; every path and port is an argument.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.adapters.routers.nginx_paths import pid_file
from local.nginx import NginxProcess, start_nginx, stop_pid
from local.processes import cmdline

POLL_S = 0.2
MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
STABLE_S = 60.0
STATE_FILE = "run/supervisor.json"


def read_state(prefix: Path) -> dict[str, Any] | None:
    """The supervisor state written under ``prefix``, or None when there is none."""
    try:
        data = json.loads((Path(prefix) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stop_leftover(prefix: Path) -> int | None:
    """Stop an nginx master left running on ``prefix`` (its pid file names it, and its
    command line names this prefix's main config). Returns its pid, or None."""
    prefix = Path(prefix).resolve()
    try:
        pid = int(pid_file(prefix).read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    if not pid or str(prefix / "conf" / "nginx.conf") not in " ".join(cmdline(pid)):
        return None
    return pid if stop_pid(pid) else None


class NginxSupervisor:
    """Runs nginx on ``prefix`` with its status server on ``host:status_port``."""

    def __init__(
        self,
        prefix: Path,
        *,
        status_port: int,
        host: str = "127.0.0.1",
        conf_dir: Path | None = None,
        worker_processes: int = 2,
        progress: Callable[[str], None] = print,
        min_backoff: float = MIN_BACKOFF_S,
        max_backoff: float = MAX_BACKOFF_S,
        stable_s: float = STABLE_S,
    ) -> None:
        self.prefix = Path(prefix).resolve()
        self.status_port = status_port
        self.host = host
        self.conf_dir = conf_dir
        self.worker_processes = worker_processes
        self.progress = progress
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.stable_s = stable_s
        self.proc: NginxProcess | None = None
        self.restarts = 0
        self._state: dict[str, Any] = {"state": "starting", "restarts": 0}

    def start(self) -> NginxProcess:
        """Start nginx (stopping one left running on this prefix first); RuntimeError with
        nginx's log when it does not come up."""
        old = stop_leftover(self.prefix)
        if old:
            self.progress(f"stopped an nginx left running on {self.prefix} (pid {old})")
        self.proc = start_nginx(
            self.prefix,
            conf_dir=self.conf_dir,
            host=self.host,
            port=self.status_port,
            worker_processes=self.worker_processes,
        )
        self._write(state="running", pid=self.proc.pid, status_url=self.proc.status_url,
                    started_at=time.time(), last_error="")
        return self.proc

    def run(self, stop: threading.Event) -> None:
        """Start nginx if it is not running, then watch it until ``stop`` is set, starting
        it again each time it dies; stop it at the end."""
        try:
            if self.proc is None:
                self.start()
            self._watch(stop)
        finally:
            if self.proc is not None:
                self.proc.stop()
            self._write(state="stopped", pid=None)

    def _watch(self, stop: threading.Event) -> None:
        failures = 0
        started = time.monotonic()
        while not stop.wait(POLL_S):
            assert self.proc is not None
            if self.proc.is_running():
                if failures and time.monotonic() - started >= self.stable_s:
                    failures = 0
                continue
            code = self.proc._popen.poll() if self.proc._popen is not None else None
            tail = self.proc.log_tail(5)
            self.proc.stop()  # its workers may still hold the ports
            failures += 1
            delay = min(self.min_backoff * 2 ** (failures - 1), self.max_backoff)
            self.progress(
                f"nginx (pid {self.proc.pid}) exited with code {code}; starting it again "
                f"in {delay:.1f} s from the last good configuration"
            )
            self._write(state="restarting", pid=None, last_exit=f"exit code {code}",
                        last_exit_at=time.time(), last_error=tail)
            while not stop.wait(delay):
                try:
                    self.start()
                except RuntimeError as exc:
                    failures += 1
                    delay = min(self.min_backoff * 2 ** (failures - 1), self.max_backoff)
                    self.progress(f"nginx did not start ({exc}); trying again in {delay:.1f} s")
                    self._write(state="restarting", last_error=str(exc)[-2000:])
                    continue
                self.restarts += 1
                self._write(restarts=self.restarts)
                started = time.monotonic()
                self.progress(f"nginx running again (pid {self.proc.pid}); {self.restarts} "
                              f"restart{'' if self.restarts == 1 else 's'} so far")
                break

    def _write(self, **changes: Any) -> None:
        self._state.update(changes)
        path = self.prefix / STATE_FILE
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(self._state, sort_keys=True))
            tmp.replace(path)
