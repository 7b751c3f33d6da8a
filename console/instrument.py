"""What Switchyard counts about itself while it works, for ``/metrics`` (console.metrics).

* :class:`RequestMetricsMiddleware`: every request by view, method and status, and its
  duration by view and method. The view is the URL pattern's name (``api:model-list``),
  never the path, so the series stay few whatever ids the paths carry.
* Celery signals (connected in console.celery): every task by name and outcome, its
  duration, and for the periodic reconcilers (:data:`RECONCILE_KINDS`) the tick's duration
  by kind.

The counts go to Redis through console.telemetry, which never fails the request or task it
measures. Kept free of models so the Celery app can import it before Django is set up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from console import telemetry
from console.telemetry import HTTP_DURATION, HTTP_REQUESTS, TASK_DURATION, TASKS, TICK_DURATION

#: The periodic tasks whose run is one reconcile tick, and the kind each is shown as.
RECONCILE_KINDS: dict[str, str] = {
    "fleet.tasks.check_servers": "health",
    "fleet.tasks.check_servers_shard": "health_shard",
    "rollouts.tasks.scrape_latency": "latency_scrape",
    "rollouts.tasks.scrape_latency_shard": "latency_scrape_shard",
    "rollouts.tasks.reconcile_loads": "loads",
    "rollouts.tasks.reconcile_rollouts": "rollouts",
    "rollouts.tasks.reconcile_benchmarks": "benchmarks",
    "rollouts.tasks.ensure_routes": "routes",
    "rollouts.tasks.reconcile_workloads": "workloads",
    "fleet.tasks.sync_kube_clusters": "kube_sync",
    "fleet.tasks.end_quota_grants": "quota_grants",
}
UNMATCHED = "unmatched"
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def view_label(request: HttpRequest) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return UNMATCHED
    # Django names an unnamed pattern's view by its dotted path.
    return match.view_name


class RequestMetricsMiddleware:
    """Counts and times every request (see the module's docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        elapsed = time.perf_counter() - started
        method = request.method if request.method in KNOWN_METHODS else "other"
        view = view_label(request)
        telemetry.record(
            counts=[(HTTP_REQUESTS, {"view": view, "method": method,
                                     "status": str(response.status_code)}, 1)],
            durations=[(HTTP_DURATION, {"view": view, "method": method}, elapsed)],
        )
        return response


_started: dict[str, float] = {}


def task_started(task_id: str | None = None, **_: Any) -> None:
    """Celery ``task_prerun``."""
    if task_id:
        _started[task_id] = time.perf_counter()


def task_ended(task_id: str | None = None, task: Any = None, state: str | None = None,
               **_: Any) -> None:
    """Celery ``task_postrun``: the task's outcome (``SUCCESS``, ``FAILURE``, ``RETRY``,
    ...) and duration, and the tick's duration for a reconciler."""
    started = _started.pop(task_id or "", None)
    name = getattr(task, "name", None) or "unknown"
    durations = []
    if started is not None:
        elapsed = time.perf_counter() - started
        durations.append((TASK_DURATION, {"task": name}, elapsed))
        kind = RECONCILE_KINDS.get(name)
        if kind is not None:
            durations.append((TICK_DURATION, {"kind": kind}, elapsed))
    telemetry.record(counts=[(TASKS, {"task": name, "state": (state or "UNKNOWN").lower()}, 1)],
                     durations=durations)
