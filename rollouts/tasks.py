"""Celery tasks for loads and live latency. Thin: they call the domain and return."""

from __future__ import annotations

from celery import Task, shared_task

from rollouts import drift, latency, loads, rollout, routes
from rollouts.benchmarks import jobs as benchmark_jobs
from rollouts.models import ModelLoad


@shared_task(bind=True, acks_late=True, ignore_result=True)
def advance_load(self: Task, load_id: int) -> None:
    """One step of a load; the next step is enqueued at once (on the same queue) while it
    makes progress. Beat's reconcile_loads catches whatever this chain loses."""
    state = loads.advance(load_id)
    if state in ModelLoad.IN_FLIGHT:
        queue = (self.request.delivery_info or {}).get("routing_key")
        advance_load.apply_async((load_id,), queue=queue)


@shared_task(ignore_result=True)
def reconcile_loads() -> int:
    """Beat tick: mark lost what the servers no longer report (drift), then advance every load
    in flight that no worker holds (lost workers included)."""
    drift.reconcile_all()
    due = loads.due_loads()
    for load_id in due:
        advance_load.delay(load_id)
    return len(due)


@shared_task(ignore_result=True)
def scrape_latency() -> dict[str, int]:
    """Beat tick: scrape every deployment's servers once and record the live window."""
    return latency.tick()


@shared_task(ignore_result=True)
def prune_latency() -> int:
    """Hourly: drop latency rollups older than 30 days."""
    return latency.prune()


@shared_task(ignore_result=True)
def ensure_routes() -> int:
    """Beat tick: a default route for every deployment that has a ready version and none yet."""
    return routes.ensure_routes()


@shared_task(bind=True, acks_late=True, ignore_result=True)
def advance_rollout(self: Task, rollout_id: int) -> None:
    """One step of a rollout; when the next step may follow at once (a weight put in force
    before an analysis), it is sent straight away. Beat's reconcile_rollouts does the rest."""
    _state, again = rollout.advance(rollout_id)
    if again:
        queue = (self.request.delivery_info or {}).get("routing_key")
        advance_rollout.apply_async((rollout_id,), queue=queue)


@shared_task(ignore_result=True)
def reconcile_rollouts() -> int:
    """Beat tick (every SWITCHYARD_ROLLOUT_INTERVAL_S): a look at every active rollout that
    no worker holds (lost workers included)."""
    due = rollout.due_rollouts()
    for rollout_id in due:
        advance_rollout.delay(rollout_id)
    return len(due)


@shared_task(bind=True, acks_late=True, ignore_result=True)
def advance_benchmark(self: Task, job_id: int) -> None:
    """One step of a benchmark job (it never waits for the load generator, which runs in a
    process of its own); a step that lets the next follow sends it at once."""
    _state, again = benchmark_jobs.advance(job_id)
    if again:
        queue = (self.request.delivery_info or {}).get("routing_key")
        advance_benchmark.apply_async((job_id,), queue=queue)


@shared_task(ignore_result=True)
def reconcile_benchmarks() -> int:
    """Beat tick: follow every active benchmark job that no worker holds."""
    due = benchmark_jobs.due_jobs()
    for job_id in due:
        advance_benchmark.delay(job_id)
    return len(due)


@shared_task(ignore_result=True)
def prune_benchmark_files() -> int:
    """Hourly: drop benchmark runner logs older than a week."""
    return benchmark_jobs.prune_runner_files()
