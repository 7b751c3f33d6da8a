"""The rollout pages: the list, a rollout's page and its live parts, the actions through their
forms (role refusals, wrong-state messages in place) and the start form on the deployment page.

Rollouts are made in the state a test needs (rows), or through ``rollout.create_rollout``; no
router or server is called: these pages show and ask, the reconciler acts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from fleet.models import Cluster
from rollouts.canary import analysis as canary_analysis
from rollouts.canary import judge
from rollouts.canary import specs as rollout_specs
from rollouts.models import (
    ModelLoad,
    Rollout,
    RolloutAnalysis,
    RolloutApproval,
    RolloutEvent,
    Route,
)
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

State = Rollout.State


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def setup(tenant_a, dave):
    """fraud (tenant A, a local cluster, so it routes): v1 ready on its server, v2 and v3
    registered."""
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.LOCAL)
    server = InferenceServerFactory(cluster=cluster, name="triton", http_url="http://127.0.0.1:9")
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    deployment = DeploymentFactory(model=model, cluster=cluster, name="fraud")
    deployment.servers.set([server])
    versions = {n: ModelVersionFactory(model=model, version=n) for n in (1, 2, 3)}
    ModelLoad.objects.create(tenant=tenant_a, deployment=deployment, server=server,
                             version=versions[1], state=ModelLoad.State.READY,
                             requested_by_label="dave")
    return {"deployment": deployment, "versions": versions, "server": server, "model": model}


def make(setup, dave, state: str = State.PROGRESSING, **fields) -> Rollout:
    v = setup["versions"]
    defaults = {
        "tenant": setup["deployment"].tenant, "deployment": setup["deployment"],
        "state": state, "baseline": v[1], "candidate": v[2],
        "steps": [{"set_weight": 25}, {"analysis": {}}, {"pause": {}}, {"set_weight": 50}],
        "step_index": 1, "weights": {"1": 75, "2": 25}, "requested_by": dave,
        "requested_by_label": "dave", "servers": ["triton"],
        "started_at": timezone.now(), "step_started_at": timezone.now(),
    }
    return Rollout.objects.create(**{**defaults, **fields})


def url(name: str, rollout: Rollout, *args: str) -> str:
    return reverse(f"rollouts:{name}", args=[rollout.pk, *args])


# --------------------------------------------------------------------------------------------
# The list
# --------------------------------------------------------------------------------------------


def test_the_list_filters_by_state_and_deployment(setup, dave, bob):
    running = make(setup, dave)
    done = make(setup, dave, state=State.SUCCEEDED, weights={"2": 100})
    other = DeploymentFactory(model=setup["model"], cluster=setup["deployment"].cluster,
                              name="fraud-eu")
    elsewhere = make(setup, dave, deployment=other, state=State.ABORTED)
    client = browser(bob)

    def listed(**query) -> set[int]:
        body = client.get(reverse("rollouts:rollouts"), query).content.decode()
        return {r.pk for r in (running, done, elsewhere) if f'data-rollout="{r.pk}"' in body}

    assert listed() == {running.pk, done.pk, elsewhere.pk}
    assert listed(state="active") == {running.pk}
    assert listed(state="finished") == {done.pk, elsewhere.pk}
    assert listed(state="finished", deployment=str(other.pk)) == {elsewhere.pk}
    body = client.get(reverse("rollouts:rollouts")).content.decode()
    assert "v1 → v2" in body and "step 2 of 4: analysis" in body and "v1 75%" in body
    # htmx filters get the table alone
    partial = client.get(reverse("rollouts:rollouts"), {"state": "active"},
                         headers={"HX-Request": "true"}).content.decode()
    assert partial.startswith('\n<div id="results">') or partial.lstrip().startswith('<div id="results">')


# --------------------------------------------------------------------------------------------
# The page and its live parts
# --------------------------------------------------------------------------------------------


def test_the_page_shows_steps_weights_analysis_timeline_and_approvals(setup, dave, erin, bob):
    rollout = make(setup, dave, waiting_for="a person to resume (step 3)")
    # A real judgement: a canary 2% slower than its baseline, with a few errors and 4xx.
    rng = np.random.default_rng(5)
    canary = judge.Arm(rng.lognormal(math.log(4.2), 0.3, 1200), 2, 7)
    baseline = judge.Arm(rng.lognormal(math.log(4.1), 0.3, 3600), 6, 0)
    judgement = judge.judge(canary, baseline, judge.JudgeConfig(max_p99_ms=50.0, max_error_rate=1.0))
    RolloutAnalysis.objects.create(
        rollout=rollout, step_index=1, weight=25, verdict="pass", window_start=0, looks=3,
        spent=0.05, reasons=["1209 canary requests show it within every tolerance"],
        config={**canary_analysis.ANALYSIS_DEFAULTS, "max_p99_ms": 50.0, "max_error_rate": 1.0},
        judgement=judgement.to_json(), slo=canary_analysis.gates_json(judgement),
    )
    RolloutEvent.objects.create(rollout=rollout, kind="analysis", state=State.PROGRESSING,
                                step_index=1, message="analysis passed at 25%",
                                data={"judgement": {"verdict": "pass"}})
    RolloutApproval.objects.create(rollout=rollout, approved_by=erin, approved_by_label="erin",
                                   reason="plan reviewed")
    body = browser(bob).get(url("rollout", rollout)).content.decode()
    assert 'data-step="1" data-status="done"' in body
    assert 'data-step="2" data-status="current"' in body
    assert 'data-step="3" data-status="to come"' in body
    assert 'data-weight="2">25%' in body and "a person to resume (step 3)" in body
    shown = {m["name"]: m["shown"] for m in judgement.to_json()["metrics"]}
    median = shown["median"]
    for number in (f"{median['canary']:.2f} ms", f"{median['estimate']:.2f} %",
                   f"{median['low']:.2f} to {median['high']:.2f}", "≤ 5 %", "≤ 10 %",
                   "≤ 0.20 points", f"lower bounds at {judgement.alpha_per_test:.3g} each", "1209", "3606", "7 canary, 0 baseline",
                   "1209 canary requests show it within every tolerance"):
        assert number in body, number
    assert 'data-gate="p99"' in body and 'data-gate="error rate"' in body and "plan reviewed" in body
    assert "<summary>evidence</summary>" in body and "analysis passed at 25%" in body
    # bob is a viewer: no buttons, only what stands
    assert 'id="action-' not in body


def test_buttons_follow_the_role_and_the_state(setup, dave, erin, bob):
    progressing = make(setup, dave)

    def buttons(user, rollout: Rollout) -> set[str]:
        body = browser(user).get(url("rollout", rollout)).content.decode()
        return {a for a in ("pause", "resume", "promote", "abort", "retry", "approve")
                if f'id="action-{a}"' in body}

    assert buttons(dave, progressing) == {"pause", "promote", "abort"}
    assert buttons(bob, progressing) == set()
    Rollout.objects.filter(pk=progressing.pk).update(state=State.PAUSED)
    assert buttons(dave, progressing) == {"resume", "promote", "abort"}
    Rollout.objects.filter(pk=progressing.pk).update(state=State.ROLLED_BACK)
    assert buttons(dave, progressing) == {"retry"}
    Rollout.objects.filter(pk=progressing.pk).update(state=State.PENDING_APPROVAL)
    # dave asked for it: abort, but no approval of his own
    assert buttons(dave, progressing) == {"abort"}
    assert "four-eyes" in browser(dave).get(url("rollout", progressing)).content.decode()
    assert buttons(erin, progressing) == {"abort", "approve"}


def test_the_live_part_polls_while_active_and_stops_with_286_once_final(setup, dave, bob):
    rollout = make(setup, dave)
    client = browser(bob)
    htmx = {"HX-Request": "true"}
    live = client.get(url("rollout-status", rollout), {"seen": f"progressing:{rollout.attempt}"},
                      headers=htmx)
    assert live.status_code == 200 and "HX-Refresh" not in live
    assert 'hx-trigger="every 2s"' in live.content.decode()
    # the state moved on: the page reloads, so its buttons match
    Rollout.objects.filter(pk=rollout.pk).update(state=State.PAUSED)
    moved = client.get(url("rollout-status", rollout), {"seen": "progressing:1"}, headers=htmx)
    assert moved.status_code == 200 and moved["HX-Refresh"] == "true"
    Rollout.objects.filter(pk=rollout.pk).update(state=State.SUCCEEDED, weights={"2": 100})
    final = client.get(url("rollout-status", rollout), {"seen": "paused:1"}, headers=htmx)
    assert final.status_code == 286
    assert "hx-trigger" not in final.content.decode()


def test_the_chart_maps_route_variants_to_versions_and_stops_once_final(
        setup, dave, bob, settings):
    import time

    from rollouts.traffic import samples

    rollout = make(setup, dave)
    Route.objects.create(deployment=setup["deployment"], name=f"dep-{setup['deployment'].pk}",
                         state=Route.State.IN_FORCE, variants={
                             "v1-triton": {"version": 1}, "v2-triton": {"version": 2}})
    now = time.time()
    lines = []
    for i in range(40):
        for variant, ms in (("v1-triton", 0.004), ("v2-triton", 0.012)):
            lines.append(json.dumps({
                "route": f"dep-{setup['deployment'].pk}", "variant": variant,
                "msec": round(now - 5 + i * 0.1, 3), "status": 200, "request_time": ms,
                "bytes_sent": 10, "mirror": False, "upstream_status": "200",
                "upstream_response_time": str(ms), "upstream_addr": "127.0.0.1:9",
                "method": "POST", "path": "/v2/models/fraud-scorer/infer",
                "request_id": f"r{i}{variant}"}))
    store = samples.connect()
    assert samples.record(lines, store=store, now=now).counts["stored"] == 80
    client = browser(bob)
    answer = client.get(url("rollout-latency", rollout), {"window": "60"})
    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert set(data["versions"]) == {"v1", "v2"}, data
    assert data["versions"]["v2"]["label"] == "v2 canary"
    assert data["versions"]["v1"]["label"] == "v1 baseline"
    p50 = [p["p50_ms"] for p in data["versions"]["v2"]["points"] if p["p50_ms"] is not None]
    assert p50 and all(abs(v - 12) < 0.01 for v in p50)
    Rollout.objects.filter(pk=rollout.pk).update(state=State.ROLLED_BACK)
    assert client.get(url("rollout-latency", rollout)).status_code == 286


# --------------------------------------------------------------------------------------------
# Actions
# --------------------------------------------------------------------------------------------


def test_a_deployer_pauses_and_the_request_is_recorded(setup, dave):
    rollout = make(setup, dave)
    response = browser(dave).post(url("rollout-action", rollout, "pause"),
                                  {"reason": "looking at logs"}, follow=True)
    assert response.redirect_chain == [(url("rollout", rollout), 302)]
    assert "Pause asked for" in response.content.decode()
    rollout.refresh_from_db()
    assert (rollout.requested_action, rollout.requested_action_by) == ("pause", "dave")
    assert rollout.events.filter(kind="action", message__contains="looking at logs").exists()


def test_a_viewer_is_refused_with_a_403_naming_the_role(setup, dave, bob):
    rollout = make(setup, dave)
    response = browser(bob).post(url("rollout-action", rollout, "abort"), {"reason": ""})
    assert response.status_code == 403
    assert "this needs the deployer role in the tenant" in response.content.decode()
    rollout.refresh_from_db()
    assert rollout.requested_action == ""


def test_an_action_the_state_does_not_allow_is_named_in_place(setup, dave):
    rollout = make(setup, dave, state=State.SUCCEEDED, weights={"2": 100})
    response = browser(dave).post(url("rollout-action", rollout, "resume"), {})
    body = response.content.decode()
    assert response.status_code == 409
    assert 'id="action-errors"' in body
    assert f"rollout {rollout.pk} is succeeded: resume needs it paused" in body


def test_a_second_action_while_one_is_in_flight_is_refused(setup, dave):
    rollout = make(setup, dave)
    client = browser(dave)
    client.post(url("rollout-action", rollout, "pause"), {})
    response = client.post(url("rollout-action", rollout, "promote"), {})
    assert response.status_code == 409
    assert "pause was asked for by dave and is being carried out" in response.content.decode()


def test_promote_is_refused_for_an_ab_split(setup, dave):
    v = setup["versions"]
    rollout = make(setup, dave, strategy="ab", candidate=None, steps=[],
                   variants=[{"version": 1, "weight": 50}, {"version": 2, "weight": 50}],
                   weights={"1": 50, "2": 50}, duration_s=60)
    assert v[1] == rollout.baseline
    response = browser(dave).post(url("rollout-action", rollout, "promote"), {})
    assert response.status_code == 409
    assert "an A/B split ends in a verdict" in response.content.decode()


def test_the_requester_cannot_approve_and_another_approver_can(setup, dave, erin, alice):
    rollout = make(setup, dave, state=State.PENDING_APPROVAL, requires_approval=True,
                   started_at=None, step_index=0, weights={})
    rollout.requested_by = alice
    rollout.save(update_fields=["requested_by"])
    refused = browser(alice).post(url("rollout-action", rollout, "approve"), {"reason": "mine"})
    assert refused.status_code == 403
    assert "four-eyes rule" in refused.content.decode()
    assert dave  # a deployer is below approver: 403 naming the role
    low = browser(dave).post(url("rollout-action", rollout, "approve"), {})
    assert low.status_code == 403 and "approver role" in low.content.decode()
    done = browser(erin).post(url("rollout-action", rollout, "approve"),
                              {"reason": "plan reviewed"}, follow=True)
    assert "approved" in done.content.decode()
    rollout.refresh_from_db()
    assert rollout.state == State.LOADING
    assert rollout.approvals.get().reason == "plan reviewed"


def test_retry_starts_a_rolled_back_rollout_again(setup, dave):
    rollout = make(setup, dave, state=State.ROLLED_BACK, weights={"1": 100},
                   reason="analysis failed")
    browser(dave).post(url("rollout-action", rollout, "retry"), {"reason": "fixed the config"})
    rollout.refresh_from_db()
    assert (rollout.state, rollout.attempt, rollout.step_index) == (State.LOADING, 2, 0)


def test_an_unknown_action_is_a_404(setup, dave):
    rollout = make(setup, dave)
    assert browser(dave).post(url("rollout-action", rollout, "explode"), {}).status_code == 404


# --------------------------------------------------------------------------------------------
# Starting a rollout from the deployment page
# --------------------------------------------------------------------------------------------


def start_url(setup) -> str:
    return reverse("rollouts:deployment-rollout-start", args=[setup["deployment"].pk])


def test_the_deployment_page_offers_the_start_forms_to_deployers_only(setup, dave, bob):
    page = reverse("rollouts:deployment", args=[setup["deployment"].pk])
    body = browser(dave).get(page).content.decode()
    assert 'id="canary-form"' in body and 'id="ab-form"' in body
    assert json.dumps(rollout_specs.DEFAULT_STEPS).replace('"', "&quot;") in body
    viewer = browser(bob).get(page).content.decode()
    assert 'id="canary-form"' not in viewer and 'id="no-rollout"' in viewer


def test_a_deployer_starts_a_canary_and_lands_on_its_page(setup, dave):
    response = browser(dave).post(start_url(setup), {
        "strategy": "canary", "version": "2", "steps": '[{"set_weight": 50}, {"pause": {}}]',
        "analysis": '{"min_samples": 50, "planned_samples": 200}', "reason": "new features",
    })
    made = Rollout.objects.get()
    assert response.status_code == 302 and response["Location"] == url("rollout", made)
    assert (made.candidate.version, made.baseline.version, made.state) == (2, 1, State.LOADING)
    assert made.steps == [{"set_weight": 50}, {"pause": {}}]
    assert made.analysis == {"min_samples": 50, "planned_samples": 200}
    # the deployment page now shows it in flight, and no start form
    body = browser(dave).get(reverse("rollouts:deployment", args=[setup["deployment"].pk]))
    text = body.content.decode()
    assert 'id="rollout-in-flight"' in text and f"Rollout {made.pk}" in text
    assert 'id="canary-form"' not in text


def test_a_deployer_starts_a_dry_run_from_the_form_and_its_page_says_so(setup, dave):
    response = browser(dave).post(start_url(setup), {
        "strategy": "canary", "version": "2", "dry_run": "on",
        "steps": '[{"shadow": {"percent": 20}}, {"set_weight": 50}, {"analysis": {}}]'})
    made = Rollout.objects.get()
    assert response.status_code == 302 and made.dry_run
    assert made.steps[0] == {"shadow": {"percent": 20}}
    page = browser(dave).get(url("rollout", made)).content.decode()
    assert f"Rollout {made.pk}: dry run of v2 against v1" in page
    assert "none: a dry run judges copies of the requests and moves no traffic" in page
    assert "shadow: copies of 20% of the requests" in page


@pytest.mark.parametrize(("fields", "field", "message"), [
    ({"steps": '[{"set_weight": 150}]'}, "steps",
     "steps[0]: set_weight is an integer from 0 to 100, got 150"),
    ({"steps": "[{set_weight: 5}"}, "steps", "not valid JSON"),
    ({"analysis": '{"alpha": 2}'}, "analysis", "analysis.alpha: must be a number from"),
    ({"version": "1"}, "version", "v1 is the baseline already"),
    ({"version": ""}, "version", "name the version to roll out"),
    ({"alias": "no spaces please"}, "alias", "an alias name"),
])
def test_a_refused_canary_names_the_field_in_place(setup, dave, fields, field, message):
    data = {"strategy": "canary", "version": "2", "steps": '[{"set_weight": 50}]', **fields}
    response = browser(dave).post(start_url(setup), data)
    body = response.content.decode()
    assert response.status_code == 400, body
    assert f'id="{field}-error"' in body
    error = body.split(f'id="{field}-error">')[1].split("</p>")[0]
    assert message in error.replace("&#x27;", "'"), error
    assert not Rollout.objects.exists()


def test_a_second_rollout_is_refused_while_one_is_in_flight(setup, dave):
    make(setup, dave)
    response = browser(dave).post(start_url(setup), {"strategy": "canary", "version": "3"})
    assert response.status_code == 409
    assert "one rollout at a time" in response.content.decode()


def test_an_ab_split_needs_an_end_and_weights_summing_to_100(setup, dave):
    ModelLoad.objects.create(tenant=setup["deployment"].tenant, deployment=setup["deployment"],
                             server=setup["server"], version=setup["versions"][2],
                             state=ModelLoad.State.READY, requested_by_label="dave")
    variants = '[{"version": 1, "weight": 50}, {"version": 2, "weight": 40}]'
    client = browser(dave)
    response = client.post(start_url(setup), {"strategy": "ab", "variants": variants,
                                              "duration_s": "60"})
    assert response.status_code == 400
    assert "the weights must sum to 100, got 90" in response.content.decode()
    response = client.post(start_url(setup), {"strategy": "ab", "variants": variants.replace(
        "40", "50")})
    assert 'id="duration_s-error"' in response.content.decode()
    response = client.post(start_url(setup), {
        "strategy": "ab", "variants": variants.replace("40", "50"), "sample_size": "500",
        "sticky_header": "X-User", "promote": "on"})
    made = Rollout.objects.get()
    assert response["Location"] == url("rollout", made)
    assert (made.strategy, made.sample_size, made.sticky_header, made.promote) == (
        "ab", 500, "X-User", True)
    page = browser(dave).get(url("rollout", made)).content.decode()
    assert 'id="ab-panel"' in page and "No verdict yet" in page
