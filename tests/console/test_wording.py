"""Counts read as people write them: "1 server", "2 servers", never "1 server(s)" or "1 cores"."""

from __future__ import annotations

import tokenize
from pathlib import Path

import pytest

from fleet.inventory import kube_sync
from fleet.models import Cluster
from rollouts.canary.pages import step_summary
from rollouts.models import ModelLoad, Rollout
from tests.api.benchmark_rows import finished_job
from tests.console.test_tenancy_matrix import World
from tests.factories import InferenceServerFactory, NodeFactory

ROOT = Path(__file__).resolve().parents[2]


def test_unloading_from_one_server_says_server(request, db):
    world = World(request)
    world.ready_a

    response = world.browser("dave").post(
        f"/registry/deployments/{world.served_a.pk}/load/",
        {"version": world.version_a.pk, "action": "unload"}, follow=True)

    assert "Unloading v1 from 1 server." in response.content.decode()
    assert ModelLoad.objects.get(pk=world.load_a.pk).state == ModelLoad.State.UNLOADING


@pytest.mark.parametrize(("steps", "state", "reads"), [
    ([{"set_weight": 100}], Rollout.State.PENDING_APPROVAL, "1 step"),
    ([{"set_weight": 10}, {"set_weight": 100}], Rollout.State.PENDING_APPROVAL, "2 steps"),
    ([{"set_weight": 100}], Rollout.State.SUCCEEDED, "the one step done"),
    ([{"set_weight": 10}, {"set_weight": 100}], Rollout.State.SUCCEEDED, "all 2 steps done"),
])
def test_a_rollouts_steps_are_counted_in_words(steps, state, reads):
    rollout = Rollout(strategy=Rollout.Strategy.CANARY, steps=steps, state=state)

    assert step_summary(rollout) == reads


def test_a_cluster_of_one_node_and_one_server_says_so(db):
    cluster = Cluster.objects.create(name="k", kind=Cluster.Kind.KUBERNETES)
    NodeFactory(cluster=cluster, synced=True, ready=True)
    InferenceServerFactory(cluster=cluster, source="discovered")

    assert kube_sync.summary(cluster) == "1 node; 1 discovered server"


def test_a_node_of_one_core_and_a_sweep_of_one_config_read_in_the_singular(request, db):
    world = World(request)
    NodeFactory(cluster=world.cluster, name="tiny", cpu_cores=1)
    finished_job(world.served_a, world.version_a,
                 configs=[{"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}])
    client = world.browser("alice")

    fleet = client.get("/fleet/").content.decode()
    benchmarks = client.get("/registry/benchmarks/").content.decode()

    assert " · 1 core · " in fleet
    assert "1 config</div>" in benchmarks


def test_no_user_facing_text_says_s_in_brackets():
    """Templates and the strings in the code name one thing or several; "(s)" is left to
    units ("Duration (s)": seconds)."""
    units = ("Duration (s)", "Warm-up (s)", "Request deadline (s)")
    found = []
    for path in ROOT.glob("templates/**/*.html"):
        found += [f"{path.relative_to(ROOT)}: {line.strip()}"
                  for line in path.read_text().splitlines() if "(s)" in line]
    for app in ("console", "fleet", "rollouts"):
        for path in (ROOT / app).rglob("*.py"):
            with path.open("rb") as source:
                strings = [t.string for t in tokenize.tokenize(source.readline)
                           if t.type == tokenize.STRING]
            found += [f"{path.relative_to(ROOT)}: {text}" for text in strings
                      if "(s)" in text and not any(unit in text for unit in units)]

    assert found == []
