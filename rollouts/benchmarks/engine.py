"""The load generator of benchmark jobs: one level of load against one model, measured.

Free of Django on purpose: it runs in a process of its own (``python -m
rollouts.benchmarks.runner``), so a Celery worker stays free while it pushes a server as hard
as it can, and nothing here touches the database.

Protocols (each driven by a module of its own):

- ``triton_http`` (:mod:`.lean_http`): KServe v2 ``POST /v2/models/<m>[/versions/<v>]/infer``
  over a lean HTTP/1.1 client of our own (keep-alive connections, one request in flight per
  connection, requests prebuilt as bytes, responses framed by Content-Length or chunked
  encoding). On this 2-core machine it reaches wrk's request rate where aiohttp reaches about
  half of it (see ``bench/engine_vs_wrk.py``).
- ``triton_grpc`` (:mod:`.coroutine_drivers`): the same inference through tritonclient's
  asyncio gRPC client.
- ``openai_completions`` / ``openai_chat`` (:mod:`.coroutine_drivers`): vLLM's
  OpenAI-compatible endpoints, streamed (aiohttp): time to first token, inter-token latency
  and output tokens come from the stream's own chunks.

Load shapes: closed loop (``concurrency`` requests always in flight) or open loop (``rate``
requests per second with Poisson arrivals; latency counts from the *scheduled* send time, so a
client or server that falls behind shows it as latency instead of quietly sending less).
Requests whose send time falls in the warm-up are not counted; the measured window is
``duration_s`` long (or ends early after ``max_requests``).

What one level is and measures lives in :mod:`.level`; its statistics in :mod:`.stats`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rollouts.benchmarks.coroutine_drivers import TaskDriver, grpc_request, openai_one
from rollouts.benchmarks.lean_http import HttpDriver
from rollouts.benchmarks.level import (
    KINDS,
    LLM_KINDS,
    MAX_OPEN_LOOP_CONNECTIONS,
    MODES,
    Level,
    Tally,
    Target,
)
from rollouts.benchmarks.stats import summarize


async def _run_async(target: Target, level: Level, stop: Callable[[], bool]) -> Tally:
    tally = Tally(answered_in_window=0)
    if target.kind == "triton_http":
        await HttpDriver(target, level, tally, stop).run()
    elif target.kind == "triton_grpc":
        client, one = grpc_request(target)
        try:
            await TaskDriver(target, level, tally, stop, lambda s, c: one(s, c, tally)).run()
        finally:
            await client.close()
    elif target.kind in LLM_KINDS:
        import aiohttp

        limit = MAX_OPEN_LOOP_CONNECTIONS if level.mode == "rate" else max(int(level.value), 1)
        connector = aiohttp.TCPConnector(limit=limit)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            one = openai_one(target, session, tally, list(target.bodies or (b"{}",)))
            await TaskDriver(target, level, tally, stop, one).run()
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
