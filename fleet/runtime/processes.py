"""Process and log helpers shared by the local server runtimes (Triton, vLLM).

They read /proc directly: which processes are alive, which belong to a process group, and
the end of a log file. Plain Python, Linux only.
"""

from __future__ import annotations

import os
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
