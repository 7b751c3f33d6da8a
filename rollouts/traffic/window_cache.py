"""A worker's memory of the route samples it read last, so that a rollout's next look reads
from Redis and parses only the samples that arrived since (issue: 100 rollouts looked at every
second). The answer is the same as a fresh read of the window
(:func:`rollouts.traffic.samples.window`), as columns
(:class:`~rollouts.traffic.columns.Columns`):

* each look reads the samples that ended from :data:`LATE_S` before the previous read on, and
  keeps the older ones it holds: a sample reaches Redis about 100 ms after its request ended
  (the collector's batch), so one that lands later than :data:`LATE_S` after it ended would be
  missed (none does while the collector keeps up; a collector that falls that far behind
  loses samples to its socket buffer first);
* it drops what Redis no longer holds: samples older than the window asked for or than
  ``SWITCHYARD_SAMPLES_KEEP_S``, and beyond the newest ``SWITCHYARD_SAMPLES_MAX_PER_VARIANT``
  of a variant;
* a window reaching further back than what is held, a clock gone backwards or a variant that
  appears are read whole.

Each worker process holds its own (rollouts are looked at by whichever worker takes the
tick; a worker that has not seen a rollout reads its window whole once). It holds at most
``SWITCHYARD_LOOK_CACHE_ROWS`` samples in all (about 50 bytes each), forgetting the windows
used least recently first; a window larger than that alone is read whole at every look."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import redis
from django.conf import settings

from rollouts.traffic import samples
from rollouts.traffic.columns import Columns

LATE_S = 5.0


@dataclass
class _Held:
    since: float  # the oldest time the held columns cover
    read_at: float  # when Redis was last read for them
    variants: dict[str, tuple[Columns, np.ndarray]]  # each with its samples' Redis scores

    @property
    def rows(self) -> int:
        return sum(len(c) for c, _ in self.variants.values())


class WindowCache:
    """Windows of route samples by (deployment, mirror), as columns per variant."""

    def __init__(self, max_rows: int | None = None) -> None:
        self._max_rows = max_rows
        self._held: OrderedDict[tuple[int, bool], _Held] = OrderedDict()
        self._lock = threading.Lock()
        self.parsed = 0  # samples parsed from Redis members, for tests and the bench
        self._client: tuple[str, redis.Redis] | None = None
        self._rows = 0  # samples held in all

    def _store(self) -> redis.Redis:
        """This process's client (its connections kept between looks), made again when the
        Redis URL changes."""
        url = settings.REDIS_URL
        with self._lock:
            if self._client is None or self._client[0] != url:
                self._client = (url, samples.connect())
            return self._client[1]

    def window(self, deployment_id: int, since: float, *, mirror: bool = False,
               now: float | None = None, store: redis.Redis | None = None) -> dict[str, Columns]:
        """The samples from ``since`` (epoch s) on per variant, oldest first, as
        :func:`rollouts.traffic.samples.window` answers them for the last ``now - since``
        seconds. Raises ``redis.RedisError``."""
        now = time.time() if now is None else now
        store = store or self._store()
        key = (deployment_id, mirror)
        with self._lock:
            held = self._held.pop(key, None)
            self._rows -= held.rows if held is not None else 0
        if held is not None and (held.since > since or now < held.read_at):
            held = None
        cutoff = since if held is None else max(held.read_at - LATE_S, since)
        variants = [v for v, is_mirror in samples.variants(store, deployment_id, since)
                    if is_mirror == mirror]
        pipe = store.pipeline(transaction=False)
        for variant in variants:
            old = held is not None and variant in held.variants
            pipe.zrangebyscore(samples.key(deployment_id, variant, mirror),
                               cutoff if old else since, "+inf", withscores=True)
        cap, oldest = samples.max_per_variant(), max(since, now - samples.keep_s())
        out: dict[str, Columns] = {}
        held_now: dict[str, tuple[Columns, np.ndarray]] = {}
        for variant, found in zip(variants, pipe.execute(), strict=True):
            fresh = Columns.of_members([raw for raw, _ in found])
            self.parsed += len(found)
            scores = np.asarray([score for _, score in found], dtype=float)
            if held is not None and variant in held.variants:
                before, before_scores = held.variants[variant]
                # Redis answers by score (when the sample ended, or when it arrived for a
                # clock far ahead): what is kept of the held part is chosen by the same.
                keep = (before_scores >= oldest) & (before_scores < cutoff)
                fresh = Columns.joined([before.where(keep), fresh])
                scores = np.concatenate([before_scores[keep], scores])
            if np.any(np.diff(fresh.t) < 0):  # oldest first by when each ended, as a read is
                order = np.argsort(fresh.t, kind="stable")
                fresh, scores = fresh.where(order), scores[order]
            if len(fresh) > cap:
                fresh, scores = fresh.newest(cap), scores[-cap:]
            if len(fresh):
                out[variant] = fresh
                held_now[variant] = (fresh, scores)
        with self._lock:
            self._held[key] = _Held(since, now, held_now)
            self._rows += self._held[key].rows
            self._trim()
        return out

    def _trim(self) -> None:
        limit = (self._max_rows if self._max_rows is not None
                 else settings.SWITCHYARD_LOOK_CACHE_ROWS)
        while self._rows > limit and self._held:
            _, dropped = self._held.popitem(last=False)
            self._rows -= dropped.rows

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._rows = 0


CACHE = WindowCache()
