"""The reconciler's ticks, without Triton: ready loads on servers nginx never calls, the
session's real nginx taking the route changes."""

from __future__ import annotations

import pytest
from django.utils import timezone

from rollouts.canary import reconciler as rollout_reconciler
from rollouts.canary import requests as rollouts
from rollouts.models import Rollout
from tests.rollouts.traffic.test_routes import Plain, ready

State = Rollout.State


@pytest.fixture
def canary(db, use_route_nginx, tenant_a, dave, settings):
    settings.SWITCHYARD_ROLLOUT_INTERVAL_S = 30  # only what a step sends may run before a tick
    plain = Plain(tenant_a)
    for version in (plain.v1, plain.v2):
        ready(plain.deployment, version, plain.a)
    made, _ = rollouts.create_rollout(dave, plain.deployment, version=2, baseline=1,
                                      servers=["triton-a"],
                                      steps=[{"set_weight": 10}, {"pause": {}}])
    return made


def test_a_step_that_lets_the_next_follow_leaves_the_rollout_due_at_once(canary):
    state, again = rollout_reconciler.advance(canary.pk, force=True)  # loading: everything is ready
    assert (state, again) == (State.PROGRESSING, True)
    assert Rollout.objects.get(pk=canary.pk).next_tick_at <= timezone.now()

    # The chained task (no force) runs the next step now, not a tick later.
    state, again = rollout_reconciler.advance(canary.pk)
    moved = Rollout.objects.get(pk=canary.pk)
    assert state == State.PROGRESSING and moved.weights == {"1": 90, "2": 10}
    assert moved.step_index == 1


def test_a_step_that_waits_is_not_due_before_the_next_tick(canary):
    rollout_reconciler.advance(canary.pk, force=True)
    rollout_reconciler.advance(canary.pk)  # 10% to v2
    state, again = rollout_reconciler.advance(canary.pk)  # the pause step: paused for a person
    assert (state, again) == (State.PAUSED, False)

    assert rollout_reconciler.advance(canary.pk) == (None, False)  # not due: nothing done
    assert canary.pk not in rollout_reconciler.due_rollouts()


def test_an_attempts_analysis_steps_share_their_evidence_each_less_its_warm_up(canary):
    """The default steps' analyses: the third looks at its own window and at the first two's
    (each from its start plus the warm-up to its end); only the last one must show the canary
    within, and a fresh start after a failed look keeps its own window alone."""
    from datetime import timedelta

    from rollouts.canary import analysis
    from rollouts.canary.specs import DEFAULT_STEPS
    from rollouts.models import RolloutAnalysis

    Rollout.objects.filter(pk=canary.pk).update(steps=DEFAULT_STEPS, step_index=1)
    canary.refresh_from_db()
    config = analysis.analysis_config(canary)
    assert not analysis.is_last_analysis(canary)
    now = timezone.now()
    for index, start, weight in ((1, 1000.0, 5), (3, 1100.0, 25)):
        RolloutAnalysis.objects.create(rollout=canary, step_index=index, weight=weight,
                                       verdict="pass", window_start=start,
                                       finished_at=now - timedelta(seconds=10 * (4 - index)))
    here = RolloutAnalysis.objects.create(rollout=canary, step_index=5, weight=50, window_start=1200.0)

    windows = analysis.evidence_windows(here, config)

    assert [(w.start, w.warmup_s) for w in windows] == [(1000.0, 2.0), (1100.0, 2.0), (1200.0, 2.0)]
    assert windows[0].end == (now - timedelta(seconds=30)).timestamp() and windows[-1].end is None
    Rollout.objects.filter(pk=canary.pk).update(step_index=5)
    canary.refresh_from_db()
    assert analysis.is_last_analysis(canary)
    here.failed_looks = 1
    assert [w.start for w in analysis.evidence_windows(here, config)] == [1200.0]


@pytest.fixture
def shadowed(db, use_route_nginx, tenant_a, dave, settings):
    settings.SWITCHYARD_ROLLOUT_INTERVAL_S = 30
    plain = Plain(tenant_a)
    for version in (plain.v1, plain.v2):
        ready(plain.deployment, version, plain.a)
    made, _ = rollouts.create_rollout(dave, plain.deployment, version=2, baseline=1,
                                      servers=["triton-a"],
                                      steps=[{"shadow": {"percent": 30}}, {"set_weight": 10}])
    return made


def test_a_shadow_step_copies_its_share_to_the_candidate_at_0_percent_and_a_rollback_stops_it(
        shadowed, dave):
    from rollouts.models import RolloutAnalysis, Route

    rollout_reconciler.advance(shadowed.pk, force=True)  # loading: everything is ready
    rollout_reconciler.advance(shadowed.pk, force=True)  # the shadow starts

    route = Route.objects.get(pk=shadowed.deployment_id)
    assert route.version_weights == {1: 100, 2: 0} and route.mirror_percent == 30
    assert route.variants[route.mirror_variant]["version"] == 2
    row = RolloutAnalysis.objects.get(rollout=shadowed)
    assert (row.weight, row.config["shadow_percent"], row.verdict) == (0, 30, "running")
    assert Rollout.objects.get(pk=shadowed.pk).step_index == 0  # no copies judged yet

    rollouts.request_action(dave, shadowed, "abort", reason="not today")
    rollout_reconciler.advance(shadowed.pk, force=True)
    route = Route.objects.get(pk=shadowed.deployment_id)
    assert Rollout.objects.get(pk=shadowed.pk).state == State.ABORTED
    assert route.mirror_percent == 0 and route.version_weights.get(1) == 100


def test_a_shadow_the_router_refuses_ends_the_rollout_with_its_reason_and_the_route_as_it_was(
        shadowed, monkeypatch):
    from rollouts.models import Route
    from rollouts.traffic import routes

    rollout_reconciler.advance(shadowed.pk, force=True)  # loading

    def refuse(*args, **kwargs):
        if kwargs.get("mirror") is not None:
            raise routes.RouteFailed("an HTTPRoute mirrors every request or none", field="route")
        return original(*args, **kwargs)

    original = routes.set_route_as_system
    monkeypatch.setattr(routes, "set_route_as_system", refuse)
    rollout_reconciler.advance(shadowed.pk, force=True)

    ended = Rollout.objects.get(pk=shadowed.pk)
    assert ended.state == State.ROLLED_BACK, ended.reason
    assert ended.reason == ("step 1: shadow: the copies cannot start: an HTTPRoute mirrors "
                            "every request or none")
    route = Route.objects.get(pk=shadowed.deployment_id)
    assert route.mirror_percent == 0 and route.version_weights.get(1) == 100


def test_an_inconclusive_end_within_the_limit_starts_again_and_the_next_pauses(canary):
    """inconclusive_limit 1, a timeout of 1 s and no traffic: the first inconclusive end
    judges again on a fresh window (the timeline says so, the budget is halved), the second
    pauses for a person."""
    import time

    from rollouts.models import RolloutAnalysis, RolloutEvent

    Rollout.objects.filter(pk=canary.pk).update(
        steps=[{"set_weight": 10}, {"analysis": {"timeout_s": 1, "inconclusive_limit": 1}}])
    rollout_reconciler.advance(canary.pk, force=True)  # loading
    rollout_reconciler.advance(canary.pk, force=True)  # 10%
    rollout_reconciler.advance(canary.pk, force=True)  # the first look: its window starts
    first = RolloutAnalysis.objects.get(rollout=canary)
    time.sleep(1.1)
    rollout_reconciler.advance(canary.pk, force=True)

    again = RolloutAnalysis.objects.get(rollout=canary)
    assert (again.verdict, again.inconclusive_ends) == ("running", 1)
    assert again.window_start > first.window_start and again.spent == pytest.approx(0.025)
    assert Rollout.objects.get(pk=canary.pk).state == State.PROGRESSING
    said = RolloutEvent.objects.filter(rollout=canary, kind="analysis").last().message
    assert said.startswith("analysis ended inconclusive (1 of 1 allowed): ") and (
        "judging again on fresh evidence" in said), said

    time.sleep(1.1)
    rollout_reconciler.advance(canary.pk, force=True)
    ended = Rollout.objects.get(pk=canary.pk)
    assert ended.state == State.PAUSED and "analysis was inconclusive" in ended.waiting_for
    assert RolloutAnalysis.objects.get(rollout=canary).verdict == "inconclusive"


# --------------------------------------------------------------------------------------------
# Metric gates, on the session's real Prometheus
# --------------------------------------------------------------------------------------------


def _prometheus_answers(url: str, query: str, limit_s: float = 15.0) -> None:
    """Wait until Prometheus has scraped the static page the query reads."""
    import time

    from fleet.adapters.metrics.prometheus import PrometheusSource

    end = time.monotonic() + limit_s
    while PrometheusSource(url).query(query) == [] and time.monotonic() < end:
        time.sleep(0.2)


@pytest.fixture
def gated(canary, local_prometheus, settings):
    """The canary, with an analysis gated on a metric template whose series the test sets on
    Prometheus' static page."""
    from rollouts.models import MetricTemplate

    settings.SWITCHYARD_PROMETHEUS_URL = local_prometheus.url
    model = canary.deployment.model.name
    MetricTemplate.objects.create(
        name="gpu-memory-ratio", unit="",
        query='max(switchyard_test_gpu_memory_ratio{model="{{ model }}", '
              'version="{{ candidate }}"})')

    def publish(value: float) -> None:
        local_prometheus.static.text = (
            f'switchyard_test_gpu_memory_ratio{{model="{model}",version="2"}} {value}\n')
        query = (f'switchyard_test_gpu_memory_ratio{{model="{model}",version="2"}} == {value}')
        _prometheus_answers(local_prometheus.url, query)

    Rollout.objects.filter(pk=canary.pk).update(steps=[
        {"set_weight": 10},
        {"analysis": {"metrics": [{"template": "gpu-memory-ratio", "max": 0.9, "every_s": 1}]}}])
    canary.publish = publish
    return canary


def test_a_metric_gate_beyond_its_range_twice_in_a_row_rolls_the_canary_back(gated):
    import time

    from rollouts.models import RolloutAnalysis

    gated.publish(0.97)
    for _ in range(3):  # loading, 10%, the first look
        rollout_reconciler.advance(gated.pk, force=True)
    first = RolloutAnalysis.objects.get(rollout=gated).slo["metrics"][0]
    assert (first["state"], first["value"], first["beyond_run"]) == ("beyond", 0.97, 1)
    assert 'version="2"' in first["query"] and gated.deployment.model.name in first["query"]
    assert Rollout.objects.get(pk=gated.pk).state == State.PROGRESSING  # one is not enough
    time.sleep(1.05)
    rollout_reconciler.advance(gated.pk, force=True)

    ended = Rollout.objects.get(pk=gated.pk)
    assert ended.state == State.ROLLED_BACK
    assert ("metric gpu-memory-ratio 0.97 is beyond at most 0.9 (2 measurements in a row)"
            in ended.reason), ended.reason
    assert ended.weights == {"1": 100}


def test_a_metric_gate_within_waits_and_one_prometheus_cannot_answer_fails_safe(gated, settings):
    import time

    from rollouts.models import RolloutAnalysis

    gated.publish(0.5)
    for _ in range(3):
        rollout_reconciler.advance(gated.pk, force=True)
    row = RolloutAnalysis.objects.get(rollout=gated)
    assert row.slo["metrics"][0]["state"] == "ok" and row.verdict == "running"
    assert "metric gpu-memory-ratio 0.5, allowed at most 0.9: within" in row.reasons

    settings.SWITCHYARD_PROMETHEUS_URL = "http://127.0.0.1:9"  # nothing listens there
    for _ in range(4):
        time.sleep(1.05)
        rollout_reconciler.advance(gated.pk, force=True)
    ended = Rollout.objects.get(pk=gated.pk)
    assert ended.state == State.ROLLED_BACK, ended.reason
    assert "metric gpu-memory-ratio could not be measured 4 times in a row" in ended.reason
    # The platform's Prometheus address is not the tenant's to read.
    assert "127.0.0.1:9" not in ended.reason and "the platform's Prometheus" in ended.reason


def test_metric_gates_are_refused_naming_the_field_without_a_template_or_a_prometheus(
        canary, dave, settings):
    from console.exceptions import DomainError
    from rollouts.canary.analysis import parse_analysis
    from rollouts.canary.metrics import render
    from rollouts.models import MetricTemplate

    settings.SWITCHYARD_PROMETHEUS_URL = ""
    with pytest.raises(DomainError) as refused:
        parse_analysis({"metrics": [{"template": "x", "max": 1}]})
    assert refused.value.field == "analysis.metrics" and "SWITCHYARD_PROMETHEUS_URL" in str(
        refused.value)
    settings.SWITCHYARD_PROMETHEUS_URL = "http://127.0.0.1:9090"
    MetricTemplate.objects.create(name="queue", query="max(q)")
    for gate, field, words in [
        ({"template": "nope", "max": 1}, "analysis.metrics[0].template", "known: queue"),
        ({"template": "queue"}, "analysis.metrics[0]", "give min, max or both"),
        ({"template": "queue", "min": 2, "max": 1}, "analysis.metrics[0].min", "above max"),
        ({"template": "queue", "max": 1, "every_s": 0}, "analysis.metrics[0].every_s", "from 1"),
        ({"template": "queue", "max": "1"}, "analysis.metrics[0].max", "a number"),
    ]:
        with pytest.raises(DomainError) as refused:
            parse_analysis({"metrics": [gate]})
        assert (refused.value.field, words in str(refused.value)) == (field, True), refused.value
    # A name can never close the quotes it stands in.
    assert render('x{m="{{ model }}"}', {"model": 'a"}) or vector(1'}) == 'x{m="a\\"}) or vector(1"}'


# --------------------------------------------------------------------------------------------
# Confirm steps: a tenant's webhook holds the rollout until it answers 2xx
# --------------------------------------------------------------------------------------------


@pytest.fixture
def release_bot(settings):
    """A receiver on 127.0.0.1 answering each POST with the next of ``answers`` (then the
    last again); the requests it got."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler

    from tests.fixtures.http_server import QuietHTTPServer

    settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    bot = {"answers": [200], "got": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            bot["got"].append({"headers": dict(self.headers), "body": body,
                               "data": json.loads(body)})
            status = bot["answers"][min(len(bot["got"]), len(bot["answers"])) - 1]
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = QuietHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    bot["url"] = f"http://127.0.0.1:{server.server_address[1]}/confirm"
    yield bot
    server.shutdown()
    server.server_close()


def test_a_confirm_step_holds_until_the_webhook_answers_2xx_and_says_each_answer(
        canary, release_bot, alice):
    import time

    from fleet.webhooks.delivery import verify
    from fleet.webhooks.requests import create_webhook
    from rollouts.canary.specs import parse_steps
    from rollouts.models import RolloutEvent

    hook = create_webhook(alice, canary.tenant, name="release-bot", url=release_bot["url"])
    steps = parse_steps([{"set_weight": 10}, {"confirm": {"webhook": "release-bot",
                                                          "every_s": 1}}],
                        webhooks={"release-bot"})
    Rollout.objects.filter(pk=canary.pk).update(steps=steps)
    release_bot["answers"] = [409, 409, 200]
    for _ in range(3):  # loading, 10%, the first ask
        rollout_reconciler.advance(canary.pk, force=True)
    held = Rollout.objects.get(pk=canary.pk)
    assert held.step_index == 1 and held.weights == {"1": 90, "2": 10}
    assert held.waiting_for == "release-bot to confirm (asked 1 times, last answer: HTTP 409)"
    rollout_reconciler.advance(canary.pk, force=True)  # within every_s: not asked again
    assert len(release_bot["got"]) == 1
    for _ in range(2):
        time.sleep(1.05)
        rollout_reconciler.advance(canary.pk, force=True)

    moved = Rollout.objects.get(pk=canary.pk)
    assert moved.step_index == 2 and moved.step_state == {}, moved.waiting_for
    asked = release_bot["got"][0]
    assert asked["headers"]["X-Switchyard-Event"] == "rollout.confirm"
    assert verify(hook.webhook.secret, asked["headers"]["X-Switchyard-Timestamp"],
                  asked["body"], asked["headers"]["X-Switchyard-Signature"])
    data = asked["data"]["data"]
    assert (data["rollout"], data["candidate"], data["baseline"], data["step"]) == (
        canary.pk, 2, 1, 2)
    said = list(RolloutEvent.objects.filter(rollout=canary, kind="step").values_list(
        "message", flat=True))
    # Each new answer once (two 409s, one line), then the confirmation.
    assert sum("release-bot did not confirm yet (HTTP 409)" in m for m in said) == 1, said
    assert "step 2: release-bot confirmed (HTTP 200)" in said


def test_a_confirm_step_without_a_2xx_in_time_goes_back_to_the_baseline(
        canary, release_bot, alice):
    import time

    from fleet.webhooks.requests import create_webhook

    create_webhook(alice, canary.tenant, name="release-bot", url=release_bot["url"])
    Rollout.objects.filter(pk=canary.pk).update(steps=[
        {"set_weight": 10}, {"confirm": {"webhook": "release-bot", "every_s": 1, "timeout_s": 2}}])
    release_bot["answers"] = [503]
    for _ in range(3):
        rollout_reconciler.advance(canary.pk, force=True)
    time.sleep(2.05)
    rollout_reconciler.advance(canary.pk, force=True)

    ended = Rollout.objects.get(pk=canary.pk)
    assert ended.state == State.ROLLED_BACK and ended.weights == {"1": 100}
    assert ended.reason.startswith("step 2: release-bot did not confirm within 2 s (asked "), (
        ended.reason)
    assert "last answer: HTTP 503" in ended.reason


def test_a_confirm_step_must_name_an_active_webhook_of_the_tenant(canary, dave, alice):
    from console.exceptions import DomainError
    from fleet.webhooks.requests import create_webhook

    create_webhook(alice, canary.tenant, name="release-bot", url="https://hooks.example.com/x")
    with pytest.raises(DomainError) as refused:
        rollouts.create_rollout(dave, canary.deployment, version=2, baseline=1,
                                steps=[{"confirm": {"webhook": "nope"}}])
    assert refused.value.field == "steps[0].webhook"
    assert "no active webhook named 'nope'; its webhooks: release-bot" in str(refused.value)


# --------------------------------------------------------------------------------------------
# The bake after 100%, and the rollback webhook
# --------------------------------------------------------------------------------------------


def _baked(canary, bake: dict) -> None:
    """The canary of ``canary`` with one 10% step and ``bake`` as its analysis, at 100%."""
    Rollout.objects.filter(pk=canary.pk).update(steps=[{"set_weight": 10}], analysis=bake)
    for _ in range(4):  # loading, 10%, every step passed: promoting, at 100%: baking
        rollout_reconciler.advance(canary.pk, force=True)


def _sample_lines(deployment_id: int, variant: str, t: float, ms: float, n: int, rng) -> list[str]:
    import json
    import uuid

    return [json.dumps({
        "time": "t", "msec": round(t, 3), "route": f"dep-{deployment_id}", "variant": variant,
        "mirror": False, "method": "POST", "path": "/v2/models/m/infer", "status": 200,
        "upstream_addr": "a", "upstream_status": "200",
        "upstream_response_time": f"{value / 1000:.3f}", "request_time": round(value / 1000, 3),
        "bytes_sent": 10, "request_id": uuid.uuid4().hex,
    }) for value in (ms * rng.lognormal(0, 0.2, n))]


def test_a_bake_holds_the_promotion_at_100_percent_and_a_regression_in_it_goes_back(
        canary, settings):
    import time
    import uuid
    from datetime import timedelta

    import numpy as np

    from rollouts.models import RolloutEvent
    from rollouts.traffic import samples

    settings.SWITCHYARD_REDIS_PREFIX = f"test-bake-{uuid.uuid4().hex[:8]}"
    _baked(canary, {"bake_s": 600, "window_s": 1, "warmup_s": 0})
    baking = Rollout.objects.get(pk=canary.pk)
    assert baking.state == State.BAKING and baking.weights == {"2": 100}
    assert baking.waiting_for.startswith("baking at 100% until ") and "back to v1" in (
        baking.waiting_for)
    assert baking.finished_at is None  # not promoted yet: v1 stays loaded to go back to

    # A steady first second, then the same version twice as slow.
    now = time.time()
    Rollout.objects.filter(pk=canary.pk).update(
        step_started_at=timezone.now() - timedelta(seconds=1.5))
    rng = np.random.default_rng(7)
    samples.record(_sample_lines(canary.deployment_id, "v2-triton-a", now - 1.0, 5.0, 300, rng)
                   + _sample_lines(canary.deployment_id, "v2-triton-a", now - 0.2, 10.0, 300, rng))
    rollout_reconciler.advance(canary.pk, force=True)

    ended = Rollout.objects.get(pk=canary.pk)
    assert ended.state == State.ROLLED_BACK and ended.weights == {"1": 100}, ended.reason
    assert ended.reason.startswith("v2 regressed while baking at 100%: median"), ended.reason
    evidence = RolloutEvent.objects.filter(rollout=canary, kind="rollback").latest("id").data
    assert evidence["bake"]["verdict"] == "fail"


def test_a_bake_that_shows_nothing_ends_the_promotion(canary):
    import time

    from rollouts.models import RolloutEvent

    _baked(canary, {"bake_s": 1})
    assert Rollout.objects.get(pk=canary.pk).state == State.BAKING
    time.sleep(1.05)
    rollout_reconciler.advance(canary.pk, force=True)  # baked: promoting
    rollout_reconciler.advance(canary.pk, force=True)
    done = Rollout.objects.get(pk=canary.pk)
    assert done.state == State.SUCCEEDED and done.weights == {"2": 100}
    said = list(RolloutEvent.objects.filter(rollout=canary).values_list("message", flat=True))
    assert "baked 1 s at 100% with no regression shown: v2 is promoted" in said



def test_a_deployers_promote_skips_the_rest_of_a_bake(canary, dave):
    from rollouts.models import RolloutEvent

    _baked(canary, {"bake_s": 3600})
    assert Rollout.objects.get(pk=canary.pk).state == State.BAKING
    rollouts.request_action(dave, Rollout.objects.get(pk=canary.pk), "promote", "looks good")
    for _ in range(2):
        rollout_reconciler.advance(canary.pk, force=True)
    skipped = Rollout.objects.get(pk=canary.pk)
    assert skipped.state == State.SUCCEEDED and skipped.weights == {"2": 100}
    assert RolloutEvent.objects.filter(rollout=canary,
                                       message__contains="the rest of the bake is skipped").exists()


def test_the_rollback_webhook_is_asked_while_the_rollout_runs_and_a_2xx_goes_back(
        canary, release_bot, alice):
    import time

    from fleet.webhooks.requests import create_webhook

    create_webhook(alice, canary.tenant, name="pager", url=release_bot["url"])
    Rollout.objects.filter(pk=canary.pk).update(
        analysis={"rollback": {"webhook": "pager", "every_s": 1}})
    release_bot["answers"] = [404, 200]
    for _ in range(3):  # loading; 10% (asked: 404, go on); the pause step
        rollout_reconciler.advance(canary.pk, force=True)
    held = Rollout.objects.get(pk=canary.pk)
    assert held.state == State.PAUSED and held.weights == {"1": 90, "2": 10}
    assert len(release_bot["got"]) == 1
    rollout_reconciler.advance(canary.pk, force=True)  # within every_s: not asked again
    assert len(release_bot["got"]) == 1
    time.sleep(1.05)
    rollout_reconciler.advance(canary.pk, force=True)  # paused, asked again: 200

    ended = Rollout.objects.get(pk=canary.pk)
    assert ended.state == State.ROLLED_BACK and ended.weights == {"1": 100}
    assert ended.reason == "the rollback webhook pager asked for a rollback (HTTP 200)"
    asked = release_bot["got"][-1]
    assert asked["headers"]["X-Switchyard-Event"] == "rollout.rollback"
    assert asked["data"]["data"]["state"] == "paused"


def test_bake_and_rollback_are_refused_naming_the_field_where_they_cannot_apply(canary, dave):
    from console.exceptions import DomainError

    Rollout.objects.filter(pk=canary.pk).update(state=State.ABORTED)
    cases = [
        ({"analysis_settings": {"rollback": {"webhook": "nope"}}}, "analysis.rollback.webhook"),
        ({"analysis_settings": {"rollback": {"webhook": "x", "every_s": 0}}},
         "analysis.rollback.every_s"),
        ({"steps": [{"analysis": {"bake_s": 60}}]}, "steps[0].bake_s"),
        ({"analysis_settings": {"bake_s": -1}}, "analysis.bake_s"),
    ]
    for extra, field in cases:
        with pytest.raises(DomainError) as refused:
            rollouts.create_rollout(dave, canary.deployment, version=2, baseline=1, **extra)
        assert refused.value.field == field, (extra, refused.value.field, str(refused.value))
    with pytest.raises(DomainError) as refused:
        rollouts.create_rollout(dave, canary.deployment, strategy="ab", duration_s=60,
                                variants=[{"version": 1, "weight": 50},
                                          {"version": 2, "weight": 50}],
                                analysis_settings={"bake_s": 60})
    assert refused.value.field == "analysis.bake_s"
