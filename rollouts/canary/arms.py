"""One side of a comparison as the judge reads it: which requests are errors, which are
timeouts, and the times of the rest (:class:`Arm`). Plain numpy, no Django."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TIMEOUT_STATUSES = frozenset({408, 499})


@dataclass(frozen=True)
class Arm:
    """One side's requests: the latencies (ms) of those answered (status below 400) and of
    those timed out (408, 499, 504: at least that slow, so counted slow rather than dropped),
    how many failed (5xx, no answer, timeouts) and how many the client got a 4xx for. On an
    LLM route, of the streamed answers: ``ttft``, the server's time to its response header
    (the first token) and ``generation``, the rest of the server's time (ms)."""

    latencies: np.ndarray
    errors: int
    client_errors: int
    ttft: np.ndarray = field(default_factory=lambda: np.empty(0))
    generation: np.ndarray = field(default_factory=lambda: np.empty(0))

    @property
    def total(self) -> int:
        return len(self.latencies) + self.errors + self.client_errors

    @classmethod
    def of(cls, samples: Sequence[Any], *, upstream: bool = False) -> Arm:
        """From route samples (``rollouts.traffic.sample_types.Sample``); with ``upstream``,
        the latencies are the servers' own times (``upstream_ms``), which a mirrored copy and
        its original are both measured in."""
        answered: list[float] = []
        ttft: list[float] = []
        generation: list[float] = []
        errors = client = 0
        for s in samples:
            own = s.upstream_ms if upstream else s.latency_ms
            if is_failure(s.status, s.upstream_failed):
                errors += 1
                if is_timeout(s.status, s.upstream_status) and s.latency_ms is not None:
                    answered.append(s.latency_ms if own is None else own)
                continue
            if s.status >= 400:
                client += 1
                continue
            if own is not None:
                answered.append(own)
            header = getattr(s, "header_ms", None)
            if getattr(s, "stream", False) and header is not None:
                ttft.append(header)
                if s.upstream_ms is not None:
                    generation.append(max(s.upstream_ms - header, 0.0))
        return cls(np.asarray(answered, dtype=float), errors, client,
                   np.asarray(ttft, dtype=float), np.asarray(generation, dtype=float))


def is_timeout(status: int, upstream_status: str = "") -> bool:
    """A request that ran out of time: the client's (408, 499) or the router's wait for the
    server (504, from it or from the server)."""
    return status in TIMEOUT_STATUSES or status == 504 or "504" in upstream_status


def is_failure(status: int, upstream_failed: bool) -> bool:
    """An error the canary is judged on: a 5xx, no answer from a server, or a timeout."""
    return status >= 500 or upstream_failed or status in TIMEOUT_STATUSES
