"""The nginx traffic router: routes as nginx configuration files, put in force by a reload.

Layout of the configuration directory ``conf_dir`` this adapter owns::

    conf_dir/switchyard.conf      shared maps + ``include conf_dir/routes/*.conf``
    conf_dir/routes/<name>.conf   one file per route (see fleet.adapters.routers.nginx_conf)
    conf_dir/run/*.sock           the least-pending hops' unix sockets (socket_dir)

The nginx that serves the routes includes ``conf_dir/switchyard.conf`` inside its ``http``
block: the local runtime's main config includes ``conf_dir/*.conf``; on a static cluster the
operator adds ``include <conf_dir>/switchyard.conf;`` and, for more than a handful of routes,
``variables_hash_max_size 8192; variables_hash_bucket_size 128;`` to its ``http`` block, and
passes the adapter its reload command. Every route listens on a port of its own, taken from
``ports`` on first apply and kept for as long as the route exists: clients call
``http://<public_host>:<port>`` exactly as they would call the Triton or vLLM server behind
it (tritonclient, perf_analyzer and OpenAI SDKs take such a base URL).

A change is put in force in four steps, under a file lock so two workers never interleave:

1. the new file is rendered and tested with ``nginx -t`` in a staging copy of the directory
   (the other routes included), before anything in ``conf_dir`` changes;
2. it replaces the route's file with an atomic rename;
3. with ``main_config`` set, the full configuration nginx runs is tested again
   (``nginx -t -c main -p prefix``), and the previous file is restored when it fails;
4. the reload command runs (default ``nginx -s reload -c main -p prefix``) and the adapter
   waits until the route's identity location answers the new file's hash, watching the error
   log for ``[emerg]`` (a port already in use, say): on failure the previous file is restored,
   so the files on disk are always the configuration last put in force.

A route already in force (same file, and nginx answering its hash) is left alone: no write
and no reload. A reload fails no request nginx has received (old workers finish theirs);
the one thing a client can see is its next request on an idle keep-alive connection meeting
the old worker's close, which never reached nginx and is retried on a new connection.

Per-request samples: every route writes one JSON line per request (and per mirrored copy) to
each ``access_log`` target, with ``escape=json``: ``time``, ``msec``, ``route``, ``variant``,
``mirror``, ``method``, ``path``, ``status``, ``upstream_addr``, ``upstream_status``,
``upstream_response_time``, ``upstream_header_time`` (the server's time to its response header:
a streamed answer's first token), ``content_type`` (the answer's, its first 128 bytes), ``key``
(on a sticky route, the sticky header's value, its first 256 bytes; "" otherwise and in a
mirrored copy's line), ``request_time``, ``bytes_sent``, ``request_id``; and on an LLM route of an nginx with the Lua
module (``token_timing``) ``first_token`` (seconds from the request's start to the answer's
first streamed event) and ``tokens`` (the answer's ``completion_tokens`` when it reports them,
else its streamed events), both "" for an answer that streamed nothing. A
:func:`syslog_target` sends them as UDP syslog messages (``<190>... switchyard: {json}``) to
a collector, which is how they leave an nginx on another host; a file target suits a local
reader. Plain Python: no Django, no settings, nothing from ``local``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import psutil
from filelock import FileLock

from fleet.adapters.base import AdapterError
from fleet.adapters.routers import nginx_paths
from fleet.adapters.routers.base import (
    ApplyResult,
    RouterHealth,
    RouteSpec,
    RouteSpecError,
    validate_route,
)
from fleet.adapters.routers.nginx_conf import (
    IDENTITY_PATH,
    base_conf,
    parse_header,
    render_route,
    socket_path,
)

BASE_CONF_NAME = "switchyard.conf"
LUA_MODULE_NAME = "ngx_http_lua_module.so"
DEFAULT_PORTS = range(18100, 18200)
UNIX_PATH_MAX = 107
NGINX_TEST_TIMEOUT = 30.0
LOG_QUIET_S = 0.7  # longer than nginx's 500 ms between two tries to bind a port


def syslog_target(host: str, port: int, tag: str = "switchyard") -> str:
    """An ``access_log`` target sending each line as one UDP syslog message to host:port."""
    return f"syslog:server={host}:{port},tag={tag},nohostname"


class NginxRouter:
    """Routes on one nginx whose configuration directory this process can write.

    ``access_log`` lists nginx ``access_log`` targets that receive every request's JSON line:
    :func:`syslog_target` (for a collector listening on UDP) and/or file paths.
    ``status_url`` is nginx's ``stub_status`` location, used by :meth:`health`;
    ``error_log`` the error log the running nginx writes (its ``[emerg]`` lines explain a
    failed reload); ``public_host`` the host name clients use in route URLs (default
    ``listen_host``). A static cluster without ``main_config`` passes its own
    ``reload_command`` (for example ``ssh router sudo nginx -s reload``). ``load_modules``:
    the dynamic modules the running nginx loads (its ``load_module`` lines), loaded by the
    staging test too; with the Lua module among them, LLM routes time their streamed answers
    token by token (``token_timing``).
    """

    def __init__(
        self,
        conf_dir: Path,
        *,
        nginx: str = "nginx",
        main_config: Path | None = None,
        prefix: Path | None = None,
        reload_command: Sequence[str] | None = None,
        listen_host: str = "127.0.0.1",
        public_host: str | None = None,
        ports: Sequence[int] = DEFAULT_PORTS,
        check_ports: bool = True,
        access_log: Sequence[str] = (),
        status_url: str | None = None,
        error_log: Path | None = None,
        socket_dir: Path | None = None,
        reload_timeout: float = 10.0,
        http_timeout: float = 2.0,
        load_modules: Sequence[Path] = (),
    ) -> None:
        self.conf_dir = Path(conf_dir).resolve()
        self.routes_dir = self.conf_dir / "routes"
        self.socket_dir = Path(socket_dir) if socket_dir else self.conf_dir / "run"
        self.nginx = nginx
        self.main_config = Path(main_config) if main_config else None
        self.prefix = Path(prefix) if prefix else None
        if reload_command is None:
            if self.main_config is None:
                raise ValueError("either main_config or reload_command is needed")
            reload_command = [nginx, *self._main_args(), "-s", "reload"]
        self.reload_command = list(reload_command)
        self.listen_host = listen_host
        self.public_host = public_host or listen_host
        self.ports = list(ports)
        self.check_ports = check_ports
        for target in access_log:
            if not target or any(c in target for c in " \t\n;{}'\""):
                raise ValueError(f"access_log target {target!r} is not a plain nginx target")
        self.access_log = list(access_log)
        self.status_url = status_url
        self.error_log = Path(error_log) if error_log else None
        self.reload_timeout = reload_timeout
        self.http_timeout = http_timeout
        self.load_modules = [Path(module) for module in load_modules]
        self.token_timing = any(m.name == LUA_MODULE_NAME for m in self.load_modules)
        longest = socket_path(self.socket_dir, "x", 99)
        if len(str(longest).encode()) > UNIX_PATH_MAX:
            raise ValueError(f"socket_dir {self.socket_dir} is too long for unix socket paths")

    # ----------------------------------------------------------------------------------------
    # The interface
    # ----------------------------------------------------------------------------------------

    def apply(self, route: RouteSpec) -> ApplyResult:
        """Put ``route`` in force (see the module docstring); idempotent."""
        validate_route(route)
        with self._lock():
            self._ensure_dirs()
            current = self._read_text(route.name)
            port = self._port_of(current) or self._free_port(route.name)
            text = render_route(
                route,
                listen=f"{self.listen_host}:{port}",
                access_log=self.access_log,
                socket_dir=self.socket_dir,
                token_timing=self.token_timing,
            )
            url = self._url(port)
            base_changed = self._base_text() != self._wanted_base()
            sha = _sha_of(text)
            if text == current and not base_changed and self._served_sha(port) == sha:
                return ApplyResult(False, False, f"route {route.name} already in force", url)
            message = self._put_in_force(route.name, text, port, sha)
            return ApplyResult(text != current or base_changed, True, message, url)

    def remove(self, name: str) -> bool:
        """Take the route ``name`` out of nginx; False when there is no such route."""
        with self._lock():
            current = self._read_text(name)
            if current is None:
                return False
            self._ensure_dirs()
            port = self._port_of(current)
            self._put_in_force(name, None, port, None)
            return True

    def read(self, name: str) -> RouteSpec | None:
        """The route ``name`` as last put in force (from its file's header), or None."""
        header = parse_header(self._read_text(name) or "")
        if header is None:
            return None
        try:
            return RouteSpec.from_json(header["spec"])  # type: ignore[arg-type]
        except (KeyError, TypeError, RouteSpecError):
            return None

    def url(self, name: str) -> str | None:
        """The base URL of the route ``name``, or None when there is no route."""
        port = self._port_of(self._read_text(name))
        return self._url(port) if port else None

    def names(self) -> list[str]:
        """The names of the routes in the configuration directory."""
        if not self.routes_dir.is_dir():
            return []
        return sorted(p.stem for p in self.routes_dir.glob("*.conf"))

    def draining(self) -> int | None:
        """How many nginx workers from before the last reload are still answering requests.

        A reload starts new workers on the new configuration; each old one takes no new
        request, finishes those it has, then exits. A variant a change took off the route
        gets no request from the new workers, so once no old worker runs, nothing is in flight
        to it. None where this router cannot see nginx's processes (one reloaded by a command,
        on another host)."""
        if self.prefix is None:
            return None
        try:
            master = psutil.Process(int(nginx_paths.pid_file(self.prefix).read_text().strip()))
            children = master.children()
        except (OSError, ValueError, psutil.Error):
            return None
        old = 0
        for child in children:
            with contextlib.suppress(psutil.Error):
                old += "shutting down" in " ".join(child.cmdline())
        return old

    def health(self) -> RouterHealth:
        """Ask nginx's status location and every route's identity location; never raises."""
        problems = []
        active = None
        if self.status_url:
            try:
                response = httpx.get(self.status_url, timeout=self.http_timeout)
                response.raise_for_status()
                active = _active_connections(response.text)
            except httpx.HTTPError as exc:
                problems.append(f"nginx status at {self.status_url} did not answer: {exc}")
        routes = {}
        for name in self.names():
            text = self._read_text(name) or ""
            port = self._port_of(text)
            routes[name] = port is not None and self._served_sha(port) == _sha_of(text)
            if not routes[name]:
                problems.append(f"route {name} is not in force")
        ok = not problems
        message = "; ".join(problems) if problems else f"{len(routes)} route{'' if len(routes) == 1 else 's'} in force"
        return RouterHealth(ok=ok, message=message, routes=routes, active_connections=active)

    # ----------------------------------------------------------------------------------------
    # Putting a change in force
    # ----------------------------------------------------------------------------------------

    def _put_in_force(self, name: str, text: str | None, port: int | None, sha: str | None) -> str:
        """Test, swap in, test again, reload and confirm; restore the old file on failure."""
        path = self.routes_dir / f"{name}.conf"
        previous = self._read_text(name)
        previous_base = self._base_text()
        self._test_staged(name, text)
        _write_atomic(self.conf_dir / BASE_CONF_NAME, self._wanted_base())
        if text is None:
            path.unlink(missing_ok=True)
        else:
            _write_atomic(path, text)
        try:
            if self.main_config is not None:
                self._run_test([*self._main_args(), "-t"], "the nginx configuration in force")
            return self._reload_and_confirm(name, port, sha)
        except AdapterError:
            self._restore(path, previous, previous_base)
            raise

    def _restore(self, path: Path, previous: str | None, previous_base: str | None) -> None:
        if previous is None:
            path.unlink(missing_ok=True)
        else:
            _write_atomic(path, previous)
        if previous_base is not None:
            _write_atomic(self.conf_dir / BASE_CONF_NAME, previous_base)

    def _test_staged(self, name: str, text: str | None) -> None:
        """``nginx -t`` the configuration directory as it would be with ``text`` for ``name``
        (None: without the route), in a staging copy; raise AdapterError (permanent) with
        nginx's message when nginx refuses it."""
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.conf_dir))
        try:
            routes = staging / "routes"
            routes.mkdir()
            for other in self.routes_dir.glob("*.conf"):
                if other.stem != name:
                    shutil.copyfile(other, routes / other.name)
            if text is not None:
                (routes / f"{name}.conf").write_text(text)
            (staging / BASE_CONF_NAME).write_text(base_conf(routes))
            temp = staging / "temp"
            temp.mkdir()
            main = staging / "test.conf"
            main.write_text(
                "\n".join(
                    [
                        *[f"load_module {module};" for module in self.load_modules],
                        f"pid {staging}/nginx.pid;",
                        "events {}",
                        "http {",
                        *[
                            f"    {kind}_temp_path {temp}/{kind};"
                            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
                        ],
                        "    variables_hash_max_size 8192;",
                        "    variables_hash_bucket_size 128;",
                        f"    include {staging}/{BASE_CONF_NAME};",
                        "}",
                        "",
                    ]
                )
            )
            self._run_test(
                ["-c", str(main), "-p", str(staging), "-e", "stderr", "-t"],
                f"route {name}",
                shown=(str(staging), str(self.conf_dir)),
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _run_test(self, args: list[str], what: str, shown: tuple[str, str] | None = None) -> None:
        try:
            result = subprocess.run(
                [self.nginx, *args],
                capture_output=True,
                text=True,
                timeout=NGINX_TEST_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AdapterError(f"cannot run {self.nginx} -t: {exc}") from exc
        if result.returncode != 0:
            output = _nginx_problem(result.stderr or result.stdout)
            if shown is not None:
                output = output.replace(*shown)
            raise AdapterError(f"nginx refused {what}: {output}", permanent=True)

    def _reload_and_confirm(self, name: str, port: int | None, sha: str | None) -> str:
        log_size = _size(self.error_log)
        try:
            result = subprocess.run(
                self.reload_command,
                capture_output=True,
                text=True,
                timeout=NGINX_TEST_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AdapterError(f"reload command failed: {exc}") from exc
        if result.returncode != 0:
            output = _nginx_problem(result.stderr or result.stdout)
            raise AdapterError(f"nginx reload failed (exit {result.returncode}): {output}")
        started = time.monotonic()
        deadline = started + self.reload_timeout
        while True:
            served = self._served_sha(port) if port else None
            if served == sha:  # the new file answers, or (removal) the route is gone
                took = time.monotonic() - started
                done = "removed" if sha is None else "in force"
                return f"route {name} {done}; nginx reloaded in {took:.2f} s"
            emerg = _new_emerg_lines(self.error_log, log_size)
            if emerg:
                self._wait_until_log_quiet(deadline)
                emerg = _new_emerg_lines(self.error_log, log_size)
                raise AdapterError(f"nginx kept its previous configuration: {emerg}")
            if time.monotonic() >= deadline:
                raise AdapterError(
                    f"nginx did not put route {name} in force within "
                    f"{self.reload_timeout:.0f} s after a reload"
                )
            time.sleep(0.02)

    def _wait_until_log_quiet(self, deadline: float) -> None:
        """Let nginx finish a failing reconfiguration before the next one can start.

        A port it cannot bind is retried 5 times, 500 ms apart, with the master busy and a
        last ``[emerg] still could not bind()`` at the end; returning earlier would leave
        that line to be read as the failure of the next reload.
        """
        size, quiet_since = _size(self.error_log), time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - quiet_since < LOG_QUIET_S:
            time.sleep(0.05)
            now = _size(self.error_log)
            if now != size:
                size, quiet_since = now, time.monotonic()

    # ----------------------------------------------------------------------------------------
    # Files, ports and nginx's answers
    # ----------------------------------------------------------------------------------------

    def _main_args(self) -> list[str]:
        args = ["-c", str(self.main_config)]
        if self.prefix is not None:
            args += ["-p", str(self.prefix)]
        return [*args, "-e", "stderr"]

    def _lock(self) -> FileLock:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(self.conf_dir / ".switchyard.lock")

    def _ensure_dirs(self) -> None:
        self.routes_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)

    def _wanted_base(self) -> str:
        return base_conf(self.routes_dir)

    def _base_text(self) -> str | None:
        try:
            return (self.conf_dir / BASE_CONF_NAME).read_text()
        except FileNotFoundError:
            return None

    def _read_text(self, name: str) -> str | None:
        try:
            return (self.routes_dir / f"{name}.conf").read_text()
        except FileNotFoundError:
            return None

    def _port_of(self, text: str | None) -> int | None:
        header = parse_header(text or "")
        if header is None:
            return None
        listen = str(header.get("listen", ""))
        port = listen.rsplit(":", 1)[-1]
        return int(port) if port.isdigit() else None

    def _free_port(self, name: str) -> int:
        taken = {self._port_of(self._read_text(other)) for other in self.names() if other != name}
        for port in self.ports:
            if port not in taken and (not self.check_ports or self._bindable(port)):
                return port
        raise AdapterError(
            f"no free route port left for {name} (ports {self.ports[0]}-{self.ports[-1]})",
            permanent=True,
        )

    def _bindable(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.listen_host, port))
            except OSError:
                return False
        return True

    def _url(self, port: int) -> str:
        return f"http://{self.public_host}:{port}"

    def _served_sha(self, port: int) -> str | None:
        """The hash nginx's route on ``port`` answers now (None when nothing answers)."""
        url = f"{self._url(port)}{IDENTITY_PATH}"
        try:
            # A fresh connection each time: one kept alive could still reach an old worker.
            response = httpx.get(url, timeout=self.http_timeout, headers={"Connection": "close"})
            if response.status_code != 200:
                return None
            value = response.json().get("sha")
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return value if isinstance(value, str) else None


def _sha_of(text: str | None) -> str | None:
    header = parse_header(text or "")
    value = header.get("sha") if header else None
    return value if isinstance(value, str) else None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _size(path: Path | None) -> int:
    if path is None:
        return 0
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _new_emerg_lines(path: Path | None, offset: int) -> str:
    """``[emerg]`` lines the error log got past ``offset`` (nginx's reason for refusing)."""
    if path is None:
        return ""
    with contextlib.suppress(OSError), path.open("rb") as fh:
        fh.seek(offset)
        text = fh.read(64 * 1024).decode("utf-8", "replace")
        return "; ".join(_strip_stamp(line) for line in text.splitlines() if "[emerg]" in line)
    return ""


def _strip_stamp(line: str) -> str:
    """``2024/01/01 00:00:00 [emerg] 12#12: message`` -> ``[emerg] message``."""
    level = "[emerg]" if "[emerg]" in line else "[alert]"
    rest = line[line.find(level) + len(level) :].strip()
    if "#" in rest.split(" ", 1)[0]:
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    return f"{level} {rest}"


def _nginx_problem(output: str) -> str:
    """The lines of ``nginx -t`` output that say what is wrong."""
    lines = [line for line in output.splitlines() if "[emerg]" in line or "[alert]" in line]
    if not lines:
        return output.strip()
    return "; ".join(_strip_stamp(line) for line in lines)


def _active_connections(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("Active connections:"):
            with contextlib.suppress(ValueError):
                return int(line.split(":", 1)[1])
    return None
