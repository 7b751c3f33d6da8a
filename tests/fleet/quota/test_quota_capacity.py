"""A quota request is checked against what the fleet has: asking for more GPUs or memory than
exist in all is refused on the field, saying how much exists (console and API alike); "Until"
is a date picker; a platform admin's dashboard lists the requests waiting for a decision."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.models import QuotaRequest
from fleet.quota import requests as quota_requests
from tests.factories import ClusterFactory, GPUFactory, NodeFactory

pytestmark = pytest.mark.django_db
A100 = "nvidia-a100-80gb"


@pytest.fixture
def fleet():
    """Two nodes (64 GiB each) with 8 A100s of 80 GiB between them."""
    cluster = ClusterFactory(name="gpu-east")
    nodes = [NodeFactory(cluster=cluster, name=f"n{i}") for i in (1, 2)]
    for i in range(8):
        GPUFactory(node=nodes[i % 2], index=i // 2)
    return nodes


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def asked(**changes) -> dict:
    return {"tenant": "tenant-a", "device_class": A100, "units": 4, "memory_mib": 4 * 81920,
            "reason": "black friday traffic"} | changes


def test_the_fleet_capacity_counts_gpus_of_nodes_still_there(fleet):
    assert quota_requests.fleet_capacity(A100) == (8, 8 * 81920)
    assert quota_requests.fleet_capacity("cpu") == (None, 2 * 65536)
    fleet[1].gone_at = timezone.now()
    fleet[1].save()
    assert quota_requests.fleet_capacity(A100) == (4, 4 * 81920)
    assert quota_requests.fleet_capacity("nvidia-h100") == (None, None)  # none to measure


@pytest.mark.parametrize(("changes", "field", "says"), [
    ({"units": 100_000}, "units", f"the fleet has 8 {A100} GPUs in all: ask for at most 8"),
    ({"memory_mib": 1 << 40}, "memory_mib",
     f"the fleet has 655360 MiB (640 GiB) of {A100} GPU memory in all: ask for at most 655360"),
    ({"device_class": "cpu", "units": 100_000, "memory_mib": 1 << 40}, "memory_mib",
     "the fleet has 131072 MiB (128 GiB) of host memory of its nodes in all"),
], ids=["100k-gpus", "1-eib-gpu-memory", "1-eib-host-memory"])
def test_more_than_the_fleet_has_is_refused_saying_how_much_exists(fleet, alice, changes, field,
                                                                   says):
    console = browser(alice).post("/fleet/quotas/requests/new/", asked(**changes))
    api = APIClient()
    api.force_authenticate(alice)
    answer = api.post("/api/v1/quota-requests/", asked(**changes), format="json")

    assert console.status_code == 400
    assert says in re.sub(r"\s+", " ", console.content.decode())
    assert f'href="#{field}-error"' in console.content.decode()
    assert answer.status_code == 400, answer.content
    assert says in answer.json()[field][0]
    assert not QuotaRequest.objects.exists()


def test_what_the_fleet_has_may_be_asked_for(fleet, alice):
    response = browser(alice).post("/fleet/quotas/requests/new/",
                                   asked(units=8, memory_mib=8 * 81920))

    assert response.status_code == 302
    assert QuotaRequest.objects.get().units == 8


def test_until_is_a_date_picker_and_takes_what_it_sends(fleet, alice):
    page = browser(alice).get("/fleet/quotas/").content.decode()
    assert re.search(r'<input type="datetime-local" name="until"', page)

    when = (timezone.now() + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M")
    response = browser(alice).post("/fleet/quotas/requests/new/", asked(until=when))

    assert response.status_code == 302
    assert QuotaRequest.objects.get().until.strftime("%Y-%m-%dT%H:%M") == when


def test_a_platform_admins_dashboard_lists_the_requests_waiting(fleet, alice, root, bob):
    request = quota_requests.ask(alice, alice.memberships.get().tenant, A100, 4, 4 * 81920,
                                 "launch")

    mine = browser(root).get("/").content.decode()
    theirs = browser(bob).get("/").content.decode()

    assert 'id="pending-quota-requests"' in mine
    assert f'data-quota-request="{request.pk}"' in mine and "“launch”" in mine
    assert 'id="pending-quota-requests"' not in theirs
    quota_requests.refuse(root, request, "not this quarter")
    assert "No quota request waits for a decision." in browser(root).get("/").content.decode()
