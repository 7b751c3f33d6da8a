"""The SLO status where people look: the dashboard, the deployments list, the deployment page
and the API, each for whoever may see the deployment."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from rollouts.models import SloStatus
from rollouts.slo import alerts
from tests.factories import DeploymentFactory, ModelFactory
from tests.rollouts.slo.test_slo import minutes

pytestmark = pytest.mark.django_db


@pytest.fixture
def burning(tenant_a, tenant_b):
    """Tenant A's scorer half failing for 25 minutes after a good half hour (breaching, a
    fast-burn alert open); tenant B's healthy one."""
    now = timezone.now()
    scorer = DeploymentFactory(model=ModelFactory(tenant=tenant_a), tenant=tenant_a, name="scorer",
                               slo_error_rate=Decimal("1.00"))
    healthy = DeploymentFactory(model=ModelFactory(tenant=tenant_b), tenant=tenant_b, name="healthy")
    minutes(scorer, 60, 26, rpm=600, now=now)
    minutes(scorer, 25, 0, rpm=600, failed=0.5, now=now)
    minutes(healthy, 60, 0, rpm=600, now=now)
    alerts.tick(now)
    return scorer, healthy


def test_the_dashboard_shows_a_breach_to_its_tenant_and_root_only(client, burning, bob, charlie, root):
    scorer, _ = burning
    client.force_login(bob)
    page = client.get("/").content.decode()
    assert 'id="slo-troubled"' in page and ">scorer</a>" in page and 'data-slo-state="breaching"' in page
    assert "fast burn" in page and f"{scorer.tenant.slug}/scorer" in page

    client.force_login(root)
    assert ">scorer</a>" in client.get("/").content.decode()

    client.force_login(charlie)
    other = client.get("/").content.decode()
    assert "scorer" not in other and 'id="slo-all-well"' in other


def test_the_deployment_page_names_why_and_the_list_filters_by_status(client, burning, bob):
    scorer, _ = burning
    client.force_login(bob)
    panel = client.get(f"/registry/deployments/{scorer.pk}/slo/", headers={"HX-Request": "true"}).content.decode()
    assert "of requests failed over the last 5 minutes (ceiling 1.00%)" in panel
    assert 'id="slo-budget-left"' in panel and "fast burn of the errors budget" in panel
    listed = client.get("/registry/deployments/?slo_status=ok").content.decode()
    assert ">scorer</a>" not in listed
    listed = client.get("/registry/deployments/?slo_status=breaching").content.decode()
    assert ">scorer</a>" in listed


def test_the_api_reports_and_filters_the_status(burning, bob):
    scorer, _ = burning
    api = APIClient()
    api.force_authenticate(bob)
    body = api.get(f"/api/v1/deployments/{scorer.pk}/").json()
    assert body["slo_status"] == "breaching" and body["slo"]["alerts_firing"] == 1
    assert body["slo"]["burn_rate_5m"] > 14.4 and body["slo"]["budget_left_pct"] < 0
    assert body["slo_window_days"] == 30
    names = [d["name"] for d in api.get("/api/v1/deployments/?slo_status=breaching").json()["results"]]
    assert names == ["scorer"]
    assert api.get("/api/v1/deployments/?slo_status=ok").json()["results"] == []
    alerts_seen = api.get("/api/v1/slo-alerts/?state=firing").json()["results"]
    assert [(a["deployment_name"], a["rule"], a["sli"]) for a in alerts_seen] == [("scorer", "fast_burn", "errors")]
    assert SloStatus.objects.get(deployment=scorer).state == "breaching"
