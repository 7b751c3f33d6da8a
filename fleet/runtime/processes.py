"""Process and log helpers shared by the local server runtimes (Triton, vLLM).

They read /proc directly (which processes are alive, which belong to a process group), read
the end of a log file, pick free ports, lock and log runtime builds. Plain Python, Linux only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path


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


def proc_stat(pid: int) -> tuple[str, int] | None:
    """Return (state, process group id) of ``pid`` from /proc, or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[2])


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = proc_stat(int(entry.name))
        if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def python_minor() -> str:
    """This interpreter's "major.minor" (runtime venvs and backend stubs must match it)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def say(progress: Callable[[str], None] | None, message: str) -> None:
    if progress is not None:
        progress(message)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (serialises concurrent runtime builders)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
