"""Who holds a shard of the fleet's periodic work: the lease of each shard (a Redis lock,
``<prefix>:latency:shard:<n>`` for the scrape, ``<prefix>:health:shard:<n>`` for the health
probes) carries a token that names the worker process holding it, ``<host>:<pid>:<random>``,
so an operator (or a benchmark) reading the key sees which process has the shard, and after a
worker dies, when another has taken its shards.

How long a lease lasts (:func:`seconds`) is counted from when beat's tick sent the shard's task,
not from when a worker took it: a worker that dies holding a shard loses it before the second
tick after, whenever in its tick it took it, so the survivors pick the shard up at that tick
(measured: ``bench/scale.py``, a worker killed holding leases)."""

from __future__ import annotations

import os
import socket
import time
import uuid

# A lease lasts until this many intervals after its tick was sent: past the next tick (whose
# task must find the shard still held while the last tick's work may run), before the second.
LEASE_INTERVALS = 1.9


def token() -> str:
    """A new lease's token: this process's host and pid, and a random part that makes each
    lease its own (a lock is released only by the token that took it)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def holder(value: bytes | str | None) -> tuple[str, int] | None:
    """The (host, pid) a lease's token names; None for no lease, or a token of another form."""
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    host, _, rest = text.rpartition(":")
    host, _, pid = host.rpartition(":")
    return (host, int(pid)) if host and pid.isdigit() and rest else None


def seconds(interval: float, floor: float, sent_at: float | None = None,
            now: float | None = None) -> float:
    """A shard's lease length, taken ``now``: until :data:`LEASE_INTERVALS` intervals after
    its tick was sent (``sent_at``, epoch seconds; None: now), and at least ``floor``, what the
    shard's own work may take, so that two workers never do it at once. A ``sent_at`` from a
    clock ahead of this one gives at most a whole lease."""
    now = time.time() if now is None else now
    whole = LEASE_INTERVALS * interval
    left = whole if sent_at is None else min(sent_at + whole - now, whole)
    return max(left, floor)
