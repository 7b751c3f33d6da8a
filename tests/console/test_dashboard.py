"""The dashboard as a user reads it: counts in the singular for one, one health dot per server,
and recent changes that never show a state of then as if it were now."""

from __future__ import annotations

import re

from fleet.models import AuditEvent, InferenceServer
from rollouts.loads import requests as loads
from rollouts.registry import approvals
from tests.console.test_tenancy_matrix import World
from tests.factories import ModelVersionFactory

FLEET_CARD = re.compile(r'<div id="fleet-health".*?</a>', re.S)
RECENT = re.compile(r"<h2>Recent changes</h2>(.*?)</table>", re.S)


def dashboard(world: World, persona: str = "alice") -> str:
    response = world.browser(persona).get("/")
    assert response.status_code == 200
    return response.content.decode()


def test_one_version_and_one_pending_read_in_the_singular(request, db):
    world = World(request)
    world.version_a, world.pending_a  # model A: version 1, and version 2 pending approval

    body = dashboard(world)
    assert '<div class="sub">2 versions</div>' in body
    assert "<div class=\"value\">1</div><div class=\"sub\">version pending a decision</div>" in body

    approvals.reject(world.persona("erin"), world.pending_a, reason="not this one")
    world.pending_a.delete()
    body = dashboard(world)
    assert '<div class="sub">1 version</div>' in body
    assert "<div class=\"value\">0</div><div class=\"sub\">versions pending a decision</div>" in body


def test_the_awaiting_approval_card_counts_them_all_and_links_the_queue(request, db):
    world = World(request)
    for number in range(2, 14):
        version = ModelVersionFactory(model=world.model_a, version=number)
        approvals.request_approval(world.persona("dave"), version)

    body = dashboard(world)

    assert ('<a class="stat" href="/registry/approvals/"><div class="label">Awaiting approval</div>'
            '<div class="value">12</div>') in body
    assert "All 12 awaiting approval" in body


def test_the_fleet_card_shows_one_health_dot_per_server(request, db):
    world = World(request)
    InferenceServer.objects.filter(pk=world.server.pk).update(health="healthy")

    card = FLEET_CARD.search(dashboard(world))[0]
    partial = world.browser("alice").get("/live/fleet-health/").content.decode()

    for html in (card, partial):
        assert '<div class="value">1 / 1</div>' in html
        assert html.count('class="dot') == 1
        assert 'class="live' not in html  # the live marker is a green dot too


def test_a_requested_load_is_named_without_its_state_then(request, db):
    """GIVEN dave requests a load (pending at that moment), WHEN it has since become ready,
    THEN recent changes and the audit log name the load without "(pending)"."""
    world = World(request)
    [load], _ = loads.request_load(world.persona("dave"), world.served_a, world.version_a)
    type(load).objects.filter(pk=load.pk).update(state="ready")

    event = AuditEvent.objects.get(verb="requested_load")
    recent = RECENT.search(dashboard(world))[1]
    audit = world.browser("alice").get("/audit/").content.decode()

    assert event.object_repr == "tenant-a/model-a v1 on cluster-1/server-1"
    assert "dave</strong> requested load" in recent
    assert "tenant-a/model-a v1 on cluster-1/server-1</span>" in recent
    for html in (recent, audit):
        assert "(pending)" not in html


def test_an_event_recorded_with_the_state_then_says_it_was(request, db):
    world = World(request)
    AuditEvent.objects.create(
        tenant=world.tenant_a, actor_label="dave", verb="requested_load",
        object_type="rollouts.modelload", object_id="1",
        object_repr="tenant-a/model-a v1 on server-1 (pending)")
    AuditEvent.objects.create(
        tenant=world.tenant_a, actor_label="dave", verb="created", object_type="rollouts.model",
        object_id="2", object_repr="tenant-a/bert (base)")

    recent = RECENT.search(dashboard(world))[1]
    audit = world.browser("alice").get("/audit/").content.decode()

    for html in (recent, audit):
        assert "tenant-a/model-a v1 on server-1 (was pending)" in html
        assert "tenant-a/bert (base)" in html  # a name with brackets of its own stays
