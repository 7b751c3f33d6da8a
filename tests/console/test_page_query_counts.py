"""SQL statements per console page, pinned, and the same however many rows there are: the
pages a fleet team reads all day (dashboard, fleet, deployments, audit log, loads), as a
tenant member and as a platform admin. A query per row (an N+1) fails here long before a
fleet-sized database shows it (bench/pages.py measures those).

Every count includes the session and the user; a member's adds their memberships.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from fleet.models import GPU, Cluster, Node
from tests.api.test_query_counts import _grow

PAGES = {
    "dashboard": "/",
    "fleet": "/fleet/",
    "fleet servers (live)": "/fleet/servers/live/",
    "deployments": "/registry/deployments/",
    "audit log": "/audit/",
    "audit log, filtered": "/audit/?verb=updated&object_type=rollouts.model",
    "loads": "/registry/loads/",
    "loads, filtered": "/registry/loads/?state=ready",
}


def _counts(user) -> dict[str, int]:
    client = Client()
    client.force_login(user)
    client.get("/")  # warm what a first request caches (the session's user)
    counts = {}
    for name, path in PAGES.items():
        with CaptureQueriesContext(connection) as queries:
            response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        counts[name] = len(queries)
    return counts


def _nodes(count: int, name: str = "gpu-farm") -> None:
    """``count`` more nodes of 8 GPUs each (one with MIG slices) in cluster ``name``: past
    ``TREE_NODES`` the fleet page sums the cluster up instead of drawing it."""
    cluster, _ = Cluster.objects.get_or_create(name=name, defaults={"kind": "static"})
    start = cluster.nodes.count()
    nodes = Node.objects.bulk_create(Node(cluster=cluster, name=f"n-{start + i}")
                                     for i in range(count))
    gpus = GPU.objects.bulk_create(
        GPU(node=node, index=g, uuid=f"GPU-{name}-{node.pk}-{g}", model="A100",
            device_class="nvidia-a100-80gb", memory_mib=81920)
        for node in nodes for g in range(8))
    GPU.objects.create(node=nodes[0], index=0, uuid=f"MIG-{name}-{nodes[0].pk}", model="A100",
                       device_class="nvidia-a100-80gb", memory_mib=40960, parent=gpus[0],
                       mig_profile="3g.40gb")


@pytest.fixture
def others(tenant_b, charlie):
    """Another tenant's rows next to the viewer's."""
    _grow(tenant_b, charlie, 2)


@pytest.mark.parametrize("persona", ["bob", "root"])
def test_a_page_runs_as_many_queries_with_five_times_the_rows(request, persona, others,
                                                              tenant_a, alice):
    user = request.getfixturevalue(persona)
    _grow(tenant_a, alice, 1)
    _nodes(2, "small-farm")  # drawn on the fleet page, as gpu-farm is until it grows
    _nodes(2)
    few = _counts(user)
    _grow(tenant_a, alice, 5)
    _nodes(30)

    many = _counts(user)

    assert tenant_a.model_loads.count() == 26 and tenant_a.audit_events.count() > 25
    assert many == few


EXPECTED = {
    # session, user, memberships; servers; counts of models, versions, pending, deployments;
    # quotas and their usage; the SLO summary (5); tenants; pending versions; recent events
    "dashboard": 19,
    # session, user, memberships; clusters with their nodes counted, servers and GPUs
    # counted; the tree of the small ones: nodes, GPUs, MIG slices, nodes' and clusters' servers
    "fleet": 11,
    "fleet servers (live)": 9,  # with the servers counted and at most LIVE_ROWS of them read
    # session, user, memberships; deployments in use and archived (counts: a few hundred
    # rows at most), the page, its servers; whether each one's servers agree (their servers
    # with their kind, their loads)
    "deployments": 9,
    # session, user, memberships; the filters' vocabulary (newest 5,000), the page, the
    # count up to 1,001, tenants
    "audit log": 7,
    "audit log, filtered": 7,
    # session, user, memberships; the page, the count up to 1,001, deployments and servers
    # with loads (EXISTS)
    "loads": 7,
    "loads, filtered": 7,
}


def test_each_page_runs_the_pinned_number_of_queries(others, tenant_a, alice, bob):
    _grow(tenant_a, alice, 3)
    _nodes(3)

    assert _counts(bob) == EXPECTED


def test_the_fleet_page_sums_up_a_big_cluster_and_draws_a_small_one(bob):
    _nodes(2, "small-farm")
    _nodes(20)
    client = Client()
    client.force_login(bob)

    body = client.get("/fleet/").content.decode()

    assert "20 nodes · 0 servers · 160 \N{MULTIPLICATION SIGN} <code>nvidia-a100-80gb</code>" in body
    assert "1 MIG slice" in body and "Too many nodes to draw here" in body
    assert "Node n-0" in body  # small-farm's tree
    assert body.count("GPU-gpu-farm-") == 0 and body.count("GPU-small-farm-") == 16


def test_the_live_server_table_shows_the_unhealthy_first_past_its_rows(bob, monkeypatch):
    from fleet.inventory import views
    from fleet.models import InferenceServer
    from tests.factories import ClusterFactory, InferenceServerFactory

    monkeypatch.setattr(views, "LIVE_ROWS", 3)
    cluster = ClusterFactory(name="live")
    for i in range(5):
        InferenceServerFactory(cluster=cluster, name=f"s-{i}",
                               health=InferenceServer.Health.UNREACHABLE if i == 4
                               else InferenceServer.Health.HEALTHY)
    client = Client()
    client.force_login(bob)

    body = client.get("/fleet/servers/live/").content.decode()

    assert 'data-server="s-4"' in body and body.count("data-server=") == 3
    assert "2 more healthy servers not shown" in body
