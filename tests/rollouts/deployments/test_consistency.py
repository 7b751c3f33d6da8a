"""One version everywhere: a deployment's servers judged against each other, and converged."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from console.exceptions import Conflict
from fleet.models import AuditEvent, InferenceServer
from rollouts.deployments import consistency
from rollouts.deployments.consistency import judge
from rollouts.loads import drift
from rollouts.models import Deployment, ModelLoad, Rollout
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

State = ModelLoad.State
H1, H2 = "a" * 64, "b" * 64
SERVERS = {1: "s-1", 2: "s-2", 3: "s-3"}
NOW = timezone.now()


def E(server: int, version: int, state: str, config_hash: str) -> consistency.Entry:
    """A load as the judge sees it (``ready_at`` set when ready)."""
    return consistency.entry(server, version, state, config_hash,
                             NOW if state == State.READY else None)


# --------------------------------------------------------------------------------------------
# Judging plain values
# --------------------------------------------------------------------------------------------


def test_servers_serving_the_same_versions_with_one_config_agree():
    found = judge(SERVERS, [E(pk, v, State.READY, H1) for pk in SERVERS for v in (1, 2)])
    assert found.consistent and found.state == "consistent" and found.reasons == []


def test_a_version_missing_from_one_server_disagrees_and_names_it():
    found = judge(SERVERS, [E(1, 1, State.READY, H1), E(2, 1, State.READY, H1),
                            E(3, 2, State.READY, H1)])
    assert not found.consistent
    assert found.missing == {1: [3], 2: [1, 2]}
    assert "v1 is not ready on s-3 (it is on s-1, s-2)" in found.reasons
    assert (3, 1) in found.odd and (1, 2) in found.odd


def test_a_config_most_servers_do_not_run_disagrees():
    found = judge(SERVERS, [E(1, 1, State.READY, H1), E(2, 1, State.READY, H1),
                            E(3, 1, State.READY, H2)])
    assert found.mixed == {1: [1, 2, 3]} and found.majority == {1: H1}
    assert set(found.odd) == {(3, 1)}
    assert found.reasons == [f"v1 runs with 2 configs: s-1 {H1[:12]}, s-2 {H1[:12]}, s-3 {H2[:12]}"]


def test_with_as_many_servers_on_each_config_every_one_disagrees():
    found = judge({1: "s-1", 2: "s-2"}, [E(1, 1, State.READY, H1), E(2, 1, State.READY, H2)])
    assert set(found.odd) == {(1, 1), (2, 1)} and found.majority == {}


def test_a_load_in_flight_makes_a_disagreement_read_converging():
    found = judge({1: "s-1", 2: "s-2"}, [E(1, 2, State.READY, H1),
                                         E(2, 2, State.LOADING, "")])
    assert found.state == "converging" and not found.consistent


def test_a_version_reloading_still_serves_its_previous_config_meanwhile():
    reloading = consistency.entry(2, 1, State.LOADING, H2, NOW)
    found = judge({1: "s-1", 2: "s-2"}, [E(1, 1, State.READY, H1), reloading])
    assert found.state == "converging" and found.mixed == {1: [1, 2]}


def test_one_server_or_none_always_agrees():
    assert judge({1: "s-1"}, [E(1, 1, State.READY, H1), E(1, 2, State.READY, H2)]).consistent
    assert judge({}, []).consistent


# --------------------------------------------------------------------------------------------
# A deployment's view, and converging it
# --------------------------------------------------------------------------------------------


@pytest.fixture
def two(tenant_a):
    """Tenant A's deployment on two servers, v1 and v2 of its model, nothing loaded."""
    cluster = ClusterFactory(name="c")
    servers = [InferenceServerFactory(cluster=cluster, name=f"triton-{i}") for i in (1, 2)]
    model = ModelFactory(tenant=tenant_a, name="scorer")
    deployment = DeploymentFactory(model=model, cluster=cluster, name="scorer")
    deployment.servers.set(servers)

    class Two:
        pass

    two = Two()
    two.__dict__.update(deployment=deployment, servers=servers,
                        v1=ModelVersionFactory(model=model, version=1),
                        v2=ModelVersionFactory(model=model, version=2))
    return two


def ready(two, version, server, config_hash=H1, **fields) -> ModelLoad:
    return ModelLoad.objects.create(
        tenant=two.deployment.tenant, deployment=two.deployment, server=server, version=version,
        state=State.READY, config_hash=config_hash, ready_at=timezone.now(),
        requested_by_label="seed", **fields)


def test_the_view_shows_each_server_with_its_version_hash_and_state(two):
    a, b = two.servers
    ready(two, two.v1, a)
    ready(two, two.v1, b, H2)
    ready(two, two.v2, a)

    seen = consistency.view(two.deployment)

    assert seen.state == "inconsistent"
    rows = [(r.server.name, r.version, r.state, r.config_short, r.disagrees) for r in seen.rows]
    assert rows == [
        ("triton-1", 1, "ready", H1[:12], True),
        ("triton-1", 2, "ready", H1[:12], False),
        ("triton-2", 1, "ready", H2[:12], True),
        ("triton-2", 2, "missing", "", True),
    ]


def test_a_kubernetes_workload_server_is_shown_and_not_judged(two):
    a, b = two.servers
    b.source = InferenceServer.Source.MANAGED
    b.save()
    ready(two, two.v1, a)
    seen = consistency.view(two.deployment)
    assert seen.consistent
    assert [(r.server.name, r.state, r.judged) for r in seen.rows] == [
        ("triton-1", "ready", True), ("triton-2", "nothing loaded", False)]


def test_the_list_states_match_each_deployments_view(two, tenant_a):
    a, _b = two.servers
    ready(two, two.v1, a)
    other = DeploymentFactory(model=two.deployment.model, cluster=two.deployment.cluster, name="o")
    other.servers.set(two.servers)
    empty = DeploymentFactory(model=two.deployment.model, cluster=two.deployment.cluster, name="e")
    states = consistency.states_of([two.deployment, other, empty])
    assert states == {two.deployment.pk: "inconsistent", other.pk: "consistent",
                      empty.pk: "consistent"}
    assert states[two.deployment.pk] == consistency.view(two.deployment).state


def test_converging_loads_what_is_missing_and_sends_the_config_again(two, dave):
    """GIVEN v1 on both servers with two configs (one left by a benchmark's override) and
    v2 on the first only,
    WHEN a deployer converges,
    THEN v2 is requested on the second (whose load sends the model's config there) and v1's
    own config is sent again to the first, in one audit entry; asking again while that runs
    is a 409 and starts nothing more."""
    a, b = two.servers
    ready(two, two.v1, a)
    ready(two, two.v1, b, H2, config_override={"max_batch_size": 8})
    ready(two, two.v2, a)

    done = consistency.converge(dave, two.deployment)

    assert [(load.server.name, load.version.version, load.state) for load in done.loads] == [
        ("triton-2", 2, State.PENDING)]
    assert done.loads[0].requested_by_label == "converge by dave"
    assert [load.server.name for load in done.reloads] == ["triton-1"]
    assert "reload of v1 on triton-1 with its own config requested by converge by dave" in (
        done.reloads[0].events.last().message)
    assert done.reloads[0].state == State.LOADING and done.reloads[0].ready_at
    audit = AuditEvent.objects.get(verb="converged", object_id=str(two.deployment.pk))
    assert audit.actor_label == "dave" and audit.before["state"] == "inconsistent"
    assert sorted(audit.after["reloads"]) == sorted(load.pk for load in done.reloads)
    assert Deployment.objects.get(pk=two.deployment.pk).converged_at is not None
    assert consistency.view(two.deployment).state == "converging"

    with pytest.raises(Conflict, match="wait for it to finish"):
        consistency.converge(dave, two.deployment)
    assert ModelLoad.objects.filter(deployment=two.deployment).count() == 4
    assert AuditEvent.objects.filter(verb="converged").count() == 1


def test_a_deployment_whose_servers_agree_has_nothing_to_converge(two, dave):
    for server in two.servers:
        ready(two, two.v1, server)
    with pytest.raises(Conflict, match="nothing to converge") as refused:
        consistency.converge(dave, two.deployment)
    assert refused.value.status_code == 409
    assert not AuditEvent.objects.filter(verb="converged").exists()


def test_a_viewer_may_not_converge(two, bob):
    ready(two, two.v1, two.servers[0])
    with pytest.raises(PermissionDenied, match="deployer"):
        consistency.converge(bob, two.deployment)


def test_a_rollout_under_way_is_left_to_finish(two, dave):
    ready(two, two.v1, two.servers[0])
    rollout = Rollout.objects.create(tenant=two.deployment.tenant, deployment=two.deployment,
                                     baseline=two.v1, candidate=two.v2,
                                     state=Rollout.State.PROGRESSING, requested_by_label="seed")
    with pytest.raises(Conflict, match=f"rollout {rollout.pk} is changing"):
        consistency.converge(dave, two.deployment)
    assert consistency.blocker(two.deployment).startswith(f"rollout {rollout.pk}")


def test_a_deployment_that_asks_for_it_converges_on_the_tick_and_not_again_at_once(two):
    a, _b = two.servers
    ready(two, two.v1, a)
    assert consistency.converge_due() == 0  # auto_converge is off

    Deployment.objects.filter(pk=two.deployment.pk).update(auto_converge=True)
    assert consistency.converge_due() == 1
    load = ModelLoad.objects.get(deployment=two.deployment, server=two.servers[1])
    assert load.requested_by_label == "converge by system"
    assert AuditEvent.objects.get(verb="converged").actor_label == "system"

    # The load fails: the deployment disagrees again, and waits its turn before a retry.
    ModelLoad.objects.filter(pk=load.pk).update(state=State.FAILED)
    assert consistency.converge_due() == 0
    later = timezone.now() + timedelta(seconds=consistency.AUTO_CONVERGE_EVERY_S + 1)
    assert consistency.converge_due(later) == 1


def test_a_refused_automatic_convergence_is_recorded_and_waits(two):
    a, _b = two.servers
    ready(two, two.v1, a)
    two.v1.status = "rejected"
    two.v1.save(update_fields=["status"])
    Deployment.objects.filter(pk=two.deployment.pk).update(auto_converge=True)
    assert consistency.converge_due() == 0
    refused = AuditEvent.objects.get(verb="converge_refused")
    assert "rejected" in refused.reason
    assert not ModelLoad.objects.filter(server=two.servers[1]).exists()
    assert consistency.converge_due() == 0
    assert AuditEvent.objects.filter(verb="converge_refused").count() == 1


def test_a_config_left_by_an_override_is_sent_the_versions_own_config_again(two, dave):
    a, b = two.servers
    ready(two, two.v1, a)
    odd = ready(two, two.v1, b, H2, config_override={"max_batch_size": 8})
    done = consistency.converge(dave, two.deployment, reason="one config everywhere")
    assert sorted(load.server.name for load in done.reloads) == ["triton-1", "triton-2"]
    odd.refresh_from_db()
    assert odd.state == State.LOADING and odd.config_override is None and odd.ready_at
    reload_audit = AuditEvent.objects.get(verb="requested_reload", object_id=str(odd.pk))
    assert reload_audit.before == {"config_hash": H2, "config_override": True}
    assert AuditEvent.objects.get(verb="converged").reason == "one config everywhere"


def test_the_servers_of_deployments_of_several_servers_are_checked_often(two):
    alone = InferenceServerFactory(cluster=two.deployment.cluster, name="alone")
    single = DeploymentFactory(model=two.deployment.model, cluster=two.deployment.cluster, name="one")
    single.servers.set([alone])
    assert drift.servers_shared() == {s.pk for s in two.servers}
