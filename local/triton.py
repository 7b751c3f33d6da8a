"""A real, local NVIDIA Triton Inference Server without a GPU.

The PyPI wheel ``nvidia-pytriton==0.7.0`` carries a complete tritonserver 2.51.0 with the python
backend and one backend stub per Python minor version. This module

* builds (once) a virtualenv holding that wheel and a backend directory the server can use
  (:func:`ensure_runtime`),
* writes a small demo model repository (:func:`write_demo_repository`),
* starts and stops servers (:func:`start_triton`, :meth:`TritonProcess.stop`, :func:`stop_pid`).

It is a plain Python module: no Django, no settings; every path and port is an argument.
See ``shared/design/TRITON.md`` for the measured facts behind the choices made here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from local.processes import alive as _alive
from local.processes import (
    cmdline,
    files_in_use,
    leads_group,
    pids_named,
    run_logged,
    start_on_ports,
    terminate,
)
from local.processes import file_lock as _file_lock
from local.processes import group_members as _group_members
from local.processes import python_minor as _python_minor
from local.processes import say as _say
from local.processes import tail as _tail_lines

PYTRITON_VERSION = "0.7.0"
TRITON_VERSION = "2.51.0"
RUNTIME_NAME = "triton-2.51"
MARKER_NAME = ".switchyard-runtime.json"
DEMO_MODELS_DIR = Path(__file__).resolve().parent / "demo_models"
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
# The only programs that map python-backend shm regions: servers and their backend stubs.
TRITON_PROGRAMS = ("tritonserver", "triton_python_backend_stub")
LOG_TAIL_LINES = 20

ProgressFn = Callable[[str], None]


# --------------------------------------------------------------------------------------------
# Runtime (virtualenv + backend directory)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TritonRuntime:
    """Paths of a prepared local Triton runtime (see :func:`ensure_runtime`)."""

    venv_dir: Path
    tritonserver: Path
    backend_dir: Path
    libs_dir: Path
    python_libdir: Path
    python_version: str

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Return the environment a tritonserver process of this runtime needs.

        ``LD_LIBRARY_PATH`` starts with the wheel's ``nvidia_pytriton.libs`` (without it the
        backend stub cannot start and a load hangs) followed by the interpreter's ``LIBDIR``
        (so the stub embeds the same libpython as this interpreter); the virtualenv's ``bin``
        comes first on ``PATH`` so the stub's embedded interpreter finds numpy. No bytecode is
        written into model folders (see below).
        """
        env = dict(os.environ if base is None else base)
        ld_parts = [str(self.libs_dir), str(self.python_libdir)]
        if env.get("LD_LIBRARY_PATH"):
            ld_parts.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(ld_parts)
        env["PATH"] = os.pathsep.join(
            p for p in (str(self.venv_dir / "bin"), env.get("PATH", "")) if p
        )
        env["VIRTUAL_ENV"] = str(self.venv_dir)
        env.pop("PYTHONHOME", None)
        # A __pycache__ written into a version folder counts as a changed model for Triton,
        # which would reload that version on the next load of any other version.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def to_json(self) -> dict[str, str]:
        """Return the runtime as a JSON-serialisable dict (inverse of :meth:`from_json`)."""
        return {
            "venv_dir": str(self.venv_dir),
            "tritonserver": str(self.tritonserver),
            "backend_dir": str(self.backend_dir),
            "libs_dir": str(self.libs_dir),
            "python_libdir": str(self.python_libdir),
            "python_version": self.python_version,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> TritonRuntime:
        """Build a runtime from :meth:`to_json` output."""
        return cls(
            venv_dir=Path(data["venv_dir"]),
            tritonserver=Path(data["tritonserver"]),
            backend_dir=Path(data["backend_dir"]),
            libs_dir=Path(data["libs_dir"]),
            python_libdir=Path(data["python_libdir"]),
            python_version=data["python_version"],
        )


def _load_marker(venv_dir: Path) -> TritonRuntime | None:
    """Return the runtime recorded in the marker if it is complete and usable, else None."""
    marker = venv_dir / MARKER_NAME
    try:
        data = json.loads(marker.read_text())
        runtime = TritonRuntime.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if data.get("pytriton") != PYTRITON_VERSION or runtime.python_version != _python_minor():
        return None
    needed = [
        runtime.tritonserver,
        runtime.libs_dir,
        runtime.backend_dir / "python" / "libtriton_python.so",
        runtime.backend_dir / "python" / "triton_python_backend_stub",
        runtime.backend_dir / "python" / "triton_python_backend_utils.py",
    ]
    if not all(p.exists() for p in needed):
        return None
    return runtime


def ensure_runtime(data_dir: Path, progress: ProgressFn | None = None) -> TritonRuntime:
    """Create (first use only) the local Triton runtime under ``data_dir`` and return it.

    Builds ``data_dir/runtimes/triton-2.51``: a virtualenv made with the running interpreter
    (the python-backend stub must match its minor version) holding ``nvidia-pytriton`` and
    ``numpy<2``, plus ``<venv>/backends/python/`` with symlinks to the wheel's backend library,
    the stub for this Python minor and ``triton_python_backend_utils.py``. A marker file
    written last records the result; a venv without a valid marker (half made, other Python
    minor) is removed and rebuilt. Concurrent callers are serialised with a file lock.
    """
    # Resolved: a runtimes folder linked to a shared cache (scripts/test links a fresh
    # checkout's) records the cache's own paths, which outlive the checkout.
    runtimes = (Path(data_dir) / "runtimes").resolve()
    venv_dir = runtimes / RUNTIME_NAME
    with _file_lock(runtimes / f"{RUNTIME_NAME}.lock"):
        existing = _load_marker(venv_dir)
        if existing is not None:
            return existing

        started = time.monotonic()
        log = runtimes / f"{RUNTIME_NAME}.install.log"
        log.write_text("")
        if venv_dir.exists():
            _say(progress, f"removing incomplete runtime at {venv_dir}")
            shutil.rmtree(venv_dir)

        _say(progress, f"creating virtualenv {venv_dir} (Python {_python_minor()})")
        _run_logged([sys.executable, "-m", "venv", str(venv_dir)], log, "creating the virtualenv")
        python = venv_dir / "bin" / "python"

        _say(progress, f"installing nvidia-pytriton=={PYTRITON_VERSION} and numpy<2 (~55 MB)")
        _run_logged(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                f"nvidia-pytriton=={PYTRITON_VERSION}",
                "numpy<2",
            ],
            log,
            "pip install",
        )

        _say(progress, "preparing the python backend directory")
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        site = Path(purelib)
        server_root = site / "pytriton" / "tritonserver"
        stub = server_root / "python_backend_stubs" / _python_minor() / "triton_python_backend_stub"
        sources = {
            "libtriton_python.so": server_root / "backends" / "python" / "libtriton_python.so",
            "triton_python_backend_stub": stub,
            "triton_python_backend_utils.py": (
                server_root / "backends" / "python" / "triton_python_backend_utils.py"
            ),
        }
        missing = [str(p) for p in sources.values() if not p.exists()]
        if missing:
            raise RuntimeError(f"the nvidia-pytriton wheel lacks: {', '.join(missing)}")
        backend_dir = venv_dir / "backends"
        (backend_dir / "python").mkdir(parents=True, exist_ok=True)
        for name, src in sources.items():
            dest = backend_dir / "python" / name
            if dest.is_symlink() or dest.exists():
                dest.unlink()
            dest.symlink_to(src)

        runtime = TritonRuntime(
            venv_dir=venv_dir,
            tritonserver=server_root / "bin" / "tritonserver",
            backend_dir=backend_dir,
            libs_dir=site / "nvidia_pytriton.libs",
            python_libdir=Path(sysconfig.get_config_var("LIBDIR") or sys.base_prefix + "/lib"),
            python_version=_python_minor(),
        )
        marker = {**runtime.to_json(), "pytriton": PYTRITON_VERSION, "triton": TRITON_VERSION}
        tmp = venv_dir / f"{MARKER_NAME}.tmp"
        tmp.write_text(json.dumps(marker, indent=2) + "\n")
        tmp.replace(venv_dir / MARKER_NAME)
        _say(progress, f"runtime ready in {time.monotonic() - started:.1f} s")
        return runtime


# --------------------------------------------------------------------------------------------
# Demo model repository
# --------------------------------------------------------------------------------------------


def demo_model_names() -> list[str]:
    """Return the names of the bundled demo models."""
    return sorted(p.name for p in DEMO_MODELS_DIR.iterdir() if (p / "config.pbtxt").is_file())


def write_demo_repository(dest: Path, *, prefix: str = "") -> list[str]:
    """Copy the bundled demo models into the model repository ``dest``; return their names.

    ``prefix`` goes before each model's name, folder and ``config.pbtxt`` alike (``bench.``
    makes ``bench.fraud-scorer``: the name a tenant's model has on a shared Triton).
    Idempotent: files whose content is already identical are left untouched (so their mtimes
    do not change and Triton does not see a modification); other files in ``dest`` are kept.
    """
    dest = Path(dest)
    names = []
    for name in demo_model_names():
        names.append(prefix + name)
        for src in sorted((DEMO_MODELS_DIR / name).rglob("*")):
            if not src.is_file() or "__pycache__" in src.parts:
                continue
            target = dest / (prefix + name) / src.relative_to(DEMO_MODELS_DIR / name)
            data = src.read_bytes()
            if prefix and src.name == "config.pbtxt":
                data = data.replace(f'name: "{name}"'.encode(), f'name: "{prefix}{name}"'.encode(), 1)
            if target.is_file() and target.read_bytes() == data:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return names


# --------------------------------------------------------------------------------------------
# Processes, ports, shared memory
# --------------------------------------------------------------------------------------------


def _shm_files_mapped_by(pids: Sequence[int]) -> set[str]:
    """Names of python-backend shm regions that ``pids`` map or hold open."""
    return {Path(p).name for p in files_in_use(pids, f"{SHM_DIR}/{SHM_PREFIX}")}


def shm_region_files() -> set[str]:
    """Names of all python-backend shared-memory region files currently in /dev/shm."""
    try:
        return {p.name for p in SHM_DIR.iterdir() if p.name.startswith(SHM_PREFIX)}
    except OSError:
        return set()


def remove_stale_shm_files(min_age: float = 10.0) -> list[str]:
    """Remove python-backend shm files that no live Triton process maps or holds open.

    For the leftovers of servers killed hard (OOM kill, SIGKILL of the whole group), e.g. from
    a ``down`` command after :func:`stop_pid` found the server already dead. Files younger
    than ``min_age`` seconds are kept (a starting server creates its file before mapping it).
    Returns the names removed.
    """
    candidates = set()
    now = time.time()
    for name in shm_region_files():
        with contextlib.suppress(OSError):
            if now - (SHM_DIR / name).stat().st_mtime >= min_age:
                candidates.add(name)
    if candidates:
        candidates -= _shm_files_mapped_by(pids_named(TRITON_PROGRAMS))
        _remove_shm(candidates)
    return sorted(candidates)


def _remove_shm(names: set[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (SHM_DIR / name).unlink()


def _is_tritonserver(pid: int) -> bool:
    """True if ``pid`` runs a tritonserver binary (guards against a stale, reused pid)."""
    args = cmdline(pid)
    return bool(args) and Path(args[0]).name == "tritonserver"


def stop_pid(pid: int, timeout: float = 15.0) -> bool:
    """Stop the tritonserver ``pid`` started by another process (e.g. from a pidfile).

    Sends SIGTERM to its process group (SIGKILL after ``timeout`` s) and removes the
    python-backend shared-memory files that the server and its stubs had mapped. Returns
    False, doing nothing, when ``pid`` is gone or is not a tritonserver (stale pidfile).
    """
    if not _alive(pid) or not _is_tritonserver(pid):
        return False
    own_group = leads_group(pid)
    owned = _shm_files_mapped_by(_group_members(pid) if own_group else [pid])
    terminate(pid, timeout, group=own_group)
    _remove_shm(owned)
    return True


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


@dataclass
class TritonProcess:
    """A tritonserver started by :func:`start_triton`."""

    pid: int
    http_url: str
    grpc_url: str
    metrics_url: str
    model_repository: Path
    log_path: Path
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    _shm_before: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    _stopped: bool = field(default=False, repr=False, compare=False)

    def is_running(self) -> bool:
        """True while the server process is alive."""
        if self._popen is not None:
            return self._popen.poll() is None
        return _alive(self.pid)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log."""
        return _tail(self.log_path, lines)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server and its stubs and remove the shm files it left. Safe to call twice.

        SIGTERM goes to the server's process group; SIGKILL follows after ``timeout`` s.
        Shared-memory regions removed are those mapped by the server's group just before the
        signal, plus regions created since this server started that no live Triton process maps
        (left by stubs that died earlier); other servers' regions are left alone.
        """
        if self._stopped:
            return
        popen = self._popen
        if self.is_running():
            owned = _shm_files_mapped_by(_group_members(self.pid) or [self.pid])
            terminate(self.pid, timeout, group=True)
        else:
            owned = set()
            # The server died on its own: its stubs may still run in its group.
            if _group_members(self.pid):
                terminate(self.pid, timeout, group=True)
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(5.0)  # reap
        _remove_shm(owned)
        orphans = shm_region_files() - self._shm_before
        if orphans:
            orphans -= _shm_files_mapped_by(pids_named(TRITON_PROGRAMS))
            _remove_shm(orphans)
        self._stopped = True


def server_version(http_url: str, timeout: float = 5.0) -> str:
    """Return the server version reported by ``GET /v2`` (e.g. "2.51.0")."""
    response = httpx.get(f"{http_url.rstrip('/')}/v2", timeout=timeout)
    response.raise_for_status()
    return str(response.json().get("version", ""))


def _server_command(
    runtime: TritonRuntime,
    model_repository: Path,
    host: str,
    ports: Sequence[int],
    load_models: Sequence[str],
) -> list[str]:
    http_port, grpc_port, metrics_port = ports
    cmd = [
        str(runtime.tritonserver),
        f"--model-repository={model_repository}",
        f"--backend-directory={runtime.backend_dir}",
        "--model-control-mode=explicit",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=false",
        "--allow-cpu-metrics=true",
        "--strict-readiness=false",
        "--exit-on-error=false",
        "--metrics-config=summary_latencies=true",
    ]
    cmd += [f"--load-model={name}" for name in load_models]
    return cmd


def _wait_ready(proc: TritonProcess, popen: subprocess.Popen[bytes], timeout: float) -> str:
    """Poll ``/v2/health/ready``; return "" when ready, else a reason for the failure."""
    deadline = time.monotonic() + timeout
    url = f"{proc.http_url}/v2/health/ready"
    with httpx.Client(timeout=1.0) as client:
        while True:
            code = popen.poll()
            if code is not None:
                return f"tritonserver exited with code {code} before it was ready"
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return ""
            if time.monotonic() >= deadline:
                return f"tritonserver was not ready after {timeout:.0f} s"
            time.sleep(0.1)


def _unready_models(http_url: str, names: Sequence[str]) -> list[str]:
    """Describe each of ``names`` that has no READY version in the repository index."""
    response = httpx.post(f"{http_url}/v2/repository/index", json={}, timeout=5.0)
    response.raise_for_status()
    by_name: dict[str, list[dict[str, str]]] = {}
    for entry in response.json():
        by_name.setdefault(entry.get("name", ""), []).append(entry)
    problems = []
    for name in names:
        entries = by_name.get(name, [])
        if not any(e.get("state") == "READY" for e in entries):
            reasons = "; ".join(
                f"v{e.get('version', '?')} {e.get('state', 'not loaded')}: {e.get('reason', '')}"
                for e in entries
            )
            problems.append(f"{name} ({reasons or 'not in the repository'})")
    return problems


def start_triton(
    runtime: TritonRuntime,
    model_repository: Path,
    *,
    host: str = "127.0.0.1",
    http_port: int = 0,
    grpc_port: int = 0,
    metrics_port: int = 0,
    load_models: Sequence[str] = (),
    log_path: Path,
    ready_timeout: float = 60.0,
    require_models_ready: bool = True,
) -> TritonProcess:
    """Start a tritonserver on ``model_repository`` and wait until it is ready.

    A port of 0 means "pick a free one" (if such a port is taken before the server binds it,
    the start is retried up to twice with new ports). The server runs in explicit model
    control mode in its own process group, with stdout and stderr going to ``log_path``.
    ``load_models`` are loaded at start-up; with ``require_models_ready`` each must have a
    READY version afterwards. On timeout, early exit or a model that failed to load, the
    server is stopped and a RuntimeError carrying the last lines of the log is raised.
    """
    model_repository = Path(model_repository).resolve()
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def launch(ports: list[int]) -> tuple[TritonProcess, str]:
        cmd = _server_command(runtime, model_repository, host, ports, load_models)
        shm_before = frozenset(shm_region_files())
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=runtime.env(),
                start_new_session=True,
                cwd=str(model_repository),
            )
        proc = TritonProcess(
            pid=popen.pid,
            http_url=f"http://{host}:{ports[0]}",
            grpc_url=f"{host}:{ports[1]}",
            metrics_url=f"http://{host}:{ports[2]}/metrics",
            model_repository=model_repository,
            log_path=log_path,
            _popen=popen,
            _shm_before=shm_before,
        )
        problem = _wait_ready(proc, popen, ready_timeout)
        if not problem and require_models_ready and load_models:
            try:
                unready = _unready_models(proc.http_url, load_models)
            except httpx.HTTPError as exc:
                unready = [f"repository index failed: {exc}"]
            if unready:
                problem = "models not ready: " + ", ".join(unready)
        return proc, problem

    return start_on_ports(
        host, (http_port, grpc_port, metrics_port), launch, log_path, LOG_TAIL_LINES
    )


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return _tail_lines(path, lines)


def _run_logged(cmd: Sequence[str], log: Path, what: str, **kwargs: object) -> None:
    run_logged(cmd, log, what, tail_lines=LOG_TAIL_LINES, **kwargs)  # type: ignore[arg-type]
