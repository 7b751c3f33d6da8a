"""Process, port, lock and log helpers shared by the local server runtimes (Triton, vLLM, S3).

Processes are looked at through psutil and builds are serialised with filelock. The start
loop (free ports, retry when one was taken meanwhile) and the stop loop (SIGTERM, wait,
SIGKILL) are written once here: :func:`start_on_ports` and :func:`terminate`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import psutil
from filelock import FileLock

# Exited but not reaped yet, or being torn down: no longer running anything.
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def tail(path: Path, lines: int) -> str:
    """Return the last ``lines`` lines of a text file ("" when unreadable)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# Looking at processes
# --------------------------------------------------------------------------------------------


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() not in _GONE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def leads_group(pid: int) -> bool:
    """True if ``pid`` is the leader of its own process group (started in a new session)."""
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and proc.status() not in _GONE:
                members.append(proc.pid)
    return members


def cmdline(pid: int) -> list[str]:
    """The command line of ``pid`` ([] when it is gone or not readable)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with ({} when it is gone or not readable)."""
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return {}


def rss_bytes(pids: Iterable[int]) -> int:
    """Resident memory of ``pids`` together (those gone meanwhile count 0)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total


def files_in_use(pids: Iterable[int], prefix: str) -> set[str]:
    """Paths starting with ``prefix`` that ``pids`` map into memory or hold open."""
    paths: set[str] = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found = [m.path for m in proc.memory_maps(grouped=False)]
            found += [f.path for f in proc.open_files()]
        except psutil.Error:
            continue
        paths.update(p.removesuffix(" (deleted)") for p in found if p.startswith(prefix))
    return paths


def pids_named(names: Iterable[str]) -> list[int]:
    """Live processes whose name (their program's file name) is one of ``names``."""
    wanted = set(names)
    return [
        proc.pid
        for proc in psutil.process_iter(["name", "status"])
        if proc.info["name"] in wanted and proc.info["status"] not in _GONE
    ]


# --------------------------------------------------------------------------------------------
# Starting and stopping servers
# --------------------------------------------------------------------------------------------


def terminate(pid: int, timeout: float, *, group: bool, kill_wait: float = 5.0) -> None:
    """SIGTERM ``pid`` (with ``group``, its whole process group) and wait up to ``timeout`` s
    for it to end; then SIGKILL what is left and wait up to ``kill_wait`` s more."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, kill_wait)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        if _ended(pid, wait, group=group):
            return


def _ended(pid: int, timeout: float, *, group: bool) -> bool:
    """Wait up to ``timeout`` s for ``pid`` (or its group) to end; True once it has.

    Zombies count as ended: an orphan's is reaped by init, a child's by its caller.
    """
    end = time.monotonic() + timeout
    while group_members(pid) if group else alive(pid):
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)
    return True


class Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=Stoppable)


def start_on_ports(
    host: str,
    ports: Sequence[int],
    launch: Callable[[list[int]], tuple[S, str]],
    log_path: Path,
    tail_lines: int,
) -> S:
    """Start a server with ``launch(ports)``; return it once it reports no problem.

    ``launch`` starts the process on the ports it is given and waits for it, returning the
    process and "" when it is ready, or a reason when it is not. A port of 0 means "pick a
    free one"; when one was taken before the server bound it ("in use" in its log), the
    start is retried up to twice with new ports. Otherwise a problem stops the server and
    raises RuntimeError carrying the last ``tail_lines`` lines of ``log_path``.
    """
    attempts = 3 if 0 in ports else 1
    for attempt in range(1, attempts + 1):
        free = iter(free_ports(host, list(ports).count(0)))
        proc, problem = launch([port or next(free) for port in ports])
        if not problem:
            return proc
        proc.stop()
        log_tail = tail(log_path, tail_lines)
        if attempt < attempts and "in use" in log_tail.lower():
            continue
        raise RuntimeError(f"{problem}; last lines of {log_path}:\n{log_tail}")
    raise AssertionError("unreachable")  # pragma: no cover


def free_ports(host: str, count: int) -> list[int]:
    """Return ``count`` distinct ports that were free on ``host`` a moment ago."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str) -> int:
    """Return a port that was free on ``host`` a moment ago."""
    return free_ports(host, 1)[0]


# --------------------------------------------------------------------------------------------
# Building runtimes
# --------------------------------------------------------------------------------------------


def file_lock(path: Path) -> FileLock:
    """An exclusive lock on ``path`` among threads and processes (serialises runtime builders)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)


def python_minor() -> str:
    """This interpreter's "major.minor" (runtime venvs and backend stubs must match it)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def say(progress: Callable[[str], None] | None, message: str) -> None:
    if progress is not None:
        progress(message)


def run_logged(
    cmd: Sequence[str],
    log: Path,
    what: str,
    env: Mapping[str, str] | None = None,
    shown: str | None = None,
    tail_lines: int = 20,
) -> None:
    """Run ``cmd`` appending its output to ``log``; raise RuntimeError with the log tail.

    ``shown`` replaces the command line written to the log (for inline scripts).
    """
    with log.open("a") as fh:
        fh.write(f"\n$ {shown or ' '.join(cmd)}\n")
        fh.flush()
        result = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {result.returncode}); last lines of {log}:\n"
            f"{tail(log, tail_lines)}"
        )
