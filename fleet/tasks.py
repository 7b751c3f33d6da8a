"""Celery tasks for the fleet. Thin: they call the domain and return."""

from __future__ import annotations

from celery import shared_task

from fleet import health, webhooks


@shared_task(ignore_result=True)
def check_servers() -> dict[str, int]:
    """Probe every inference server and traffic router once (beat runs this every few seconds)."""
    counts = health.check_all()
    health.check_routers()
    return counts


@shared_task(ignore_result=True)
def check_server(server_id: int) -> None:
    health.check_server(server_id)


@shared_task(acks_late=True, ignore_result=True)
def deliver_webhook(delivery_id: int) -> None:
    """One attempt at one webhook delivery (claims the row; a second call changes nothing)."""
    webhooks.deliver(delivery_id)


@shared_task(ignore_result=True)
def retry_webhook_deliveries() -> int:
    """Beat tick: hand every webhook delivery that is due (a retry, or a first attempt whose
    message the broker lost) to a worker."""
    due = webhooks.due_deliveries()
    for delivery_id in due:
        deliver_webhook.delay(delivery_id)
    return len(due)
