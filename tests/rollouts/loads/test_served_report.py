"""What a server reports agrees with a load the moment the load is done: the load asks the real
Triton before it writes its final state, so a page that sees the load ready (or unloaded) does
not show the report of the last health check; a version Triton was told to unload reads as
unloaded, not as a red UNAVAILABLE."""

from __future__ import annotations

import pytest
from django.test import Client

from console.templatetags.switchyard import served_state
from fleet.models import InferenceServer
from rollouts.loads import reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad
from tests.rollouts.triton_world import load_once

pytestmark = pytest.mark.django_db(transaction=True)


def reported(server: InferenceServer, model: str) -> dict[str, str]:
    server.refresh_from_db()
    return {m["version"]: served_state(m) for m in server.reported_models if m["name"] == model}


def test_the_servers_report_is_current_when_a_load_and_an_unload_end(world):
    InferenceServer.objects.filter(pk=world.server.pk).update(reported_models=[])
    v1, v2 = world.version(1), world.version(2)

    assert load_once(world, v1).state == ModelLoad.State.READY
    assert reported(world.server, world.served) == {"1": "READY"}
    assert load_once(world, v2).state == ModelLoad.State.READY
    assert reported(world.server, world.served) == {"1": "READY", "2": "READY"}

    unload = loads.request_unload(world.user, world.deployment, v1)[0]
    assert reconciler.run_to_end(unload.pk).state == ModelLoad.State.UNLOADED
    after = reported(world.server, world.served)
    assert after == {"1": "UNLOADED", "2": "READY"}, after

    client = Client()
    client.force_login(world.user)
    page = client.get(f"/registry/deployments/{world.deployment.pk}/").content.decode()
    assert "v2 READY</span>" in page
    assert '<span class="badge UNLOADED" title="unloaded">v1 UNLOADED</span>' in page
    assert "badge UNAVAILABLE" not in page


def test_a_real_unavailable_stays_unavailable():
    assert served_state({"state": "UNAVAILABLE", "reason": "unloaded"}) == "UNLOADED"
    assert served_state({"state": "UNAVAILABLE", "reason": "failed to load 'x'"}) == "UNAVAILABLE"
    assert served_state({"state": "READY", "reason": ""}) == "READY"
    assert served_state("garbage") == ""
