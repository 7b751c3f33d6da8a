"""SQL statements per request for the list and detail endpoints CI calls (bench/api.py loads
them): pinned, and the same however many rows there are, so an N+1 (a query per row of a page,
or per alias, server or event of a row) fails here before it reaches a benchmark.

The requests authenticate with a tenant token, as CI does. Every count includes the token's
lookup; lists add their page's ``COUNT(*)`` (but for the loads and the audit log, which page
by cursor and count nothing), and a prefetch where a row carries a list (a model's aliases, a
deployment's servers, a load's events, a page of quotas' usage).
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import audit
from fleet.models import Membership, Placement, Quota
from rollouts.models import Alias, ModelLoad, ModelLoadEvent, Route
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

EXPECTED = {
    "models list": 4,  # token, count, models (latest version as a subquery), aliases
    "models detail": 3,
    "versions list": 3,  # token, count, versions with model, tenant and who registered
    "versions detail": 2,
    # token, count, deployments with tenant, model, cluster, route; servers; for consistency:
    # the page's servers with their kind, its loads
    "deployments list": 6,
    "deployments detail": 5,
    "loads list": 3,  # token, loads with deployment, server, version, model; events (no count)
    "loads detail": 3,
    "quotas list": 4,  # token, count, quotas with tenant; usage of the page
    "quotas detail": 3,
    "audit-events list": 2,  # token, events with tenant (a cursor page: no count)
    "audit-events detail": 2,
}
DEVICE_CLASSES = ("cpu", "nvidia-a100-80gb", "nvidia-l4", "nvidia-h100-80gb")
_numbers = itertools.count(1)


def _grow(tenant, actor, size: int) -> None:
    """``size`` models of ``tenant`` with ``size`` versions and two aliases each, a deployment
    of each on ``size`` servers with a route, ``size`` loads of each with ``size`` events and
    a placement, a quota per device class (up to four) and audit events."""
    n = next(_numbers)
    cluster = ClusterFactory(name=f"qc-{n}")
    servers = [InferenceServerFactory(cluster=cluster, name=f"qc-{n}-{i}") for i in range(size)]
    for m in range(size):
        model = ModelFactory(tenant=tenant, name=f"qc-{n}-model-{m}")
        versions = [ModelVersionFactory(model=model, version=v + 1) for v in range(size)]
        Alias.objects.create(model=model, name="staging", version=versions[-1])
        Alias.objects.create(model=model, name="production", version=versions[0])
        deployment = DeploymentFactory(tenant=tenant, model=model, cluster=cluster,
                                       name=f"qc-{n}-dep-{m}")
        deployment.servers.set(servers)
        Route.objects.create(deployment=deployment, name=f"dep-{deployment.pk}",
                             url=f"http://router:{18100 + m}", state=Route.State.IN_FORCE)
        for i, version in enumerate(versions):
            server = servers[i % size]
            placement = Placement.objects.create(
                tenant=tenant, server=server, model_version=version, device_class="cpu",
                units=1, memory_mib=1024, state=Placement.State.ACTIVE)
            load = ModelLoad.objects.create(
                tenant=tenant, deployment=deployment, server=server, version=version,
                placement=placement, state=ModelLoad.State.READY, requested_by_label="ci")
            ModelLoadEvent.objects.bulk_create(
                ModelLoadEvent(load=load, state=ModelLoad.State.READY, message=f"step {e}")
                for e in range(size))
    for device_class in DEVICE_CLASSES[:size]:
        Quota.objects.get_or_create(tenant=tenant, device_class=device_class,
                                    defaults={"units": 8, "memory_mib": 8192})
    for model in tenant.models.all():
        for _ in range(size):
            audit.record(actor, "updated", model, tenant=tenant, after={"description": "x"})


def _counts(client, tenant) -> dict[str, int]:
    """Statements per request for every endpoint, the detail ones read on the newest row."""
    newest = {
        "models": tenant.models.order_by("-pk").first(),
        "versions": tenant.models.order_by("-pk").first().versions.order_by("-pk").first(),
        "deployments": tenant.deployments.order_by("-pk").first(),
        "loads": tenant.model_loads.order_by("-pk").first(),
        "quotas": tenant.quotas.order_by("-pk").first(),
        "audit-events": tenant.audit_events.order_by("-pk").first(),
    }
    client.get("/api/v1/models/")  # the token's last_used_at is written once a minute
    counts = {}
    for resource, row in newest.items():
        for name, path in ((f"{resource} list", f"/api/v1/{resource}/"),
                           (f"{resource} detail", f"/api/v1/{resource}/{row.pk}/")):
            with CaptureQueriesContext(connection) as queries:
                response = client.get(path)
            assert response.status_code == 200, (path, response.content[:300])
            counts[name] = len(queries)
    return counts


@pytest.fixture
def grown(tenant_a, tenant_b, alice, charlie, token_client):
    """A CI token of tenant A; another tenant's rows next to it."""
    _grow(tenant_b, charlie, 2)
    return token_client(tenant_a, Membership.Role.DEPLOYER)


def test_each_endpoint_runs_the_pinned_number_of_queries(grown, tenant_a, alice):
    _grow(tenant_a, alice, 1)

    assert _counts(grown, tenant_a) == EXPECTED


def test_the_number_of_queries_does_not_grow_with_the_rows(grown, tenant_a, alice):
    _grow(tenant_a, alice, 1)
    few = _counts(grown, tenant_a)
    _grow(tenant_a, alice, 4)

    many = _counts(grown, tenant_a)

    assert tenant_a.models.count() == 5 and tenant_a.model_loads.count() == 17
    assert many == few


def test_a_full_page_of_every_list_runs_the_pinned_number_of_queries(grown, tenant_a, alice):
    """Past one page (50 rows): the count and the page are still one query each."""
    _grow(tenant_a, alice, 1)
    model = tenant_a.models.get()
    for number in range(100, 160):
        ModelVersionFactory(model=model, version=number)
    for _ in range(60):
        audit.record(alice, "updated", model, tenant=tenant_a, after={"description": "y"})
    load = tenant_a.model_loads.get()
    for i in range(60):
        ModelLoad.objects.create(
            tenant=tenant_a, deployment=load.deployment, server=load.server, version=load.version,
            state=ModelLoad.State.UNLOADED, requested_by_label="ci",
            finished_at=timezone.now() - timedelta(minutes=i))

    counts = _counts(grown, tenant_a)

    assert counts == EXPECTED
