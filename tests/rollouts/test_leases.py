"""One lease protocol for every leased row (rollouts/leases.py): loads, rollouts, benchmark
jobs and server workloads are claimed, kept alive, written and released the same way, each
under its own lease length."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from console.exceptions import Conflict
from rollouts import idempotency, leases
from rollouts.benchmarks import reconciler as benchmark_reconciler
from rollouts.canary import reconciler as rollout_reconciler
from rollouts.loads import reconciler as load_reconciler
from rollouts.models import BenchmarkJob, ModelLoad, Rollout, ServerWorkload
from rollouts.workloads import reconciler as workload_reconciler
from tests.factories import DeploymentFactory, InferenceServerFactory, ModelVersionFactory

KINDS = ["load", "rollout", "benchmark", "workload"]
#: Each kind's lease length setting, and the module whose advance() takes the lease.
SETTING = {
    "load": "SWITCHYARD_LOAD_LEASE_S",
    "rollout": "SWITCHYARD_ROLLOUT_LEASE_S",
    "benchmark": "SWITCHYARD_BENCHMARK_LEASE_S",
    "workload": "SWITCHYARD_WORKLOAD_LEASE_S",
}


def make_row(kind: str) -> Any:
    """A row of ``kind`` that its reconciler would advance now."""
    deployment = DeploymentFactory()
    version = ModelVersionFactory(model=deployment.model)
    server = InferenceServerFactory(cluster=deployment.cluster)
    common = {"tenant": deployment.tenant, "deployment": deployment, "requested_by_label": "ci"}
    if kind == "load":
        return ModelLoad.objects.create(server=server, version=version, **common)
    if kind == "rollout":
        return Rollout.objects.create(baseline=version, state=Rollout.State.LOADING, **common)
    if kind == "benchmark":
        return BenchmarkJob.objects.create(
            version=version, server=server, protocol=BenchmarkJob.Protocol.TRITON_HTTP,
            levels=[1], phase="queued", **common)
    return ServerWorkload.objects.create(
        cluster=deployment.cluster, version=version, name="triton-x", namespace="serving",
        runtime=version.runtime, image="triton:1", **common)


def claim(row: Any, **kwargs: Any) -> Any:
    return leases.claim(type(row).objects.all(), row.pk, lease_s=kwargs.pop("lease_s", 30),
                        **kwargs)


@pytest.mark.django_db
@pytest.mark.parametrize("kind", KINDS)
def test_a_claimed_row_is_not_claimed_by_a_second_worker(kind):
    row = make_row(kind)

    first = claim(row)
    assert first is not None and first.lease_owner and not first.taken_over
    assert claim(row) is None  # the lease holds: a second worker leaves the row alone

    stored = type(row).objects.get(pk=row.pk)
    assert (stored.lease_owner, stored.lease_expires_at) == (first.lease_owner,
                                                              first.lease_expires_at)
    assert claim(row, due=lambda found, now: False) is None  # not due: nobody claims it


@pytest.mark.django_db
@pytest.mark.parametrize("kind", KINDS)
def test_an_expired_lease_is_taken_over_and_the_taker_is_told_whose(kind):
    row = make_row(kind)
    dead = claim(row)
    type(row).objects.filter(pk=row.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    told: list[str] = []

    taker = claim(row, on_take_over=lambda found, owner: told.append(owner))

    assert taker is not None and taker.taken_over
    assert taker.lease_owner not in ("", dead.lease_owner)
    assert told == [dead.lease_owner]
    assert type(row).objects.get(pk=row.pk).lease_owner == taker.lease_owner


@pytest.mark.django_db
@pytest.mark.parametrize("kind", KINDS)
def test_a_write_after_losing_the_lease_raises_lost_lease_and_changes_nothing(kind):
    row = make_row(kind)
    dead = claim(row)
    type(row).objects.filter(pk=row.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    taker = claim(row)

    with pytest.raises(leases.LostLease):
        leases.update(dead, requested_by_label="the dead worker's late write")
    leases.release(dead)  # not its lease any more: nothing is given back

    stored = type(row).objects.get(pk=row.pk)
    assert (stored.requested_by_label, stored.lease_owner) == ("ci", taker.lease_owner)
    leases.update(taker, requested_by_label="written under the lease")
    assert type(row).objects.get(pk=row.pk).requested_by_label == "written under the lease"
    leases.release(taker)
    assert type(row).objects.get(pk=row.pk).lease_owner == ""


@pytest.mark.django_db
def test_a_guarded_write_also_refuses_a_row_that_moved_on():
    row = make_row("workload")
    held = claim(row)
    ServerWorkload.objects.filter(pk=row.pk).update(state=ServerWorkload.State.DELETING)

    with pytest.raises(leases.LostLease):
        leases.update(held, {"state": ServerWorkload.State.PENDING}, detail="applying")
    assert ServerWorkload.objects.get(pk=row.pk).detail == ""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["load", "rollout"])
def test_the_heartbeat_keeps_a_lease_alive_past_its_length_and_stops_with_its_block(kind):
    row = make_row(kind)
    # The heartbeat renews every third of a lease: a lease of 1.5 s survives its thread
    # being starved for up to a second (0.8 s was measured on a busy 2-core machine, which
    # let a 0.6 s lease run out under the heartbeat).
    lease_s = 1.5
    held = claim(row, lease_s=lease_s)

    with leases.heartbeat(held, lease_s=lease_s, max_s=30):
        time.sleep(3 * lease_s)  # three lease lengths
        assert claim(row, lease_s=lease_s) is None  # still ours
        stored = type(row).objects.get(pk=row.pk)
        assert stored.lease_owner == held.lease_owner and stored.lease_expires_at > timezone.now()

    time.sleep(lease_s + 0.3)  # no renewal after the block: the lease runs out
    taker = claim(row, lease_s=lease_s)
    assert taker is not None and taker.lease_owner != held.lease_owner


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_gives_up_after_its_maximum_and_when_taken_over():
    row = make_row("benchmark")
    lease_s = 0.6
    stuck = claim(row, lease_s=lease_s)
    with leases.heartbeat(stuck, lease_s=lease_s, max_s=0.1):
        time.sleep(lease_s + 0.5)  # a stuck step: no renewal past the maximum
        taker = claim(row, lease_s=30)
        assert taker is not None
    assert BenchmarkJob.objects.get(pk=row.pk).lease_owner == taker.lease_owner

    other = make_row("benchmark")
    held = claim(other, lease_s=lease_s)
    with leases.heartbeat(held, lease_s=lease_s, max_s=30):
        BenchmarkJob.objects.filter(pk=other.pk).update(lease_owner="another-worker")
        time.sleep(lease_s)  # a renewal finds the lease is not ours: it writes nothing
    assert BenchmarkJob.objects.get(pk=other.pk).lease_owner == "another-worker"


ADVANCE: dict[str, tuple[Any, Callable[[int], Any]]] = {
    "load": (load_reconciler, load_reconciler.advance),
    "rollout": (rollout_reconciler, lambda pk: rollout_reconciler.advance(pk, force=True)),
    "benchmark": (benchmark_reconciler, benchmark_reconciler.advance),
    "workload": (workload_reconciler, workload_reconciler.advance),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_steps_under_its_own_lease_kept_alive_by_a_heartbeat(kind, settings,
                                                                        monkeypatch):
    """A step of each kind runs under a lease of its own setting's length (the others are
    set far longer, so a kind reading another's setting shows), renewed while the step runs
    past it, and given back when the step ends. A worker that died holding the row is taken
    over (loads and rollouts record it)."""
    lease_s = 0.6
    for name in SETTING.values():
        setattr(settings, name, 600)
    setattr(settings, SETTING[kind], lease_s)
    module, advance = ADVANCE[kind]
    row = make_row(kind)
    type(row).objects.filter(pk=row.pk).update(
        lease_owner="deadbeef" * 4, lease_expires_at=timezone.now() - timedelta(seconds=1))
    seen: dict[str, Any] = {}

    def step(claimed: Any) -> bool:
        seen["taken_over"] = getattr(claimed, "taken_over", False)
        seen["lease_left_s"] = (claimed.lease_expires_at - timezone.now()).total_seconds()
        time.sleep(3 * lease_s)
        stored = type(row).objects.get(pk=row.pk)
        seen["still_ours"] = stored.lease_owner == claimed.lease_owner
        seen["renewed"] = stored.lease_expires_at > timezone.now()
        return False

    monkeypatch.setitem(module.STEPS, row.state, step)
    advance(row.pk)

    assert 0 < seen["lease_left_s"] <= lease_s
    assert seen["still_ours"] and seen["renewed"]
    assert seen["taken_over"]
    assert type(row).objects.get(pk=row.pk).lease_owner == ""
    if kind in ("load", "rollout"):
        assert row.events.filter(message="took over from a worker whose lease ran out (deadbeef)")


def test_an_idempotency_key_replays_only_its_own_request():
    idempotency.check_replay("abc", "abc")
    with pytest.raises(Conflict) as refused:
        idempotency.check_replay("abc", "xyz")
    assert refused.value.field == "idempotency_key"
    assert refused.value.message == "this Idempotency-Key was used for a different request"
