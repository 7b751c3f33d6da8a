"""One level of load: what to load (:class:`Target`), how hard and for how long (:class:`Level`),
what the client measured (:class:`Tally`), the level's timeline (:class:`Clock`: warm-up, then
the measured window) and the wait for its end (:func:`watch_level`).

The nouns both of the engine's drivers (:mod:`.lean_http`, :mod:`.coroutine_drivers`) share.
Free of Django, like the rest of the engine.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

KINDS = ("triton_http", "triton_grpc", "openai_completions", "openai_chat")
LLM_KINDS = ("openai_completions", "openai_chat")
MODES = ("concurrency", "rate")
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


class Clock:
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


async def watch_level(driver: Any, clock: Clock, tally: Tally) -> None:
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
