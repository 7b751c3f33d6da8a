"""The demo's seeding, started again on the database of an earlier run (as `./scripts/demo`
does every time): each deployment gets one load request, whatever was approved meanwhile."""

from __future__ import annotations

import pytest

from local import demo
from rollouts.models import Deployment, ModelLoad, ModelVersion


@pytest.fixture
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.mark.django_db
def test_a_restart_after_a_second_version_was_approved_loads_one_version_a_deployment(
    fast_passwords,
):
    demo.seed("switchyard-demo")
    first = demo.request_demo_loads()
    fraud = Deployment.objects.get(name="fraud-scorer-prod")
    # Meanwhile a person approved fraud-scorer v2; the demo stops and starts again.
    ModelVersion.objects.filter(model=fraud.model, version=2).update(
        status=ModelVersion.Status.APPROVED)

    again = demo.request_demo_loads()

    assert sorted((load.deployment.name, load.version.version) for load in first) == [
        ("fraud-scorer-prod", 1), ("sentiment-prod", 1)]
    assert sorted((load.deployment.name, load.version.version) for load in again) == [
        ("fraud-scorer-prod", 1), ("sentiment-prod", 1)]
    # The first run's loads were interrupted by the restart, not left in flight.
    assert ModelLoad.objects.filter(pk__in=[load.pk for load in first],
                                    state=ModelLoad.State.FAILED).count() == 2


@pytest.mark.django_db
def test_without_an_approved_production_version_the_newest_approved_one_is_served(fast_passwords):
    demo.seed("switchyard-demo")
    fraud = Deployment.objects.get(name="fraud-scorer-prod")
    ModelVersion.objects.filter(model=fraud.model, version=2).update(
        status=ModelVersion.Status.APPROVED)
    ModelVersion.objects.filter(model=fraud.model, version=3).update(
        status=ModelVersion.Status.ARCHIVED)
    fraud.model.aliases.filter(name="production").delete()

    assert demo.demo_version(fraud).version == 2
