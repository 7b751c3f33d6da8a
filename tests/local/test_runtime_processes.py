"""The start and stop loops the local runtimes share (``local.processes``), on real
processes: a Python HTTP server whose port is taken, and a process group that ignores SIGTERM.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from local.processes import group_members, start_on_ports, terminate


@dataclass
class HttpServer:
    popen: subprocess.Popen[bytes]
    port: int

    def stop(self) -> None:
        self.popen.kill()
        self.popen.wait(5)


def http_server_launcher(log_path: Path, squat: list[socket.socket], squat_first: bool):
    """A ``launch`` for start_on_ports: ``python -m http.server`` on the port it is given;
    with ``squat_first`` the first port is taken just before the server starts."""
    ports_tried: list[int] = []

    def launch(ports: list[int]) -> tuple[HttpServer, str]:
        ports_tried.append(ports[0])
        if squat_first and len(ports_tried) == 1:
            sock = socket.socket()
            sock.bind(("127.0.0.1", ports[0]))
            sock.listen(1)
            squat.append(sock)
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "http.server", str(ports[0]), "--bind", "127.0.0.1"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = HttpServer(popen, ports[0])
        deadline = time.monotonic() + 20
        while popen.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{ports[0]}/", timeout=1).status_code == 200:
                    return server, ""
            except httpx.HTTPError:
                time.sleep(0.05)
        return server, f"http.server ended with {popen.poll()}"

    return launch, ports_tried


@pytest.fixture
def squat():
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def test_a_picked_port_taken_before_the_server_binds_it_is_retried_with_a_new_one(
    tmp_path: Path, squat: list[socket.socket]
) -> None:
    log_path = tmp_path / "server.log"
    launch, tried = http_server_launcher(log_path, squat, squat_first=True)

    server = start_on_ports("127.0.0.1", [0], launch, log_path, 20)
    try:
        assert len(tried) == 2 and tried[1] != tried[0]
        assert server.port == tried[1]
        assert httpx.get(f"http://127.0.0.1:{server.port}/", timeout=5).status_code == 200
    finally:
        server.stop()


def test_a_given_port_that_is_taken_fails_at_once_with_the_log_tail(
    tmp_path: Path, squat: list[socket.socket]
) -> None:
    log_path = tmp_path / "server.log"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    squat.append(sock)
    port = sock.getsockname()[1]
    launch, tried = http_server_launcher(log_path, squat, squat_first=False)

    with pytest.raises(RuntimeError) as failure:
        start_on_ports("127.0.0.1", [port], launch, log_path, 20)

    assert tried == [port]
    assert f"last lines of {log_path}" in str(failure.value)
    assert "in use" in str(failure.value)


# A group leader that ignores SIGTERM and a child in its group that does too.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_terminate_kills_a_group_that_ignores_sigterm_after_the_timeout() -> None:
    leader = subprocess.Popen(
        [sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        child = int(leader.stdout.readline())
        assert set(group_members(leader.pid)) == {leader.pid, child}

        started = time.monotonic()
        terminate(leader.pid, 0.5, group=True)
        elapsed = time.monotonic() - started

        assert group_members(leader.pid) == []
        assert leader.wait(5) == -signal.SIGKILL
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
        # It waited out the SIGTERM timeout, then SIGKILL ended it well before kill_wait (5 s).
        assert 0.5 <= elapsed < 0.5 + 5
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()
