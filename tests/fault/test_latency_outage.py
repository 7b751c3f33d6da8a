"""Live latency through a Redis outage and a hung metrics endpoint, on the real Triton.

GIVEN a deployment on the session's real Triton, scraped into a real redis-server,
WHEN the redis-server is killed, THEN the latency endpoint answers from the minute rollups,
says so (``source``, ``live_error``), and dates the data by its last real scrape, so its age
grows while scraping is stopped; once Redis is back the live window returns.
WHEN another server of the fleet accepts connections and never answers, THEN the real
Triton's point is written as soon as its own scrape is in, and the tick ends at its deadline.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

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
from tests.fault.conftest import RedisServer
from tests.fixtures.triton import serve_demo_models_as

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
# The demo model as the tenant "demo"'s model is named on a shared Triton.
TENANT = "demo"
SERVED = f"{TENANT}.fraud-scorer"
INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}]}


def infer(triton, count: int) -> None:
    with httpx.Client(base_url=triton.http_url, timeout=10) as client:
        for _ in range(count):
            response = client.post(f"/v2/models/{SERVED}/versions/1/infer", json=INFER)
            assert response.status_code == 200, response.text


@pytest.fixture
def deployment(local_triton):
    cluster = ClusterFactory(name="latency-outage")
    server = InferenceServerFactory(
        cluster=cluster, name="triton", http_url=local_triton.http_url,
        metrics_url=local_triton.metrics_url, runtime=InferenceServer.Runtime.TRITON,
    )
    serve_demo_models_as(local_triton, TENANT)
    model = ModelFactory(name="fraud-scorer", tenant=TenantFactory(slug=TENANT))
    dep = DeploymentFactory(tenant=model.tenant, model=model, cluster=cluster, name="fraud")
    dep.servers.set([server])
    return dep


def newest_rollup(deployment) -> LatencyRollup:
    return LatencyRollup.objects.filter(deployment=deployment, label="v1").latest("minute")


@pytest.fixture
def hung_url() -> Iterator[str]:
    """An HTTP URL whose server accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_with_redis_down_the_endpoint_says_its_data_is_stale_and_from_the_rollups(
    deployment, local_triton, redis_server: RedisServer, settings, client_for
):
    settings.REDIS_URL = redis_server.url
    viewer = UserFactory(username="viewer-outage")
    MembershipFactory(user=viewer, tenant=deployment.tenant, role=Membership.Role.VIEWER)
    url = f"/api/v1/deployments/{deployment.pk}/latency/?window=300"
    latency.tick()
    infer(local_triton, 3)
    latency.tick()
    last_scrape_done = time.time()
    live = latency.series(deployment, 300)
    assert (live["source"], live["live_error"]) == ("live", None)
    assert live["versions"]["v1"]["points"][-1]["rps"] > 0

    redis_server.kill()
    with pytest.raises(redis.RedisError):
        latency.tick()  # the scraper cannot work without Redis: it stops
    time.sleep(1.0)  # traffic goes on unseen; the data gets older
    infer(local_triton, 2)
    gap = time.time() - last_scrape_done
    response = client_for(viewer).get(url)

    assert response.status_code == 200, response.content
    stale = response.json()
    assert stale["source"] == "rollups"
    assert "cannot be read" in stale["live_error"]
    assert stale["versions"]["v1"]["points"][-1]["rps"] > 0
    # Dated by the last real scrape: at least as old as the time since that tick ended.
    assert stale["age_s"] >= round(gap, 2), (stale["age_s"], gap)
    row = newest_rollup(deployment)
    assert row.last_sample_at is not None and row.last_sample_at.timestamp() <= last_scrape_done

    redis_server.start()  # empty: the first tick only records the counters again
    latency.tick()
    infer(local_triton, 1)
    latency.tick()
    back = client_for(viewer).get(url).json()
    assert (back["source"], back["live_error"]) == ("live", None)
    assert back["age_s"] < stale["age_s"]


def test_a_hung_server_delays_neither_the_others_points_nor_the_tick_past_its_deadline(
    deployment, local_triton, hung_url, settings
):
    # A long scrape timeout makes the difference plain: the live Triton answers in
    # milliseconds, the hung server holds its scrape for the whole timeout.
    timeout = 3.0
    hung = InferenceServerFactory(cluster=deployment.cluster, name="hung", http_url=hung_url)
    other = DeploymentFactory(tenant=deployment.tenant, model=deployment.model,
                              cluster=deployment.cluster, name="fraud-hung")
    other.servers.set([hung])
    latency.tick(timeout)
    infer(local_triton, 2)

    # What a tick of the live Triton alone takes here, measured, stands for "costs nothing".
    other.servers.set([])
    started = time.monotonic()
    latency.tick(timeout)
    alone_s = time.monotonic() - started
    other.servers.set([hung])
    infer(local_triton, 2)
    before = newest_rollup(deployment).last_sample_at

    first_point_s: list[float] = []
    started = time.monotonic()
    done = threading.Event()

    def watch() -> None:
        from django.db import connection

        try:
            while not done.is_set():
                if newest_rollup(deployment).last_sample_at != before:
                    first_point_s.append(time.monotonic() - started)
                    return
                time.sleep(0.01)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = latency.tick(timeout)
        took = time.monotonic() - started
    finally:
        done.set()
        watcher.join()

    assert result["failed"] == 1 and result["points"] >= 1
    # Slack for a busy machine: one more tick of the live server alone, and 0.5 s.
    slack = alone_s + 0.5
    assert first_point_s and first_point_s[0] < alone_s + slack, (first_point_s, alone_s)
    assert took < timeout + latency.TICK_GRACE_S + slack, (took, alone_s)
