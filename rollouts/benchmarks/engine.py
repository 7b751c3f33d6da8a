"""The load generator of benchmark jobs: one level of load against one model, measured.

Free of Django on purpose: it runs in a process of its own (``python -m
rollouts.benchmarks.runner``), so a Celery worker stays free while it pushes a server as hard
as it can, and nothing here touches the database.

Protocols:

- ``triton_http``: KServe v2 ``POST /v2/models/<m>[/versions/<v>]/infer`` over a lean HTTP/1.1
  client of our own (keep-alive connections, one request in flight per connection, requests
  prebuilt as bytes, responses framed by Content-Length or chunked encoding). On this 2-core
  machine it reaches wrk's request rate where aiohttp reaches about half of it (see
  ``bench/engine_vs_wrk.py``).
- ``triton_grpc``: the same inference through tritonclient's asyncio gRPC client.
- ``openai_completions`` / ``openai_chat``: vLLM's OpenAI-compatible endpoints, streamed
  (aiohttp): time to first token, inter-token latency and output tokens come from the stream's
  own chunks.

Load shapes: closed loop (``concurrency`` requests always in flight) or open loop (``rate``
requests per second with Poisson arrivals; latency counts from the *scheduled* send time, so a
client or server that falls behind shows it as latency instead of quietly sending less).
Requests whose send time falls in the warm-up are not counted; the measured window is
``duration_s`` long (or ends early after ``max_requests``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

KINDS = ("triton_http", "triton_grpc", "openai_completions", "openai_chat")
LLM_KINDS = ("openai_completions", "openai_chat")
MODES = ("concurrency", "rate")
PERCENTILES = (50, 90, 95, 99)
STOP_POLL_S = 0.1
MAX_OPEN_LOOP_CONNECTIONS = 1024
RECONNECT_PAUSE_S = 0.05


@dataclass(frozen=True)
class Target:
    """What to load: ``url`` is the server's HTTP base URL (``host:port`` for gRPC)."""

    kind: str
    url: str
    model: str
    version: str = ""
    # Request bodies, used in turn: one Triton infer body, or LLM requests with their prompt
    # and output lengths drawn from the job's distributions.
    bodies: tuple[bytes, ...] = ()
    timeout_s: float = 30.0

    def path(self) -> str:
        if self.kind in LLM_KINDS:
            return "/v1/chat/completions" if self.kind == "openai_chat" else "/v1/completions"
        version = f"/versions/{self.version}" if self.version else ""
        return f"/v2/models/{self.model}{version}/infer"


@dataclass(frozen=True)
class Level:
    """One load level: ``value`` concurrent requests or requests per second."""

    mode: str
    value: float
    duration_s: float = 10.0
    warmup_s: float = 2.0
    max_requests: int = 0  # 0: no limit; else the window ends after this many measured requests
    seed: int = 0


@dataclass
class Tally:
    """What one level measured (client side)."""

    latencies: list[float] = field(default_factory=list)  # seconds, successful requests
    errors: Counter[str] = field(default_factory=Counter)
    first_error: str = ""
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)  # per request: mean gap between tokens
    output_tokens: int = 0
    window_s: float = 0.0
    cancelled: bool = False
    # Successful answers that arrived inside the window (whenever they were sent); None where
    # not tracked, and throughput is then ``len(latencies)`` over the window.
    answered_in_window: int | None = None

    def error(self, kind: str, detail: str = "") -> None:
        self.errors[kind] += 1
        if not self.first_error:
            self.first_error = f"{kind}: {detail}"[:500] if detail else kind


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50/p90/p95/p99 (nearest rank), mean and max of ``values`` times ``scale``."""
    if not values:
        return {**{f"p{p}": None for p in PERCENTILES}, "mean": None, "max": None}
    ordered = sorted(values)
    n = len(ordered)
    out: dict[str, float | None] = {
        f"p{p}": round(ordered[max(math.ceil(p / 100 * n) - 1, 0)] * scale, 3) for p in PERCENTILES
    }
    out["mean"] = round(sum(ordered) / n * scale, 3)
    out["max"] = round(ordered[-1] * scale, 3)
    return out


def goodput_count(tally: Tally, slo: dict[str, float | None]) -> int:
    """Requests that met every latency limit in ``slo`` one by one (``latency_ms``, and for
    LLMs ``ttft_ms`` and ``itl_ms``, the request's mean gap between tokens)."""
    latency, ttft, itl = (slo.get(k) for k in ("latency_ms", "ttft_ms", "itl_ms"))
    llm = len(tally.ttft) == len(tally.latencies) and bool(tally.ttft)
    count = 0
    for i, value in enumerate(tally.latencies):
        if latency is not None and value * 1000.0 > latency:
            continue
        if llm and ttft is not None and tally.ttft[i] * 1000.0 > ttft:
            continue
        if llm and itl is not None and i < len(tally.tpot) and tally.tpot[i] * 1000.0 > itl:
            continue
        count += 1
    return count


def summarize(level: Level, tally: Tally, goodput: dict[str, float | None] | None = None) -> dict[str, Any]:
    """The level's result as plain JSON: throughput, latency percentiles, errors by kind, and
    goodput (requests per second that met ``goodput``'s latency limits) when it is given."""
    ok = len(tally.latencies)
    failed = sum(tally.errors.values())
    total = ok + failed
    window = tally.window_s or level.duration_s
    # What the server delivered inside the window: in an overloaded open loop, requests sent in
    # the window are still being answered long after it, so counting them would report the
    # offered rate instead of the server's.
    delivered = ok if tally.answered_in_window is None else tally.answered_in_window
    result: dict[str, Any] = {
        "mode": level.mode,
        "value": level.value,
        "requests": total,
        "ok": ok,
        "errors": dict(tally.errors),
        "error_rate": round(failed / total, 6) if total else 0.0,
        "first_error": tally.first_error,
        "window_s": round(window, 3),
        "throughput_rps": round(delivered / window, 3) if window > 0 else 0.0,
        "offered_rps": level.value if level.mode == "rate" else None,
        "latency_ms": percentiles(tally.latencies),
        "cancelled": tally.cancelled,
    }
    if goodput and any(v is not None for v in goodput.values()):
        result["goodput_rps"] = round(goodput_count(tally, goodput) / window, 3) if window > 0 else 0.0
    if tally.ttft or tally.output_tokens:
        result["ttft_ms"] = percentiles(tally.ttft)
        result["itl_ms"] = percentiles(tally.itl)
        result["output_tokens"] = tally.output_tokens
        result["output_tokens_per_s"] = round(tally.output_tokens / window, 3) if window > 0 else 0.0
    return result


class _Clock:
    """The level's timeline: warm-up, then the measured window."""

    def __init__(self, level: Level) -> None:
        self.level = level
        self.start = time.perf_counter()
        self.window_start = self.start + level.warmup_s
        self.window_end = self.window_start + level.duration_s
        self.measured = 0

    def counts(self, sent_at: float) -> bool:
        return self.window_start <= sent_at < self.window_end

    def sending(self, now: float) -> bool:
        if now >= self.window_end:
            return False
        return not (self.level.max_requests and self.measured >= self.level.max_requests)

    def close_window(self, now: float) -> float:
        """The window's real length: shorter when ``max_requests`` ended it early."""
        end = min(now, self.window_end)
        return max(end - self.window_start, 1e-9)


# ----------------------------------------------------------------------------------------
# The lean HTTP/1.1 client (Triton)


def request_bytes(url: str, path: str, body: bytes) -> bytes:
    host = urlsplit(url).netloc
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class _HttpConnection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight.

    Responses are framed by Content-Length or by walking the chunks of a chunked body (chunk
    extensions and trailers allowed); bytes may arrive split anywhere, and a response's bytes
    are kept only when its status is an error (for the error's text).
    """

    def __init__(self, driver: _HttpDriver) -> None:
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


class _HttpDriver:
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
        self.clock = _Clock(level)
        self.connections: set[_HttpConnection] = set()
        self.idle: deque[_HttpConnection] = deque()
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

    async def connect(self) -> _HttpConnection | str:
        """A new connection, or why none could be made."""
        self.connecting += 1
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _HttpConnection(self), self.host, self.port),
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

    def answered(self, conn: _HttpConnection, status: int, body: bytes) -> None:
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

    def failed(self, conn: _HttpConnection, kind: str, detail: str) -> None:
        """A request in flight that will get no answer on ``conn``: count it, drop the
        connection, and (closed loop) put a new connection in its slot."""
        if not conn.busy:
            return
        conn.busy = False
        self.record(conn.sent_at, time.perf_counter(), False, kind, detail)
        conn.transport.abort()  # type: ignore[union-attr]
        if self.closed_loop:
            self.spawn(self.replace())

    def reuse(self, conn: _HttpConnection, now: float) -> None:
        if not self.clock.sending(now):
            self.maybe_done()
            return
        if self.closed_loop:
            conn.send(self.payload(), now)
        elif self.pending:
            conn.send(self.payload(), self.pending.popleft())
        else:
            self.idle.append(conn)

    def lost(self, conn: _HttpConnection, exc: Exception | None) -> None:
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
            if isinstance(conn, _HttpConnection):
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
        await _watch(self, self.clock, self.tally)
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
        if isinstance(conn, _HttpConnection):
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
        if not isinstance(conn, _HttpConnection):
            if self.pending:
                self.record(self.pending.popleft(), time.perf_counter(), False, "connect", conn)
            self.maybe_done()
            return
        self.reuse(conn, time.perf_counter())


async def _watch(driver: Any, clock: _Clock, tally: Tally) -> None:
    """Wait for the level to end: window over and answers in, a stop request, or timeouts."""
    while True:
        try:
            await asyncio.wait_for(driver.done.wait(), timeout=STOP_POLL_S)
            break
        except TimeoutError:
            pass
        now = time.perf_counter()
        if driver.stop():
            tally.cancelled = True
            break
        driver.expire(now)
        if not clock.sending(now):
            driver.maybe_done()
            # Requests still out past their timeout after the window are counted as timeouts.
            if now > clock.window_end + driver.target.timeout_s + 1:
                break
    tally.window_s = clock.close_window(time.perf_counter())


# ----------------------------------------------------------------------------------------
# Coroutine drivers: gRPC (tritonclient) and streamed OpenAI requests (aiohttp)


class _TaskDriver:
    """Closed or open loop where each request is a coroutine (``one(sent_at)``)."""

    def __init__(self, target: Target, level: Level, tally: Tally, stop: Callable[[], bool],
                 one: Callable[[float], Any]) -> None:
        self.target = target
        self.level = level
        self.tally = tally
        self.stop = stop
        self.one = one
        self.clock = _Clock(level)
        self.done = asyncio.Event()
        self.in_flight: set[asyncio.Task[None]] = set()

    def maybe_done(self) -> None:
        if not self.clock.sending(time.perf_counter()) and not self.in_flight:
            self.done.set()

    def expire(self, now: float) -> None:  # timeouts are per request (asyncio.timeout)
        return

    async def timed(self, sent_at: float) -> None:
        counts = self.clock.counts(sent_at)
        try:
            async with asyncio.timeout(self.target.timeout_s):
                await self.one(sent_at, counts)
            if self.clock.counts(time.perf_counter()):
                self.tally.answered_in_window += 1  # type: ignore[operator]
        except TimeoutError:
            if counts:
                self.tally.error("timeout", f"no answer in {self.target.timeout_s:g} s")
        except _RequestFailed as exc:
            if counts:
                self.tally.error(exc.kind, exc.detail)
        except Exception as exc:
            if counts:
                self.tally.error(_error_kind(exc), str(exc))
        if counts:
            self.clock.measured += 1

    async def worker(self) -> None:
        while self.clock.sending(time.perf_counter()) and not self.stop():
            started = time.perf_counter()
            await self.timed(started)
            if self.tally.errors and time.perf_counter() - started < RECONNECT_PAUSE_S / 10:
                await asyncio.sleep(RECONNECT_PAUSE_S)  # a dead server: don't spin

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.in_flight.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self.maybe_done()

    async def run(self) -> None:
        if self.level.mode == "concurrency":
            for _ in range(max(int(self.level.value), 1)):
                self.spawn(self.worker())
        else:
            self.spawn(self.arrivals())
        await _watch(self, self.clock, self.tally)
        for task in list(self.in_flight):
            task.cancel()
        await asyncio.gather(*self.in_flight, return_exceptions=True)

    async def arrivals(self) -> None:
        rng = random.Random(self.level.seed)
        rate = max(self.level.value, 1e-6)
        due = self.clock.start
        while not self.stop():
            due += rng.expovariate(rate)
            if not self.clock.sending(due):
                break
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
            self.spawn(self.timed(due))


class _RequestFailed(Exception):
    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def _error_kind(exc: BaseException) -> str:
    name = type(exc).__name__
    if "Connect" in name or isinstance(exc, ConnectionError | OSError):
        return "connection"
    return name.lower()[:40] or "error"


def _grpc_request(target: Target) -> Any:
    """The gRPC inference call for the Triton JSON body (inputs with shapes and data)."""
    import numpy as np
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import triton_to_np_dtype

    body = json.loads((target.bodies or (b"{}",))[0])
    inputs = []
    for spec in body.get("inputs", []):
        infer_input = grpcclient.InferInput(spec["name"], spec["shape"], spec["datatype"])
        dtype = object if spec["datatype"] == "BYTES" else triton_to_np_dtype(spec["datatype"])
        data = np.array(spec["data"], dtype=dtype).reshape(spec["shape"])
        infer_input.set_data_from_numpy(data)
        inputs.append(infer_input)
    url = target.url.split("://", 1)[-1]
    client = grpcclient.InferenceServerClient(url)

    async def one(sent_at: float, counts: bool, tally: Tally) -> None:
        await client.infer(target.model, inputs, model_version=target.version)
        if counts:
            tally.latencies.append(time.perf_counter() - sent_at)

    return client, one


def _stream_chunks(line: bytes) -> dict[str, Any] | None:
    """One line of an OpenAI server-sent event stream: the chunk's JSON, ``{"done": True}``
    for the end marker, None for anything else (blank lines, comments, other fields). A
    ``data:`` line that is not a JSON object fails the request (``bad_stream``)."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return {"done": True}
    try:
        chunk = json.loads(data)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        raise _RequestFailed("bad_stream", f"not a JSON object: {data[:200]!r}")
    return chunk


def _openai_one(target: Target, session: Any, tally: Tally, bodies: list[bytes]) -> Callable[..., Any]:
    """One streamed completion per call, timed from ``sent_at`` (the scheduled send time in
    an open loop): TTFT is when the first chunk carrying tokens arrives; each later token gets
    one inter-token gap. How many tokens a chunk carries is read from the running
    ``usage.completion_tokens`` (``continuous_usage_stats``) where the server sends it, else
    one per chunk with text; a chunk that carries ``k`` tokens (vLLM merges the outputs of a
    stream its client reads too slowly) shares the gap since the previous chunk among them, so
    the gaps of a request add up to its decode time and number one fewer than its tokens, as
    in vLLM's own inter-token histogram. An ``error`` object in the stream fails the request."""
    url = target.url.rstrip("/") + target.path()
    headers = {"Content-Type": "application/json"}
    turn = [0]

    def has_text(choices: list[Any]) -> bool:
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            if choice.get("text") or delta.get("content") or delta.get("reasoning_content"):
                return True
        return False

    async def one(sent_at: float, counts: bool) -> None:
        body = bodies[turn[0] % len(bodies)]
        turn[0] += 1
        arrivals: list[tuple[float, int]] = []  # (when, tokens the chunk carried)
        running = 0  # completion tokens the stream reported so far
        final_tokens = None
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                raise _RequestFailed(f"http_{resp.status}", (await resp.text())[:300])
            async for raw in resp.content:
                chunk = _stream_chunks(raw)
                if chunk is None or chunk.get("done"):
                    continue
                now = time.perf_counter()
                if chunk.get("error"):
                    error = chunk["error"]
                    message = error.get("message") if isinstance(error, dict) else error
                    raise _RequestFailed("stream_error", str(message)[:300])
                usage = chunk.get("usage") or {}
                reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
                choices = chunk.get("choices") or []
                if not choices:
                    if isinstance(reported, int):
                        final_tokens = reported
                    continue
                if isinstance(reported, int):
                    carried, running = max(reported - running, 0), max(reported, running)
                else:
                    carried = 1 if has_text(choices) else 0
                if carried:
                    arrivals.append((now, carried))
        if not counts:
            return
        end = time.perf_counter()
        if not arrivals:
            raise _RequestFailed("empty_stream", "the stream carried no tokens")
        first, first_tokens = arrivals[0]
        tally.latencies.append(end - sent_at)
        tally.ttft.append(first - sent_at)
        gaps = [0.0] * (first_tokens - 1)
        for (before, _), (at, carried) in itertools.pairwise(arrivals):
            gaps.extend([(at - before) / carried] * carried)
        tally.itl.extend(gaps)
        tally.tpot.append((arrivals[-1][0] - first) / len(gaps) if gaps else 0.0)
        streamed = sum(carried for _, carried in arrivals)
        tally.output_tokens += final_tokens if final_tokens is not None else streamed

    return one


async def _run_async(target: Target, level: Level, stop: Callable[[], bool]) -> Tally:
    tally = Tally(answered_in_window=0)
    if target.kind == "triton_http":
        await _HttpDriver(target, level, tally, stop).run()
    elif target.kind == "triton_grpc":
        client, one = _grpc_request(target)
        try:
            await _TaskDriver(target, level, tally, stop, lambda s, c: one(s, c, tally)).run()
        finally:
            await client.close()
    elif target.kind in LLM_KINDS:
        import aiohttp

        limit = MAX_OPEN_LOOP_CONNECTIONS if level.mode == "rate" else max(int(level.value), 1)
        connector = aiohttp.TCPConnector(limit=limit)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            one = _openai_one(target, session, tally, list(target.bodies or (b"{}",)))
            await _TaskDriver(target, level, tally, stop, one).run()
    else:
        raise ValueError(f"unknown kind {target.kind!r}; one of {', '.join(KINDS)}")
    return tally


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (a third faster here), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_level(target: Target, level: Level, stop: Callable[[], bool] = lambda: False,
              goodput: dict[str, float | None] | None = None) -> dict[str, Any]:
    """Run one level to its end (or until ``stop()`` says so) and summarize it."""
    if level.mode not in MODES:
        raise ValueError(f"unknown mode {level.mode!r}; one of {', '.join(MODES)}")
    loop = new_loop()
    try:
        tally = loop.run_until_complete(_run_async(target, level, stop))
    finally:
        loop.close()
    return summarize(level, tally, goodput)


def describe(target: Target, level: Level) -> dict[str, Any]:
    data = asdict(level)
    data.update(kind=target.kind, model=target.model, version=target.version)
    return data
