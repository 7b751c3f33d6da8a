"""Celery tasks for loads. Thin: they call the domain and return."""

from __future__ import annotations

from celery import shared_task

from rollouts import loads
from rollouts.models import ModelLoad


@shared_task(acks_late=True, ignore_result=True)
def advance_load(load_id: int) -> None:
    """One step of a load; the next step is enqueued at once while it makes progress."""
    state = loads.advance(load_id)
    if state in ModelLoad.IN_FLIGHT:
        advance_load.delay(load_id)


@shared_task(ignore_result=True)
def reconcile_loads() -> int:
    """Beat tick: advance every load in flight that no worker holds (lost workers included)."""
    due = loads.due_loads()
    for load_id in due:
        advance_load.delay(load_id)
    return len(due)
