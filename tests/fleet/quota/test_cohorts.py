"""Cohorts: tenants lend each other unused quota, borrowing is marked on placements, a
lender's quota comes back (listed, or unloaded by policy, lowest priority first), and one
admission function explains every decision, in the domain, the API and the console."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.exceptions import Conflict, QuotaExceeded
from fleet.models import Cohort, Placement
from fleet.quota import admission as quota
from rollouts.loads import reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad
from tests.factories import (
    DeploymentFactory,
    InferenceServerFactory,
    ModelVersionFactory,
    QuotaFactory,
    TenantFactory,
)

pytestmark = pytest.mark.django_db
A100 = "nvidia-a100-80gb"
GIB80 = 81920


@pytest.fixture
def pool():
    """Cohort gpu-pool: acme and globex, 4 A100s each; acme may borrow 2, globex nothing."""
    cohort = Cohort.objects.create(name="gpu-pool")
    acme = TenantFactory(slug="acme", cohort=cohort)
    globex = TenantFactory(slug="globex", cohort=cohort)
    QuotaFactory(tenant=acme, device_class=A100, units=4, memory_mib=4 * GIB80,
                 borrowing_limit_units=2, borrowing_limit_memory_mib=2 * GIB80)
    QuotaFactory(tenant=globex, device_class=A100, units=4, memory_mib=4 * GIB80)
    server = InferenceServerFactory()
    return cohort, acme, globex, server


def place(tenant, server, units, priority=0):
    version = ModelVersionFactory(model__tenant=tenant)
    return quota.admit_on_class(tenant, server, version.pk, A100, units, units * GIB80,
                                priority=priority)


def test_a_tenant_borrows_from_its_cohort_and_the_placement_says_so(pool):
    _, acme, _, server = pool
    own = place(acme, server, 3)

    decision = quota.assess(acme, A100, 2, 2 * GIB80)
    assert decision.admitted
    assert decision.explanation.startswith(
        f"needs 2 \u00d7 {A100} (1 free in quota, 2 borrowable from cohort gpu-pool) and "
        f"163840 MiB (81920 MiB free in quota, 163840 MiB borrowable from cohort gpu-pool)")
    assert decision.explanation.endswith("admitted, borrowing 1 and 81920 MiB from cohort gpu-pool")

    more = place(acme, server, 2)
    assert (more.borrowed_units, more.borrowed_memory_mib) == (1, GIB80)
    own.refresh_from_db()
    assert own.borrowed_units == 0
    usage = quota.usage_for([acme.quotas.get()])[0]
    assert (usage.units_used, usage.units_borrowed, usage.cohort_free_units) == (5, 1, 3)


def test_borrowing_past_the_limit_is_refused_with_the_numbers(pool):
    _, acme, _, server = pool
    place(acme, server, 4)
    place(acme, server, 1)  # borrows 1 of its limit of 2

    with pytest.raises(QuotaExceeded) as refused:
        place(acme, server, 2)

    assert refused.value.message == (
        f"GPUs quota of acme on {A100} exceeded: asks 2, 0 free in quota, 1 borrowable from "
        "cohort gpu-pool (borrowing limit 2, 1 borrowed already; the cohort has 3 free) "
        "(short by 1)")
    assert Placement.objects.filter(tenant=acme, state__in=Placement.HOLDING).count() == 2


def test_a_tenant_outside_any_cohort_borrows_nothing():
    loner = TenantFactory(slug="loner")
    QuotaFactory(tenant=loner, device_class=A100, units=1, memory_mib=GIB80,
                 borrowing_limit_units=4, borrowing_limit_memory_mib=4 * GIB80)
    decision = quota.assess(loner, A100, 2, 2 * GIB80)
    assert not decision.admitted
    assert decision.refusal() == (f"GPUs quota of loner on {A100} exceeded: asks 2, 1 left of 1 "
                                  "(short by 1)")


def test_a_lender_short_of_its_own_quota_is_told_what_to_reclaim_lowest_priority_first(pool):
    _, acme, globex, server = pool
    bulk = place(acme, server, 4, priority=10)
    important = place(acme, server, 1, priority=50)
    cheap = place(acme, server, 1, priority=0)
    place(globex, server, 2)  # the cohort's 8 are all held now
    # The highest priority is held in acme's own quota; the 2 borrowed are on the lowest.
    important.refresh_from_db()
    bulk.refresh_from_db()
    assert (important.borrowed_units, bulk.borrowed_units, cheap.borrowed_units) == (0, 1, 1)

    with pytest.raises(QuotaExceeded) as refused:
        place(globex, server, 1)

    assert refused.value.reclaim_policy == "list"
    assert [r.placement_id for r in refused.value.reclaimable] == [cheap.pk]
    message = refused.value.message
    assert "0 free in quota" in message and "2 of its own quota is lent" in message
    assert ("reclaimable, lowest priority first: 1 placement of other tenants borrowing 1 and "
            "81920 MiB") in message
    # The lender is told how much, never whose: no borrower, placement id or model name.
    assert "acme" not in message
    assert f"placement {cheap.pk}" not in message
    assert cheap.model_version.model.name not in message
    # Asking for both lent units lists both, the cheaper one first.
    both = quota.assess(globex, A100, 2, 2 * GIB80)
    assert [r.placement_id for r in both.reclaimable] == [cheap.pk, bulk.pk]


def test_borrowed_marks_follow_what_is_held(pool):
    _, acme, _, server = pool
    first = place(acme, server, 3, priority=5)
    second = place(acme, server, 2, priority=0)
    assert second.borrowed_units == 1

    quota.release(first)
    second.refresh_from_db()
    assert (second.borrowed_units, second.borrowed_memory_mib) == (0, 0)

    # A quota cut makes part of what is held borrowed, on the lowest priority first.
    third = place(acme, server, 2, priority=9)
    row = acme.quotas.get()
    row.units, row.memory_mib = 3, 3 * GIB80
    row.save()
    quota.mark_borrowed(acme, A100)
    second.refresh_from_db()
    third.refresh_from_db()
    assert (third.borrowed_units, second.borrowed_units) == (0, 1)


# --------------------------------------------------------------------------------------------
# Reclaim by unloading, through model loads
# --------------------------------------------------------------------------------------------


@pytest.fixture
def cpu_pool(settings):
    cohort = Cohort.objects.create(name="cpu-pool", reclaim=Cohort.Reclaim.UNLOAD)
    lender = TenantFactory(slug="lender", cohort=cohort)
    borrower = TenantFactory(slug="borrower", cohort=cohort)
    QuotaFactory(tenant=lender, device_class="cpu", units=3, memory_mib=3072)
    QuotaFactory(tenant=borrower, device_class="cpu", units=1, memory_mib=1024,
                 borrowing_limit_units=2, borrowing_limit_memory_mib=2048)
    server = InferenceServerFactory()
    return cohort, lender, borrower, server


def ready_load(tenant, server, units, memory, priority=0):
    deployment = DeploymentFactory(model__tenant=tenant, tenant=tenant, cluster=server.cluster,
                                   priority=priority)
    deployment.servers.add(server)
    version = ModelVersionFactory(model=deployment.model)
    placement = quota.admit(tenant, server, version.pk, units, memory,
                            priority=deployment.priority)
    return ModelLoad.objects.create(tenant=tenant, deployment=deployment, server=server,
                                    version=version, placement=placement, state="ready",
                                    requested_by_label="ci")


def test_by_policy_the_lowest_priority_borrower_is_unloaded_and_the_lender_waits_for_it(
        cpu_pool, monkeypatch):
    monkeypatch.setattr(reconciler, "demand_of", lambda version, device_class, config: (1, 1024))
    _, lender, borrower, server = cpu_pool
    ready_load(borrower, server, 1, 1024, priority=5)  # in its own quota
    keep = ready_load(borrower, server, 1, 1024, priority=5)  # borrowed
    cheap = ready_load(borrower, server, 1, 1024, priority=-3)  # borrowed, lowest priority
    ready_load(lender, server, 1, 1024)
    assert cheap.placement.__class__.objects.get(pk=cheap.placement_id).borrowed_units == 1

    deployment = DeploymentFactory(model__tenant=lender, tenant=lender, cluster=server.cluster)
    deployment.servers.add(server)
    wanted = ModelLoad.objects.create(
        tenant=lender, deployment=deployment, server=server,
        version=ModelVersionFactory(model=deployment.model), requested_by_label="ci")

    reconciler.advance(wanted.pk)

    wanted.refresh_from_db()
    cheap.refresh_from_db()
    keep.refresh_from_db()
    assert wanted.state == "pending" and wanted.next_attempt_at is not None
    assert cheap.state == "unloading" and keep.state == "ready"
    # The borrower's history names no lender either.
    assert cheap.unload_requested_by_label == "reclaimed for a lender of cohort cpu-pool"
    waiting = wanted.events.order_by("-pk").first().message
    assert "unloading a placement borrowing 1 and 1024 MiB" in waiting
    # The lender's history names neither the borrower nor its placement.
    for text in [*wanted.events.values_list("message", flat=True), wanted.error]:
        assert "borrower" not in text and f"placement {cheap.placement_id}" not in text

    # The unload finishes: its quota goes back to the cohort, and the lender is admitted.
    quota.release(cheap.placement)
    ModelLoad.objects.filter(pk=cheap.pk).update(state="unloaded")
    ModelLoad.objects.filter(pk=wanted.pk).update(next_attempt_at=None)
    reconciler.advance(wanted.pk)
    wanted.refresh_from_db()
    assert wanted.state == "admitted"
    assert wanted.placement.borrowed_units == 0


def test_a_borrower_that_keeps_its_placement_is_not_named_to_the_lender(cpu_pool, monkeypatch):
    """The borrower's version still serves route traffic: it is kept, and the lender's
    history says so without the refusal's text, which names the borrower's deployment."""
    monkeypatch.setattr(reconciler, "demand_of", lambda version, device_class, config: (1, 1024))
    _, lender, borrower, server = cpu_pool
    ready_load(borrower, server, 1, 1024)  # in its own quota
    ready_load(borrower, server, 1, 1024, priority=5)  # borrowed
    busy = ready_load(borrower, server, 1, 1024, priority=-3)  # borrowed, reclaimed first
    ready_load(lender, server, 1, 1024)

    def carrying(deployment, version, servers):
        raise Conflict(f"{deployment.name} still sends traffic to v{version.version}", field="version")

    monkeypatch.setattr(loads.routes, "check_unload", carrying)
    deployment = DeploymentFactory(model__tenant=lender, tenant=lender, cluster=server.cluster)
    deployment.servers.add(server)
    wanted = ModelLoad.objects.create(
        tenant=lender, deployment=deployment, server=server,
        version=ModelVersionFactory(model=deployment.model), requested_by_label="ci")

    reconciler.advance(wanted.pk)

    busy.refresh_from_db()
    assert busy.state == "ready"
    waiting = wanted.events.order_by("-pk").first().message
    assert "a placement borrowing 1 and 1024 MiB (kept for now" in waiting
    for text in [*wanted.events.values_list("message", flat=True), wanted.error]:
        assert busy.deployment.name not in text and "borrower" not in text


def test_a_lender_that_waited_too_long_fails_with_the_refusal(cpu_pool, monkeypatch, settings):
    monkeypatch.setattr(reconciler, "demand_of", lambda version, device_class, config: (1, 1024))
    _, lender, borrower, server = cpu_pool
    for _ in range(3):
        ready_load(borrower, server, 1, 1024)
    ready_load(lender, server, 1, 1024)
    deployment = DeploymentFactory(model__tenant=lender, tenant=lender, cluster=server.cluster)
    wanted = ModelLoad.objects.create(
        tenant=lender, deployment=deployment, server=server,
        version=ModelVersionFactory(model=deployment.model), requested_by_label="ci")
    ModelLoad.objects.filter(pk=wanted.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.SWITCHYARD_RECLAIM_WAIT_S + 1))

    reconciler.advance(wanted.pk)

    wanted.refresh_from_db()
    assert wanted.state == "failed"
    assert "lent to other tenants of cohort cpu-pool" in wanted.error
    assert "was not given back within 120 s" in wanted.error


# --------------------------------------------------------------------------------------------
# API and console
# --------------------------------------------------------------------------------------------


def test_the_api_explains_admission_and_shows_borrowing(pool, client_for):
    from tests.conftest import _admin_of

    _, acme, globex, server = pool
    place(acme, server, 5)
    api = client_for(_admin_of(acme))
    row = acme.quotas.get()

    listed = api.get("/api/v1/quotas/").json()["results"]
    mine = next(q for q in listed if q["id"] == row.pk)
    assert (mine["cohort"], mine["units_borrowed"], mine["borrowing_limit_units"]) == (
        "gpu-pool", 1, 2)
    assert {q["tenant"] for q in listed} == {"acme"}  # globex's quota is not acme's to see

    answer = api.get(f"/api/v1/quotas/{row.pk}/admission/", {"units": 1, "memory_mib": GIB80})
    assert answer.status_code == 200
    body = answer.json()
    assert body["admitted"] is True and body["units"]["borrow"] == 1
    assert body["explanation"].startswith(f"needs 1 \u00d7 {A100} (0 free in quota, 1 "
                                          "borrowable from cohort gpu-pool)")
    too_much = api.get(f"/api/v1/quotas/{row.pk}/admission/", {"units": 9}).json()
    assert too_much["admitted"] is False and "short by 8" in too_much["refusal"]

    bad = api.get(f"/api/v1/quotas/{row.pk}/admission/", {"units": -1})
    assert bad.status_code == 400 and "units" in bad.json()
    other = api.get(f"/api/v1/quotas/{globex.quotas.get().pk}/admission/", {"units": 1})
    assert other.status_code == 404


def test_a_lenders_admission_dry_run_says_how_much_is_reclaimable_not_from_whom(
        pool, client_for, root):
    """GIVEN globex's quota lent to acme (acme borrows 2 of globex's 4 A100s)
    WHEN a globex viewer asks admission for its own 4 units
    THEN it learns how many placements and how much would come back, not acme's name nor
    the placement ids; a platform admin still sees them one by one."""
    from fleet.models import Membership
    from tests.conftest import _member

    _, acme, globex, server = pool
    place(acme, server, 4, priority=10)
    cheap = place(acme, server, 1, priority=0)
    bulk = place(acme, server, 1, priority=5)
    row = globex.quotas.get()
    viewer = client_for(_member("globex-viewer", globex, Membership.Role.VIEWER))

    answer = viewer.get(f"/api/v1/quotas/{row.pk}/admission/", {"units": 4})

    assert answer.status_code == 200
    body = answer.json()
    assert body["admitted"] is False
    assert body["reclaim"] == {"placements": 2, "units": 2, "memory_mib": 2 * GIB80}
    assert "reclaimable" not in body
    text = answer.content.decode()
    assert "acme" not in text
    for placement in (cheap, bulk):
        assert f'"placement_id": {placement.pk}' not in text
        assert f"placement {placement.pk}" not in text
    assert "2 placements of other tenants borrowing 2 and 163840 MiB" in body["refusal"]

    # A platform admin keeps the detail.
    detail = client_for(root).get(f"/api/v1/quotas/{row.pk}/admission/", {"units": 4}).json()
    assert [(r["placement_id"], r["tenant"]) for r in detail["reclaimable"]] == [
        (cheap.pk, "acme"), (bulk.pk, "acme")]
    assert detail["reclaim"]["placements"] == 2


def test_the_quota_page_marks_borrowed_capacity(pool, client):
    from tests.conftest import _admin_of

    _, acme, _, server = pool
    borrowed = place(acme, server, 5)
    client.force_login(_admin_of(acme))

    html = client.get("/fleet/quotas/").content.decode()

    assert 'data-cohort="gpu-pool"' in html
    assert "borrows 1 GPU, 80 GiB now" in html
    assert "may borrow up to 2 GPUs, 160 GiB" in html
    assert f'data-borrowed-placement="{borrowed.pk}"' in html


def test_a_deployments_new_priority_moves_its_placements_and_their_borrowed_marks(cpu_pool):
    from rollouts.deployments import lifecycle as deployments
    from tests.conftest import _admin_of

    _, _, borrower, server = cpu_pool
    first = ready_load(borrower, server, 1, 1024, priority=0)
    second = ready_load(borrower, server, 1, 1024, priority=0)  # newest: the borrowed one
    assert (Placement.objects.get(pk=first.placement_id).borrowed_units,
            Placement.objects.get(pk=second.placement_id).borrowed_units) == (0, 1)

    # Raised above the other, the newest deployment's placement is held in the quota instead.
    deployment = second.deployment
    deployment.priority = 100
    deployments.save_deployment(_admin_of(borrower), deployment)

    moved = Placement.objects.get(pk=second.placement_id)
    assert (moved.priority, moved.borrowed_units) == (100, 0)
    assert Placement.objects.get(pk=first.placement_id).borrowed_units == 1
