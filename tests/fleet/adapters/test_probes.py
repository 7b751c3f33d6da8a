"""Health probes of inference servers: a live Triton, dead ports, silent and slow servers."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from fleet.adapters import triton, vllm
from fleet.adapters.base import ModelState, ServerProbeAdapter
from local.triton import TritonProcess


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A listener that accepts connections (kernel backlog) but never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """Answers 200 at once, then sends its body one byte every 0.1 s, for ever."""
    stop = threading.Event()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.1)

    def serve() -> None:
        conns = []
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                conn = None
            if conn is not None:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                conns.append(conn)
            for c in conns:
                with contextlib.suppress(OSError):
                    c.sendall(b"x")
        for c in conns:
            c.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        sock.close()


@pytest.mark.triton
def test_probe_live_triton(local_triton: TritonProcess) -> None:
    result = triton.probe(local_triton.http_url, 5.0)
    assert result.error == ""
    assert result.ready is True
    assert result.live is True
    assert result.version == "2.51.0"
    # Other tests of the session may add models of their own: look at the demo ones.
    demo = {m for m in result.models if m.name in ("fraud-scorer", "sentiment")}
    assert demo == {
        ModelState("fraud-scorer", "1", "READY", ""),
        ModelState("fraud-scorer", "2", "READY", ""),
        ModelState("sentiment", "1", "READY", ""),
    }
    assert 0 < result.latency_ms < 5000


@pytest.mark.parametrize("adapter", [triton, vllm], ids=["triton", "vllm"])
def test_probe_closed_port_fails_fast_naming_the_url(adapter: ServerProbeAdapter) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    result = adapter.probe(url, 2.0)
    assert time.monotonic() - started < 1.0
    assert result.ready is False
    assert result.live is False
    assert "connection refused" in result.error
    assert url in result.error
    assert result.models == []


@pytest.mark.parametrize("adapter", [triton, vllm], ids=["triton", "vllm"])
def test_probe_silent_server_returns_within_timeout(
    adapter: ServerProbeAdapter, silent_server: str
) -> None:
    started = time.monotonic()
    result = adapter.probe(silent_server, 1.0)
    elapsed = time.monotonic() - started
    assert elapsed <= 1.2
    assert result.ready is False
    assert "timed out after 1.0 s" in result.error
    assert silent_server in result.error


def test_triton_probe_trickling_server_returns_within_timeout(trickling_server: str) -> None:
    started = time.monotonic()
    result = triton.probe(trickling_server, 1.0)
    assert time.monotonic() - started <= 1.2
    assert result.ready is False
    assert "timed out after 1.0 s" in result.error


def test_adapter_modules_satisfy_the_protocol() -> None:
    assert isinstance(triton, ServerProbeAdapter)
    assert isinstance(vllm, ServerProbeAdapter)
