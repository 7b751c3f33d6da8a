"""The rollouts API: requests (201, 200 replays, 409 in flight), reads, actions, approvals.

The reconciler is not run here except where an action is carried out; tests/rollouts/ drive
rollouts on real servers. A deployment on a local cluster (which has a traffic router) with
version 1 ready on both its servers is enough to ask for a rollout of version 2.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from fleet.models import AuditEvent, Cluster, Membership
from fleet.tenancy import tokens
from rollouts.canary import analysis as canary_analysis
from rollouts.canary import reconciler as rollout_reconciler
from rollouts.canary import requests as rollout
from rollouts.canary import specs as rollout_specs
from rollouts.models import ModelLoad, ModelVersion, Rollout, RolloutAnalysis, RolloutEvent, Route
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    MembershipFactory,
    ModelFactory,
    ModelVersionFactory,
    UserFactory,
)
from tests.fixtures import sent_tasks

URL = "/api/v1/rollouts/"
UNUSED = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def enqueued_rollouts(monkeypatch):
    """What would go to the broker (the reconciler's next tick) is kept here."""
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_rollout", sent.append)
    return sent


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class Plain:
    """A deployment of ``scorer`` on a local cluster, v1 ready on its two servers, v2 and v3
    registered (approved on a production deployment)."""

    def __init__(self, tenant, *, production: bool = False, kind: str = Cluster.Kind.LOCAL,
                 name: str = "scorer") -> None:
        self.cluster = ClusterFactory(name=f"c-{uuid.uuid4().hex[:6]}", kind=kind)
        self.a = InferenceServerFactory(cluster=self.cluster, name=f"triton-a-{name}",
                                        http_url=UNUSED)
        self.b = InferenceServerFactory(cluster=self.cluster, name=f"triton-b-{name}",
                                        http_url=UNUSED)
        self.model = ModelFactory(tenant=tenant, name=name)
        status = ModelVersion.Status.APPROVED if production else ModelVersion.Status.REGISTERED
        self.v1, self.v2, self.v3 = (ModelVersionFactory(model=self.model, version=n, status=status)
                                     for n in (1, 2, 3))
        self.deployment = DeploymentFactory(model=self.model, cluster=self.cluster, name=name,
                                            production=production)
        self.deployment.servers.set([self.a, self.b])
        for server in (self.a, self.b):
            ModelLoad.objects.create(tenant=tenant, deployment=self.deployment, server=server,
                                     version=self.v1, state=ModelLoad.State.READY,
                                     requested_by_label="seed")


@pytest.fixture
def plain(tenant_a) -> Plain:
    return Plain(tenant_a)


@pytest.fixture
def prod(tenant_a) -> Plain:
    return Plain(tenant_a, production=True, name="scorer-prod")


def api_as(user) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(user)
    return client


def ask(client: APIClient, deployment, key: str | None = None, **body: Any):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(URL, {"deployment": deployment.pk, "version": 2, **body}, format="json",
                       **headers)


def make(actor, setup: Plain, **kwargs: Any) -> Rollout:
    made, _ = rollout.create_rollout(actor, setup.deployment, version=kwargs.pop("version", 2),
                                     **kwargs)
    return made


def set_state(row: Rollout, state: str, **fields: Any) -> Rollout:
    Rollout.objects.filter(pk=row.pk).update(state=state, **fields)
    return Rollout.objects.get(pk=row.pk)


def field_error(response, field: str) -> str:
    body = response.json()
    assert list(body) == [field], body
    return " ".join(body[field])


# --- asking for a rollout --------------------------------------------------------------------


def test_a_canary_request_answers_201_with_the_rollout_loading(
    dave, plain, enqueued_rollouts, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = ask(api_as(dave), plain.deployment, reason="release 118")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["strategy"], body["baseline"], body["candidate"]) == (
        "loading", "canary", 1, 2)
    assert (body["deployment"], body["deployment_name"], body["model"]) == (
        plain.deployment.pk, "scorer", "scorer")
    assert body["requested_by_label"] == "dave" and body["reason"] == "release 118"
    assert [s["step"] for s in body["steps"]] == rollout_specs.DEFAULT_STEPS
    assert [s["index"] for s in body["steps"]] == list(range(6))
    assert not any(s["current"] or s["done"] for s in body["steps"])
    assert body["analysis"]["planned_samples"] == canary_analysis.ANALYSIS_DEFAULTS["planned_samples"]
    assert body["analysis"]["max_p99_ms"] == float(plain.deployment.slo_p99_ms)
    assert body["servers"] == [plain.a.name, plain.b.name]
    assert (body["is_active"], body["is_final"], body["route_url"]) == (True, False, None)
    assert body["events"][0]["message"] == (
        "canary of v2 against v1 requested by dave: release 118")
    assert body["events_total"] == 1 and body["analyses"] == [] and body["approvals"] == []
    assert enqueued_rollouts == [body["id"]]
    assert AuditEvent.objects.filter(verb="requested_rollout", object_id=str(body["id"])).exists()


def test_steps_and_analysis_are_taken_as_given(dave, plain):
    steps = [{"shadow": {"min_samples": 200}}, {"set_weight": 10}, {"analysis": {"alpha": 0.01}},
             {"pause": {"seconds": 30}}, {"approval": {}}, {"set_weight": 50}, {"pause": {}}]

    response = ask(api_as(dave), plain.deployment, steps=steps,
                   analysis={"planned_samples": 500, "max_p95_ms": 40})

    assert response.status_code == 201, response.content
    body = response.json()
    assert [s["step"] for s in body["steps"]] == [
        {"shadow": {"percent": 100, "min_samples": 200}}, {"set_weight": 10},
        {"analysis": {"alpha": 0.01}}, {"pause": {"seconds": 30.0}},
        {"approval": {}}, {"set_weight": 50}, {"pause": {}}]
    assert (body["analysis"]["planned_samples"], body["analysis"]["max_p95_ms"]) == (500, 40.0)
    assert Rollout.objects.get().analysis == {"planned_samples": 500, "max_p95_ms": 40.0}


def test_an_ab_split_names_its_variants_and_its_end(dave, plain):
    response = api_as(dave).post(URL, {
        "deployment": plain.deployment.name, "strategy": "ab", "sample_size": 200,
        "variants": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}],
        "sticky_header": "X-User", "promote": True,
    }, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["strategy"], body["baseline"], body["candidate"], body["sample_size"]) == (
        "ab", 1, None, 200)
    assert body["variants"] == [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]
    assert (body["sticky_header"], body["promote"], body["steps"]) == ("X-User", True, [])


def test_a_production_deployments_rollout_waits_for_an_approver(dave, prod):
    response = ask(api_as(dave), prod.deployment)

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["requires_approval"], body["alias"]) == (
        "pending_approval", True, "production")
    assert body["waiting_for"] == "an approver who is not the requester"


def test_the_same_idempotency_key_replays_the_first_request(dave, plain):
    client = api_as(dave)

    first = ask(client, plain.deployment, key="release-118")
    again = ask(client, plain.deployment, key="release-118")

    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["idempotency_key"] == "release-118"
    assert Rollout.objects.count() == 1


def test_a_key_reused_for_another_request_is_a_409_naming_it(dave, plain):
    client = api_as(dave)
    ask(client, plain.deployment, key="release-118")

    response = ask(client, plain.deployment, key="release-118", version=3)

    assert response.status_code == 409
    assert "used for a different request" in field_error(response, "idempotency_key")
    assert Rollout.objects.count() == 1


def test_a_key_over_200_characters_is_a_400(dave, plain):
    response = ask(api_as(dave), plain.deployment, key="k" * 201)

    assert response.status_code == 400
    assert "at most 200" in field_error(response, "idempotency_key")


def test_a_second_rollout_in_flight_is_a_409_naming_the_deployment(dave, plain):
    client = api_as(dave)
    first = ask(client, plain.deployment)

    response = ask(client, plain.deployment, version=3)

    assert response.status_code == 409
    assert f"rollout {first.json()['id']} is loading" in field_error(response, "deployment")


RACERS = 20


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_requests_make_one_rollout_and_the_rest_are_409(dave, plain):
    """GIVEN 20 clients asking at once for a rollout of the same deployment (without a key)
    THEN exactly one is made (201) and every other answer is a 409 naming the deployment."""
    start = threading.Barrier(RACERS)

    def post(_: int) -> tuple[int, Any]:
        client = APIClient(raise_request_exception=False)
        client.force_authenticate(dave)
        try:
            start.wait(timeout=30)
            response = ask(client, plain.deployment)
            return response.status_code, response.json()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=RACERS) as pool:
        answers = list(pool.map(post, range(RACERS)))

    assert Counter(code for code, _ in answers) == {201: 1, 409: RACERS - 1}, answers
    [made] = Rollout.objects.all()
    assert all(list(body) == ["deployment"] and f"rollout {made.pk}" in body["deployment"][0]
               for code, body in answers if code == 409)


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"version": None}, "version", "may not be null"),
    ({"version": 9}, "version", "scorer has no version 9"),
    ({"version": 1}, "version", "v1 is the baseline already"),
    ({"baseline": 3}, "baseline", "v3 is not ready"),
    ({"strategy": "blue-green"}, "strategy", "not a valid choice"),
    ({"steps": []}, "steps", "must be a non-empty list of steps"),
    ({"steps": {"set_weight": 5}}, "steps", "must be a non-empty list of steps"),
    ({"steps": [{"set_weight": 150}]}, "steps", "steps[0]: set_weight is an integer from 0 to 100"),
    ({"steps": [{"set_weight": 5}, {"jump": {}}]}, "steps", "steps[1]: unknown step 'jump'"),
    ({"steps": [{"pause": {"minutes": 5}}]}, "steps", "steps[0]: pause is {}"),
    ({"steps": [{"analysis": {"alpha": 0.9}}]}, "steps", "steps[0].alpha: must be a number"),
    ({"steps": [{"set_weight": 5}, {"shadow": {}}]}, "steps",
     "steps[1]: a shadow step runs before the candidate serves anyone; here it has 5%"),
    ({"steps": [{"shadow": {"percent": 0}}]}, "steps", "steps[0].percent: percent is an integer"),
    ({"steps": [{"shadow": {"percent": 50, "alpha": 2}}]}, "steps",
     "steps[0].alpha: must be a number"),
    ({"steps": [{"shadow": [100]}]}, "steps", 'steps[0]: shadow is {"percent": N}'),
    ({"analysis": {"alpha": 0.9}}, "analysis", "analysis.alpha: must be a number from 0.0001"),
    ({"analysis": {"patience": 1}}, "analysis", "unknown setting 'patience'"),
    ({"analysis": {"planned_samples": 50, "min_samples": 100}}, "analysis",
     "analysis.planned_samples: must be at least min_samples"),
    ({"analysis": [1]}, "analysis", "must be an object of analysis settings"),
    ({"servers": ["ghost"]}, "servers", "has no server named ghost"),
    ({"alias": "not an alias!"}, "alias", "an alias name"),
    ({"sticky_header": "X User"}, "sticky_header", "header name"),
    ({"colour": "red"}, "colour", "unknown field"),
    ({"id": 7}, "id", "unknown field"),
    ({"reason": "x" * 2001}, "reason", "no more than 2000"),
])
def test_a_refused_request_names_the_field_and_makes_nothing(dave, plain, body, field, words):
    response = ask(api_as(dave), plain.deployment, **body)

    assert response.status_code == 400, response.content
    assert words in field_error(response, field)
    assert not Rollout.objects.exists()


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"dry_run": True, "duration_s": 60,
      "variants": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]},
     "dry_run", "a dry run is a canary's"),
    ({"duration_s": 60}, "variants", "an A/B split names 2 to 10 variants"),
    ({"duration_s": 60, "variants": [{"version": 1, "weight": 50}]}, "variants", "at least 2"),
    ({"duration_s": 60, "variants": [{"version": 1, "weight": 60}, {"version": 2, "weight": 30}]},
     "variants",
     "the weights must sum to 100, got 90"),
    ({"duration_s": 60, "variants": [{"version": 1, "weight": 50}, {"version": 9, "weight": 50}]},
     "variants",
     "variants[1].version: scorer has no version 9"),
    ({"variants": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50, "x": 1}]},
     "variants", "unknown field"),
    ({"variants": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]}, "duration_s",
     "give one"),
])
def test_a_refused_ab_split_names_the_field(dave, plain, body, field, words):
    response = api_as(dave).post(URL, {"deployment": plain.deployment.pk, "strategy": "ab",
                                       **body}, format="json")

    assert response.status_code == 400, response.content
    assert words in str(response.json()[field])
    assert list(response.json()) == [field]


def test_a_cluster_without_a_traffic_router_cannot_roll_out(dave, tenant_a):
    static = Plain(tenant_a, kind=Cluster.Kind.STATIC, name="offline")

    response = ask(api_as(dave), static.deployment)

    assert response.status_code == 409
    assert "has no traffic router" in field_error(response, "deployment")


def test_no_ready_version_is_a_409(dave, plain):
    ModelLoad.objects.update(state=ModelLoad.State.UNLOADED)

    response = ask(api_as(dave), plain.deployment)

    assert response.status_code == 409
    assert "load the stable version first" in field_error(response, "deployment")


def test_another_tenants_deployment_reads_as_unknown(charlie, plain):
    response = ask(api_as(charlie), plain.deployment)

    assert response.status_code == 400
    assert field_error(response, "deployment") == f"no deployment with id {plain.deployment.pk}"


def test_a_viewer_cannot_ask_for_a_rollout(bob, plain):
    response = ask(api_as(bob), plain.deployment)

    assert response.status_code == 403
    assert "needs the deployer role" in response.json()["detail"]
    assert not Rollout.objects.exists()


def test_an_anonymous_caller_is_401(plain):
    response = ask(APIClient(), plain.deployment)

    assert response.status_code == 401


def test_a_deployer_token_asks_and_the_token_is_named(token_client, tenant_a, plain):
    response = ask(token_client(tenant_a), plain.deployment)

    assert response.status_code == 201, response.content
    assert response.json()["requested_by_label"].startswith("token:ci-deployer-tenant-a")


# --- reading ---------------------------------------------------------------------------------


def test_lists_filter_by_deployment_state_and_strategy_within_the_tenant(dave, bob, charlie,
                                                                        plain, tenant_a, tenant_b):
    other = Plain(tenant_a, name="ranker")
    mine = make(dave, plain)
    theirs = make(dave, other, strategy="ab", sample_size=100,
                  variants=[{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    set_state(theirs, Rollout.State.ABORTED)
    client = api_as(bob)

    def ids(**params: Any) -> list[int]:
        response = client.get(URL, params)
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    assert ids() == [theirs.pk, mine.pk]
    assert ids(deployment=plain.deployment.pk) == [mine.pk]
    assert ids(deployment="ranker") == [theirs.pk]
    assert ids(state="loading") == [mine.pk]
    assert ids(state__in="aborted,failed") == [theirs.pk]
    assert ids(strategy="ab") == [theirs.pk]
    assert ids(ordering="created_at") == [mine.pk, theirs.pk]
    assert api_as(charlie).get(URL).json()["count"] == 0
    listed = client.get(URL).json()["results"][0]
    assert "events" not in listed and listed["state"] == "aborted"
    assert client.get(URL, {"state": "bogus"}).status_code == 400


def test_the_detail_shows_steps_analyses_approvals_events_and_the_route(dave, erin, prod):
    made = make(dave, prod)
    rollout.approve(erin, made, "looks fine")
    now = set_state(made, Rollout.State.PROGRESSING, step_index=1, weights={"1": 95, "2": 5},
                    started_at=made.created_at)
    RolloutAnalysis.objects.create(rollout=now, step_index=1, weight=5, window_start=1.5,
                                   looks=3, spent=0.01, reasons=["p99 within 5%"],
                                   judgement={"verdict": "running"}, slo={"checked": True})
    Route.objects.create(deployment=prod.deployment, name=f"dep-{prod.deployment.pk}",
                         state=Route.State.IN_FORCE, url="http://127.0.0.1:18101")

    response = api_as(dave).get(f"{URL}{made.pk}/")

    assert response.status_code == 200
    body = response.json()
    assert [(s["index"], s["current"], s["done"]) for s in body["steps"][:3]] == [
        (0, False, True), (1, True, False), (2, False, False)]
    assert body["weights"] == {"1": 95, "2": 5}
    [analysis] = body["analyses"]
    assert (analysis["verdict"], analysis["looks"], analysis["spent"], analysis["weight"],
            analysis["window_start"], analysis["reasons"]) == (
        "running", 3, 0.01, 5, 1.5, ["p99 within 5%"])
    [approval] = body["approvals"]
    assert (approval["approved_by_label"], approval["reason"], approval["step_index"]) == (
        "erin", "looks fine", None)
    assert [e["kind"] for e in body["events"]] == ["request", "approval", "approval"]
    assert body["route_url"] == "http://127.0.0.1:18101"


def test_the_detail_carries_the_newest_200_events(dave, plain):
    made = make(dave, plain)
    RolloutEvent.objects.bulk_create(
        RolloutEvent(rollout=made, kind="step", state="progressing", message=f"event {n}")
        for n in range(250))

    body = api_as(dave).get(f"{URL}{made.pk}/").json()

    assert body["events_total"] == 251
    assert len(body["events"]) == 200
    assert body["events"][-1]["message"] == "event 249"


def test_another_tenants_rollout_is_a_404(charlie, dave, plain):
    made = make(dave, plain)

    assert api_as(charlie).get(f"{URL}{made.pk}/").status_code == 404
    assert api_as(charlie).post(f"{URL}{made.pk}/abort/", {}, format="json").status_code == 404
    assert api_as(dave).get(f"{URL}99999999999999999999/").status_code == 404


# --- actions ---------------------------------------------------------------------------------


def test_abort_answers_202_and_the_next_tick_aborts(dave, plain, enqueued_rollouts,
                                                    django_capture_on_commit_callbacks):
    made = make(dave, plain)

    with django_capture_on_commit_callbacks(execute=True):
        response = api_as(dave).post(f"{URL}{made.pk}/abort/", {"reason": "wrong build"},
                                     format="json")

    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["state"], body["requested_action"], body["requested_action_by"]) == (
        "loading", "abort", "dave")
    assert body["events"][-1]["message"] == "abort asked for by dave: wrong build"
    assert enqueued_rollouts[-1] == made.pk
    rollout_reconciler.advance(made.pk, force=True)
    after = api_as(dave).get(f"{URL}{made.pk}/").json()
    assert (after["state"], after["is_final"]) == ("aborted", True)
    assert after["reason"] == "aborted by dave (wrong build)"


@pytest.mark.parametrize(("state", "action", "words"), [
    (Rollout.State.LOADING, "pause", "pause needs it progressing"),
    (Rollout.State.PROGRESSING, "resume", "resume needs it paused"),
    (Rollout.State.LOADING, "promote", "promote needs it progressing or paused"),
    (Rollout.State.SUCCEEDED, "abort", "rollout"),
    (Rollout.State.PROGRESSING, "approve", "nothing waits for an approval"),
    (Rollout.State.PROGRESSING, "retry", "only a rolled back, failed or aborted rollout"),
])
def test_an_action_the_state_does_not_allow_is_a_409_naming_action(dave, erin, plain, state,
                                                                    action, words):
    made = set_state(make(dave, plain), state)

    response = api_as(erin).post(f"{URL}{made.pk}/{action}/", {}, format="json")

    assert response.status_code == 409, response.content
    assert words in field_error(response, "action")


def test_a_second_different_action_waits_for_the_first(dave, plain):
    made = set_state(make(dave, plain), Rollout.State.PROGRESSING)
    client = api_as(dave)

    assert client.post(f"{URL}{made.pk}/pause/", {}, format="json").status_code == 202
    response = client.post(f"{URL}{made.pk}/abort/", {}, format="json")

    assert response.status_code == 409
    assert "pause was asked for by dave" in field_error(response, "action")


def test_promote_of_an_ab_split_is_a_409(dave, plain):
    made = make(dave, plain, strategy="ab", version=None, duration_s=60,
                variants=[{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    set_state(made, Rollout.State.PROGRESSING)

    response = api_as(dave).post(f"{URL}{made.pk}/promote/", {}, format="json")

    assert response.status_code == 409
    assert "ends in a verdict" in field_error(response, "action")


def test_a_dry_run_is_shown_as_one_and_promote_is_a_409(dave, plain):
    response = ask(api_as(dave), plain.deployment, dry_run=True)
    assert response.status_code == 201, response.content
    assert response.json()["dry_run"] is True
    made = set_state(Rollout.objects.get(pk=response.json()["id"]), Rollout.State.PROGRESSING)

    response = api_as(dave).post(f"{URL}{made.pk}/promote/", {}, format="json")

    assert response.status_code == 409
    assert "a dry run moves no traffic and promotes nothing" in field_error(response, "action")
    assert Rollout.objects.get(pk=made.pk).requested_action == ""


@pytest.mark.parametrize("action", ["pause", "resume", "promote", "abort", "retry"])
def test_a_viewer_cannot_act_on_a_rollout(bob, dave, plain, action):
    made = set_state(make(dave, plain), Rollout.State.PROGRESSING)

    response = api_as(bob).post(f"{URL}{made.pk}/{action}/", {}, format="json")

    assert response.status_code == 403
    assert "needs the deployer role" in response.json()["detail"]
    assert Rollout.objects.get(pk=made.pk).requested_action == ""


def test_an_action_body_takes_only_a_reason(dave, plain):
    made = set_state(make(dave, plain), Rollout.State.PROGRESSING)

    response = api_as(dave).post(f"{URL}{made.pk}/pause/", {"why": "x"}, format="json")

    assert response.status_code == 400
    assert field_error(response, "why") == "unknown field"


def test_retry_starts_an_aborted_rollout_again(dave, plain):
    made = set_state(make(dave, plain), Rollout.State.ABORTED)

    response = api_as(dave).post(f"{URL}{made.pk}/retry/", {"reason": "fixed"}, format="json")

    assert response.status_code == 200, response.content
    assert (response.json()["state"], response.json()["attempt"]) == ("loading", 2)


# --- approvals: four-eyes, people only --------------------------------------------------------


@pytest.fixture
def pending(dave, prod) -> Rollout:
    made = make(dave, prod)
    assert made.state == Rollout.State.PENDING_APPROVAL
    return made


def approve_url(row: Rollout) -> str:
    return f"{URL}{row.pk}/approve/"


def test_the_requester_cannot_approve_their_own_rollout(tenant_a, prod):
    # An approver who asked for the rollout themselves.
    frank = UserFactory(username="frank")
    MembershipFactory(user=frank, tenant=tenant_a, role=Membership.Role.APPROVER)
    made = make(frank, prod)

    response = api_as(frank).post(approve_url(made), {}, format="json")

    assert response.status_code == 403
    assert "four-eyes rule" in response.json()["detail"]
    assert Rollout.objects.get(pk=made.pk).state == Rollout.State.PENDING_APPROVAL


def test_a_rollout_asked_for_through_a_token_cannot_be_approved_by_its_maker(alice, tenant_a,
                                                                             prod):
    issued = tokens.issue(alice, tenant_a, "release-bot", Membership.Role.DEPLOYER)
    bot = APIClient()
    bot.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    made = bot.post(URL, {"deployment": prod.deployment.pk, "version": 2}, format="json").json()

    response = api_as(alice).post(f"{URL}{made['id']}/approve/", {}, format="json")

    assert response.status_code == 403
    assert "four-eyes rule" in response.json()["detail"]


@pytest.mark.parametrize("role", [Membership.Role.APPROVER, Membership.Role.ADMIN])
def test_no_token_approves_not_even_one_the_requester_made(alice, tenant_a, pending, role):
    # alice made the token; dave asked for the rollout: a token still cannot decide.
    issued = tokens.issue(alice, tenant_a, f"approver-bot-{role}", role)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")

    response = client.post(approve_url(pending), {}, format="json")

    assert response.status_code == 403
    assert "approvals are decided by people" in response.json()["detail"]


def test_a_token_made_by_the_requester_cannot_approve(tenant_a, prod):
    frank = UserFactory(username="frank")
    MembershipFactory(user=frank, tenant=tenant_a, role=Membership.Role.ADMIN)
    made = make(frank, prod)
    issued = tokens.issue(frank, tenant_a, "franks-bot", Membership.Role.APPROVER)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")

    response = client.post(approve_url(made), {}, format="json")

    assert response.status_code == 403
    assert Rollout.objects.get(pk=made.pk).state == Rollout.State.PENDING_APPROVAL


def test_a_deployer_cannot_approve(dave, tenant_a, prod):
    other = UserFactory(username="gina")
    MembershipFactory(user=other, tenant=tenant_a, role=Membership.Role.DEPLOYER)
    made = make(other, prod)

    response = api_as(dave).post(approve_url(made), {}, format="json")

    assert response.status_code == 403
    assert "needs the approver role" in response.json()["detail"]


def test_another_approver_approves_and_the_rollout_starts_loading(erin, pending, enqueued_rollouts,
                                                                  django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = api_as(erin).post(approve_url(pending), {"reason": "benchmarks ok"},
                                     format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["state"], body["waiting_for"]) == ("loading", "")
    assert body["approvals"][0]["approved_by_label"] == "erin"
    assert enqueued_rollouts[-1] == pending.pk
    again = api_as(erin).post(approve_url(pending), {}, format="json")
    assert again.status_code == 409
    assert "nothing waits for an approval" in field_error(again, "action")
