"""Noisy neighbours on a shared server: a change by one deployment that coincides with another
going over its SLO is shown on both pages, named only inside a tenant; a production
deployment can keep other tenants' loads off its servers."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from console.exceptions import Conflict
from fleet.models import Membership
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, ModelLoadEvent, SloDisturbance
from rollouts.slo import alerts
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    MembershipFactory,
    ModelFactory,
    ModelVersionFactory,
    QuotaFactory,
)
from tests.rollouts.slo.test_slo import minutes

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(tenant_a, tenant_b):
    """Tenant A's production scorer and tenant B's ranker on one server, and A's second
    deployment there too."""
    cluster = ClusterFactory(name="shared")
    server = InferenceServerFactory(cluster=cluster, name="triton-shared")
    scorer = DeploymentFactory(tenant=tenant_a, model=ModelFactory(tenant=tenant_a, name="scorer-model"),
                               cluster=cluster, name="scorer", production=True, slo_error_rate=Decimal("1.00"))
    ranker = DeploymentFactory(tenant=tenant_b, model=ModelFactory(tenant=tenant_b, name="secret-ranker"),
                               cluster=cluster, name="ranker")
    sibling = DeploymentFactory(tenant=tenant_a, model=ModelFactory(tenant=tenant_a, name="sibling-model"),
                                cluster=cluster, name="sibling")
    for d in (scorer, ranker, sibling):
        d.servers.set([server])
    return scorer, ranker, sibling, server


def load_started(deployment, server, version_number: int, when) -> ModelLoad:
    version = ModelVersionFactory(model=deployment.model, version=version_number)
    load = ModelLoad.objects.create(tenant=deployment.tenant, deployment=deployment, server=server,
                                    version=version, state=ModelLoad.State.LOADING, requested_by_label="ci")
    event = ModelLoadEvent.objects.create(load=load, state=ModelLoad.State.LOADING, message="loading")
    ModelLoadEvent.objects.filter(pk=event.pk).update(created_at=when)
    return load


def test_a_load_that_coincides_with_a_breach_shows_on_both_pages_unnamed_across_tenants(
        shared, client, alice, charlie):
    scorer, ranker, sibling, server = shared
    now = timezone.now()
    load_started(ranker, server, 3, now - timedelta(minutes=2))      # another tenant's change
    load_started(sibling, server, 2, now - timedelta(minutes=4))     # a change of its own tenant
    load_started(ranker, server, 4, now - timedelta(minutes=30))     # too long before: not it
    minutes(scorer, 30, 3, rpm=600, now=now)
    minutes(scorer, 2, 0, rpm=600, failed=0.2, now=now)

    alerts.tick(now)
    alerts.tick(now)  # recorded once

    assert SloDisturbance.objects.filter(affected=scorer).count() == 2
    client.force_login(alice)
    page = client.get(f"/registry/deployments/{scorer.pk}/slo/", headers={"HX-Request": "true"}).content.decode()
    assert "A change on this server (triton-shared)" in page
    assert "Load of sibling-model v2 (deployment sibling)" in page
    assert "secret-ranker" not in page and "ranker" not in page

    client.force_login(charlie)
    theirs = client.get(f"/registry/deployments/{ranker.pk}/slo/", headers={"HX-Request": "true"}).content.decode()
    assert "load of secret-ranker v3 on triton-shared" in theirs
    assert "coincided with another deployment on this server going over its SLO" in theirs
    assert "scorer" not in theirs


def test_a_production_deployment_that_guards_its_servers_keeps_other_tenants_loads_off(
        shared, tenant_a, tenant_b, settings):
    scorer, ranker, sibling, _server = shared
    deployer_b = MembershipFactory(tenant=tenant_b, role=Membership.Role.DEPLOYER).user
    deployer_a = MembershipFactory(tenant=tenant_a, role=Membership.Role.DEPLOYER).user
    QuotaFactory(tenant=tenant_a)
    QuotaFactory(tenant=tenant_b)
    settings.CELERY_TASK_ALWAYS_EAGER = False
    b_version = ModelVersionFactory(model=ranker.model, version=1, status="approved")
    a_version = ModelVersionFactory(model=sibling.model, version=1, status="approved")

    scorer.guard_servers = True
    scorer.save()
    with pytest.raises(Conflict) as refused:
        loads.request_load(deployer_b, ranker, b_version)
    assert refused.value.field == "servers"
    assert "carries another tenant's production deployment" in str(refused.value)
    assert "scorer" not in str(refused.value)
    # Its own tenant's loads are not kept off.
    created, _ = loads.request_load(deployer_a, sibling, a_version)
    assert len(created) == 1

    # The tenant-wide switch does the same for all its production deployments; a
    # deployment that is not production guards nothing.
    scorer.guard_servers = False
    scorer.save()
    tenant_a.guard_production_servers = True
    tenant_a.save()
    with pytest.raises(Conflict):
        loads.request_load(deployer_b, ranker, b_version)
    scorer.production = False
    scorer.save()
    created, _ = loads.request_load(deployer_b, ranker, b_version)
    assert len(created) == 1
