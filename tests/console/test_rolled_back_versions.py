"""A version whose last canary was rolled back says so in the registry, beside its approval
status: on the model's page, the version's page and the models list; a later canary of the
same version that succeeded clears it."""

from __future__ import annotations

import datetime as dt

from django.test import Client
from django.utils import timezone

from rollouts.models import ModelVersion, Rollout
from tests.console import test_rollout_pages as pages
from tests.console.test_rollout_pages import make

setup = pages.setup  # fraud: v1 ready on its server, v2 and v3 registered


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def ended(setup, dave, state: str, minutes_ago: int, **fields) -> Rollout:
    fields = {"weights": {"1": 100}} | fields
    return make(setup, dave, state=state,
                finished_at=timezone.now() - dt.timedelta(minutes=minutes_ago), **fields)


def test_a_rolled_back_canary_shows_on_every_registry_page(setup, dave, bob):
    v2 = setup["versions"][2]
    ModelVersion.objects.filter(pk=v2.pk).update(status=ModelVersion.Status.APPROVED)
    rollout = ended(setup, dave, Rollout.State.ROLLED_BACK, 5,
                    reason="p99 over its SLO: 812 ms against 500 ms")
    marker = f'data-rolled-back="{rollout.pk}"'

    model_page = browser(bob).get(f"/registry/models/{setup['model'].pk}/").content.decode()
    version_page = browser(bob).get(f"/registry/versions/{v2.pk}/").content.decode()
    other_page = browser(bob).get(f"/registry/versions/{setup['versions'][1].pk}/").content.decode()

    assert model_page.count(marker) == 1 and "canary rolled back" in model_page
    assert marker in version_page and "Approved" in version_page
    assert 'id="version-rolled-back"' in version_page
    assert "p99 over its SLO: 812 ms against 500 ms" in version_page
    assert "canary rolled back" not in other_page


def test_the_models_list_marks_a_latest_version_rolled_back(setup, dave, bob):
    v3 = setup["versions"][3]
    rollout = ended(setup, dave, Rollout.State.ROLLED_BACK, 5, candidate=v3)

    body = browser(bob).get("/registry/").content.decode()

    assert f'data-rolled-back="{rollout.pk}"' in body


def test_a_later_canary_that_succeeded_clears_it(setup, dave, bob):
    ended(setup, dave, Rollout.State.ROLLED_BACK, 30)
    ended(setup, dave, Rollout.State.SUCCEEDED, 5, weights={"2": 100})

    body = browser(bob).get(f"/registry/versions/{setup['versions'][2].pk}/").content.decode()

    assert "canary rolled back" not in body
