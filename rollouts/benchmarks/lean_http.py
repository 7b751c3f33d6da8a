"""The lean HTTP/1.1 client of ``triton_http`` levels.

KServe v2 ``POST /v2/models/<m>[/versions/<v>]/infer`` over keep-alive connections of our own,
one request in flight per connection, requests prebuilt as bytes, responses framed by
Content-Length or chunked encoding (:class:`HttpConnection`); :class:`HttpDriver` runs a closed
or open loop over them. On this 2-core machine it reaches wrk's request rate where aiohttp
reaches about half of it (see ``bench/engine_vs_wrk.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from rollouts.benchmarks.level import (
    MAX_OPEN_LOOP_CONNECTIONS,
    RECONNECT_PAUSE_S,
    Clock,
    Level,
    Tally,
    Target,
    watch_level,
)


def request_bytes(url: str, path: str, body: bytes) -> bytes:
    host = urlsplit(url).netloc
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight.

    Responses are framed by Content-Length or by walking the chunks of a chunked body (chunk
    extensions and trailers allowed); bytes may arrive split anywhere, and a response's bytes
    are kept only when its status is an error (for the error's text).
    """

    def __init__(self, driver: HttpDriver) -> None:
        self.driver = driver
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.sent_at = 0.0
        self.busy = False
        self.closed = False
        self._end = -1  # where the response in ``buf`` ends, once its framing is known
        self._status = 0
        self._chunk = -1  # chunked body: where the next chunk-size line starts

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, payload: bytes, sent_at: float) -> None:
        self.sent_at = sent_at
        self.busy = True
        self.transport.write(payload)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while buf:
            end = self._end
            if end < 0:
                try:
                    end = self._frame()
                except ValueError as exc:
                    self.driver.failed(self, "protocol", f"unreadable response: {exc}")
                    return
                if end < 0:
                    return
            if len(buf) < end:
                return
            status = self._status
            body = bytes(buf[:end]) if status >= 300 else b""
            del buf[:end]
            self._end = -1
            self.busy = False
            self.driver.answered(self, status, body)

    def _frame(self) -> int:
        """Where the response at the start of ``buf`` ends, or -1 while bytes are missing."""
        buf = self.buf
        pos = self._chunk
        if pos < 0:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                return -1
            try:
                self._status = int(buf[9:12])
            except ValueError:
                self._status = 599
            length = _header(buf, head_end, b"content-length")
            if length is not None:
                self._end = head_end + 4 + int(length)
                return self._end
            if b"chunked" not in (_header(buf, head_end, b"transfer-encoding") or b"").lower():
                self._end = head_end + 4
                return self._end
            pos = head_end + 4
        while True:
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                self._chunk = pos
                return -1
            size = int(buf[pos:line_end].split(b";", 1)[0], 16)
            if size == 0:  # the last chunk, then trailers (if any) and an empty line
                end = buf.find(b"\r\n\r\n", line_end)
                if end < 0:
                    self._chunk = pos
                    return -1
                self._chunk = -1
                self._end = end + 4
                return self._end
            pos = line_end + 4 + size
            if pos >= len(buf):
                self._chunk = pos
                return -1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.driver.lost(self, exc)


def _header(buf: bytearray, head_end: int, name: bytes) -> bytes | None:
    """The value of header ``name`` (lower case) in the response head ``buf[:head_end]``."""
    at = buf.find(b"\r\n" + name.title() + b":", 0, head_end)  # as servers write it
    if at < 0:
        at = bytes(buf[:head_end]).lower().find(b"\r\n" + name + b":")
        if at < 0:
            return None
    start = at + len(name) + 3
    line_end = buf.find(b"\r\n", start, head_end)
    return bytes(buf[start:line_end if line_end >= 0 else head_end]).strip()


class HttpDriver:
    """Closed or open loop over lean HTTP connections."""

    def __init__(self, target: Target, level: Level, tally: Tally, stop: Callable[[], bool]) -> None:
        self.target = target
        self.level = level
        self.tally = tally
        self.stop = stop
        parts = urlsplit(target.url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        bodies = target.bodies or (b"{}",)
        self.payloads = [request_bytes(target.url, target.path(), body) for body in bodies]
        self.next_payload = 0
        self.clock = Clock(level)
        self.connections: set[HttpConnection] = set()
        self.idle: deque[HttpConnection] = deque()
        self.pending: deque[float] = deque()  # open loop: scheduled times waiting for a connection
        self.loop = asyncio.get_running_loop()
        self.done = asyncio.Event()
        self.connecting = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed_loop = level.mode == "concurrency"
        self.closing = False
        self.max_requests = level.max_requests
        self.latencies = tally.latencies

    def spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def payload(self) -> bytes:
        payloads = self.payloads
        if len(payloads) == 1:
            return payloads[0]
        self.next_payload = (self.next_payload + 1) % len(payloads)
        return payloads[self.next_payload]

    async def connect(self) -> HttpConnection | str:
        """A new connection, or why none could be made."""
        self.connecting += 1
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: HttpConnection(self), self.host, self.port),
                timeout=self.target.timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            return str(exc) or type(exc).__name__
        finally:
            self.connecting -= 1
        self.connections.add(conn)
        return conn

    def record(self, sent_at: float, now: float, ok: bool, kind: str = "", detail: str = "") -> None:
        if not self.clock.counts(sent_at):
            return
        self.clock.measured += 1
        if ok:
            self.tally.latencies.append(now - sent_at)
        else:
            self.tally.error(kind, detail)

    def answered(self, conn: HttpConnection, status: int, body: bytes) -> None:
        # The hot path of every response: one clock read, the next request (closed loop) sent
        # before the bookkeeping, so that is not in the next request's latency.
        now = time.perf_counter()
        clock = self.clock
        sent_at = conn.sent_at
        counted = clock.window_start <= sent_at < clock.window_end
        if counted:
            clock.measured += 1
        again = self.closed_loop and now < clock.window_end and (
            not self.max_requests or clock.measured < self.max_requests)
        if again:
            conn.sent_at = now
            conn.busy = True
            conn.transport.write(self.payload())  # type: ignore[union-attr]
        if status == 200 and clock.window_start <= now < clock.window_end:
            self.tally.answered_in_window += 1  # type: ignore[operator]
        if counted:
            if status == 200:
                self.latencies.append(now - sent_at)
            else:
                self.tally.error(f"http_{status}", body[-300:].decode(errors="replace"))
        if not again:
            self.reuse(conn, now)

    def failed(self, conn: HttpConnection, kind: str, detail: str) -> None:
        """A request in flight that will get no answer on ``conn``: count it, drop the
        connection, and (closed loop) put a new connection in its slot."""
        if not conn.busy:
            return
        conn.busy = False
        self.record(conn.sent_at, time.perf_counter(), False, kind, detail)
        conn.transport.abort()  # type: ignore[union-attr]
        if self.closed_loop:
            self.spawn(self.replace())

    def reuse(self, conn: HttpConnection, now: float) -> None:
        if not self.clock.sending(now):
            self.maybe_done()
            return
        if self.closed_loop:
            conn.send(self.payload(), now)
        elif self.pending:
            conn.send(self.payload(), self.pending.popleft())
        else:
            self.idle.append(conn)

    def lost(self, conn: HttpConnection, exc: Exception | None) -> None:
        self.connections.discard(conn)
        if self.closing:
            return
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        if conn.busy:
            conn.busy = False
            self.record(conn.sent_at, time.perf_counter(), False, "connection",
                        str(exc) if exc else "server closed the connection")
            if self.closed_loop:
                self.spawn(self.replace())
        self.maybe_done()

    async def replace(self) -> None:
        """A closed-loop slot whose connection broke: reconnect after a short pause."""
        await asyncio.sleep(RECONNECT_PAUSE_S)
        while self.clock.sending(time.perf_counter()) and not self.stop():
            tried = time.perf_counter()
            conn = await self.connect()
            if isinstance(conn, HttpConnection):
                conn.send(self.payload(), time.perf_counter())
                return
            self.record(tried, time.perf_counter(), False, "connect", conn)
            await asyncio.sleep(RECONNECT_PAUSE_S)
        self.maybe_done()

    def maybe_done(self) -> None:
        if not self.clock.sending(time.perf_counter()) and not any(c.busy for c in self.connections) \
                and not self.connecting:
            self.done.set()

    def expire(self, now: float) -> None:
        for conn in list(self.connections):
            if conn.busy and now - conn.sent_at > self.target.timeout_s:
                self.failed(conn, "timeout", f"no answer in {self.target.timeout_s:g} s")

    async def run(self) -> None:
        if self.closed_loop:
            for _ in range(max(int(self.level.value), 1)):
                self.spawn(self.replace_now())
        else:
            self.spawn(self.arrivals())
        await watch_level(self, self.clock, self.tally)
        # The level is over: what is still in flight (a stopped level) is dropped, neither
        # counted as failed nor replaced.
        self.closing = True
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for conn in list(self.connections):
            conn.transport.abort()  # type: ignore[union-attr]

    async def replace_now(self) -> None:
        tried = time.perf_counter()
        conn = await self.connect()
        if isinstance(conn, HttpConnection):
            conn.send(self.payload(), time.perf_counter())
            return
        self.record(tried, time.perf_counter(), False, "connect", conn)
        await self.replace()

    async def arrivals(self) -> None:
        """Poisson arrivals at ``level.value`` per second until the window closes."""
        rng = random.Random(self.level.seed)
        rate = max(self.level.value, 1e-6)
        due = self.clock.start
        while not self.stop():
            due += rng.expovariate(rate)
            now = time.perf_counter()
            if not self.clock.sending(due):
                break
            if due > now:
                await asyncio.sleep(due - now)
            self.dispatch(due)
        self.maybe_done()

    def dispatch(self, due: float) -> None:
        while self.idle:
            conn = self.idle.popleft()
            if not conn.closed:
                conn.send(self.payload(), due)
                return
        self.pending.append(due)
        if len(self.connections) + self.connecting < MAX_OPEN_LOOP_CONNECTIONS:
            self.spawn(self.open_for_pending())

    async def open_for_pending(self) -> None:
        conn = await self.connect()
        if not isinstance(conn, HttpConnection):
            if self.pending:
                self.record(self.pending.popleft(), time.perf_counter(), False, "connect", conn)
            self.maybe_done()
            return
        self.reuse(conn, time.perf_counter())
