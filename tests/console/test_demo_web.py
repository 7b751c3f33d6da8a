"""The demo's web server: two Switchyards on one host do not share anything of gunicorn's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from local.management.commands.run_demo import web_command

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_serving(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the web server exited ({proc.returncode})"
        try:
            return httpx.get(url, timeout=2.0).status_code
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s")


def test_two_demo_web_servers_on_one_host_both_serve_and_leave_the_home_directory_alone(tmp_path):
    """gunicorn's control socket defaults to ~/.gunicorn/gunicorn.ctl, one per home directory:
    the second server of a host took it over from the first. The demo starts gunicorn
    without it, so nothing is written to the home directory and both servers serve."""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "SWITCHYARD_DATA_DIR": str(tmp_path / "data"),
        "DJANGO_SETTINGS_MODULE": "console.settings",
    }
    env.pop("DATABASE_URL", None)  # the login page needs no database
    procs = []
    try:
        ports = [_free_port(), _free_port()]
        for port in ports:
            procs.append(subprocess.Popen(
                web_command(sys.executable, port), cwd=REPO_ROOT, env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            ))
        for port, proc in zip(ports, procs, strict=True):
            assert _wait_until_serving(f"http://127.0.0.1:{port}/login/", proc) == 200
        assert list(home.iterdir()) == []
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
