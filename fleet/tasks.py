"""Celery tasks for the fleet. Thin: they call the domain and return."""

from __future__ import annotations

import logging
import time

from celery import Task, shared_task
from django.conf import settings

from console.celery import BROKER_ERRORS, queue_of, send_now
from fleet.audit import export as audit_export
from fleet.inventory import health, kube_sync
from fleet.quota import requests as quota_requests
from fleet.webhooks import delivery

log = logging.getLogger(__name__)


@shared_task(bind=True, ignore_result=True)
def check_servers(self: Task) -> int:
    """Beat's health round (every SWITCHYARD_HEALTH_INTERVAL_S): one task per shard of the
    servers, which any worker takes (a shard's task that waited a whole interval expires),
    then every cluster's traffic router. The number of shards sent."""
    sent = 0
    count = settings.SWITCHYARD_SHARDS
    sent_at = time.time()
    turn = int(sent_at / settings.SWITCHYARD_HEALTH_INTERVAL_S) % count  # see scrape_latency
    for index in [*range(turn, count), *range(turn)]:
        try:
            check_servers_shard.apply_async((index,), {"sent_at": sent_at}, queue=queue_of(self),
                                            expires=settings.SWITCHYARD_HEALTH_INTERVAL_S)
            sent += 1
        except BROKER_ERRORS as exc:
            log.warning("could not send health shard %s, the broker is unreachable (%s); the "
                        "next round sends it again", index, exc)
    health.check_routers()
    return sent


@shared_task(ignore_result=True)
def check_servers_shard(index: int, sent_at: float | None = None) -> dict[str, int]:
    """Probe one shard's servers once, under the shard's lease."""
    return health.check_shard(index, sent_at=sent_at)


@shared_task(ignore_result=True)
def check_server(server_id: int) -> None:
    health.check_server(server_id)


@shared_task(acks_late=True, ignore_result=True)
def deliver_webhook(delivery_id: int) -> None:
    """One attempt at one webhook delivery (claims the row; a second call changes nothing)."""
    delivery.deliver(delivery_id)


@shared_task(ignore_result=True)
def end_quota_grants() -> int:
    """Every minute: grants past their end date give the quota back."""
    return quota_requests.end_due()


@shared_task(ignore_result=True)
def prune_audit() -> int:
    """Daily: delete audit events past their retention (SWITCHYARD_AUDIT_RETENTION_DAYS)."""
    return audit_export.prune()


@shared_task(ignore_result=True)
def retry_webhook_deliveries() -> int:
    """Beat tick: hand every webhook delivery that is due (a retry, or a first attempt whose
    message the broker lost) to a worker."""
    due = delivery.due_deliveries()
    for delivery_id in due:
        deliver_webhook.delay(delivery_id)
    return len(due)


@shared_task(ignore_result=True)
def sync_kube_clusters() -> int:
    """Beat tick: one sync task per Kubernetes cluster whose connection details are set.

    Each cluster syncs in its own task, so a slow or failing cluster never delays or stops
    the others; a broker that cannot take one is logged and the next tick tries again.
    """
    ids = kube_sync.clusters_to_sync()
    for cluster_id in ids:
        send_now(sync_kube_cluster, cluster_id)
    return len(ids)


@shared_task(ignore_result=True)
def sync_kube_cluster(cluster_id: int, full: bool = False) -> None:
    """One sync of one Kubernetes cluster (a list or a bounded watch; ``full``: a list);
    records its outcome, never raises."""
    kube_sync.sync_cluster_id(cluster_id, full=full)
