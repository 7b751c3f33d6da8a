"""The pagerduty webhook format: a PagerDuty Events API v2 event to a real HTTP receiver on
127.0.0.1, its routing key checked, never read back and never in the audit log."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from console.exceptions import DomainError
from fleet.models import AuditEvent, WebhookDelivery
from fleet.webhooks.delivery import deliver
from fleet.webhooks.requests import update_webhook
from tests.fleet.webhooks.test_webhooks import (  # noqa: F401  (fixtures)
    emit,
    hook,
    local_receivers_allowed,
    receiver,
    sent,
)

pytestmark = pytest.mark.django_db
KEY = "R0ut1ngKeyOfTheService0123456789"


def test_a_rollback_is_triggered_as_its_own_incident(alice, tenant_a, receiver, sent):  # noqa: F811
    hook(alice, tenant_a, receiver.url, format="pagerduty", routing_key=KEY)
    emit(tenant_a)

    deliver(WebhookDelivery.objects.get().pk)

    (body,) = receiver.bodies
    assert body["routing_key"] == KEY and body["event_action"] == "trigger"
    assert body["dedup_key"] == f"switchyard-{tenant_a.slug}-{WebhookDelivery.objects.get().pk}"
    payload = body["payload"]
    assert (payload["summary"], payload["severity"], payload["class"]) == (
        "Rollout 3 rolled back", "warning", "rollout.rolled_back")
    assert payload["source"] == f"switchyard/{tenant_a.slug}/fraud-prod"
    assert payload["custom_details"]["reason"] == "p99 breached"


def test_the_routing_key_is_required_checked_and_never_shown(alice, tenant_a, receiver):  # noqa: F811
    with pytest.raises(DomainError) as missing:
        hook(alice, tenant_a, receiver.url, format="pagerduty")
    assert missing.value.field == "routing_key"
    with pytest.raises(DomainError) as stray:
        hook(alice, tenant_a, receiver.url, name="json", routing_key=KEY)
    assert stray.value.field == "routing_key"

    api = APIClient()
    api.force_authenticate(alice)
    created = api.post("/api/v1/webhooks/", {"name": "pd", "url": receiver.url, "format": "pagerduty",
                                             "routing_key": "not a key!"}, format="json")
    assert created.status_code == 400 and list(created.json()) == ["routing_key"]
    created = api.post("/api/v1/webhooks/", {"name": "pd", "url": receiver.url, "format": "pagerduty",
                                             "routing_key": KEY}, format="json")
    assert created.status_code == 201, created.content
    assert KEY not in created.content.decode()
    webhook_id = created.json()["id"]
    assert KEY not in api.get(f"/api/v1/webhooks/{webhook_id}/").content.decode()

    webhook = update_webhook(alice, tenant_a.webhooks.get(pk=webhook_id), routing_key="An0therKey")
    assert webhook.routing_key == "An0therKey"
    change = AuditEvent.objects.filter(verb="updated").latest("pk")
    assert change.after == {"routing_key": "changed"}
    assert "An0therKey" not in json.dumps([e.after for e in AuditEvent.objects.all()] +
                                          [e.before for e in AuditEvent.objects.all()])
    # Leaving the format clears the key; coming back needs one again.
    assert update_webhook(alice, webhook, format="slack").routing_key == ""
    with pytest.raises(DomainError):
        update_webhook(alice, webhook, format="pagerduty")
