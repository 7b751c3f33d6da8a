"""``manage.py seed_fleet`` writes a fleet-sized database (here a small one) in batches, with
history spread over a year, and refuses to seed the same database twice."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from fleet.models import GPU, AuditEvent, InferenceServer, Membership, Tenant
from rollouts.models import Deployment, ModelLoad

SIZES = {"tenants": 3, "gpus": 20, "servers": 6, "deployments": 9, "loads": 40,
         "audit_events": 120}


def test_it_seeds_the_sizes_asked_with_a_year_of_history(db):
    call_command("seed_fleet", verbosity=0, **SIZES)

    assert Tenant.objects.count() == 3 and Membership.objects.count() == 3
    assert GPU.objects.count() == 20 and InferenceServer.objects.count() == 6
    assert Deployment.objects.count() == 9 and ModelLoad.objects.count() == 40
    assert AuditEvent.objects.count() == 120
    assert all(d.servers.count() == 2 for d in Deployment.objects.all())
    # Every load is its deployment's tenant's, of a version of its model, on one of its servers.
    for load in ModelLoad.objects.select_related("deployment", "version"):
        assert load.tenant_id == load.deployment.tenant_id
        assert load.version.model_id == load.deployment.model_id
        assert load.deployment.servers.filter(pk=load.server_id).exists()
    oldest = AuditEvent.objects.order_by("created_at").first().created_at
    assert timezone.now() - oldest > timedelta(days=360)
    assert AuditEvent.objects.filter(tenant__isnull=True).exists()  # platform-level events
    assert AuditEvent.objects.values("verb").distinct().count() > 1


def test_a_second_run_is_refused_and_changes_nothing(db):
    call_command("seed_fleet", verbosity=0, **SIZES)

    with pytest.raises(CommandError, match="seeded already"):
        call_command("seed_fleet", verbosity=0, **SIZES)

    assert AuditEvent.objects.count() == 120 and Tenant.objects.count() == 3
