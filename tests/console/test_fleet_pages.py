"""The fleet page shows each server's health once: in the live table, which refreshes."""

from __future__ import annotations

from fleet.models import InferenceServer
from tests.console.test_tenancy_matrix import World


def test_each_servers_health_shows_once_on_the_fleet_page(request, db):
    """GIVEN one healthy server, THEN its health dot is in the live table alone: a second one
    in the cluster's panel would not refresh, and would disagree once the server goes down."""
    world = World(request)
    InferenceServer.objects.filter(pk=world.server.pk).update(health="healthy")
    client = world.browser("alice")

    page = client.get("/fleet/").content.decode()
    live = client.get("/fleet/servers/live/").content.decode()

    assert 'href="/fleet/servers/' in page  # the cluster's panel still lists it
    assert 'class="dot' not in page
    assert live.count('class="dot healthy"') == 1
