"""One version everywhere on real Triton servers: two servers of one deployment made to run
v1 with different configs read inconsistent within one health tick, and converge when asked
(and by themselves, when the deployment says so).

GIVEN the load-test world (tests/rollouts/triton_world.py) on the session's Triton, and a
second Triton of this module's own as a second server of the deployment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from django.conf import settings

from console.exceptions import Conflict
from fleet.adapters.base import AdapterError
from fleet.adapters.triton_runtime import TritonServerRuntime
from fleet.inventory import health
from fleet.models import AuditEvent, InferenceServer
from local.triton import TritonProcess, start_triton
from rollouts import tasks
from rollouts.deployments import consistency
from rollouts.loads import reconciler
from rollouts.loads import requests as loads
from rollouts.models import Deployment, ModelLoad
from tests.rollouts.triton_world import held

State = ModelLoad.State


@pytest.fixture(scope="module")
def second_triton(triton_runtime, tmp_path_factory) -> Iterator[TritonProcess]:
    base = tmp_path_factory.mktemp("consistency-triton")
    (base / "models").mkdir()
    proc = start_triton(triton_runtime, base / "models", log_path=base / "tritonserver.log")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def pair(world, second_triton, settings):
    """The world's deployment on the world's Triton and a second one, v1 ready on both;
    health ticks a second apart."""
    settings.SWITCHYARD_HEALTH_INTERVAL_S = 1.0
    other = InferenceServer.objects.create(
        cluster=world.cluster, node=world.node, name="triton-2",
        runtime=InferenceServer.Runtime.TRITON, http_url=second_triton.http_url,
        model_repository=str(second_triton.model_repository),
        log_path=str(second_triton.log_path))
    world.deployment.servers.add(other)
    world.other, world.v1 = other, world.version(1)
    rows, created = loads.request_load(world.user, world.deployment, world.v1)
    assert created and len(rows) == 2
    for row in rows:
        done = reconciler.run_to_end(row.pk)
        assert done.state == State.READY, done.error
    yield world
    rows = loads.request_unload(world.user, world.deployment, world.v1, server_names=["triton-2"])
    for row in rows:
        reconciler.run_to_end(row.pk)


def served_config(triton_url: str, name: str) -> dict:
    answer = httpx.get(f"{triton_url}/v2/models/{name}/versions/1/config", timeout=5)
    answer.raise_for_status()
    return answer.json()


def reload_by_hand(triton_url: str, name: str, instances: int) -> None:
    """Someone reloads v1 through Triton's repository API with another instance count."""
    config = served_config(triton_url, name)
    config["instance_group"][0]["count"] = instances
    answer = httpx.post(f"{triton_url}/v2/repository/models/{name}/load",
                        json={"parameters": {"config": json.dumps(config)}}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert served_config(triton_url, name)["instance_group"][0]["count"] == instances


def health_tick(world) -> None:
    """One health tick, an interval after the last: every server probed, then the reconcile
    tick."""
    time.sleep(settings.SWITCHYARD_HEALTH_INTERVAL_S)
    for server in (world.server, world.other):
        assert health.check_server(server.pk) is not None
    tasks.reconcile_loads()


def run_loads(deployment: Deployment) -> None:
    for load in ModelLoad.objects.filter(deployment=deployment, state__in=ModelLoad.IN_FLIGHT):
        done = reconciler.run_to_end(load.pk)
        assert done.state == State.READY, done.error


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_two_servers_on_different_configs_read_inconsistent_within_a_tick_and_converge(pair):
    """WHEN v1 is reloaded by hand on the second server with two instances,
    THEN one health tick later the deployment reads inconsistent, naming both configs;
    WHEN a deployer converges, v1's own config is sent again: the second server runs one
    instance again, the first is left as it runs, and the deployment reads consistent; a
    second converge has nothing to do."""
    world, name = pair, pair.served
    seen = consistency.view(world.deployment)
    assert seen.consistent, seen.reasons
    first_hash = {r.config_hash for r in seen.rows}
    assert len(first_hash) == 1 and "" not in first_hash
    # The tick ran just before: the servers' configs were read a moment ago.
    health_tick(world)

    reload_by_hand(world.other.http_url, name, 2)
    health_tick(world)

    seen = consistency.view(world.deployment)
    assert seen.state == "inconsistent", [(r.server.name, r.config_short) for r in seen.rows]
    assert [(r.server.name, r.disagrees) for r in seen.rows] == [("triton", True), ("triton-2", True)]
    assert seen.reasons[0].startswith("v1 runs with 2 configs")

    done = consistency.converge(world.user, world.deployment, reason="one config everywhere")
    assert done.loads == [] and len(done.reloads) == 2
    run_loads(world.deployment)

    assert served_config(world.other.http_url, name)["instance_group"][0]["count"] == 1
    seen = consistency.view(world.deployment)
    assert seen.consistent, seen.reasons
    assert {r.config_hash for r in seen.rows} == first_hash
    assert all(r.state == State.READY for r in seen.rows)
    health_tick(world)
    assert consistency.view(world.deployment).consistent
    with pytest.raises(Conflict, match="nothing to converge"):
        consistency.converge(world.user, world.deployment)
    assert AuditEvent.objects.filter(verb="converged").count() == 1


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_a_deployment_that_converges_by_itself_does_so_on_the_tick(pair):
    world, name = pair, pair.served
    Deployment.objects.filter(pk=world.deployment.pk).update(auto_converge=True)
    health_tick(world)
    reload_by_hand(world.other.http_url, name, 2)

    health_tick(world)  # sees the disagreement and starts converging
    assert AuditEvent.objects.get(verb="converged").actor_label == "system"
    run_loads(world.deployment)

    assert served_config(world.other.http_url, name)["instance_group"][0]["count"] == 1
    assert consistency.view(world.deployment).consistent


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_a_reload_the_server_refuses_leaves_the_version_serving_as_it_ran(pair, monkeypatch):
    """GIVEN the servers disagree, WHEN the server refuses the config converging sends,
    THEN the version stays ready there with the config it ran with and its quota held, the
    refusal on its timeline; the deployment still reads inconsistent."""
    world, name = pair, pair.served
    health_tick(world)
    reload_by_hand(world.other.http_url, name, 2)
    health_tick(world)
    held_before = held(world)

    def refuse(self, model, version, config, timeout=None):
        raise AdapterError("the server refused the config", permanent=True)

    monkeypatch.setattr(TritonServerRuntime, "load", refuse)
    done = consistency.converge(world.user, world.deployment)
    for load in done.reloads:
        settled = reconciler.run_to_end(load.pk)
        assert settled.state == State.READY and settled.error == "the server refused the config"
        assert "reload failed: the server refused the config" in settled.events.last().message
    assert served_config(world.other.http_url, name)["instance_group"][0]["count"] == 2
    assert held(world) == held_before
    assert not consistency.view(world.deployment).consistent
