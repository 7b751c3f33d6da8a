"""Every live panel follows what it shows, in Chromium, without a reload: the dashboard's fleet
health, a server's status, the quotas, a Kubernetes cluster's sync and nodes, a deployment's
Kubernetes servers (which stop polling once nothing is in flight), and relative times, which
keep counting between refreshes.

Each test opens the page, changes the row the panel reads, and waits for the panel to say so;
the page itself is never reloaded (a marker set on ``window`` before the change is still there).
The waits are those of the panels' own polling (2 to 5 s) with a margin of three polls.
"""

from __future__ import annotations

import re

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from fleet.models import Cluster, InferenceServer, Membership, Node, Placement
from rollouts.models import ServerWorkload
from tests.api.test_tenancy_matrix import World
from tests.factories import (
    AliasFactory,
    ClusterFactory,
    InferenceServerFactory,
    MembershipFactory,
    ModelFactory,
    ModelVersionFactory,
    QuotaFactory,
    UserFactory,
)
from tests.fixtures import sent_tasks

pytestmark = pytest.mark.browser
THREE_POLLS_MS = 16_000  # the slowest panel polls every 5 s


@pytest.fixture
def alice(transactional_db):
    user = UserFactory(username="alice")
    MembershipFactory(user=user, role=Membership.Role.ADMIN)
    return user


def opened(open_page, url: str) -> Page:
    page = open_page("alice")
    page.goto(url)
    page.evaluate("window.__notReloaded = true")
    return page


def not_reloaded(page: Page) -> bool:
    return page.evaluate("window.__notReloaded") is True


def test_the_dashboards_fleet_health_follows_the_servers(open_page, live_server, alice):
    cluster = ClusterFactory(name="live-dash")
    servers = [InferenceServerFactory(cluster=cluster, name=f"s{n}", health="healthy") for n in (1, 2)]
    page = opened(open_page, f"{live_server.url}/")
    expect(page.locator("#fleet-health .value")).to_have_text("2 / 2")

    InferenceServer.objects.filter(pk=servers[1].pk).update(health="unreachable")

    expect(page.locator("#fleet-health .value")).to_have_text("1 / 2", timeout=THREE_POLLS_MS)
    assert not_reloaded(page)


def test_a_servers_status_follows_its_probes(open_page, live_server, alice):
    server = InferenceServerFactory(cluster=ClusterFactory(name="live-server"), name="t1",
                                    health="healthy", health_detail="")
    page = opened(open_page, f"{live_server.url}/fleet/servers/{server.pk}/")
    expect(page.locator("#server-status .badge").first).to_contain_text("Healthy")

    InferenceServer.objects.filter(pk=server.pk).update(
        health="unreachable", health_detail="connection refused at http://127.0.0.1:9",
        health_changed_at=timezone.now())

    expect(page.locator("#server-status .badge").first).to_contain_text("Unreachable", timeout=THREE_POLLS_MS)
    expect(page.locator("#server-status")).to_contain_text("connection refused")
    assert not_reloaded(page)


def test_the_quotas_follow_what_is_placed(open_page, live_server, alice):
    tenant = alice.memberships.get().tenant
    quota = QuotaFactory(tenant=tenant, device_class="cpu", units=4, memory_mib=1024)
    server = InferenceServerFactory(cluster=ClusterFactory(name="live-quota"), name="t1")
    version = ModelVersionFactory(model=ModelFactory(tenant=tenant, name="m"))
    page = opened(open_page, f"{live_server.url}/fleet/quotas/")
    expect(page.locator("#quota-table")).to_contain_text("0 of 4")

    Placement.objects.create(tenant=tenant, server=server, model_version=version, device_class="cpu",
                             units=3, memory_mib=256, state=Placement.State.ACTIVE)

    expect(page.locator("#quota-table")).to_contain_text("3 of 4", timeout=THREE_POLLS_MS)
    assert quota.units == 4 and not_reloaded(page)


def test_a_kubernetes_clusters_sync_and_nodes_follow_the_api(open_page, live_server, alice):
    cluster = ClusterFactory(name="kube-live", kind=Cluster.Kind.KUBERNETES, kube_auth="in-cluster",
                             sync_state="syncing")
    page = opened(open_page, f"{live_server.url}/fleet/clusters/{cluster.pk}/")
    expect(page.locator("[data-sync]")).to_have_attribute("data-sync", "syncing")

    Cluster.objects.filter(pk=cluster.pk).update(sync_state="ok", last_synced_at=timezone.now())
    Node.objects.create(cluster=cluster, name="gpu-node-7", memory_mib=1024)

    expect(page.locator("[data-sync]")).to_have_attribute("data-sync", "ok", timeout=THREE_POLLS_MS)
    expect(page.locator('[data-node="gpu-node-7"]')).to_be_visible()
    assert not_reloaded(page)


def test_the_kubernetes_servers_panel_polls_until_nothing_is_in_flight(
    request, open_page, live_server, transactional_db, monkeypatch
):
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_workload", lambda workload_id: None)
    world = World(request)
    workload = world.pending_workload_a  # asked for by dave, not applied yet
    polls: list[int] = []
    page = open_page("dave")
    page.on("response", lambda r: polls.append(r.status) if "/workloads/" in r.url else None)
    page.goto(f"{live_server.url}/registry/deployments/{workload.deployment_id}/")
    page.evaluate("window.__notReloaded = true")
    row = page.locator(f'#workloads tr[data-workload="{workload.pk}"]')
    expect(row).to_have_attribute("data-state", "pending")

    ServerWorkload.objects.filter(pk=workload.pk).update(
        state=ServerWorkload.State.READY, detail="every replica available",
        observed={"replicas": 1, "updated": 1, "ready": 1, "available": 1})

    expect(row).to_have_attribute("data-state", "ready", timeout=THREE_POLLS_MS)
    settled = len(polls)
    page.wait_for_timeout(5_000)  # two and a half polling periods: no poll after the 286
    assert polls[-1] == 286 and len(polls) == settled
    assert not_reloaded(page)


def test_relative_times_keep_counting_between_refreshes(open_page, live_server, alice):
    """The model page does not poll: only the browser can move its "moved N s ago"."""
    model = ModelFactory(tenant=alice.memberships.get().tenant, name="m")
    AliasFactory(model=model, version=ModelVersionFactory(model=model, version=1), name="staging")
    page = opened(open_page, f"{live_server.url}/registry/models/{model.pk}/")
    moment = page.locator("time[data-ago]").first
    first = moment.inner_text()

    expect(moment).not_to_have_text(first, timeout=5_000)
    expect(moment).to_have_text(re.compile(r"^\d+ s ago$"))
    assert moment.get_attribute("title").endswith(" UTC")
    assert not_reloaded(page)
