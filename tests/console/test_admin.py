"""The Django admin as a platform admin reads it: names spelled as people write them, and model
loads to look at (filter, search, history) but never to edit."""

from __future__ import annotations

import pytest

from rollouts.models import ModelLoad, ModelLoadEvent
from tests.console.test_tenancy_matrix import World


@pytest.fixture
def world(request, db) -> World:
    return World(request)


@pytest.fixture
def admin_client(world, client):
    client.force_login(world.persona("root"))
    return client


def test_the_admin_index_spells_names_as_people_write_them(admin_client):
    body = admin_client.get("/admin/").content.decode()

    for name in ("API tokens", "GPUs", "Model loads"):
        assert f">{name}</a>" in body
    for wrong in ("Api tokens", "Gpus", "analysiss"):
        assert wrong not in body


def test_model_loads_are_listed_filtered_and_searched(world, admin_client):
    ready = world.load_a
    ModelLoad.objects.filter(pk=ready.pk).update(state=ModelLoad.State.READY)
    other = world.load_b

    listed = admin_client.get("/admin/rollouts/modelload/").content.decode()
    by_state = admin_client.get("/admin/rollouts/modelload/", {"state__exact": "ready"})
    by_name = admin_client.get("/admin/rollouts/modelload/", {"q": "model-b"})

    assert "tenant-a/model-a v1" in listed and "tenant-b/model-b v1" in listed
    assert list(by_state.context["cl"].result_list) == [ready]
    assert list(by_name.context["cl"].result_list) == [other]


def test_a_model_load_is_read_only_with_its_history(world, admin_client):
    load = world.load_a
    ModelLoadEvent.objects.create(load=load, state="pending", message="load requested by dave")
    url = f"/admin/rollouts/modelload/{load.pk}/change/"

    page = admin_client.get(url)
    edited = admin_client.post(url, {"state": "ready"})

    assert page.status_code == 200
    body = page.content.decode()
    assert "load requested by dave" in body
    assert 'name="state"' not in body and 'name="_save"' not in body
    assert edited.status_code == 403
    assert admin_client.get("/admin/rollouts/modelload/add/").status_code == 403
    assert admin_client.post(f"/admin/rollouts/modelload/{load.pk}/delete/",
                             {"post": "yes"}).status_code == 403
    assert ModelLoad.objects.get(pk=load.pk).state == ModelLoad.State.PENDING


def test_a_tenants_slug_cannot_change_once_it_exists(world, admin_client):
    """The slug qualifies the tenant's model names on shared servers (acme.fraud-scorer)."""
    tenant = world.load_a.tenant
    page = admin_client.get(f"/admin/fleet/tenant/{tenant.pk}/change/").content.decode()
    assert 'name="slug"' not in page and tenant.slug in page

    added = admin_client.get("/admin/fleet/tenant/add/").content.decode()
    assert 'name="slug"' in added
