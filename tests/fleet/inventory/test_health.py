"""Server health: probing, classification and what is recorded (``fleet.inventory.health``), its API
action and the fleet console's live table. Tasks are called as functions (STYLE.md); the
path through Redis and a real worker is in ``test_health_worker.py``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
import redis
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from fleet.adapters.base import ServerProbe
from fleet.inventory import health
from fleet.models import InferenceServer
from fleet.tenancy.scoping import tenant_of_served_name
from local.triton import TritonProcess
from tests.factories import ClusterFactory, InferenceServerFactory, ModelFactory
from tests.fixtures.http_server import QuietHTTPServer

Health = InferenceServer.Health
# Tests whose probes run against real servers commit their rows, like the beat task does.
CHECK_ALL_DB = pytest.mark.django_db(transaction=True)
def others_than(name: str, server: InferenceServer, own_slug: str) -> set[str]:
    """The names in the server's index other than ``name`` and the ones qualified by the
    tenant ``own_slug`` (its models as other tests of the session left them there)."""
    return {m["name"] for m in server.reported_models
            if m["name"] != name and tenant_of_served_name(m["name"]) != own_slug}


EXPECTED_MODELS = {("fraud-scorer", "1", "READY"), ("fraud-scorer", "2", "READY"),
                   ("sentiment", "1", "READY")}


def closed_port_url() -> str:
    """The URL of a port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _seconds(check, *args) -> float:
    """How long ``check(*args)`` takes."""
    started = time.monotonic()
    check(*args)
    return time.monotonic() - started


@pytest.fixture
def silent_urls() -> Iterator[list[str]]:
    """Four listeners that accept connections (kernel backlog) but never answer a byte."""
    socks = []
    try:
        for _ in range(4):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(16)
            socks.append(sock)
        yield [f"http://127.0.0.1:{s.getsockname()[1]}" for s in socks]
    finally:
        for sock in socks:
            sock.close()


class _NotReadyTriton(BaseHTTPRequestHandler):
    """Answers like a Triton that is live but not ready (e.g. still loading its models)."""

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v2/health/live":
            self._send(200, {})
        elif self.path == "/v2/health/ready":
            self._send(503, {"error": "not ready"})
        elif self.path == "/v2":
            self._send(200, {"name": "triton", "version": "2.51.0"})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        index = [{"name": "fraud-scorer", "version": "1", "state": "LOADING", "reason": ""}]
        self._send(200 if self.path == "/v2/repository/index" else 404, index)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_ready_url() -> Iterator[str]:
    server = QuietHTTPServer(("127.0.0.1", 0), _NotReadyTriton)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def cluster(db):
    return ClusterFactory(name="health-test")


@pytest.fixture
def live_server_row(cluster, local_triton: TritonProcess) -> InferenceServer:
    return InferenceServerFactory(cluster=cluster, name="triton-live", http_url=local_triton.http_url)


# --- classification ---------------------------------------------------------------------------


@pytest.mark.triton
def test_a_ready_triton_is_healthy_with_its_version_and_models(
    live_server_row: InferenceServer,
) -> None:
    server = health.check_server(live_server_row.pk)

    assert server is not None
    server.refresh_from_db()
    assert server.health == Health.HEALTHY
    assert server.health_detail == ""
    assert server.server_version == "2.51.0"
    # The session's own demo models; other tests' tenants' models there have qualified names.
    assert {(m["name"], m["version"], m["state"]) for m in server.reported_models
            if "." not in m["name"]} == EXPECTED_MODELS
    assert server.consecutive_failures == 0
    assert server.last_seen_at == server.last_checked_at == server.health_changed_at
    assert server.probe_latency_ms is not None and server.probe_latency_ms > 0


def test_a_closed_port_is_unreachable_with_a_readable_reason(cluster) -> None:
    url = closed_port_url()
    row = InferenceServerFactory(cluster=cluster, http_url=url)

    health.check_server(row.pk)

    row.refresh_from_db()
    assert row.health == Health.UNREACHABLE
    assert row.health_detail == f"connection refused at {url}/v2/health/live"
    assert row.consecutive_failures == 1
    assert row.last_seen_at is None
    assert row.last_checked_at is not None


def test_a_live_but_not_ready_server_is_unhealthy(cluster, not_ready_url: str) -> None:
    row = InferenceServerFactory(cluster=cluster, http_url=not_ready_url)

    health.check_server(row.pk)

    row.refresh_from_db()
    assert row.health == Health.UNHEALTHY
    assert "not ready (GET /v2/health/ready returned 503)" in row.health_detail
    # It answered, so it was seen, and what it said is kept for the console.
    assert row.last_seen_at == row.last_checked_at
    assert row.server_version == "2.51.0"
    assert row.reported_models == [
        {"name": "fraud-scorer", "version": "1", "state": "LOADING", "reason": ""}
    ]


def test_a_silent_server_times_out_within_the_probe_timeout(cluster, silent_urls) -> None:
    # A check of a closed port costs all a check costs but the wait: ten of them is the timeout.
    refused = InferenceServerFactory(cluster=cluster, name="refused", http_url=closed_port_url())
    overhead = _seconds(health.check_server, refused.pk, 5)
    timeout = round(max(0.5, 10 * overhead), 1)
    row = InferenceServerFactory(cluster=cluster, http_url=silent_urls[0])

    elapsed = _seconds(health.check_server, row.pk, timeout)

    row.refresh_from_db()
    assert row.health == Health.UNREACHABLE
    assert f"timed out after {timeout:.1f} s" in row.health_detail
    assert silent_urls[0] in row.health_detail
    # Within the timeout plus that much again for the check's own work.
    assert elapsed < 2 * timeout, f"took {elapsed:.2f} s, timeout {timeout} s"


# --- check_all: concurrency and bookkeeping ---------------------------------------------------


@pytest.mark.triton
@CHECK_ALL_DB
def test_silent_and_dead_servers_cost_about_one_timeout_in_total(
    live_server_row: InferenceServer, cluster, silent_urls: list[str]
) -> None:
    """GIVEN four servers that never answer, three closed ports and one live Triton,
    WHEN check_all runs with a timeout ten times what a check of the live server takes here,
    THEN it ends in under two timeouts, where the silent servers one after another cost four."""
    # What one check of the live server (probe and bookkeeping) costs on this machine now:
    # the slowest of three, so a busy moment counts.
    live_check = max(_seconds(health.check_server, live_server_row.pk, 30) for _ in range(3))
    # The live server answers well within it however busy the machine is, and the remaining
    # margin (one timeout, i.e. ten live checks) covers the bookkeeping of the eight checks.
    timeout = max(0.5, 10 * live_check)
    for i, url in enumerate(silent_urls):
        InferenceServerFactory(cluster=cluster, name=f"silent-{i}", http_url=url)
    for i in range(3):
        InferenceServerFactory(cluster=cluster, name=f"dead-{i}", http_url=closed_port_url())

    started = time.monotonic()
    counts = health.check_all(timeout=timeout)
    elapsed = time.monotonic() - started

    assert counts == {Health.HEALTHY: 1, Health.UNREACHABLE: 7}
    assert elapsed < 2 * timeout, (
        f"check_all took {elapsed:.2f} s with a {timeout:.2f} s timeout "
        f"(a live check took {live_check:.3f} s)"
    )
    live_server_row.refresh_from_db()
    assert live_server_row.health == Health.HEALTHY
    details = dict(InferenceServer.objects.values_list("name", "health_detail"))
    assert all("timed out" in details[f"silent-{i}"] for i in range(4)), details
    assert all("connection refused" in details[f"dead-{i}"] for i in range(3)), details


def test_check_all_with_no_servers_returns_no_counts(db) -> None:
    assert health.check_all(timeout=0.5) == {}


def test_check_all_leaves_the_callers_transaction_usable(cluster) -> None:
    InferenceServerFactory(cluster=cluster, http_url=closed_port_url())

    with transaction.atomic():
        health.check_all(timeout=0.5)
        assert InferenceServer.objects.filter(health=Health.UNREACHABLE).count() == 1


@pytest.mark.triton
def test_health_changed_at_moves_only_on_a_transition(
    live_server_row: InferenceServer, local_triton: TritonProcess
) -> None:
    row = live_server_row
    row.http_url = closed_port_url()
    row.save()

    health.check_server(row.pk)
    row.refresh_from_db()
    went_down = row.health_changed_at
    assert row.health == Health.UNREACHABLE and went_down is not None

    health.check_server(row.pk)
    row.refresh_from_db()
    assert row.health == Health.UNREACHABLE
    assert row.health_changed_at == went_down
    assert row.consecutive_failures == 2
    assert row.last_checked_at > went_down

    row.http_url = local_triton.http_url
    row.save()
    health.check_server(row.pk)
    row.refresh_from_db()
    assert row.health == Health.HEALTHY
    assert row.health_changed_at > went_down
    assert row.health_changed_at == row.last_checked_at
    assert row.consecutive_failures == 0


@pytest.mark.triton
def test_a_failure_keeps_last_seen_and_version_but_not_stale_models(
    live_server_row: InferenceServer,
) -> None:
    row = live_server_row
    health.check_server(row.pk)
    row.refresh_from_db()
    seen = row.last_seen_at
    assert seen is not None

    row.http_url = closed_port_url()
    row.save()
    health.check_server(row.pk)

    row.refresh_from_db()
    assert row.health == Health.UNREACHABLE
    assert row.last_seen_at == seen
    assert row.last_checked_at > seen
    assert row.server_version == "2.51.0"
    assert row.consecutive_failures == 1
    # What an unreachable server has loaded is unknown: the console must not show it as READY.
    assert row.reported_models == []


@pytest.mark.triton
@CHECK_ALL_DB
def test_check_all_twice_changes_only_the_clock_fields(live_server_row: InferenceServer) -> None:
    dead = InferenceServerFactory(cluster=live_server_row.cluster, http_url=closed_port_url())
    health.check_all()
    first = {s.pk: s for s in InferenceServer.objects.all()}

    health.check_all()

    stable = ("health", "health_detail", "server_version", "reported_models", "health_changed_at")
    for server in InferenceServer.objects.all():
        before = first[server.pk]
        for name in stable:
            assert getattr(server, name) == getattr(before, name), (server.name, name)
        assert server.last_checked_at > before.last_checked_at
    dead.refresh_from_db()
    assert dead.consecutive_failures == 2
    assert dead.last_seen_at is None


def test_a_server_deleted_while_probing_is_skipped(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIVEN two servers, WHEN one is deleted while its probe is in flight,
    THEN check_all records the other, counts only it, and does not fail."""
    cluster = ClusterFactory(name="deleted-test")
    victim = InferenceServerFactory(
        cluster=cluster, name="victim", http_url=f"{closed_port_url()}/victim"
    )
    other = InferenceServerFactory(cluster=cluster, name="other", http_url=closed_port_url())
    real_steps = health.PROBE_STEPS[InferenceServer.Runtime.TRITON]

    def delete_victim() -> None:
        try:  # another process deletes the row meanwhile (a thread with its own connection)
            InferenceServer.objects.filter(pk=victim.pk).delete()
        finally:
            connection.close()

    def probe_and_delete(base: str, start: float):
        if base == victim.http_url:  # the probe has started, on the round's event loop
            deleter = threading.Thread(target=delete_victim)
            deleter.start()
            deleter.join()
        return real_steps(base, start)

    monkeypatch.setitem(health.PROBE_STEPS, InferenceServer.Runtime.TRITON, probe_and_delete)

    counts = health.check_all(timeout=0.5)

    assert counts == {Health.UNREACHABLE: 1}
    assert not InferenceServer.objects.filter(pk=victim.pk).exists()
    other.refresh_from_db()
    assert other.health == Health.UNREACHABLE
    assert other.consecutive_failures == 1
    assert health.check_server(victim.pk) is None


@CHECK_ALL_DB
def test_a_server_deleted_just_before_its_result_is_written_is_skipped(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = InferenceServerFactory(cluster=cluster, name="victim", http_url=closed_port_url())
    other = InferenceServerFactory(cluster=cluster, name="other", http_url=closed_port_url())
    real_classify = health.classify

    def delete_between_read_and_write(probe: ServerProbe) -> str:
        if victim.http_url in probe.error:  # record_probe() has read the row, not yet written
            InferenceServer.objects.filter(pk=victim.pk).delete()
        return real_classify(probe)

    monkeypatch.setattr(health, "classify", delete_between_read_and_write)
    counts = health.check_all(timeout=0.5)

    assert counts == {Health.UNREACHABLE: 1}
    assert not InferenceServer.objects.filter(pk=victim.pk).exists()
    other.refresh_from_db()
    assert other.consecutive_failures == 1


@CHECK_ALL_DB
def test_an_adapter_bug_is_recorded_and_does_not_stop_the_others(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = InferenceServerFactory(
        cluster=cluster, name="broken", http_url=f"{closed_port_url()}/broken"
    )
    fine = InferenceServerFactory(cluster=cluster, name="fine", http_url=closed_port_url())
    real_steps = health.PROBE_STEPS[InferenceServer.Runtime.TRITON]

    def buggy(base: str, start: float):
        if base == broken.http_url:
            raise KeyError("oops")
        return real_steps(base, start)

    monkeypatch.setitem(health.PROBE_STEPS, InferenceServer.Runtime.TRITON, buggy)

    assert health.check_all(timeout=0.5) == {Health.UNREACHABLE: 2}
    broken.refresh_from_db()
    fine.refresh_from_db()
    assert broken.health_detail == "probe failed: 'oops'"
    assert "connection refused" in fine.health_detail


# --- API and console ----------------------------------------------------------------------------


@pytest.mark.triton
def test_api_check_action_probes_now_and_returns_health(
    live_server_row: InferenceServer, alice, bob, client_for, api
) -> None:
    """A viewer sees the entries of its tenant's models on the shared server; the rest is
    counted, not named."""
    url = f"/api/v1/servers/{live_server_row.pk}/check/"
    ModelFactory(tenant=bob.memberships.get().tenant, name="fraud-scorer")

    response = client_for(bob).post(url)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == live_server_row.pk
    assert body["health"] == Health.HEALTHY
    assert body["server_version"] == "2.51.0"
    mine = {m for m in EXPECTED_MODELS if m[0] == "fraud-scorer"}
    slug = bob.memberships.get().tenant.slug
    assert {(m["name"], m["version"], m["state"]) for m in body["reported_models"]
            if "." not in m["name"]} == mine
    assert all(tenant_of_served_name(m["name"]) in (None, slug) for m in body["reported_models"])
    live_server_row.refresh_from_db()
    # sentiment, and whatever other tests' tenants left on the session's Triton
    assert body["other_models"] == len(others_than("fraud-scorer", live_server_row, slug)) >= 1
    assert live_server_row.health == Health.HEALTHY
    assert body["last_checked_at"] is not None

    assert client_for(alice).post(url).status_code == 200
    assert api.post(url).status_code == 401


def test_api_check_action_reports_an_unreachable_server(cluster, alice, client_for) -> None:
    url = closed_port_url()
    row = InferenceServerFactory(cluster=cluster, http_url=url)

    response = client_for(alice).post(f"/api/v1/servers/{row.pk}/check/")

    assert response.status_code == 200
    assert response.json()["health"] == Health.UNREACHABLE
    assert url in response.json()["health_detail"]


def test_api_check_of_an_unknown_server_is_404(alice, client_for) -> None:
    assert client_for(alice).post("/api/v1/servers/999999/check/").status_code == 404


@pytest.mark.triton
@CHECK_ALL_DB
def test_console_live_table_shows_the_healthy_triton(
    live_server_row: InferenceServer, alice, client
) -> None:
    health.check_all()
    ModelFactory(tenant=alice.memberships.get().tenant, name="fraud-scorer")
    client.force_login(alice)

    response = client.get("/fleet/servers/live/")

    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-server="triton-live"' in html
    assert 'data-health="healthy"' in html
    assert "Healthy" in html
    assert "fraud-scorer v2" in html  # her tenant's model, named
    assert "sentiment" not in html  # another's, counted
    live_server_row.refresh_from_db()
    slug = alice.memberships.get().tenant.slug
    assert f'data-other-models="{len(others_than("fraud-scorer", live_server_row, slug))}"' in html
    assert "2.51.0" in html


def test_console_live_table_needs_a_login(client) -> None:
    response = client.get("/fleet/servers/live/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


# --- Rounds at fleet size: shards, leases, batched writes --------------------------------------


@CHECK_ALL_DB
def test_shards_split_the_servers_each_in_one(cluster) -> None:
    made = {InferenceServerFactory(cluster=cluster, name=f"s{i}").pk for i in range(11)}
    parts = [set(health.shard_of(InferenceServer.objects.all(), i, 3).values_list("pk", flat=True))
             for i in range(3)]
    assert set().union(*parts) == made
    assert sum(len(p) for p in parts) == len(made)
    assert all(pk % 3 == i for i, part in enumerate(parts) for pk in part)


@CHECK_ALL_DB
def test_a_shard_another_worker_holds_is_skipped_and_taken_when_its_lease_ends(
    cluster, settings
) -> None:
    InferenceServerFactory(cluster=cluster, http_url=closed_port_url())
    store = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.SWITCHYARD_REDIS_PREFIX}:health:shard:0"
    store.delete(key)
    assert store.lock(key, timeout=1.0, blocking=False).acquire()  # a worker that died with it

    assert health.check_shard(0, count=1, timeout=0.5) == {"skipped": 1}
    time.sleep(1.1)
    assert health.check_shard(0, count=1, timeout=0.5) == {Health.UNREACHABLE: 1}
    assert store.get(key) is None  # released after the round


@pytest.mark.parametrize("count", [10, 40])
@CHECK_ALL_DB
def test_a_round_runs_the_same_statements_for_ten_servers_as_for_forty(
    cluster, count, monkeypatch
) -> None:
    """One read of the servers, then per batch one read of their rows and one UPDATE (one
    batch here), whatever the number of servers."""
    for i in range(count):
        InferenceServerFactory(cluster=cluster, name=f"closed-{i}", http_url=closed_port_url())
    monkeypatch.setattr(health, "FLUSH_IDLE_S", 30.0)
    monkeypatch.setattr(health, "FLUSH_EVERY_S", 30.0)

    with CaptureQueriesContext(connection) as queries:
        counts = health.check_all(timeout=1.0)

    assert counts == {Health.UNREACHABLE: count}
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("BEGIN", "COMMIT",
                                                                           "SAVEPOINT", "RELEASE"))]
    assert len(statements) == 3, " | ".join(sql[:60] for sql in statements)
    assert set(InferenceServer.objects.values_list("consecutive_failures", flat=True)) == {1}


@CHECK_ALL_DB
def test_twenty_hung_servers_cost_one_timeout_not_two(cluster) -> None:
    """More hung servers than the old 16 probes in flight: still one timeout for the round."""
    socks = []
    try:
        for i in range(20):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(16)
            socks.append(sock)
            InferenceServerFactory(cluster=cluster, name=f"hung-{i}",
                                   http_url=f"http://127.0.0.1:{sock.getsockname()[1]}")
        # Long enough that a busy machine's scheduling (well under a second) cannot pass for
        # a second wave of timeouts.
        timeout = 3.0
        started = time.monotonic()
        counts = health.check_all(timeout=timeout)
        took = time.monotonic() - started
    finally:
        for sock in socks:
            sock.close()
    assert counts == {Health.UNREACHABLE: 20}
    # Two timeouts would mean the hung servers waited in line; the rest is bookkeeping.
    assert took < 2 * timeout, took
