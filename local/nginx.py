"""A real, local nginx: the traffic router of the local cluster and the tests.

The Debian package ``nginx`` provides the binary. This module writes a main configuration
under a prefix directory and runs nginx on it in the foreground (``daemon off;`` with a
master process), in its own session, as :func:`start_nginx`; :meth:`NginxProcess.stop` and
:func:`stop_pid` stop it. The main configuration holds only what belongs to the process:

* the modules it loads: Debian's Lua module when installed (``libnginx-mod-http-lua``), with
  which the traffic router times an LLM route's streamed answers token by token;
* the pid file, the error log, the temp directories, all under the prefix;
* a status server on the process's own port, with ``stub_status`` at :data:`STATUS_PATH`;
* ``include <conf_dir>/*.conf;`` inside ``http``: the routes that the traffic-router adapter
  (``fleet.adapters.routers.nginx``) writes there; none at first.

Started again after a crash, nginx serves the routes last put in force, since the adapter
only leaves configuration on disk that nginx accepted. When run as root, nginx's workers run
as the owner of the prefix directory (root for a root-owned data directory), so they can
reach the unix sockets and temp files under it.

It is a plain Python module: no Django, no settings; every path and port is an argument.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from fleet.adapters.routers.nginx_paths import pid_file, token_timing_modules
from local.processes import alive as _alive
from local.processes import cmdline, start_on_ports, terminate
from local.processes import tail as _tail_lines

STATUS_PATH = "/nginx_status"
LOG_TAIL_LINES = 20
TEMP_KINDS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def find_nginx() -> str:
    """The nginx binary: on ``PATH``, else Debian's ``/usr/sbin/nginx`` (not on a user's PATH)."""
    return shutil.which("nginx") or "/usr/sbin/nginx"


@dataclass
class NginxProcess:
    """An nginx master process started by :func:`start_nginx`."""

    pid: int
    port: int
    status_url: str
    prefix: Path
    main_config: Path
    conf_dir: Path
    error_log: Path
    nginx: str
    modules: tuple[Path, ...] = ()
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    _stopped: bool = field(default=False, repr=False, compare=False)

    def is_running(self) -> bool:
        """True while the master process is alive."""
        if self._popen is not None:
            return self._popen.poll() is None
        return _alive(self.pid)

    def worker_pids(self) -> set[int]:
        """The master's live worker processes (a reload replaces them all)."""
        try:
            children = psutil.Process(self.pid).children()
        except psutil.Error:
            return set()
        found = set()
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE:
                    found.add(child.pid)
        return found

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the error log."""
        return _tail_lines(self.error_log, lines)

    def router_options(self) -> dict[str, object]:
        """Keyword arguments of ``fleet.adapters.routers.nginx.NginxRouter`` for this nginx."""
        return {
            "conf_dir": self.conf_dir,
            "nginx": self.nginx,
            "main_config": self.main_config,
            "prefix": self.prefix,
            "status_url": self.status_url,
            "error_log": self.error_log,
            "load_modules": list(self.modules),
        }

    def stop(self, timeout: float = 10.0) -> None:
        """Stop nginx (SIGQUIT: finish the requests in flight; SIGTERM to the group, then
        SIGKILL, after ``timeout`` s). Safe to call twice."""
        if self._stopped:
            return
        popen = self._popen
        if self.is_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGQUIT)
            end = time.monotonic() + timeout
            while self.is_running() and time.monotonic() < end:
                time.sleep(0.05)
        terminate(self.pid, timeout, group=True)
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(5.0)  # reap
        self._stopped = True


def _is_nginx_master(pid: int) -> bool:
    args = cmdline(pid)
    return bool(args) and args[0].startswith("nginx: master process")


def stop_pid(pid: int, timeout: float = 10.0) -> bool:
    """Stop the nginx master ``pid`` started by another process (e.g. from its pid file).

    Returns False, doing nothing, when ``pid`` is gone or is not an nginx master.
    """
    if not _alive(pid) or not _is_nginx_master(pid):
        return False
    terminate(pid, timeout, group=False)
    return True


def _worker_user(prefix: Path) -> str:
    """The ``user`` directive for a root master: the owner of the prefix directory."""
    stat = prefix.stat()
    user = pwd.getpwuid(stat.st_uid).pw_name
    group = grp.getgrgid(stat.st_gid).gr_name
    return f"user {user} {group};"


def main_config_text(
    prefix: Path,
    conf_dir: Path,
    *,
    host: str,
    port: int,
    worker_processes: int,
    modules: list[Path] | tuple[Path, ...] = (),
) -> str:
    """The main configuration nginx runs with (see the module docstring)."""
    lines = [
        "# Written by Switchyard's local cluster runtime; rewritten at each start.",
        *[f"load_module {module};" for module in modules],
        "daemon off;",
        "master_process on;",
        f"worker_processes {worker_processes};",
        f"pid {pid_file(prefix)};",
        f"error_log {prefix}/logs/error.log notice;",
    ]
    if os.geteuid() == 0:
        lines.append(_worker_user(prefix))
    lines += [
        "events {",
        "    worker_connections 4096;",
        "}",
        "http {",
        *[f"    {kind}_temp_path {prefix}/temp/{kind};" for kind in TEMP_KINDS],
        "    access_log off;",
        "    server_tokens off;",
        "    # Each route adds a few variables; room for hundreds of routes.",
        "    variables_hash_max_size 8192;",
        "    variables_hash_bucket_size 128;",
        "    server {",
        f"        listen {host}:{port};",
        f"        location = {STATUS_PATH} {{",
        "            stub_status;",
        "        }",
        "        location / {",
        "            return 404;",
        "        }",
        "    }",
        f"    include {conf_dir}/*.conf;",
        "}",
        "",
    ]
    return "\n".join(lines)


def _remove_stale_sockets(socket_dir: Path) -> None:
    """Unix sockets left by an nginx that was killed: a new one could not bind them."""
    for sock in socket_dir.glob("*.sock"):
        with contextlib.suppress(OSError):
            sock.unlink()


def _wait_ready(popen: subprocess.Popen[bytes], status_url: str, timeout: float) -> str:
    """Poll the status location; return "" once it answers, else a reason for the failure."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while True:
            code = popen.poll()
            if code is not None:
                return f"nginx exited with code {code} before it answered"
            with contextlib.suppress(httpx.HTTPError):
                response = client.get(status_url)
                if response.status_code == 200 and "Active connections" in response.text:
                    return ""
            if time.monotonic() >= deadline:
                return f"nginx did not answer at {status_url} after {timeout:.0f} s"
            time.sleep(0.05)


def start_nginx(
    prefix: Path,
    *,
    conf_dir: Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    worker_processes: int = 2,
    nginx: str | None = None,
    ready_timeout: float = 15.0,
    modules: list[Path] | tuple[Path, ...] | None = None,
) -> NginxProcess:
    """Write the main configuration under ``prefix`` and start nginx on it.

    ``conf_dir`` (default ``prefix/switchyard``) is the directory whose ``*.conf`` files the
    ``http`` block includes: the traffic router's directory. ``port`` is the status server's
    port; 0 picks a free one (retried up to twice if it is taken before nginx binds it). The
    master runs in the foreground in its own session; its output and its error log go to
    ``prefix/logs/error.log``. On an early exit or timeout it is stopped and a RuntimeError
    carrying the last lines of that log is raised. ``modules``: the dynamic modules it loads
    (default: Debian's Lua module when installed, ``token_timing_modules``).
    """
    prefix = Path(prefix).resolve()
    loaded = tuple(token_timing_modules() if modules is None else modules)
    conf_dir = Path(conf_dir).resolve() if conf_dir else prefix / "switchyard"
    binary = nginx or find_nginx()
    for sub in ("conf", "logs", *(f"temp/{kind}" for kind in TEMP_KINDS)):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    conf_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_sockets(conf_dir / "run")
    main = prefix / "conf" / "nginx.conf"
    error_log = prefix / "logs" / "error.log"

    def launch(ports: list[int]) -> tuple[NginxProcess, str]:
        main.write_text(
            main_config_text(
                prefix, conf_dir, host=host, port=ports[0], worker_processes=worker_processes,
                modules=loaded,
            )
        )
        status_url = f"http://{host}:{ports[0]}{STATUS_PATH}"
        cmd = [binary, "-c", str(main), "-p", str(prefix), "-e", str(error_log)]
        with error_log.open("ab") as log:
            popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = NginxProcess(
            pid=popen.pid,
            port=ports[0],
            status_url=status_url,
            prefix=prefix,
            main_config=main,
            conf_dir=conf_dir,
            error_log=error_log,
            nginx=binary,
            modules=loaded,
            _popen=popen,
        )
        return proc, _wait_ready(popen, status_url, ready_timeout)

    return start_on_ports(host, (port,), launch, error_log, LOG_TAIL_LINES)
