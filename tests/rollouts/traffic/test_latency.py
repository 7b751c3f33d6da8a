"""Live latency from the real Triton: the scraper's window, rollups, history and the API.

GIVEN deployments whose server is the session's real Triton (demo models fraud-scorer v1/v2,
there under the name the tenant "demo"'s model has on a shared Triton: demo.fraud-scorer),
WHEN real inference requests are sent between two scraper ticks, THEN the series of each
version shows exactly those requests, and the numbers survive Redis losing them.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from fleet.models import InferenceServer, Membership
from rollouts.models import LatencyRollup
from rollouts.traffic import latency
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
from tests.rollups import requests_rolled_up

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
TENANT = "demo"
SERVED = f"{TENANT}.fraud-scorer"
INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}]}


def infer(triton, version: int, count: int) -> None:
    with httpx.Client(base_url=triton.http_url, timeout=10) as client:
        for _ in range(count):
            response = client.post(f"/v2/models/{SERVED}/versions/{version}/infer", json=INFER)
            assert response.status_code == 200, response.text


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def deployment(local_triton):
    cluster = ClusterFactory(name="latency")
    server = InferenceServerFactory(
        cluster=cluster, name="triton", http_url=local_triton.http_url,
        metrics_url=local_triton.metrics_url, runtime=InferenceServer.Runtime.TRITON,
    )
    serve_demo_models_as(local_triton, TENANT)
    model = ModelFactory(name="fraud-scorer", tenant=TenantFactory(slug=TENANT))
    dep = DeploymentFactory(tenant=model.tenant, model=model, cluster=cluster, name="fraud", slo_p99_ms=50)
    dep.servers.set([server])
    return dep


def test_the_series_counts_exactly_the_requests_sent_per_version(deployment, local_triton):
    latency.tick()  # the first scrape only remembers the counters
    infer(local_triton, 1, 12)
    infer(local_triton, 2, 5)
    time.sleep(0.2)
    result = latency.tick()

    assert result["points"] == 2
    data = latency.series(deployment)
    v1, v2 = data["versions"]["v1"]["points"][-1], data["versions"]["v2"]["points"][-1]
    assert v1["rps"] > 0 and v2["rps"] > 0
    rollups = {r.label: r for r in LatencyRollup.objects.filter(deployment=deployment)}
    assert (rollups["v1"].requests, rollups["v2"].requests) == (12, 5)
    assert rollups["v1"].failures == 0 and v1["error_rate"] == 0
    # v2 sleeps 12 ms a request against v1's 4 ms: the server's own timings show it.
    assert v2["avg_ms"] > v1["avg_ms"] + 4
    assert v1["p99_ms"] is not None and v1["p50_ms"] <= v1["p99_ms"]
    assert data["slo_p99_ms"] == 50 and data["age_s"] < 5


def test_a_dead_server_does_not_hold_up_the_others(deployment, local_triton, settings):
    settings.SWITCHYARD_SCRAPE_TIMEOUT_S = 0.5
    cluster = deployment.cluster
    for n in range(3):
        dead = InferenceServerFactory(cluster=cluster, name=f"dead-{n}",
                                      http_url=f"http://127.0.0.1:{closed_port()}")
        other = DeploymentFactory(tenant=deployment.tenant, model=deployment.model, cluster=cluster,
                                  name=f"other-{n}")
        other.servers.set([dead])
    latency.tick()
    infer(local_triton, 1, 3)
    started = time.monotonic()
    result = latency.tick()
    took = time.monotonic() - started

    assert result["failed"] == 3
    assert took < 3 * settings.SWITCHYARD_SCRAPE_TIMEOUT_S + 1
    assert requests_rolled_up(deployment, "v1") == 3


def test_history_survives_losing_the_live_window(deployment, local_triton, settings):
    latency.tick()
    infer(local_triton, 1, 4)
    latency.tick()
    store = latency._redis()
    for key in store.scan_iter(f"{settings.SWITCHYARD_REDIS_PREFIX}:*"):
        store.delete(key)

    data = latency.series(deployment)

    assert data["versions"]["v1"]["points"][-1]["rps"] > 0  # from the minute rollup


def test_old_rollups_are_pruned(deployment):
    old = LatencyRollup.objects.create(deployment=deployment, label="v1",
                                       minute=timezone.now() - timedelta(days=31))
    recent = LatencyRollup.objects.create(deployment=deployment, label="v1",
                                          minute=timezone.now() - timedelta(days=29))

    assert latency.prune() == 1
    assert list(LatencyRollup.objects.values_list("pk", flat=True)) == [recent.pk]
    assert old.pk != recent.pk


def test_the_api_returns_the_series_to_members_only(deployment, local_triton, client_for):
    user = UserFactory(username="viewer-lat")
    MembershipFactory(user=user, tenant=deployment.tenant, role=Membership.Role.VIEWER)
    stranger = UserFactory(username="stranger-lat")
    MembershipFactory(user=stranger, role=Membership.Role.ADMIN)
    latency.tick()
    infer(local_triton, 1, 2)
    latency.tick()

    ok = client_for(user).get(f"/api/v1/deployments/{deployment.pk}/latency/?window=300")
    bad = client_for(user).get(f"/api/v1/deployments/{deployment.pk}/latency/?window=soon")
    hidden = client_for(stranger).get(f"/api/v1/deployments/{deployment.pk}/latency/")

    assert ok.status_code == 200 and "v1" in ok.json()["versions"]
    assert ok.json()["window_s"] == 300
    assert bad.status_code == 400 and "window" in bad.json()
    assert hidden.status_code == 404


@pytest.mark.vllm
def test_a_vllm_deployment_shows_time_to_first_token_and_inter_token_latency(local_vllm):
    cluster = ClusterFactory(name="latency-vllm")
    server = InferenceServerFactory(
        cluster=cluster, name="vllm", runtime=InferenceServer.Runtime.VLLM,
        http_url=local_vllm.http_url, metrics_url=f"{local_vllm.http_url}/metrics",
    )
    model = ModelFactory(name=local_vllm.served_model_name)
    dep = DeploymentFactory(tenant=model.tenant, model=model, cluster=cluster, name="chat")
    dep.servers.set([server])
    latency.tick()
    with httpx.Client(base_url=local_vllm.http_url, timeout=60) as client:
        for _ in range(3):
            answer = client.post("/v1/completions", json={
                "model": local_vllm.served_model_name, "prompt": "The sea is", "max_tokens": 8,
                "temperature": 0})
            assert answer.status_code == 200
    time.sleep(0.2)
    latency.tick()

    point = latency.series(dep)["versions"][local_vllm.served_model_name]["points"][-1]
    assert requests_rolled_up(dep) == 3
    assert 0 < point["ttft_p50_ms"] < 60_000
    assert 0 < point["itl_p50_ms"] < 60_000
    assert point["p50_ms"] >= point["ttft_p50_ms"]


def test_a_versions_live_cost_is_what_its_placement_held_over_what_it_served(deployment,
                                                                            local_triton):
    """Real requests to v1 on the real Triton, rolled up by the scraper: the live cost per
    1,000 requests is the unit-seconds its placement held over the requests served, as
    computed by hand from the recorded rows, within 1%."""
    from fleet.models import Placement
    from rollouts.registry import costs
    from tests.factories import ModelVersionFactory

    v1 = ModelVersionFactory(model=deployment.model, version=1)
    server = deployment.servers.get()
    placement = Placement.objects.create(
        tenant=deployment.tenant, server=server, model_version=v1, device_class="cpu", units=2,
        memory_mib=64, state=Placement.State.ACTIVE)
    Placement.objects.filter(pk=placement.pk).update(
        created_at=timezone.now() - timedelta(minutes=10))
    latency.tick()
    infer(local_triton, 1, 150)
    time.sleep(0.2)
    latency.tick()
    end = timezone.now()

    reading = costs.live_reading(v1, end=end)

    served = sum(LatencyRollup.objects.filter(deployment=deployment, label="v1")
                 .values_list("requests", flat=True))
    held_s = 2 * (end - Placement.objects.get(pk=placement.pk).created_at).total_seconds()
    assert served == 150 == reading.numbers["requests"]
    assert reading.unit_seconds_per_1000 == pytest.approx(held_s * 1000 / served, rel=0.01)
