"""The console's webhook form: it shapes its input, then ``save()`` calls the domain function
the API calls (``fleet.webhooks.requests.create_webhook``), so both faces refuse the same input
with the same message on the same field."""

from __future__ import annotations

from typing import Any

from django import forms

from console.forms import DomainForm
from fleet.models import Tenant, Webhook
from fleet.webhooks import requests as webhook_requests
from fleet.webhooks.events import EVENTS


class WebhookForm(DomainForm):
    """Make a webhook in one of the actor's tenants (``fleet.webhooks.requests.create_webhook``)."""

    tenant = forms.ChoiceField(
        error_messages={"invalid_choice": "not one of your tenants", "required": "choose a tenant"}
    )
    name = forms.CharField(
        max_length=100, error_messages={"required": "give the webhook a name, e.g. ops-slack"}
    )
    url = forms.CharField(max_length=2000, error_messages={"required": "give the URL to POST to"})
    events = forms.MultipleChoiceField(
        choices=list(EVENTS.items()), required=False,
        error_messages={"invalid_choice": "unknown event %(value)s"},
    )
    format = forms.ChoiceField(choices=Webhook.Format.choices, initial=Webhook.Format.JSON)
    routing_key = forms.CharField(
        max_length=64, required=False, label="PagerDuty routing key",
        help_text="the integration key of the PagerDuty service (Events API v2); the pagerduty format only",
    )

    def __init__(self, *args: Any, actor: Any, **kwargs: Any) -> None:
        super().__init__(*args, actor=actor, **kwargs)
        self.tenants = {t.slug: t for t in Tenant.objects.visible_to(actor)}
        self.fields["tenant"].choices = [(slug, t.name) for slug, t in self.tenants.items()]

    def perform(self) -> webhook_requests.CreatedWebhook:
        data = self.cleaned_data
        return webhook_requests.create_webhook(
            self.actor, self.tenants[data["tenant"]], name=data["name"], url=data["url"],
            events=data["events"], format=data["format"], routing_key=data["routing_key"],
        )
