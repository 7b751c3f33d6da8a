"""Celery tasks for loads and live latency. Thin: they call the domain and return."""

from __future__ import annotations

import logging
import time

from celery import Task, shared_task
from django.conf import settings
from django.utils import timezone

from console.celery import BROKER_ERRORS, queue_of
from rollouts.benchmarks import reconciler as benchmark_reconciler
from rollouts.benchmarks import runs as benchmark_runs
from rollouts.canary import reconciler as rollout_reconciler
from rollouts.deployments import consistency
from rollouts.loads import drift
from rollouts.loads import reconciler as load_reconciler
from rollouts.models import ModelLoad, ServerWorkload
from rollouts.slo import alerts as slo_alerts
from rollouts.slo import routed as slo_routed
from rollouts.traffic import latency, routes, scrape_tick
from rollouts.workloads import reconciler as workload_reconciler

log = logging.getLogger(__name__)


@shared_task(bind=True, acks_late=True, ignore_result=True)
def advance_load(self: Task, load_id: int) -> None:
    """One step of a load; the next step is enqueued at once (on the same queue) while it
    makes progress. Beat's reconcile_loads catches whatever this chain loses."""
    state = load_reconciler.advance(load_id)
    if state in ModelLoad.IN_FLIGHT:
        queue = (self.request.delivery_info or {}).get("routing_key")
        advance_load.apply_async((load_id,), queue=queue)


@shared_task(bind=True, ignore_result=True)
def reconcile_loads(self: Task) -> int:
    """Beat tick: a task per shard of the servers to mark lost what they no longer report
    (drift, ``reconcile_drift_shard``: any worker takes it; one that waited a whole interval
    expires), converge the deployments that ask for it, then advance every load in flight
    that no worker holds (lost workers included)."""
    interval = settings.SWITCHYARD_RECONCILE_INTERVAL_S
    sent_at = time.time()
    for index in range(settings.SWITCHYARD_SHARDS):
        try:
            reconcile_drift_shard.apply_async((index,), {"sent_at": sent_at},
                                              queue=queue_of(self), expires=interval)
        except BROKER_ERRORS as exc:
            log.warning("could not send drift shard %s, the broker is unreachable (%s); the "
                        "next tick sends it again", index, exc)
    consistency.converge_due()
    due = load_reconciler.due_loads()
    for load_id in due:
        advance_load.delay(load_id)
    return len(due)


@shared_task(ignore_result=True)
def reconcile_drift_shard(index: int, sent_at: float | None = None) -> dict[str, int]:
    """Reconcile one shard's servers with what they report, under the shard's lease."""
    return drift.reconcile_shard(index, sent_at=sent_at)


@shared_task(bind=True, ignore_result=True)
def scrape_latency(self: Task) -> int:
    """Beat tick: one task per shard of the fleet (``rollouts.traffic.scrape_tick``), which
    any worker takes; a shard's task that waited a whole interval expires (the next tick's
    replaces it). The number of shards sent."""
    plan = list(scrape_tick.shards().items())
    expires = settings.SWITCHYARD_SCRAPE_INTERVAL_S
    # Each tick starts at another shard: workers that fall behind let the shards at the end
    # of the queue expire, and those must not be the same shards every tick.
    sent_at = time.time()
    turn = int(sent_at / expires) % len(plan) if plan else 0
    sent = 0
    for index, deployment_ids in plan[turn:] + plan[:turn]:
        try:
            # The shard's lease runs from now, whenever a worker takes it (shard_leases).
            scrape_latency_shard.apply_async((index, deployment_ids), {"sent_at": sent_at},
                                             queue=queue_of(self), expires=expires)
            sent += 1
        except BROKER_ERRORS as exc:
            log.warning("could not send scrape shard %s, the broker is unreachable (%s); the "
                        "next tick sends it again", index, exc)
    return sent


@shared_task(ignore_result=True)
def scrape_latency_shard(index: int, deployment_ids: list[int],
                         sent_at: float | None = None) -> dict[str, int]:
    """Scrape one shard's servers once, under the shard's lease, and record the live window."""
    return scrape_tick.run({index: deployment_ids}, sent_at=sent_at)


@shared_task(ignore_result=True)
def evaluate_slos() -> dict[str, int]:
    """Beat tick (every SWITCHYARD_SLO_INTERVAL_S): every deployment's SLO status, and its
    burn-rate alerts opened or resolved."""
    return slo_alerts.tick()


@shared_task(ignore_result=True)
def prune_latency() -> int:
    """Hourly: drop latency rollups and the router's SLO minutes older than 30 days."""
    return latency.prune() + slo_routed.prune(timezone.now() - latency.ROLLUP_KEEP)


@shared_task(ignore_result=True)
def ensure_routes() -> int:
    """Beat tick: a default route for every deployment that has a ready version and none yet."""
    return routes.ensure_routes()


@shared_task(bind=True, acks_late=True, ignore_result=True)
def advance_rollout(self: Task, rollout_id: int) -> None:
    """One step of a rollout; when the next step may follow at once (a weight put in force
    before an analysis), it is sent straight away. Beat's reconcile_rollouts does the rest."""
    _state, again = rollout_reconciler.advance(rollout_id)
    if again:
        queue = (self.request.delivery_info or {}).get("routing_key")
        advance_rollout.apply_async((rollout_id,), queue=queue)


@shared_task(ignore_result=True)
def reconcile_rollouts() -> int:
    """Beat tick (every SWITCHYARD_ROLLOUT_INTERVAL_S): a look at every active rollout that
    no worker holds (lost workers included)."""
    due = rollout_reconciler.due_rollouts()
    for rollout_id in due:
        advance_rollout.delay(rollout_id)
    return len(due)


@shared_task(bind=True, acks_late=True, ignore_result=True)
def advance_benchmark(self: Task, job_id: int) -> None:
    """One step of a benchmark job (it never waits for the load generator, which runs in a
    process of its own); a step that lets the next follow sends it at once."""
    _state, again = benchmark_reconciler.advance(job_id)
    if again:
        queue = (self.request.delivery_info or {}).get("routing_key")
        advance_benchmark.apply_async((job_id,), queue=queue)


@shared_task(ignore_result=True)
def reconcile_benchmarks() -> int:
    """Beat tick: follow every active benchmark job that no worker holds."""
    due = benchmark_reconciler.due_jobs()
    for job_id in due:
        advance_benchmark.delay(job_id)
    return len(due)


@shared_task(ignore_result=True)
def prune_benchmark_files() -> int:
    """Hourly: drop benchmark runner logs older than a week."""
    return benchmark_runs.prune_runner_files()


@shared_task(bind=True, acks_late=True, ignore_result=True)
def advance_workload(self: Task, workload_id: int) -> None:
    """One step of a server workload on Kubernetes; while it applies (not while it waits for
    pods, which beat looks at every few seconds) the next step is sent at once."""
    state = workload_reconciler.advance(workload_id)
    if state in (ServerWorkload.State.APPLYING, ServerWorkload.State.ROLLING_BACK,
                 ServerWorkload.State.DELETING):
        queue = (self.request.delivery_info or {}).get("routing_key")
        advance_workload.apply_async((workload_id,), queue=queue)


@shared_task(ignore_result=True)
def reconcile_workloads() -> int:
    """Beat tick: advance every workload in flight that is due and no worker holds (lost
    workers included), and read ready autoscaled ones every SWITCHYARD_KUBE_SYNC_INTERVAL_S
    (the replicas their HPA set)."""
    due = workload_reconciler.due_workloads()
    for workload_id in due:
        advance_workload.delay(workload_id)
    return len(due)
