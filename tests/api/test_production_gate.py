"""Issue 20, item 2: a deployer cannot sidestep the production approval.

Marking a deployment production or not is an approver's change, refused while a version that
is not approved is on the deployment; the production alias names approved versions only, and
a rollout's promotion leaves it where it is rather than point it at any other. Run as the
hostile deployer would: through the API with a deployer token of the tenant.
"""

from __future__ import annotations

import pytest

from console.exceptions import Conflict, DomainError
from fleet.models import AuditEvent, Membership
from rollouts.canary import reconciler as rollout_reconciler
from rollouts.canary import requests as rollouts
from rollouts.deployments import lifecycle as deployments
from rollouts.loads import requests as loads
from rollouts.models import Alias, Deployment, ModelLoad, ModelVersion, Rollout, RolloutEvent
from tests.factories import (
    AliasFactory,
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)
from tests.rollouts.traffic.test_routes import Plain, ready

Role = Membership.Role
Status = ModelVersion.Status


@pytest.fixture
def prod(tenant_a, alice):
    """acme-like: a production deployment, v1 approved, v2 waiting for approval."""
    cluster = ClusterFactory(name="c-prod-gate")
    server = InferenceServerFactory(cluster=cluster, name="triton-1")
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    v1 = ModelVersionFactory(model=model, version=1, status=Status.APPROVED)
    v2 = ModelVersionFactory(model=model, version=2, status=Status.PENDING_APPROVAL)
    deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=cluster,
                                   name="fraud-scorer-prod", production=True)
    deployment.servers.set([server])
    return {"model": model, "v1": v1, "v2": v2, "deployment": deployment, "server": server}


@pytest.fixture
def deployer(token_client, tenant_a):
    return token_client(tenant_a, Role.DEPLOYER)


@pytest.fixture
def approver(token_client, tenant_a):
    return token_client(tenant_a, Role.APPROVER)


def url(deployment: Deployment) -> str:
    return f"/api/v1/deployments/{deployment.pk}/"


def test_a_deployer_cannot_turn_production_off_to_load_an_unapproved_version(deployer, prod):
    """The issue's sequence, step by step: every door stays shut and v2 never reaches the
    production deployment."""
    deployment, load = prod["deployment"], {"deployment": prod["deployment"].pk, "version": 2}

    refused = deployer.post("/api/v1/loads/", load, format="json")
    assert refused.status_code == 400, refused.content
    assert "approved versions only" in refused.json()["version"][0]

    off = deployer.patch(url(deployment), {"production": False}, format="json")
    assert off.status_code == 403, off.content
    assert "an approver must change whether deployment fraud-scorer-prod is production" in (
        off.json()["detail"])

    again = deployer.post("/api/v1/loads/", load, format="json")
    assert again.status_code == 400, again.content

    on = deployer.patch(url(deployment), {"production": True}, format="json")
    assert on.status_code == 200, on.content  # it is production already: nothing changes

    deployment.refresh_from_db()
    assert deployment.production
    assert not ModelLoad.objects.filter(deployment=deployment, version=prod["v2"]).exists()
    assert not AuditEvent.objects.filter(object_type="rollouts.deployment").exists()


def test_a_deployer_cannot_mark_a_deployment_production_either(deployer, prod):
    ModelVersion.objects.filter(pk=prod["v2"].pk).update(status=Status.APPROVED)
    Deployment.objects.filter(pk=prod["deployment"].pk).update(production=False)

    response = deployer.patch(url(prod["deployment"]), {"production": True}, format="json")

    assert response.status_code == 403
    assert "an approver must change" in response.json()["detail"]
    assert not Deployment.objects.get(pk=prod["deployment"].pk).production


def test_a_deployer_still_changes_everything_else_and_may_create_a_production_deployment(
    deployer, prod
):
    changed = deployer.patch(url(prod["deployment"]), {"slo_p99_ms": 80, "production": True},
                             format="json")
    created = deployer.post("/api/v1/deployments/", {
        "name": "fraud-scorer-eu", "model": prod["model"].pk, "cluster": "c-prod-gate",
        "production": True}, format="json")

    assert changed.status_code == 200, changed.content
    assert changed.json()["slo_p99_ms"] == 80
    assert created.status_code == 201, created.content
    assert created.json()["production"] is True


def test_the_production_alias_never_names_a_version_that_is_not_approved(deployer, prod):
    body = {"model": prod["model"].pk, "name": "production", "version": 2}

    created = deployer.post("/api/v1/aliases/", body, format="json")
    assert created.status_code == 400, created.content
    assert created.json() == {"version": [
        "@production names approved versions only; v2 is pending approval: have it approved first"]}
    assert not Alias.objects.exists()

    # Nor by moving it there once it names an approved version.
    alias = AliasFactory(model=prod["model"], name="production", version=prod["v1"])
    moved = deployer.post("/api/v1/aliases/", body, format="json")
    patched = deployer.patch(f"/api/v1/aliases/{alias.pk}/", {"version": 2}, format="json")
    assert (moved.status_code, patched.status_code) == (400, 400)
    assert "version" in moved.json() and "version" in patched.json()
    assert Alias.objects.get().version == prod["v1"]


def test_other_aliases_and_approved_versions_move_as_before(deployer, prod):
    staging = deployer.post("/api/v1/aliases/", {"model": prod["model"].pk, "name": "staging",
                                                 "version": 2}, format="json")
    production = deployer.post("/api/v1/aliases/", {"model": prod["model"].pk,
                                                    "name": "production", "version": 1},
                               format="json")

    assert (staging.status_code, production.status_code) == (201, 201)


def test_an_approver_turns_production_off_and_on_when_nothing_unapproved_is_there(
    approver, prod
):
    deployment = prod["deployment"]
    ready(deployment, prod["v1"], prod["server"])  # an approved version may stay

    off = approver.patch(url(deployment), {"production": False, "reason": "staging soak"},
                         format="json")
    on = approver.patch(url(deployment), {"production": True, "reason": "back in service"},
                        format="json")

    assert (off.status_code, on.status_code) == (200, 200), (off.content, on.content)
    assert on.json()["production"] is True
    first, second = AuditEvent.objects.filter(object_type="rollouts.deployment").order_by("id")
    assert (first.verb, first.before, first.after, first.reason) == (
        "updated", {"production": True}, {"production": False}, "staging soak")
    assert (second.after, second.reason) == ({"production": True}, "back in service")
    assert first.actor_label == second.actor_label == (
        f"token:{approver.issued.token.name}@tenant-a")


def test_turning_production_on_with_an_unapproved_load_queued_is_a_409(
    approver, deployer, prod
):
    """With the flag off (an approver's call), a deployer may load v2; the flag then stays
    off until v2 is gone or approved."""
    deployment = prod["deployment"]
    assert approver.patch(url(deployment), {"production": False}, format="json").status_code == 200
    loaded = deployer.post("/api/v1/loads/", {"deployment": deployment.pk, "version": 2},
                           format="json")
    assert loaded.status_code == 202, loaded.content
    load_id = loaded.json()[0]["id"]

    on = approver.patch(url(deployment), {"production": True}, format="json")

    assert on.status_code == 409, on.content
    [message] = on.json()["production"]
    assert f"v2 (pending approval): load {load_id} pending on triton-1" in message
    assert not Deployment.objects.get(pk=deployment.pk).production

    ModelLoad.objects.filter(pk=load_id).update(state=ModelLoad.State.FAILED)
    assert approver.patch(url(deployment), {"production": True}, format="json").status_code == 200


def test_a_ready_unapproved_version_is_named_and_approving_it_opens_the_way(approver, prod):
    deployment = prod["deployment"]
    Deployment.objects.filter(pk=deployment.pk).update(production=False)
    load = ready(deployment, prod["v2"], prod["server"])

    refused = approver.patch(url(deployment), {"production": True}, format="json")
    assert refused.status_code == 409
    assert f"load {load.pk} ready on triton-1" in refused.json()["production"][0]

    ModelVersion.objects.filter(pk=prod["v2"].pk).update(status=Status.APPROVED)
    assert approver.patch(url(deployment), {"production": True}, format="json").status_code == 200


# --- rollouts: the flag and the alias they move ------------------------------------------------


@pytest.fixture
def canary(db, use_route_nginx, tenant_a, dave, settings):
    """A canary of registered v2 against approved v1 on a deployment that is not production
    (no approval needed), @production on v1."""
    settings.SWITCHYARD_ROLLOUT_INTERVAL_S = 30
    plain = Plain(tenant_a)
    ModelVersion.objects.filter(pk=plain.v1.pk).update(status=Status.APPROVED)
    for version in (plain.v1, plain.v2):
        ready(plain.deployment, version, plain.a)
    AliasFactory(model=plain.model, name="production", version=plain.v1)
    made, _ = rollouts.create_rollout(dave, plain.deployment, version=2, baseline=1,
                                      servers=["triton-a"], alias="production",
                                      unload_previous=False,
                                      steps=[{"set_weight": 10}, {"pause": {}}])
    assert made.state == Rollout.State.LOADING  # no approver asked for
    plain.rollout = made
    return plain


def test_a_rollout_of_an_unapproved_version_in_flight_keeps_production_off(canary, erin):
    deployment = Deployment.objects.get(pk=canary.deployment.pk)
    deployment.production = True

    with pytest.raises(Conflict) as refused:
        deployments.save_deployment(erin, deployment)

    assert refused.value.field == "production"
    assert f"rollout {canary.rollout.pk} (loading) of v2 (registered)" in refused.value.message
    assert not Deployment.objects.get(pk=deployment.pk).production


def test_promoting_an_unapproved_version_leaves_the_production_alias_and_says_so(canary, dave):
    rollout_reconciler.advance(canary.rollout.pk, force=True)  # loading: both ready, so progressing
    rollout_reconciler.advance(canary.rollout.pk, force=True)  # 10% to v2
    rollouts.request_action(dave, Rollout.objects.get(pk=canary.rollout.pk), "promote")
    for _ in range(10):
        rollout_reconciler.advance(canary.rollout.pk, force=True)
        if Rollout.objects.get(pk=canary.rollout.pk).state in Rollout.FINAL:
            break

    ended = Rollout.objects.get(pk=canary.rollout.pk)
    assert ended.state == Rollout.State.SUCCEEDED, (ended.state, ended.reason)
    assert Alias.objects.get(model=canary.model, name="production").version == canary.v1
    note = RolloutEvent.objects.filter(rollout=ended).order_by("id").last().message
    assert "v2 promoted: all traffic; the production alias was left where it was: " \
           "@production names approved versions only; v2 is registered" in note


def test_a_load_read_before_the_flag_went_on_is_checked_again_under_the_lock(prod, dave):
    """A load request that read the deployment as not production, while an approver marked
    it production before the load's lock was taken, is refused all the same."""
    stale = Deployment.objects.get(pk=prod["deployment"].pk)
    stale.production = False  # as the request read it, a moment before the approver's change

    with pytest.raises(DomainError, match="production deployments load approved versions only"):
        loads.request_load(dave, stale, prod["v2"])

    assert not ModelLoad.objects.filter(deployment=prod["deployment"]).exists()
