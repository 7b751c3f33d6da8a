"""The deployment form: each checkbox's label beside its box (the servers' list under its
own label), the servers shown only for the cluster chosen, and a server of another cluster
refused as a mistake in the form (400 on ``servers``), never a 409 page."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from playwright.sync_api import expect

from rollouts.models import Deployment
from tests.console import test_registry_forms as registry_forms
from tests.console.test_registry_forms import deployment_data

# gpu-east with t1 and t2, gpu-west with w1; tenant A's model "scorer"
fleet = registry_forms.fleet
model = registry_forms.model


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_each_server_names_its_cluster_for_the_page_to_follow_the_choice(dave, model, fleet):
    body = browser(dave).get("/registry/deployments/new/").content.decode()

    boxes = dict(re.findall(r'<input type="checkbox" name="servers" value="(\d+)"[^>]*'
                            r'data-cluster="(\d+)"', body))
    assert boxes == {str(s.pk): str(s.cluster_id) for s in [*fleet["servers"], fleet["stranger"]]}
    assert 'data-follows="cluster"' in body


def test_a_checkbox_label_sits_beside_its_box_and_the_server_list_under_its_label(dave, model,
                                                                                 fleet):
    body = browser(dave).get("/registry/deployments/new/").content.decode()

    servers = body[body.index('id="field-servers"'):]
    servers = servers[:servers.index('<p class="small muted">')]
    assert servers.index(">Servers</label>") < servers.index('type="checkbox"')
    production = body[body.index('id="field-production"'):]
    assert re.search(r'<label for="id_production"><input type="checkbox"[^>]*> Production</label>',
                     production)


def test_a_server_of_another_cluster_is_a_form_error_not_a_conflict(dave, model, fleet):
    response = browser(dave).post("/registry/deployments/new/", deployment_data(
        model, fleet, servers=[fleet["servers"][0].pk, fleet["stranger"].pk]))

    body = response.content.decode()
    assert response.status_code == 400
    assert 'href="#servers-error"' in body
    assert "servers w1 are not in cluster gpu-east; its servers: t1, t2" in body
    assert not Deployment.objects.exists()


@pytest.mark.browser
def test_choosing_a_cluster_shows_only_its_servers(
    transactional_db: None, live_server, dave, model, fleet, open_page
) -> None:
    """GIVEN the new deployment form, WHEN dave picks gpu-west, THEN only w1 is offered; WHEN
    he ticks t1 under gpu-east and switches to gpu-west, THEN t1 is hidden and unticked."""
    page = open_page("dave")
    page.goto(f"{live_server.url}/registry/deployments/new/")
    east, west = fleet["cluster"], fleet["other"]
    t1, w1 = fleet["servers"][0], fleet["stranger"]

    page.select_option("#id_cluster", str(east.pk))
    expect(page.locator(f"input[name=servers][value='{t1.pk}']")).to_be_visible()
    expect(page.locator(f"input[name=servers][value='{w1.pk}']")).to_be_hidden()
    page.check(f"input[name=servers][value='{t1.pk}']")

    page.select_option("#id_cluster", str(west.pk))
    expect(page.locator(f"input[name=servers][value='{w1.pk}']")).to_be_visible()
    expect(page.locator(f"input[name=servers][value='{t1.pk}']")).to_be_hidden()
    assert not page.locator(f"input[name=servers][value='{t1.pk}']").is_checked()
