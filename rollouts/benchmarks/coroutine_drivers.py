"""Levels where each request is a coroutine (:class:`TaskDriver`): ``triton_grpc`` through
tritonclient's asyncio gRPC client (:func:`grpc_request`), and ``openai_completions`` /
``openai_chat`` streamed from vLLM's OpenAI-compatible endpoints through aiohttp
(:func:`openai_one`): time to first token, inter-token latency and output tokens come from the
stream's own chunks."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Callable
from typing import Any

from rollouts.benchmarks.level import RECONNECT_PAUSE_S, Clock, Level, Tally, Target, watch_level


class TaskDriver:
    """Closed or open loop where each request is a coroutine (``one(sent_at)``)."""

    def __init__(self, target: Target, level: Level, tally: Tally, stop: Callable[[], bool],
                 one: Callable[[float], Any]) -> None:
        self.target = target
        self.level = level
        self.tally = tally
        self.stop = stop
        self.one = one
        self.clock = Clock(level)
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
        await watch_level(self, self.clock, self.tally)
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


def grpc_request(target: Target) -> Any:
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


def openai_one(target: Target, session: Any, tally: Tally, bodies: list[bytes]) -> Callable[..., Any]:
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
