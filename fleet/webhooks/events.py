"""What a tenant's webhooks can listen to, and emitting it: ``emit()`` queues one delivery per
active webhook of the tenant that listens to the event, in the caller's transaction, and hands
each to a worker once it commits (``fleet.webhooks.delivery`` makes the attempts)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from console.celery import send_soon
from fleet.models import Tenant, Webhook, WebhookDelivery

# The events a webhook can listen to, with what each means (the API and the console list them).
EVENTS: dict[str, str] = {
    "rollout.state_changed": "a rollout moved to another state",
    "rollout.approval_needed": "a rollout waits for an approver",
    "rollout.rolled_back": "a rollout rolled back to its baseline",
    "slo.alert_opened": "a deployment's SLO burn-rate alert opened (fast or slow burn of its budget)",
    "slo.alert_resolved": "a deployment's SLO burn-rate alert resolved",
    "quota.request_changed": "a quota request was made, approved, refused, or its grant ended",
}
PING = "ping"  # sent by the test button to one webhook, whatever its events


def emit(tenant: Tenant, event: str, payload: dict[str, Any], *, summary: str = "") -> int:
    """Queue ``event`` for every webhook of ``tenant`` that listens to it; returns how many
    deliveries were queued. Call it inside the transaction that made the change: the
    deliveries commit (and go to the workers) with it, or not at all."""
    if event not in EVENTS:
        raise ValueError(f"unknown webhook event {event!r}; add it to fleet.webhooks.events.EVENTS")
    hooks = [h for h in Webhook.objects.filter(tenant=tenant, active=True) if h.listens_to(event)]
    for webhook in hooks:
        queue_delivery(webhook, event, payload, summary)
    return len(hooks)


def queue_delivery(webhook: Webhook, event: str, payload: dict[str, Any], summary: str) -> WebhookDelivery:
    """One delivery of ``event`` to ``webhook``, sent to a worker when the caller commits."""
    delivery = WebhookDelivery.objects.create(
        webhook=webhook, event=event, payload=payload, summary=summary[:500],
        next_attempt_at=timezone.now(),
    )
    # Sent once the row is committed; with the broker down, beat's retry tick sends it.
    send_soon("fleet.tasks.deliver_webhook", delivery.pk)
    return delivery
