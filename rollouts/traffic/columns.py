"""A route's samples as columns: one numpy array per field the canary judge reads, in the order
the samples ended. A look at a busy rollout reads ten thousand samples and more; as objects,
parsing and walking them cost a hundred times what the judgement itself does, so the analysis
reads them as columns (:mod:`rollouts.traffic.window_cache` keeps them between looks and
parses only what arrived since). Plain numpy, no Django."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from rollouts.traffic.sample_types import MEMBER_DEFAULTS, status_codes

NAN = float("nan")


@dataclass(frozen=True)
class Columns:
    """Samples by field, oldest first. ``t``: when each ended (epoch s); ``latency``: what the
    client waited (ms); ``upstream``: the server's part (ms, NaN when no server answered);
    ``status``: what the client got; ``upstream_failed``: a server answered 5xx, or none
    answered; ``upstream_timeout``: the router gave up waiting for a server (504 among the
    upstream statuses); ``header``: the server's time to its response header (ms, NaN when
    none); ``stream``: a streamed answer; ``first``: the time to its first streamed event as
    the router sent it (ms, NaN when not timed); ``tokens``: its tokens (NaN when not
    counted)."""

    t: np.ndarray
    latency: np.ndarray
    upstream: np.ndarray
    status: np.ndarray
    upstream_failed: np.ndarray
    upstream_timeout: np.ndarray
    header: np.ndarray
    stream: np.ndarray
    first: np.ndarray
    tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.t)

    @classmethod
    def _of_rows(cls, rows: Sequence[tuple[Any, ...]]) -> Columns:
        """From (t, latency, upstream, status, upstream_status, header, stream, first, tokens)
        tuples."""
        if not rows:
            return EMPTY
        t, latency, upstream, status, up_status, header, stream, first, tokens = zip(
            *rows, strict=True)
        # A route's answers have few distinct upstream statuses: each is split once.
        failed = {text: (not (c := status_codes(text)) or any(code >= 500 for code in c))
                  for text in set(up_status)}
        return cls(
            np.asarray(t, dtype=float),
            np.asarray([NAN if v is None else v for v in latency], dtype=float),
            np.asarray([NAN if v is None else v for v in upstream], dtype=float),
            np.asarray(status, dtype=np.int32),
            np.asarray([failed[text] for text in up_status], dtype=bool),
            np.asarray(["504" in text for text in up_status], dtype=bool),
            np.asarray([NAN if v is None else v for v in header], dtype=float),
            np.asarray(stream, dtype=bool),
            np.asarray([NAN if v is None else v for v in first], dtype=float),
            np.asarray([NAN if v is None else v for v in tokens], dtype=float),
        )

    @classmethod
    def of(cls, samples: Iterable[Any]) -> Columns:
        """From route samples (:class:`rollouts.traffic.sample_types.Sample`)."""
        return cls._of_rows([(s.t, s.latency_ms, s.upstream_ms, s.status, s.upstream_status,
                              getattr(s, "header_ms", None), bool(getattr(s, "stream", False)),
                              getattr(s, "first_ms", None), getattr(s, "tokens", None))
                             for s in samples])

    @classmethod
    def of_members(cls, raws: Sequence[bytes | str]) -> Columns:
        """From members as stored in Redis (:meth:`Sample.to_member`), without making a
        :class:`Sample` of each."""
        if not raws:
            return EMPTY
        # One decode of them all, as one JSON array: a call per member cost twice as much.
        joined = b",".join(raw if isinstance(raw, bytes) else raw.encode() for raw in raws)
        rows = []
        for values in json.loads(b"[" + joined + b"]"):
            newer = values[10:]  # key, header, stream, first, tokens (older members: fewer)
            if len(newer) < len(MEMBER_DEFAULTS):
                newer = [*newer, *MEMBER_DEFAULTS[len(newer):]]
            rows.append((values[0], values[2], values[3], values[1], values[5], newer[1],
                         bool(newer[2]), newer[3], newer[4]))
        return cls._of_rows(rows)

    def where(self, mask: np.ndarray) -> Columns:
        """The samples where ``mask`` is true."""
        return Columns(*(getattr(self, f.name)[mask] for f in fields(self)))

    def since(self, start: float) -> Columns:
        """The samples that ended at ``start`` or later."""
        return self.where(self.t >= start)

    def newest(self, count: int) -> Columns:
        """The last ``count`` samples."""
        return self if len(self) <= count else Columns(
            *(getattr(self, f.name)[len(self) - count:] for f in fields(self)))

    @staticmethod
    def joined(parts: Sequence[Columns]) -> Columns:
        """The parts' samples in one, part after part."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return EMPTY
        if len(parts) == 1:
            return parts[0]
        return Columns(*(np.concatenate([getattr(p, f.name) for p in parts])
                         for f in fields(Columns)))


EMPTY = Columns(np.empty(0), np.empty(0), np.empty(0), np.empty(0, dtype=np.int32),
                np.empty(0, dtype=bool), np.empty(0, dtype=bool), np.empty(0),
                np.empty(0, dtype=bool), np.empty(0), np.empty(0))


def ended_since(side: Sequence[Any] | Columns, start: float) -> Sequence[Any] | Columns:
    """The samples of ``side`` (columns, or a list of samples) that ended at ``start`` or
    later, in the same form."""
    return side.since(start) if isinstance(side, Columns) else [s for s in side if s.t >= start]
