"""Model loads end to end: S3 (moto server) → quota → real Triton, and every way back.

GIVEN a tenant with a cpu quota, a deployment on a server record that points at the session's
real Triton, and versions whose artifacts sit in a real S3 endpoint (moto's server mode),
WHEN the reconciler advances a load, THEN the version ends READY on the server, or FAILED with
a readable reason and nothing left behind (no quota held, no files, nothing loaded).
Every test uses its own model name: the Triton is shared by the whole session.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import httpx
import pytest
from django.db import connections

from console.exceptions import Conflict, DomainError
from fleet.models import AuditEvent, Placement
from rollouts.loads import reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, ModelVersion
from tests.rollouts.triton_world import (
    BROKEN_MODEL_PY,
    held,
    index_state,
    load_once,
    make_artifact,
)

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
State = ModelLoad.State


def test_it_loads_a_version_from_s3_onto_triton_and_unloads_it(world):
    v1 = world.version(1)
    load = load_once(world, v1)

    assert load.state == State.READY, load.error
    assert index_state(world.triton, world.served)["1"] == "READY"
    assert load.bytes_done == load.bytes_total == v1.size_bytes
    assert len(load.config_hash) == 64
    placement = Placement.objects.get(pk=load.placement_id)
    assert (placement.state, placement.config_hash, placement.units, placement.memory_mib) == (
        Placement.State.ACTIVE, load.config_hash, 1, 64)
    assert held(world) == (1, 64)
    states = [e.state for e in load.events.all()]
    assert states[:1] == [State.PENDING] and states[-1] == State.READY
    assert {State.ADMITTED, State.FETCHING, State.PLACING, State.LOADING} <= set(states)

    loads.request_unload(world.user, world.deployment, v1)
    load = reconciler.run_to_end(load.pk)

    assert load.state == State.UNLOADED
    assert index_state(world.triton, world.served).get("1") != "READY"
    assert not (Path(world.server.model_repository) / world.served / "1").exists()
    assert held(world) == (0, 0)


def test_loading_a_ready_version_again_changes_nothing(world):
    v1 = world.version(1)
    first = load_once(world, v1)
    events = first.events.count()

    rows, created = loads.request_load(world.user, world.deployment, v1)

    assert created is False and [r.pk for r in rows] == [first.pk]
    assert ModelLoad.objects.filter(version=v1).count() == 1
    assert first.events.count() == events
    assert held(world) == (1, 64)


def test_a_second_version_with_more_instances_scales_the_version_kept_beside_it(world):
    v1 = world.version(1)
    v2 = world.version(2, config={"instance_group": [{"count": 2, "kind": "KIND_CPU"}]})
    first = load_once(world, v1)
    second = load_once(world, v2)

    assert second.state == State.READY, second.error
    assert index_state(world.triton, world.served) == {"1": "READY", "2": "READY"}
    counts = {
        v: httpx.get(
            f"{world.triton.http_url}/v2/models/{world.served}/versions/{v}/config", timeout=5
        ).json()["instance_group"][0]["count"]
        for v in (1, 2)
    }
    # Triton keeps one config per model: v1 was scaled to v2's two instances.
    assert counts == {1: 2, 2: 2}
    kept = ModelLoad.objects.get(pk=first.pk)
    assert kept.config_hash != first.config_hash and kept.config_hash == second.config_hash
    assert Placement.objects.get(pk=kept.placement_id).config_hash == kept.config_hash
    assert "v2 was loaded beside it" in kept.events.last().message
    # Both versions run two instances now, and the quota held says so.
    assert held(world) == (2 + 2, 128 + 128)
    assert AuditEvent.objects.filter(verb="config_changed", object_id=str(first.pk)).count() == 1


def test_an_idempotency_key_returns_the_first_answer_and_refuses_another_request(world):
    v1, v2 = world.version(1), world.version(2)
    rows, created = loads.request_load(world.user, world.deployment, v1, idempotency_key="ci-42")
    again, created_again = loads.request_load(world.user, world.deployment, v1, idempotency_key="ci-42")

    assert created and not created_again and [r.pk for r in again] == [r.pk for r in rows]
    with pytest.raises(Conflict) as refused:
        loads.request_load(world.user, world.deployment, v2, idempotency_key="ci-42")
    assert refused.value.field == "idempotency_key"
    reconciler.run_to_end(rows[0].pk)


def test_a_second_load_of_the_model_in_flight_is_a_conflict(world):
    v1, v2 = world.version(1), world.version(2)
    rows, _ = loads.request_load(world.user, world.deployment, v1)

    with pytest.raises(Conflict, match="in flight") as refused:
        loads.request_load(world.user, world.deployment, v2)

    assert refused.value.field == "version"
    assert ModelLoad.objects.filter(version=v2).count() == 0
    reconciler.run_to_end(rows[0].pk)


def test_quota_exceeded_fails_readably_and_holds_nothing(world):
    world.quota.units, world.quota.memory_mib = 1, 1024
    world.quota.save()
    big = world.version(1, config={"instance_group": [{"count": 3, "kind": "KIND_CPU"}]})

    load = load_once(world, big)

    assert load.state == State.FAILED
    assert "model instances quota" in load.error and "asks 3, 1 left of 1" in load.error
    assert held(world) == (0, 0)
    assert world.served not in {r["name"] for r in httpx.post(
        f"{world.triton.http_url}/v2/repository/index", timeout=5).json()}


def test_node_memory_is_admitted_too(world):
    world.node.memory_mib = 100
    world.node.save()
    load = load_once(world, world.version(1, memory=200))

    assert load.state == State.FAILED
    assert "node localhost has too little free memory: asks 200 MiB, 100 MiB free" in load.error


def test_a_checksum_mismatch_fails_and_leaves_nothing(world, settings):
    version = world.version(1, sha256="0" * 64)

    load = load_once(world, version)

    assert load.state == State.FAILED
    assert "0" * 64 in load.error and "sha256" in load.error
    assert held(world) == (0, 0)
    assert not list(Path(settings.SWITCHYARD_ARTIFACT_CACHE).glob("*"))
    assert not (Path(world.server.model_repository) / world.served).exists()


def test_a_broken_model_fails_with_the_servers_explanation_and_is_cleaned_up(world):
    broken = world.version(1, blob=make_artifact(world.model.name, 1, model_py=BROKEN_MODEL_PY))

    load = load_once(world, broken)

    assert load.state == State.FAILED
    assert "model.py" in load.error and ("line 4" in load.error or "SyntaxError" in load.error)
    assert held(world) == (0, 0)
    assert not (Path(world.server.model_repository) / world.served / "1").exists()
    assert index_state(world.triton, world.served).get("1") != "READY"


def test_an_unreachable_server_is_retried_then_fails_and_releases_quota(world, settings):
    world.server.http_url = "http://127.0.0.1:9"
    world.server.save()
    load = load_once(world, world.version(1))

    assert load.state == State.FAILED
    assert "127.0.0.1:9" in load.error
    assert held(world) == (0, 0)
    assert any("retry" in e.message for e in load.events.all())


def test_production_deployments_load_approved_versions_only(world):
    world.deployment.production = True
    world.deployment.save()
    version = world.version(1)
    version.status = ModelVersion.Status.PENDING_APPROVAL
    ModelVersion.objects.filter(pk=version.pk).update(status=version.status)

    with pytest.raises(DomainError, match="approved versions only"):
        loads.request_load(world.user, world.deployment, version)


def _killed_worker(load_id: int) -> None:
    """Run one step the way a worker does, and die in the middle of the download."""
    from fleet.adapters import s3

    real_fetch = s3.S3ArtifactStore.fetch

    def fetch_then_die(self, uri, *, sha256, size, progress=None):
        if progress:
            progress(size // 2, size)
        os._exit(17)  # no cleanup, no finally: a SIGKILLed worker

    s3.S3ArtifactStore.fetch = fetch_then_die
    try:
        reconciler.advance(load_id)
    finally:
        s3.S3ArtifactStore.fetch = real_fetch


def test_a_worker_killed_mid_fetch_is_taken_over_and_the_load_finishes(world):
    version = world.version(1)
    rows, _ = loads.request_load(world.user, world.deployment, version)
    load_id = rows[0].pk
    reconciler.advance(load_id)  # pending → admitted

    connections.close_all()  # the child opens its own connection
    child = multiprocessing.get_context("fork").Process(target=_killed_worker, args=(load_id,))
    child.start()
    child.join(60)
    assert child.exitcode == 17

    stuck = ModelLoad.objects.get(pk=load_id)
    assert stuck.state == State.FETCHING and stuck.lease_owner  # claimed, then abandoned
    assert reconciler.advance(load_id) is None  # the lease still holds: nobody steps in yet
    time.sleep(2.2)  # the lease runs out
    load = reconciler.run_to_end(load_id)

    assert load.state == State.READY, load.error
    assert any("took over" in e.message for e in load.events.all())
    assert held(world) == (1, 64)
