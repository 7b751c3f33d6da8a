"""The console's server pages on a shared server: each tenant sees its own models' entries,
the others only counted; platform admins see all."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.adapters.base import ModelState, ServerProbe
from fleet.inventory import health
from fleet.models import InferenceServer
from tests.factories import InferenceServerFactory, ModelFactory

PRIVATE = "failed to load: s3://tenant-b-private/model-b/1.tar.gz: access denied"
INDEX = [
    {"name": "model-a", "version": "1", "state": "READY", "reason": ""},
    {"name": "model-b", "version": "1", "state": "UNAVAILABLE", "reason": PRIVATE},
    {"name": "stray", "version": "1", "state": "READY", "reason": ""},
]


@pytest.fixture
def shared(tenant_a, tenant_b, monkeypatch):
    ModelFactory(tenant=tenant_a, name="model-a")
    ModelFactory(tenant=tenant_b, name="model-b")

    def probe(http_url: str, timeout: float) -> ServerProbe:
        models = [ModelState(m["name"], m["version"], m["state"], m["reason"]) for m in INDEX]
        return ServerProbe(ready=True, live=True, version="2.51.0", models=models)

    monkeypatch.setattr(health, "PROBES", dict.fromkeys(InferenceServer.Runtime, probe))
    return InferenceServerFactory(name="shared", reported_models=INDEX)


# persona: (names shown, names never shown, "N other model(s)" or None)
SEES = {
    "bob": (["model-a"], ["model-b", "stray", PRIVATE], "2 other models"),
    "charlie": (["model-b", PRIVATE], ["model-a", "stray"], "2 other models"),
    "root": (["model-a", "model-b", "stray", PRIVATE], [], None),
}


@pytest.mark.parametrize("persona", sorted(SEES))
@pytest.mark.parametrize("page", ["live", "server", "status", "check"])
def test_each_server_page_names_only_the_callers_models(request, shared, persona, page):
    client = Client()
    client.force_login(request.getfixturevalue(persona))
    url = {
        "live": "/fleet/servers/live/",
        "server": f"/fleet/servers/{shared.pk}/",
        "status": f"/fleet/servers/{shared.pk}/status/",
        "check": f"/fleet/servers/{shared.pk}/check/",
    }[page]

    response = client.post(url) if page == "check" else client.get(url)

    assert response.status_code == 200
    html = response.content.decode()
    shown, hidden, others = SEES[persona]
    for text in shown:
        assert text in html, text
    for text in hidden:
        assert text not in html, text
    if others:
        assert others in html
    else:
        assert "other model" not in html


def test_a_deployment_page_shows_only_its_own_tenants_entries_of_a_shared_name(
    tenant_a, tenant_b, bob, charlie,
):
    """Two tenants name a model alike; on the shared Triton each has a name of its own
    (its tenant's slug qualifies it), and each page shows its own entry only."""
    from tests.factories import DeploymentFactory

    theirs = ModelFactory(tenant=tenant_b, name="scorer")
    ours = ModelFactory(tenant=tenant_a, name="scorer")
    server = InferenceServerFactory(name="shared-2", reported_models=[
        {"name": f"{tenant_b.slug}.scorer", "version": "7", "state": "UNAVAILABLE", "reason": PRIVATE},
        {"name": f"{tenant_a.slug}.scorer", "version": "3", "state": "READY", "reason": ""},
    ])
    page_of = {}
    for user, model in ((bob, ours), (charlie, theirs)):
        deployment = DeploymentFactory(model=model, cluster=server.cluster)
        deployment.servers.add(server)
        client = Client()
        client.force_login(user)
        response = client.get(f"/registry/deployments/{deployment.pk}/")
        assert response.status_code == 200
        page_of[user.username] = response.content.decode()

    assert "v7 UNAVAILABLE" not in page_of["bob"] and PRIVATE not in page_of["bob"]
    assert "v3 READY" in page_of["bob"]
    assert "v7 UNAVAILABLE" in page_of["charlie"]
    assert "v3 READY" not in page_of["charlie"]
