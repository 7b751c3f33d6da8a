"""An SLO breach on real parts, end to end: the session's real Triton behind a real nginx
route, the real sample collector, a real HTTP webhook receiver.

The deployment's version 2 fails every request inside the model (the demo model's
``error_rate_v2``): Triton answers 500 yet counts each as a success in its own metrics, so
only the router sees the failures. The SLO tick counts what the router saw, finds the
deployment breaching, opens a fast-burn alert, the dashboard shows it to its tenant and to
root and to nobody else, the receiver gets it in Slack's shape, and it resolves once good
traffic drowns the failures."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from decimal import Decimal

import httpx
import pytest
from django.db.models import Sum
from django.test import TestCase
from django.utils import timezone

from fleet.adapters.routers.base import RouteSpec, Variant
from fleet.models import InferenceServer, Membership, WebhookDelivery
from fleet.webhooks import delivery as webhook_delivery
from fleet.webhooks.requests import create_webhook
from rollouts.models import LatencyRollup, RoutedMinute, SloAlert, SloStatus
from rollouts.slo import alerts, counters
from rollouts.traffic import latency, samples
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    MembershipFactory,
    ModelFactory,
    TenantFactory,
    UserFactory,
)
from tests.fixtures.triton import serve_demo_models_as
from tests.fleet.webhooks.test_webhooks import receiver  # noqa: F401  (a fixture)
from tests.rollouts.traffic.test_samples import (  # noqa: F401  (fixtures: one nginx, Redis, collector)
    BAD_INFER,
    INFER,
    INFER_PATH,
    collector,
    nginx,
    redis_server,
    router,
    samples_redis,
    wait_for_samples,
)

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
SERVED = "slo.fraud-scorer"


@pytest.fixture
def deployment(local_triton):
    """Tenant "slo"'s fraud scorer on the session's Triton, its version 2 loaded to fail every
    request (the demo model's ``error_rate_v2`` parameter, set through Triton's load API)."""
    cluster = ClusterFactory(name="slo")
    server = InferenceServerFactory(cluster=cluster, name="triton", http_url=local_triton.http_url,
                                    metrics_url=local_triton.metrics_url, runtime=InferenceServer.Runtime.TRITON)
    serve_demo_models_as(local_triton, "slo")
    with httpx.Client(base_url=local_triton.http_url, timeout=120) as client:
        config = client.get(f"/v2/models/{SERVED}/config").json()
        config["parameters"]["error_rate_v2"] = {"string_value": "1"}
        client.post(f"/v2/repository/models/{SERVED}/load",
                    json={"parameters": {"config": json.dumps(config)}}).raise_for_status()
    model = ModelFactory(name="fraud-scorer", tenant=TenantFactory(slug="slo"))
    dep = DeploymentFactory(tenant=model.tenant, model=model, cluster=cluster, name="scorer",
                            slo_error_rate=Decimal("1.00"), slo_p99_ms=5000)
    dep.servers.set([server])
    yield dep
    httpx.post(f"{local_triton.http_url}/v2/repository/models/{SERVED}/unload", timeout=60)


def route_to(nginx_router, deployment, triton, w1: int, w2: int) -> str:
    """The deployment's route (named as deployment routes are): v1 and v2 of its model."""
    spec = RouteSpec(name=f"dep-{deployment.pk}", protocol="kserve-v2", variants=(
        Variant("v1", triton.http_url, w1, model=SERVED, version=1),
        Variant("v2", triton.http_url, w2, model=SERVED, version=2)))
    return nginx_router.apply(spec).url


def send(url: str, count: int, body: dict = INFER) -> Counter:
    with httpx.Client(base_url=url, timeout=10) as client:
        return Counter(client.post(INFER_PATH, json=body).status_code for _ in range(count))


def ticks(now: datetime | None = None) -> None:
    """A scrape (Triton's counters since the last one) and an SLO evaluation (as at ``now``),
    with what the evaluation queued for the webhooks handed over as a commit does."""
    latency.tick()
    with TestCase.captureOnCommitCallbacks(execute=True):
        alerts.tick(now)


def deliver(event: str) -> None:
    for pk in WebhookDelivery.objects.filter(event=event).values_list("pk", flat=True):
        assert webhook_delivery.deliver(pk) == "delivered"


def test_a_breach_the_router_saw_shows_alerts_a_webhook_and_resolves(
        deployment, router, local_triton, receiver, settings, client):  # noqa: F811
    settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    admin = UserFactory(username="ops-admin")
    MembershipFactory(user=admin, tenant=deployment.tenant, role=Membership.Role.ADMIN)
    create_webhook(admin, deployment.tenant, name="ops-slack", url=receiver.url, format="slack",
                   events=["slo.alert_opened", "slo.alert_resolved"])
    latency.tick()  # the baseline the next scrape counts from

    url = route_to(router, deployment, local_triton, 50, 50)
    codes = send(url, 40) + send(url, 10, BAD_INFER)
    assert set(codes) == {200, 500, 400} and codes[500] > 5, codes
    wait_for_samples(deployment.pk, 50)
    with TestCase.captureOnCommitCallbacks(execute=True):
        alerts.tick()  # the router's count first: from now on /metrics counts what it saw
    ticks()

    # Triton admits no failure; the router saw every one, and the 400s are the client's.
    scraped = LatencyRollup.objects.filter(deployment=deployment).aggregate(f=Sum("failures"))["f"]
    assert scraped == 0
    routed = RoutedMinute.objects.filter(deployment=deployment).aggregate(r=Sum("requests"), f=Sum("failures"))
    assert routed == {"r": 50, "f": codes[500]}
    # /metrics' counters (what the Prometheus rules read) count the same, once.
    exported = counters.read(samples.connect(), [deployment.pk])[deployment.pk]
    assert (exported["requests"], exported["failures"]) == (50, codes[500])
    status = SloStatus.objects.get(deployment=deployment)
    assert status.state == SloStatus.State.BREACHING, status.reason
    assert "of requests failed over the last 5 minutes (ceiling 1.00%)" in status.reason
    (alert,) = SloAlert.objects.filter(deployment=deployment)
    assert (alert.rule, alert.sli, alert.state) == ("fast_burn", "errors", "firing")

    # Seen where people look: the tenant's member and root, never another tenant.
    client.force_login(admin)
    assert 'data-slo-state="breaching"' in client.get("/").content.decode()
    client.force_login(UserFactory(username="root-ish", is_superuser=True, is_staff=True))
    assert f">{deployment.name}</a>" in client.get("/").content.decode()
    client.force_login(MembershipFactory().user)
    assert f">{deployment.name}</a>" not in client.get("/").content.decode()

    deliver("slo.alert_opened")
    (opened,) = receiver.bodies
    assert opened["text"].startswith(f"SLO alert opened: {deployment.name}: fast burn of its error budget")
    assert {"type": "section", "text": {"type": "mrkdwn", "text": opened["text"]}} in opened["blocks"]

    # All traffic back on v1; good requests drown the failures under 14.4x a 1% budget,
    # and once the alert has been open for its short window (5 minutes on) it resolves.
    url = route_to(router, deployment, local_triton, 100, 0)
    assert send(url, 20 * codes[500]) == {200: 20 * codes[500]}
    wait_for_samples(deployment.pk, 50 + 20 * codes[500])
    ticks()
    alert.refresh_from_db()
    assert alert.state == "firing"
    ticks(timezone.now() + timedelta(minutes=5))
    alert.refresh_from_db()
    assert alert.state == "resolved", alert.events
    deliver("slo.alert_resolved")
    assert receiver.bodies[-1]["text"].startswith("SLO alert resolved:")
