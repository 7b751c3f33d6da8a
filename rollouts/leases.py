"""Leases on job rows: claim, heartbeat, guarded write, release; one :class:`LostLease`.

Loads, rollouts, benchmark jobs and server workloads are advanced by reconcilers that Celery
calls for a row's id. A reconciler claims the row with a short lease (``lease_owner``, a
random id, and ``lease_expires_at``: the fields of :class:`rollouts.models.jobs.LeasedJob`,
which all four inherit), does at most one step and releases it. While the step
runs, :func:`heartbeat` renews the lease every third of its length, so a worker that dies
(SIGKILL, a lost machine) leaves a lease that runs out within one lease length, whatever its
step was waiting for; the next tick's claim then takes the row over. Each write of a step is
:func:`update`: it changes the row only while the lease is still ours, else raises
:class:`LostLease` (another worker took the row over: stop quietly).

Each kind has its own lease length (``SWITCHYARD_LOAD_LEASE_S``,
``SWITCHYARD_ROLLOUT_LEASE_S``, ``SWITCHYARD_BENCHMARK_LEASE_S``,
``SWITCHYARD_WORKLOAD_LEASE_S``); its module passes it in.

The same rows are created idempotently: :mod:`rollouts.idempotency`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from rollouts.models.jobs import LeasedJob

log = logging.getLogger(__name__)
Row = TypeVar("Row", bound=LeasedJob)


class LostLease(Exception):
    """Another worker took the row over (our lease ran out), or the row moved on: stop."""


def until(lease_s: float) -> datetime:
    """When a lease of ``lease_s`` seconds taken now runs out."""
    return timezone.now() + timedelta(seconds=lease_s)


def claim(
    rows: QuerySet[Row],
    pk: int,
    *,
    lease_s: float,
    due: Callable[[Row, datetime], bool] = lambda row, now: True,
    on_take_over: Callable[[Row, str], object] | None = None,
) -> Row | None:
    """Lock row ``pk`` of ``rows`` (skipping it when another transaction holds its lock) and
    take a lease of ``lease_s`` seconds on it; None when it is locked, not ``due`` (its
    state, its next attempt), or leased by another worker.

    Taking over a lease that ran out (a worker died holding it) marks the row
    ``taken_over`` and calls ``on_take_over(row, dead_owner)`` before the new lease is
    written, in the same transaction (an event saying so)."""
    now = timezone.now()
    with transaction.atomic():
        row = rows.select_for_update(skip_locked=True, of=("self",)).filter(pk=pk).first()
        if row is None or not due(row, now) or row.lease_held(now):
            return None
        dead_owner = row.lease_owner
        row.taken_over = bool(dead_owner)
        if dead_owner and on_take_over is not None:
            on_take_over(row, dead_owner)
        row.lease_owner = uuid.uuid4().hex
        row.lease_expires_at = now + timedelta(seconds=lease_s)
        row.save(update_fields=["lease_owner", "lease_expires_at"])
    return row


# How the worker's log names a row whose state changed.
NOUNS = {"ModelLoad": "load", "Rollout": "rollout", "BenchmarkJob": "benchmark",
         "ServerWorkload": "workload"}


def update(row: LeasedJob, where: dict[str, Any] | None = None, /, *, said: str = "",
           **fields: Any) -> None:
    """Write ``fields`` (and ``updated_at``, now unless given) only while we still hold the
    row's lease (and it still matches ``where``); else :class:`LostLease`.

    A change of ``state`` is the one line the worker logs at INFO for the row ("load 12:
    fetching → verifying: ..."), with ``said`` (or the phase, detail or error written) as
    its why; everything else a step does is DEBUG or its own timeline.
    """
    before = getattr(row, "state", None)
    fields.setdefault("updated_at", timezone.now())
    guard = {"pk": row.pk, "lease_owner": row.lease_owner, **(where or {})}
    if not type(row).objects.filter(**guard).update(**fields):
        raise LostLease
    for key, value in fields.items():
        setattr(row, key, value)
    if "state" in fields and fields["state"] != before:
        why = said or next((str(fields[k]) for k in ("phase", "detail", "reason", "error")
                            if fields.get(k)), "")
        noun = NOUNS.get(type(row).__name__, type(row).__name__.lower())
        log.info("%s %s: %s → %s%s", noun, row.pk, before, fields["state"],
                 f": {why}" if why else "")


def release(row: LeasedJob, **fields: Any) -> None:
    """Give the lease back (with ``fields`` written alongside), if it is still ours."""
    type(row).objects.filter(pk=row.pk, lease_owner=row.lease_owner).update(
        lease_owner="", lease_expires_at=None, **fields
    )


@contextlib.contextmanager
def heartbeat(row: LeasedJob, *, lease_s: float, max_s: float) -> Iterator[None]:
    """Keep the row's lease short and alive while a step runs.

    A daemon thread renews the lease every third of ``lease_s``. It stops when the block
    ends, when the lease was taken over (the step's next :func:`update` notices), and once
    ``max_s`` seconds have passed (longer than any step may take: the worker is stuck, so
    let another one take over). A renewal that fails lets the lease run out: the safe side.
    """
    every = lease_s / 3
    give_up = time.monotonic() + max_s
    stop = threading.Event()
    model, pk, owner = type(row), row.pk, row.lease_owner
    name = model.__name__.lower()

    def renew() -> None:
        try:
            while not stop.wait(every) and time.monotonic() < give_up:
                if not model.objects.filter(pk=pk, lease_owner=owner).update(
                    lease_expires_at=until(lease_s)
                ):
                    return  # taken over
        except Exception:
            log.exception("%s %s: renewing the lease failed", name, pk)
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=renew, name=f"{name}-{pk}-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
