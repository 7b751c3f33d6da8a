"""One side of a comparison as the judge reads it: which requests are errors, which are
timeouts, and the times of the rest (:class:`Arm`). Plain numpy, no Django."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollouts.traffic.columns import Columns

TIMEOUT_STATUSES = (408, 499)


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
    tpot: np.ndarray = field(default_factory=lambda: np.empty(0))

    @property
    def total(self) -> int:
        return len(self.latencies) + self.errors + self.client_errors

    @classmethod
    def of(cls, samples: Sequence[Any] | Columns, *, upstream: bool = False) -> Arm:
        """From route samples (``rollouts.traffic.sample_types.Sample``, or their
        :class:`~rollouts.traffic.columns.Columns`); with ``upstream``, the latencies are the
        servers' own times (``upstream_ms``), which a mirrored copy and its original are both
        measured in."""
        c = samples if isinstance(samples, Columns) else Columns.of(samples)
        own = c.upstream if upstream else c.latency
        timeouts = np.isin(c.status, TIMEOUT_STATUSES)
        failed = (c.status >= 500) | c.upstream_failed | timeouts
        # A timed-out request was at least as slow as it waited: counted slow, not dropped.
        timed = failed & (timeouts | (c.status == 504) | c.upstream_timeout) & ~np.isnan(c.latency)
        ok = ~failed & (c.status < 400)
        answered = (ok & ~np.isnan(own)) | timed
        latencies = np.where(timed & np.isnan(own), c.latency, own)[answered]
        ttft = np.where(np.isnan(c.first), c.header, c.first)
        streamed = ok & c.stream & ~np.isnan(ttft)
        generated = streamed & ~np.isnan(c.upstream) & ~np.isnan(c.header)
        per_token = streamed & ~np.isnan(c.first) & (c.tokens >= 2)
        return cls(latencies, int(failed.sum()), int((~failed & (c.status >= 400)).sum()),
                   ttft[streamed],
                   np.maximum(c.upstream[generated] - c.header[generated], 0.0),
                   np.maximum(c.latency[per_token] - c.first[per_token], 0.0)
                   / (c.tokens[per_token] - 1))


def is_timeout(status: int, upstream_status: str = "") -> bool:
    """A request that ran out of time: the client's (408, 499) or the router's wait for the
    server (504, from it or from the server)."""
    return status in TIMEOUT_STATUSES or status == 504 or "504" in upstream_status


def is_failure(status: int, upstream_failed: bool) -> bool:
    """An error the canary is judged on: a 5xx, no answer from a server, or a timeout."""
    return status >= 500 or upstream_failed or status in TIMEOUT_STATUSES
