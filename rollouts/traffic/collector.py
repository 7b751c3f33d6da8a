"""The sample collector: routers' access-log lines over UDP syslog, into Redis in batches.

nginx sends one UDP datagram per request (``access_log syslog:server=host:port``); on
Kubernetes a log shipper sends each line of an Envoy gateway's JSON access log the same way
(:mod:`rollouts.traffic.envoy_samples`). So the collector is a UDP socket and a loop: lines are
gathered into a batch, and the batch goes to Redis in one pipeline
(:func:`rollouts.traffic.samples.record`) once it holds ``batch_size`` lines or its first line is
``flush_s`` old (100 ms): a request is in Redis well within a second.

When Redis cannot be written the batch is dropped and counted, the outage is logged once,
and the loop goes on reading (the kernel's socket buffer would otherwise fill and drop lines
unseen); the count of dropped samples is added to Redis once it answers again. Malformed
lines, and a gateway's lines that are no variant's of a route in force, are counted, never
fatal. :meth:`Collector.stop` (the command's SIGTERM and SIGINT handler) ends the loop after
writing what it holds.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

import redis

from rollouts.traffic import samples

if TYPE_CHECKING:
    from rollouts.traffic.envoy_samples import RouteResolver

log = logging.getLogger(__name__)

FLUSH_S = 0.1
BATCH_SIZE = 500
HEARTBEAT_S = 1.0
RECEIVE_BUFFER = 4 * 1024 * 1024  # room for bursts while Redis answers a batch
PROBLEM_LOG_EVERY_S = 60.0
MAX_DATAGRAM = 65535


class Collector:
    """A UDP syslog listener on ``host:port`` writing samples to Redis.

    ``port`` 0 picks a free port (see :attr:`port`). ``keep_s`` and ``max_per_variant``
    bound what Redis keeps (default: the settings, 15 minutes and 100000 per variant).
    ``resolver`` maps a gateway's lines to the variants of the routes in force (default the
    process's :func:`rollouts.traffic.envoy_samples.default_resolver`). ``counts`` holds what this
    process has seen (the :data:`rollouts.traffic.samples.COUNTERS` names), whether or not Redis was
    there.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        flush_s: float = FLUSH_S,
        batch_size: int = BATCH_SIZE,
        keep_s: int | None = None,
        max_per_variant: int | None = None,
        store: redis.Redis | None = None,
        resolver: RouteResolver | None = None,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        self.sock.bind((host, port))
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.flush_s = flush_s
        self.batch_size = batch_size
        self.keep_s = keep_s or samples.keep_s()
        self.max_per_variant = max_per_variant or samples.max_per_variant()
        self.store = store or samples.connect()
        self.resolver = resolver
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._unreported_drops = 0
        self._redis_down_since: float | None = None
        self._problem_logged_at = -PROBLEM_LOG_EVERY_S
        self._beat_at = 0.0

    def stop(self) -> None:
        """End :meth:`run` (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> None:
        """Receive and flush until :meth:`stop`; then write the last batch and close."""
        batch: list[bytes] = []
        first_at = 0.0
        try:
            while not self._stop.is_set():
                wait = self.flush_s - (time.monotonic() - first_at) if batch else self.flush_s
                self.sock.settimeout(max(wait, 0.001))
                try:
                    data = self.sock.recv(MAX_DATAGRAM)
                except TimeoutError:
                    data = None
                except InterruptedError:
                    continue
                if data is not None:
                    if not batch:
                        first_at = time.monotonic()
                    batch.append(data)
                if batch and (
                    len(batch) >= self.batch_size or time.monotonic() - first_at >= self.flush_s
                ):
                    self.flush(batch)
                    batch = []
                elif not batch and time.monotonic() - self._beat_at >= HEARTBEAT_S:
                    self._heartbeat()
            self._drain(batch)
        finally:
            self.sock.close()

    def _drain(self, batch: list[bytes]) -> None:
        """Take what the socket still holds, and write it with ``batch``."""
        self.sock.setblocking(False)
        with contextlib.suppress(BlockingIOError, OSError):
            while len(batch) < 10 * self.batch_size:
                batch.append(self.sock.recv(MAX_DATAGRAM))
        if batch:
            self.flush(batch)

    def flush(self, batch: list[bytes]) -> None:
        """Write ``batch`` to Redis; on failure count it as dropped and carry on."""
        extra = {"dropped_redis": self._unreported_drops} if self._unreported_drops else None
        try:
            result = samples.record(batch, store=self.store, extra=extra, keep=self.keep_s,
                                    cap=self.max_per_variant, resolver=self.resolver)
        except redis.RedisError as exc:
            self.counts["received"] += len(batch)
            self.counts["dropped_redis"] += len(batch)
            self._unreported_drops += len(batch)
            if self._redis_down_since is None:
                self._redis_down_since = time.monotonic()
                log.warning("Redis cannot be written (%s); dropping samples until it can", exc)
            return
        self._beat_at = time.monotonic()
        self.counts.update(result.counts)
        if self._redis_down_since is not None:
            log.warning(
                "Redis written again after %.1f s; %d samples were dropped meanwhile",
                time.monotonic() - self._redis_down_since, self._unreported_drops,
            )
            self._redis_down_since = None
        self._unreported_drops = 0
        if result.problem and time.monotonic() - self._problem_logged_at >= PROBLEM_LOG_EVERY_S:
            self._problem_logged_at = time.monotonic()
            log.warning("dropped a line that is not a sample: %s", result.problem)

    def _heartbeat(self) -> None:
        self._beat_at = time.monotonic()
        try:
            samples.heartbeat(self.store)
        except redis.RedisError:
            return  # said once by flush(); the next batch or beat tries again
