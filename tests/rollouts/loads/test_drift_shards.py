"""The reconcile tick's drift work is split into shards of the servers that any worker takes
under a lease (rollouts/loads/drift.py, rollouts/tasks.py): every server with ready loads is
reconciled by exactly one shard, a shard another worker holds is skipped, and the tick sends
one task per shard, all counted from when it was sent."""

from __future__ import annotations

import time

import pytest
import redis

from fleet.inventory import shard_leases
from rollouts import tasks
from rollouts.loads import drift
from rollouts.models import ModelLoad
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

pytestmark = pytest.mark.django_db


def servers_with_ready_loads(count: int) -> list[int]:
    cluster = ClusterFactory(name="drift-shards")
    model = ModelFactory(name="scorer")
    version = ModelVersionFactory(model=model, version=1)
    deployment = DeploymentFactory(tenant=model.tenant, model=model, cluster=cluster)
    out = []
    for i in range(count):
        server = InferenceServerFactory(cluster=cluster, name=f"s{i}")
        ModelLoad.objects.create(tenant=model.tenant, deployment=deployment, server=server,
                                 version=version, state=ModelLoad.State.READY)
        out.append(server.pk)
    return out


def test_each_server_is_reconciled_by_exactly_one_shard(monkeypatch, settings):
    ids = servers_with_ready_loads(7)
    seen: list[int] = []
    monkeypatch.setattr(drift, "reconcile_server", lambda server: seen.append(server.pk) or [])
    monkeypatch.setattr(drift, "check_configs", lambda server: [])

    by_shard = {}
    for index in range(3):
        before = len(seen)
        assert drift.reconcile_shard(index, count=3) == {"lost": 0, "config": 0}
        by_shard[index] = seen[before:]

    assert sorted(seen) == sorted(ids)
    assert all(pk % 3 == index for index, found in by_shard.items() for pk in found)


def test_a_shard_another_worker_holds_is_skipped(monkeypatch, settings):
    servers_with_ready_loads(2)
    monkeypatch.setattr(drift, "reconcile_server", lambda server: pytest.fail("reconciled"))
    store = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.SWITCHYARD_REDIS_PREFIX}:drift:shard:0"
    assert store.lock(key, timeout=5, blocking=False).acquire(token=shard_leases.token())

    assert drift.reconcile_shard(0, count=1) == {"skipped": 1}


def test_the_tick_sends_a_task_per_shard_counted_from_when_it_was_sent(monkeypatch, settings):
    settings.SWITCHYARD_SHARDS = 3
    sent = []
    monkeypatch.setattr(tasks.reconcile_drift_shard, "apply_async",
                        lambda args, kwargs, queue, expires: sent.append((args, kwargs, expires)))
    before = time.time()

    tasks.reconcile_loads()

    assert sorted(args for args, _, _ in sent) == [(0,), (1,), (2,)]
    assert {e for _, _, e in sent} == {settings.SWITCHYARD_RECONCILE_INTERVAL_S}
    (stamp,) = {k["sent_at"] for _, k, _ in sent}
    assert before <= stamp <= time.time()
