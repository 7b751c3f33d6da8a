"""The scrape tick's shards, leases and cost, on servers of the fleet simulator
(``local/fleetsim.py``, which serves the real servers' metrics pages): no server in two shards,
a shard scraped by one tick at a time, a dead worker's lease run out within two ticks, and
the statements a tick runs the same for 10 servers as for 40."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.inventory import shard_leases
from local.fleetsim import FleetConfig, FleetThread
from rollouts import tasks
from rollouts.models import LatencyRollup
from rollouts.traffic import live_window, scrape_tick
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    TenantFactory,
)

pytestmark = pytest.mark.django_db(transaction=True)

SLUG = "sim"


@pytest.fixture
def fleet():
    """40 simulated Triton servers serving ``sim.scorer-0`` v1 (the name a tenant ``sim``'s
    model ``scorer-0`` has on a shared Triton) at 50 requests a second."""
    config = FleetConfig(triton=40, models=1, versions=1, model_prefix=f"{SLUG}.scorer",
                         seconds=120)
    config.traffic = config.traffic.with_changes({"rps": 50.0})
    with FleetThread(config) as running:
        yield running


def register(fleet, count: int):
    """``count`` deployments of one simulated server each; their servers."""
    tenant = TenantFactory(slug=SLUG)
    model = ModelFactory(tenant=tenant, name="scorer-0")
    cluster = ClusterFactory()
    servers = []
    for sim in fleet.servers[:count]:
        server = InferenceServerFactory(cluster=cluster, name=f"sim-{sim.index}",
                                        http_url=sim.http_url, metrics_url=sim.metrics_url)
        deployment = DeploymentFactory(tenant=tenant, model=model, cluster=cluster,
                                       name=f"dep-{sim.index}")
        deployment.servers.set([server])
        servers.append(server)
    return servers


@pytest.fixture(autouse=True)
def clean_leases():
    store = live_window.connect()
    for key in store.scan_iter("*:latency:shard:*"):
        store.delete(key)
    yield


def test_deployments_that_share_a_server_share_a_shard_and_no_server_is_in_two():
    cluster = ClusterFactory()
    s = [InferenceServerFactory(cluster=cluster, name=f"s{i}") for i in range(6)]
    layout = {"a": [0, 1], "b": [1, 2], "c": [3], "d": [4, 5], "e": [5]}
    made = {}
    for name, members in layout.items():
        made[name] = DeploymentFactory(cluster=cluster, name=name)
        made[name].servers.set([s[i] for i in members])
    gone = DeploymentFactory(cluster=cluster, name="archived", archived_at=timezone.now())
    gone.servers.set([s[0], s[3]])  # an archived deployment joins nothing and is not scraped

    plan = scrape_tick.shards(count=3)

    shard_of = {pk: index for index, ids in plan.items() for pk in ids}
    assert sorted(shard_of) == sorted(d.pk for d in made.values())
    assert sum(len(ids) for ids in plan.values()) == len(made)  # each deployment once
    assert shard_of[made["a"].pk] == shard_of[made["b"].pk] == s[0].pk % 3
    assert shard_of[made["c"].pk] == s[3].pk % 3
    assert shard_of[made["d"].pk] == shard_of[made["e"].pk] == s[4].pk % 3
    servers_in = {index: {srv for d in made.values() if shard_of[d.pk] == index
                          for srv in d.servers.values_list("pk", flat=True)} for index in plan}
    for index, members in servers_in.items():
        for other, theirs in servers_in.items():
            assert index == other or not members & theirs


@pytest.mark.parametrize("count", [10, 40])
def test_a_tick_runs_the_same_statements_for_ten_servers_as_for_forty(fleet, count, monkeypatch):
    """Three reads (the shard plan, the deployments, their servers) and one upsert of every
    rollup, whatever the fleet's size (the tick's writes are batched into one flush here)."""
    register(fleet, count)
    monkeypatch.setattr(scrape_tick, "FLUSH_IDLE_S", 30.0)
    monkeypatch.setattr(scrape_tick, "FLUSH_EVERY_S", 30.0)
    assert scrape_tick.tick(timeout=2.0)["points"] == 0  # the first scrape: nothing to diff
    time.sleep(0.3)

    with CaptureQueriesContext(connection) as queries:
        result = scrape_tick.tick(timeout=2.0)

    assert result == {"servers": count, "points": count, "failed": 0}
    # bulk_create's own transaction adds its BEGIN and COMMIT where the database needs them.
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("BEGIN", "COMMIT"))]
    assert len(statements) == 4, " | ".join(sql[:60] for sql in statements)
    assert LatencyRollup.objects.filter(label="v1").count() == count
    assert all(row.requests > 0 for row in LatencyRollup.objects.all())


def test_a_shard_is_scraped_by_one_tick_at_a_time(fleet):
    """Two ticks of one plan at once (two workers): every server is scraped once between
    them, the shards the other holds are skipped."""
    servers = register(fleet, 20)
    fleet.servers[0].state, fleet.servers[0].delay_s = "slow", 0.8  # both ticks overlap
    plan = scrape_tick.shards(count=4)
    results = []

    def one_tick() -> None:
        results.append(scrape_tick.run(plan, timeout=2.0))
        connection.close()

    threads = [threading.Thread(target=one_tick) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sum(r["servers"] for r in results) == len(servers)
    assert sum(r.get("skipped", 0) for r in results) == len(plan)


def test_a_shards_lease_names_the_worker_process_holding_it(fleet, settings):
    """While a tick scrapes, each of its shards' leases in Redis names this process (host and
    pid): who holds a shard can be read, and after a worker dies, who took it over."""
    register(fleet, 8)
    fleet.servers[0].state, fleet.servers[0].delay_s = "slow", 0.8  # the tick lasts a while
    plan = scrape_tick.shards(count=2)
    store = redis.Redis.from_url(settings.REDIS_URL)
    keys = [f"{settings.SWITCHYARD_REDIS_PREFIX}:latency:shard:{i}" for i in plan]

    def one_tick() -> None:
        scrape_tick.run(plan, timeout=2.0)
        connection.close()

    thread = threading.Thread(target=one_tick)
    thread.start()
    held: dict[str, object] = {}
    deadline = time.monotonic() + 5
    while len(held) < len(keys) and time.monotonic() < deadline:
        for key in keys:
            if (value := store.get(key)) is not None:
                held[key] = shard_leases.holder(value)
        time.sleep(0.01)
    thread.join(30)

    assert held == {key: (socket.gethostname(), os.getpid()) for key in keys}
    assert all(store.get(key) is None for key in keys)  # released at the tick's end
    assert shard_leases.holder(None) is None and shard_leases.holder(b"a-uuid-token") is None
    assert shard_leases.holder("h:12:") is None and shard_leases.holder("h:x:ab") is None


def test_a_lease_left_by_a_dead_worker_runs_out_within_two_ticks(fleet, settings):
    register(fleet, 4)
    settings.SWITCHYARD_SCRAPE_INTERVAL_S = 1.0
    plan = scrape_tick.shards(count=1)
    store = live_window.connect()
    # A worker took shard 0 and died with it.
    assert store.lock(f"{settings.SWITCHYARD_REDIS_PREFIX}:latency:shard:0",
                      timeout=scrape_tick.lease_s(), blocking=False).acquire()
    taken = time.monotonic()

    assert scrape_tick.run(plan, timeout=1.0) == {"servers": 0, "points": 0, "skipped": 1}
    while scrape_tick.run(plan, timeout=1.0).get("skipped"):
        time.sleep(0.05)
    free_after = time.monotonic() - taken

    # The lease outlasts a tick's own deadline and is gone before the second tick after it.
    assert scrape_tick.lease_s() > settings.SWITCHYARD_SCRAPE_TIMEOUT_S + scrape_tick.TICK_GRACE_S
    assert scrape_tick.lease_s() < 2 * settings.SWITCHYARD_SCRAPE_INTERVAL_S
    assert free_after >= scrape_tick.lease_s() - 0.1


def test_a_lease_runs_from_when_its_tick_was_sent_so_a_dead_worker_loses_it_by_the_second():
    """Whenever in its tick a worker took a shard, its lease is gone when the second tick
    after is sent (1.9 intervals from the first): the survivors take the shard at that tick.
    It never ends before the shard's own work may (the floor), nor lasts more than a whole
    lease when the sender's clock runs ahead."""
    sent = 1000.0
    for taken_after in (0.0, 0.3, 0.6):
        left = shard_leases.seconds(1.0, 0.5, sent_at=sent, now=sent + taken_after)
        assert sent + taken_after + left == pytest.approx(sent + 1.9)
    assert shard_leases.seconds(1.0, 1.3, sent_at=sent, now=sent + 0.9) == 1.3  # the floor
    assert shard_leases.seconds(1.0, 0.5, sent_at=sent + 60, now=sent) == pytest.approx(1.9)
    assert shard_leases.seconds(3.0, 1.0) == pytest.approx(5.7)  # no tick: from now


def test_beat_sends_one_task_per_shard(fleet, settings, monkeypatch):
    register(fleet, 12)
    settings.SWITCHYARD_SHARDS = 3
    sent = []
    kwargs = []
    monkeypatch.setattr(tasks.scrape_latency_shard, "apply_async",
                        lambda args, given, queue, expires: (sent.append((args, expires)),
                                                             kwargs.append(given)))

    before = time.time()
    assert tasks.scrape_latency() == len(sent) > 0
    # Every shard's lease is counted from when the tick sent it.
    assert len({k["sent_at"] for k in kwargs}) == 1
    assert before <= kwargs[0]["sent_at"] <= time.time()
    assert sorted(index for (index, _ids), _ in sent) == sorted(scrape_tick.shards())
    assert sorted(pk for (_index, ids), _ in sent for pk in ids) == sorted(
        pk for ids in scrape_tick.shards().values() for pk in ids)
    assert {expires for _, expires in sent} == {settings.SWITCHYARD_SCRAPE_INTERVAL_S}
    # A shard's task scrapes its deployments' servers under its lease.
    (index, ids), _ = sent[0]
    assert tasks.scrape_latency_shard(index, ids)["servers"] == len(ids)
