"""Quota requests as a workflow: a tenant admin asks with a reason and an end date, a platform
admin approves (as asked or changed) or refuses, the decision is audited and sent to the
tenant's webhooks, and a grant that ends gives the quota back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.models import AuditEvent, Quota, QuotaRequest, WebhookDelivery
from fleet.quota import requests as quota_requests
from fleet.webhooks.requests import create_webhook
from tests.factories import ClusterFactory, GPUFactory, NodeFactory, QuotaFactory

pytestmark = pytest.mark.django_db


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def asked(**changes) -> dict:
    return {"tenant": "tenant-a", "device_class": "cpu", "units": 8, "memory_mib": 4096,
            "reason": "black friday traffic"} | changes


@pytest.mark.parametrize(("changes", "field", "says"), [
    ({"device_class": "nvidia-b200"}, "device_class", "unknown device class 'nvidia-b200'; known: cpu"),
    ({"units": -1}, "units", "greater than or equal to 0"),
    ({"memory_mib": 2**62}, "memory_mib", "less than or equal to"),
    ({"reason": "  "}, "reason", "may not be blank"),
    ({"until": "2020-01-01T00:00:00Z"}, "until", "must be in the future"),
    ({"until": "next week"}, "until", "Datetime has wrong format"),
    ({"units": 2, "memory_mib": 1024}, "units", "asks for no more than the quota allows now"),
])
def test_a_bad_request_is_refused_naming_the_field(alice, tenant_a, changes, field, says):
    QuotaFactory(tenant=tenant_a, device_class="cpu", units=4, memory_mib=2048)
    answer = api(alice).post("/api/v1/quota-requests/", asked(**changes), format="json")
    # Asking for what the quota already allows conflicts with the quota as it is now: a 409.
    assert answer.status_code == (409 if "no more than" in says else 400)
    assert list(answer.json()) == [field] and says in answer.json()[field][0]
    assert not QuotaRequest.objects.exists()


def test_a_gpu_class_of_the_fleet_may_be_asked_for(alice):
    GPUFactory(node=NodeFactory(cluster=ClusterFactory()), device_class="nvidia-a100-80gb")
    answer = api(alice).post("/api/v1/quota-requests/", asked(device_class="nvidia-a100-80gb", units=1),
                             format="json")
    assert answer.status_code == 201 and answer.json()["state"] == "pending"


def test_an_approval_as_asked_sets_the_quota_audits_and_notifies(alice, root, tenant_a):
    hook = create_webhook(alice, tenant_a, name="ops", url="https://hooks.example.com/",
                          events=["quota.request_changed"]).webhook
    made = api(alice).post("/api/v1/quota-requests/", asked(), format="json").json()

    decided = api(root).post(f"/api/v1/quota-requests/{made['id']}/approve/", {}, format="json")

    assert decided.status_code == 200
    body = decided.json()
    assert (body["state"], body["granted_units"], body["previous_units"]) == ("approved", 8, None)
    quota = Quota.objects.get(tenant=tenant_a, device_class="cpu")
    assert (quota.units, quota.memory_mib) == (8, 4096)
    verbs = list(AuditEvent.objects.order_by("id").values_list("verb", "object_type"))
    assert ("requested", "fleet.quotarequest") in verbs and ("approved", "fleet.quotarequest") in verbs
    assert ("updated", "fleet.quota") in verbs
    states = [d.payload["state"] for d in WebhookDelivery.objects.filter(webhook=hook).order_by("id")]
    assert states == ["pending", "approved"]


def test_an_approval_may_change_the_totals_and_a_grant_ends_on_its_date(alice, root, tenant_a):
    QuotaFactory(tenant=tenant_a, device_class="cpu", units=4, memory_mib=2048)
    request = quota_requests.ask(alice, tenant_a, "cpu", 16, 8192, "launch",
                                 until=timezone.now() + timedelta(days=3))
    quota_requests.approve(root, request, "half now", units=8, memory_mib=4096)
    quota = Quota.objects.get(tenant=tenant_a, device_class="cpu")
    assert (quota.units, quota.memory_mib) == (8, 4096)

    assert quota_requests.end_due() == 0  # not yet
    assert quota_requests.end_due(timezone.now() + timedelta(days=4)) == 1

    quota.refresh_from_db()
    assert (quota.units, quota.memory_mib) == (4, 2048)
    request.refresh_from_db()
    assert request.state == "ended" and request.ended_at is not None
    assert AuditEvent.objects.filter(object_type="fleet.quota", verb="updated",
                                     reason=f"quota request {request.pk} ended").exists()


def test_a_grant_where_there_was_no_quota_takes_the_quota_away_when_it_ends(alice, root, tenant_a):
    request = quota_requests.ask(alice, tenant_a, "cpu", 2, 512, "demo day",
                                 until=timezone.now() + timedelta(hours=1))
    quota_requests.approve(root, request)
    assert quota_requests.end_due(timezone.now() + timedelta(hours=2)) == 1
    assert not Quota.objects.filter(tenant=tenant_a).exists()


def test_a_refusal_needs_a_reason_and_a_decision_is_made_once(alice, root, tenant_a):
    made = api(alice).post("/api/v1/quota-requests/", asked(), format="json").json()
    url = f"/api/v1/quota-requests/{made['id']}/"
    without = api(root).post(url + "refuse/", {}, format="json")
    refused = api(root).post(url + "refuse/", {"reason": "no capacity this quarter"}, format="json")
    again = api(root).post(url + "approve/", {}, format="json")

    assert without.status_code == 400 and list(without.json()) == ["reason"]
    assert refused.status_code == 200 and refused.json()["decision_reason"] == "no capacity this quarter"
    assert again.status_code == 409 and "decided already" in again.json()["detail"]
    assert not Quota.objects.filter(tenant=tenant_a).exists()


def test_the_console_asks_and_a_platform_admin_decides(alice, root, tenant_a):
    client = Client()
    client.force_login(alice)
    bad = client.post("/fleet/quotas/requests/new/", {**asked(), "units": "-3"})
    assert bad.status_code == 400 and b'id="units-error"' in bad.content
    assert client.post("/fleet/quotas/requests/new/", asked()).status_code == 302
    request = QuotaRequest.objects.get()

    admin = Client()
    admin.force_login(root)
    page = admin.get("/fleet/quotas/").content.decode()
    assert f'action="/fleet/quotas/requests/{request.pk}/decide/"' in page
    admin.post(f"/fleet/quotas/requests/{request.pk}/decide/",
               {"decision": "approve", "units": "5", "memory_mib": "4096"})
    assert Quota.objects.get(tenant=tenant_a, device_class="cpu").units == 5
    shown = client.get("/fleet/quotas/").content.decode()
    assert 'data-state="approved"' in shown and "by root: 5 units" in shown
