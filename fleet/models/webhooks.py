"""Tenant webhooks: where a tenant's events are posted, and the log of each attempt."""

from __future__ import annotations

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from fleet.models.tenancy import Tenant
from fleet.tenancy.scoping import scoped_manager

SECRET_SHOWN_CHARS = 10  # "whsec_" and the first 4 characters of the secret proper


class Webhook(models.Model):
    """A URL that receives a tenant's events as signed POSTs (``fleet.webhooks``).

    ``events`` lists the event names it listens to; empty means every event. ``format`` is
    ``json`` (the event itself, signed), ``slack`` (an incoming-webhook message) or
    ``pagerduty`` (a PagerDuty Events v2 event carrying ``routing_key``, the integration key
    of the PagerDuty service, never shown again). The secret
    keys the HMAC signature, so it is stored as it is; it is shown in full once, at creation,
    and as ``secret_prefix`` after. An inactive webhook is sent nothing new, and its
    deliveries still pending fail instead of being sent.
    """

    class Format(models.TextChoices):
        JSON = "json", "JSON event"
        SLACK = "slack", "Slack message"
        PAGERDUTY = "pagerduty", "PagerDuty Events v2"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhooks")
    name = models.CharField(max_length=100)
    url = models.CharField(max_length=2000, help_text="http:// or https:// URL the events are POSTed to")
    secret = models.CharField(max_length=100)
    events = models.JSONField(default=list, blank=True, help_text="event names; empty: all events")
    format = models.CharField(max_length=16, choices=Format.choices, default=Format.JSON)
    routing_key = models.CharField(max_length=64, blank=True,
                                   help_text="PagerDuty's integration key (the pagerduty format only)")
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("tenant")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="uniq_webhook_name"),
        ]
        ordering = ["tenant__slug", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant})"

    @property
    def secret_prefix(self) -> str:
        return f"{self.secret[:SECRET_SHOWN_CHARS]}…"

    def listens_to(self, event: str) -> bool:
        return not self.events or event in self.events


class WebhookDelivery(models.Model):
    """One event to send to one webhook, and what the last attempt got.

    States: pending → delivered (a 2xx answer) or failed (``attempts`` reached
    ``SWITCHYARD_WEBHOOK_MAX_ATTEMPTS``, the webhook was deactivated, or its address was
    refused). While pending, ``next_attempt_at`` is when it is due; a worker that claims it
    pushes that forward by a lease, so a lost worker's attempt is retried once the lease ends.
    ``response_excerpt`` (an old name: the API calls it ``error``) is Switchyard's reason when
    there was no answer; the receiver's answer itself is never stored, only its status.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=64)
    payload = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    summary = models.CharField(max_length=500, blank=True, help_text="one line, for chat formats")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    response_excerpt = models.CharField(max_length=500, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    objects = scoped_manager("webhook__tenant")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="webhook_delivery_due")]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.event} to {self.webhook.name} ({self.state})"
