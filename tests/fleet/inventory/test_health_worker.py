"""The health task end to end: Redis → a real Celery worker → real probes → the test database.

GIVEN a real tritonserver (``local_triton``) and a server registered at a closed port,
WHEN ``fleet.tasks.check_servers`` is sent through Redis to a real worker process,
THEN the worker records both results in the database this test reads.
"""

from __future__ import annotations

import socket

import pytest

from fleet import tasks
from fleet.models import InferenceServer
from local.triton import TritonProcess
from tests.factories import ClusterFactory, InferenceServerFactory
from tests.fixtures.celery_worker import CeleryWorker

pytestmark = [pytest.mark.worker, pytest.mark.triton]

Health = InferenceServer.Health
EXPECTED_MODELS = {("fraud-scorer", "1", "READY"), ("fraud-scorer", "2", "READY"),
                   ("sentiment", "1", "READY")}
# What a second, identical check may change on a healthy server: only the clock fields.
CLOCK_FIELDS = {"last_checked_at", "last_seen_at", "probe_latency_ms"}


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def snapshot(server: InferenceServer) -> dict:
    server.refresh_from_db()
    return {f.attname: getattr(server, f.attname) for f in InferenceServer._meta.concrete_fields}


@pytest.fixture
def two_servers(
    transactional_db: None, local_triton: TritonProcess
) -> tuple[InferenceServer, InferenceServer]:
    cluster = ClusterFactory(name="worker-test")
    live = InferenceServerFactory(cluster=cluster, name="triton-live", http_url=local_triton.http_url)
    dead = InferenceServerFactory(cluster=cluster, name="triton-dead", http_url=closed_port_url())
    return live, dead


def run_check(worker: CeleryWorker, servers: tuple[InferenceServer, ...]) -> None:
    """Send one check_servers through Redis; wait until the worker recorded every server."""
    before = {s.pk: s.last_checked_at for s in servers}
    worker.send(tasks.check_servers)

    def all_checked() -> bool:
        rows = InferenceServer.objects.filter(pk__in=before).values_list("pk", "last_checked_at")
        return all(at is not None and at != before[pk] for pk, at in rows)

    worker.wait_for(all_checked, timeout=20, what="the worker checking both servers")


def test_worker_records_a_healthy_triton_and_an_unreachable_server(
    celery_worker: CeleryWorker,
    two_servers: tuple[InferenceServer, InferenceServer],
) -> None:
    live, dead = two_servers

    run_check(celery_worker, two_servers)

    live.refresh_from_db()
    assert live.health == Health.HEALTHY, live.health_detail
    assert live.health_detail == ""
    assert live.server_version == "2.51.0"
    # The session's own demo models; other tests' tenants' models there have qualified names.
    assert {(m["name"], m["version"], m["state"]) for m in live.reported_models
            if "." not in m["name"]} == EXPECTED_MODELS
    assert live.consecutive_failures == 0
    assert live.last_seen_at is not None
    assert live.health_changed_at is not None

    dead.refresh_from_db()
    assert dead.health == Health.UNREACHABLE
    assert dead.http_url in dead.health_detail
    assert "refused" in dead.health_detail
    assert dead.consecutive_failures == 1
    assert dead.last_seen_at is None
    assert dead.reported_models == []
    # The worker logged the task it ran: proof it came through Redis, not a local call.
    assert "fleet.tasks.check_servers" in celery_worker.log()


def test_a_second_run_only_counts_another_failure(
    celery_worker: CeleryWorker,
    two_servers: tuple[InferenceServer, InferenceServer],
) -> None:
    live, dead = two_servers
    run_check(celery_worker, two_servers)
    first_live, first_dead = snapshot(live), snapshot(dead)

    run_check(celery_worker, two_servers)

    second_live, second_dead = snapshot(live), snapshot(dead)
    changed = {k for k in first_live if first_live[k] != second_live[k]}
    assert changed <= CLOCK_FIELDS, f"a repeat check of a healthy server changed {changed}"
    assert second_live["health_changed_at"] == first_live["health_changed_at"]
    assert second_live["last_checked_at"] > first_live["last_checked_at"]

    assert second_dead["health"] == Health.UNREACHABLE
    assert second_dead["consecutive_failures"] == 2
    assert second_dead["health_changed_at"] == first_dead["health_changed_at"]
    changed = {k for k in first_dead if first_dead[k] != second_dead[k]}
    assert changed <= {"last_checked_at", "probe_latency_ms", "consecutive_failures"}, changed
