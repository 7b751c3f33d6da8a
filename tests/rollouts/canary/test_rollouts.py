"""Rollouts on the real stack: versions loaded on the session's REAL Triton through the load
path, traffic through the session's REAL nginx, per-request samples through the REAL collector
into Redis, and real requests sent while the reconciler judges.

fraud-scorer's demo model sleeps ``sleep_ms`` (or ``sleep_ms_v<version>``) from its config's
parameters on every request, so a version made slower by its Triton config is a real
regression the judge has to find in real latencies.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from django.core.exceptions import PermissionDenied

from fleet.models import InferenceServer, Membership
from local.triton import TritonProcess, start_triton
from rollouts import leases
from rollouts.canary import actions as rollout_actions
from rollouts.canary import analysis as canary_analysis
from rollouts.canary import reconciler as rollout_reconciler
from rollouts.canary import requests as rollouts
from rollouts.deployments import consistency
from rollouts.loads import reconciler as load_reconciler
from rollouts.loads import requests as loads
from rollouts.models import (
    Alias,
    ModelLoad,
    Rollout,
    RolloutAnalysis,
    RolloutEvent,
    Route,
    RouteRevision,
)
from rollouts.traffic import routes, samples
from tests.factories import MembershipFactory, UserFactory
from tests.fixtures.celery_worker import CeleryWorker, database_url, forget_queue, start_worker
from tests.fixtures.samples import CollectorProcess
from tests.rollouts.triton_world import held, index_state, make_artifact, make_config_text

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]

State = Rollout.State
PREFIX = "switchyard-test-rollouts"
INFER = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [0.1, 0.5, 2.0]}]}


def slow_config(version: int, sleep_ms: float) -> dict:
    """The demo model's parameters with ``version`` sleeping ``sleep_ms`` (the others 4 ms)."""
    return {"parameters": {
        "sleep_ms": {"string_value": "4"},
        f"sleep_ms_v{version}": {"string_value": str(sleep_ms)},
        "error_rate": {"string_value": "0"},
    }}


@pytest.fixture(scope="module")
def collector(tmp_path_factory) -> Iterator[CollectorProcess]:
    import os

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    proc = CollectorProcess(tmp_path_factory.mktemp("collector") / "collector.log", url,
                            prefix=PREFIX)
    try:
        yield proc
    finally:
        proc.stop()


class CanaryTriton:
    """A second tritonserver of the module, for a canary on a server of its own; started
    on first use and again after a test killed it."""

    def __init__(self, runtime, base) -> None:
        self.runtime, self.base, self.started = runtime, base, 0
        self.proc: TritonProcess | None = None

    def running(self) -> TritonProcess:
        if self.proc is None or not self.proc.is_running():
            self.stop()
            self.started += 1
            repository = self.base / f"models-{self.started}"
            repository.mkdir()
            self.proc = start_triton(self.runtime, repository,
                                     log_path=self.base / f"tritonserver-{self.started}.log")
        return self.proc

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()  # after a SIGKILL too: its stubs and shm files go
            self.proc = None


@pytest.fixture(scope="module")
def canary_triton(triton_runtime, tmp_path_factory) -> Iterator[CanaryTriton]:
    holder = CanaryTriton(triton_runtime, tmp_path_factory.mktemp("canary-triton"))
    try:
        yield holder
    finally:
        holder.stop()


def second_server(world, proc: TritonProcess, name: str, repository: str | None = None):
    """``proc``, a Triton of the module's own, as a second server of the world's deployment
    (added after v1 was loaded: v1 stays on "triton" only); ``repository``: the model
    repository Switchyard is told it has, when not its own."""
    server = InferenceServer.objects.create(
        cluster=world.cluster, node=world.node, name=name,
        runtime=InferenceServer.Runtime.TRITON, http_url=proc.http_url,
        model_repository=repository or str(proc.model_repository), log_path=str(proc.log_path),
    )
    world.deployment.servers.add(server)
    return server


@pytest.fixture
def stack(world, use_route_nginx, collector, settings):
    """The world's deployment with v1 ready and routed, its samples collected into Redis."""
    settings.SWITCHYARD_COLLECTOR_PORT = collector.port
    settings.SWITCHYARD_REDIS_PREFIX = PREFIX
    store = samples.connect()
    for key in store.scan_iter(f"{PREFIX}:*"):
        store.delete(key)
    settings.SWITCHYARD_ROLLOUT_INTERVAL_S = 0.5
    v1 = world.version(1)
    rows, _ = loads.request_load(world.user, world.deployment, v1)
    assert load_reconciler.run_to_end(rows[0].pk).state == ModelLoad.State.READY
    route, _ = routes.ensure_route(world.user, world.deployment)
    world.route_url = route.url
    world.v1 = v1
    yield world
    # Unloads a rollout asked for finish before the world takes its versions off.
    for load in ModelLoad.objects.filter(state__in=ModelLoad.IN_FLIGHT):
        load_reconciler.run_to_end(load.pk)
    Route.objects.filter(pk=world.deployment.pk).delete()


@dataclass
class Traffic:
    """Clients calling the route until stopped (or ``limit_s`` passed, whatever happens)."""

    url: str
    model: str
    clients: int = 2
    limit_s: float = 120.0
    stop: threading.Event = field(default_factory=threading.Event)
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    answered: dict[str, float] = field(default_factory=dict)  # variant: its last answer's end
    resent: int = 0

    def __enter__(self) -> Traffic:
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.clients)]
        for thread in self.threads:
            thread.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while not self.stop.is_set() and time.monotonic() < deadline:
                status = self._call(client)
                self.sent += 1
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def _call(self, client: httpx.Client) -> int:
        try:
            try:
                answer = client.post(f"/v2/models/{self.model}/infer", json=INFER)
            except httpx.RemoteProtocolError as exc:
                # An idle keep-alive connection that nginx closed as the request went out
                # (a reload's old worker lets its idle connections go): nothing was answered,
                # and an HTTP/1.1 client sends it again on a new connection. Counted apart.
                if "without sending a response" not in str(exc):
                    raise
                self.resent += 1
                answer = client.post(f"/v2/models/{self.model}/infer", json=INFER)
        except httpx.HTTPError as exc:
            self.failures.append(f"{time.time():.3f} {type(exc).__name__}: {exc}")
            return 0
        self.answered[answer.headers.get("X-Switchyard-Variant", "")] = time.time()
        if answer.status_code != 200:
            self.failures.append(f"{time.time():.3f} {answer.status_code} {answer.text[:200]}")
        return answer.status_code

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)


def quick(**extra) -> dict:
    return {"min_samples": 100, "planned_samples": 400, "timeout_s": 60, **extra}


def test_a_canary_30_percent_slower_by_its_config_is_rolled_back_with_the_evidence(stack):
    world = stack
    slower = world.version(3, config=slow_config(3, 5.6))
    made, created = rollouts.create_rollout(
        world.user, world.deployment, version=3,
        steps=[{"set_weight": 50}, {"analysis": {}}], analysis_settings=quick(),
    )
    assert created and made.state == State.LOADING and made.baseline == world.v1

    with Traffic(world.route_url, world.model.name):
        ended = rollout_reconciler.run_to_end(made.pk, max_ticks=400)

    assert ended.state == State.ROLLED_BACK, (ended.state, ended.reason)
    assert "analysis failed" in ended.reason and "slower" in ended.reason
    route = Route.objects.get(pk=world.deployment.pk)
    assert route.version_weights.get(1) == 100 and route.version_weights.get(3, 0) == 0
    judged = RolloutAnalysis.objects.get(rollout=ended)
    assert judged.verdict == RolloutAnalysis.Verdict.FAIL
    median = next(m for m in judged.judgement["metrics"] if m["name"] == "median")
    # A real regression: the lower bound of the slowdown is beyond the 5% allowed.
    assert median["state"] == "fail" and median["low"] > math.log(1.05), median
    assert median["canary"] > median["baseline"]
    rollback = ended.events.get(kind="rollback")
    assert rollback.data["judgement"]["verdict"] == "fail"
    # The candidate is taken off again: its quota comes back.
    unload = ModelLoad.objects.filter(version=slower).order_by("-created_at").first()
    assert unload.state in (ModelLoad.State.UNLOADING, ModelLoad.State.UNLOADED)
    load_reconciler.run_to_end(unload.pk)


def test_an_identical_canary_passes_is_promoted_and_the_alias_moves(stack):
    world = stack
    world.version(2, config=slow_config(2, 4))
    # Showing an error rate within 0.2 points of no errors takes about 4,000 canary requests;
    # within 1 point, about 800: the test allows 1 point, and the plan allows the requests.
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2, alias="production",
        steps=[{"set_weight": 50}, {"analysis": {}}],
        analysis_settings=quick(planned_samples=20000, timeout_s=120, error_tolerance_pct=1.0),
    )
    with Traffic(world.route_url, world.model.name):
        ended = rollout_reconciler.run_to_end(made.pk, max_ticks=800)

    judged = RolloutAnalysis.objects.get(rollout=made)
    assert ended.state == State.SUCCEEDED, (ended.state, ended.waiting_for, judged.reasons)
    assert Route.objects.get(pk=world.deployment.pk).version_weights.get(2) == 100
    assert Alias.objects.get(model=world.model, name="production").version.version == 2
    assert judged.verdict == RolloutAnalysis.Verdict.PASS, judged.reasons
    # A pass is what the bounds show: the median's and the errors' upper bounds within their
    # tolerances; the guards (the tail, the current window) at least not shown beyond theirs.
    metrics = judged.judgement["metrics"]
    assert all(m["state"] == "within" and m["high"] <= m["tolerance"]
               for m in metrics if m["name"] in ("median", "errors")), metrics
    assert all(m["state"] != "fail" for m in metrics), metrics
    # v1 is unloaded once v2 carries everything.
    old = ModelLoad.objects.filter(version=world.v1).order_by("-created_at").first()
    load_reconciler.run_to_end(old.pk)
    assert ModelLoad.objects.get(pk=old.pk).state == ModelLoad.State.UNLOADED


def test_a_promotion_under_traffic_fails_no_request_while_the_baseline_is_drained_and_unloaded(
        stack):
    world = stack
    # The version in production answers in 0.8 s, so requests are in flight on it whenever
    # its traffic moves: v2, promoted first with no traffic.
    slow = world.version(2, config=slow_config(2, 800))
    first, _ = rollouts.create_rollout(world.user, world.deployment, version=2,
                                       steps=[{"set_weight": 100}], analysis_settings=quick())
    assert rollout_reconciler.run_to_end(first.pk, max_ticks=100).state == State.SUCCEEDED
    for load in ModelLoad.objects.filter(state=ModelLoad.State.UNLOADING):
        load_reconciler.run_to_end(load.pk, max_steps=200)
    world.version(3, config=slow_config(3, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=3,
        steps=[{"set_weight": 50}, {"pause": {"seconds": 1}}], analysis_settings=quick(),
    )
    with Traffic(world.route_url, world.model.name, clients=4) as traffic:
        ended = rollout_reconciler.run_to_end(made.pk, max_ticks=200)
        load = ModelLoad.objects.filter(version=slow).order_by("-created_at").first()
        # The unload as a worker runs it, at once, while the clients go on.
        unloaded = load_reconciler.run_to_end(load.pk, max_steps=200)
        time.sleep(0.5)

    assert ended.state == State.SUCCEEDED, (ended.state, ended.reason)
    assert weights_now(world).get(3) == 100 and weights_now(world).get(2, 0) == 0
    assert unloaded.state == ModelLoad.State.UNLOADED, unloaded.state
    assert traffic.statuses.get(200, 0) > 100
    assert set(traffic.statuses) == {200}, traffic.failures
    # Sent again: only requests on a connection a reload closed unanswered, a few a reload.
    assert traffic.resent <= 4 * RouteRevision.objects.filter(route_id=world.deployment.pk).count()
    # v2 left the route, its requests in flight were answered, and only then did it leave the
    # server: the drain waited for the router's workers that still had them.
    drained = unloaded.events.get(message__startswith="drained v2 on triton")
    assert "no request in flight" in drained.message
    assert traffic.answered["v2-triton"] <= drained.created_at.timestamp()


def test_a_canary_whose_server_stops_answering_is_rolled_back_within_seconds(stack, local_triton):
    """The canary's upstream is made unreachable (the server record points at a closed port,
    as a killed server is): its requests fail upstream and the next tick goes back."""
    world = stack
    world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2,
        steps=[{"set_weight": 50}, {"pause": {}}], analysis_settings=quick(),
    )
    with Traffic(world.route_url, world.model.name):
        paused = rollout_reconciler.run_to_end(made.pk, max_ticks=200)
        assert paused.state == State.PAUSED, (paused.state, paused.reason)
        InferenceServer.objects.filter(pk=world.server.pk).update(
            health=InferenceServer.Health.UNREACHABLE, health_detail="connection refused")
        started = time.monotonic()
        rollout_reconciler.advance(made.pk, force=True)
        took = time.monotonic() - started
    InferenceServer.objects.filter(pk=world.server.pk).update(health=InferenceServer.Health.HEALTHY)
    ended = Rollout.objects.get(pk=made.pk)
    assert ended.state == State.ROLLED_BACK, ended.reason
    assert "unreachable" in ended.reason
    assert Route.objects.get(pk=world.deployment.pk).version_weights.get(1) == 100
    assert took < 10


# --------------------------------------------------------------------------------------------
# Helpers of the tests below
# --------------------------------------------------------------------------------------------


def weights_now(world) -> dict[int, int]:
    """The weights by version of the route in force (what nginx was given)."""
    return Route.objects.get(pk=world.deployment.pk).version_weights


def revisions_of(world, weights: dict[int, int]) -> int:
    """How many applied route revisions put exactly ``weights`` (by version) in force."""
    wanted = {str(n): w for n, w in weights.items()}
    found = RouteRevision.objects.filter(route_id=world.deployment.pk,
                                         result=RouteRevision.Result.APPLIED)
    return sum(1 for r in found if {k: v for k, v in r.weights.items() if v} == wanted)


def variants_answering(world, requests: int = 20, headers: dict | None = None) -> dict[str, int]:
    """Send ``requests`` through the route; the X-Switchyard-Variant of the answers, counted
    (every answer must be a 200)."""
    seen: dict[str, int] = {}
    with httpx.Client(base_url=world.route_url, timeout=5) as client:
        for _ in range(requests):
            answer = client.post(f"/v2/models/{world.model.name}/infer", json=INFER,
                                 headers=headers or {})
            assert answer.status_code == 200, answer.text
            name = answer.headers["x-switchyard-variant"]
            seen[name] = seen.get(name, 0) + 1
    return seen


def messages(rollout: Rollout, kind: str | None = None) -> list[str]:
    events = RolloutEvent.objects.filter(rollout=rollout).order_by("created_at", "id")
    return [e.message for e in events if kind is None or e.kind == kind]


def wait_until(rollout_id: int, until, *, limit_s: float = 60) -> Rollout:
    """run_to_end with a time limit: ticks (loads included) until ``until`` says so."""
    deadline = time.monotonic() + limit_s
    while True:
        found = rollout_reconciler.run_to_end(rollout_id, max_ticks=40, tick_s=0.1, until=until)
        if until(found) or found.state in Rollout.FINAL or time.monotonic() > deadline:
            return found


# --------------------------------------------------------------------------------------------
# A/B splits
# --------------------------------------------------------------------------------------------


def run_ab(world, version: int, *, sample_size: int = 150, clients: int = 4, **extra) -> Rollout:
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, strategy=Rollout.Strategy.AB,
        variants=[{"version": 1, "weight": 50}, {"version": version, "weight": 50}],
        sample_size=sample_size, promote=False, **extra,
    )
    with Traffic(world.route_url, world.model.name, clients=clients, limit_s=90):
        ended = rollout_reconciler.run_to_end(made.pk, max_ticks=400)
    assert ended.state == State.SUCCEEDED, (ended.state, ended.reason, ended.waiting_for)
    return ended


def test_an_ab_split_of_two_equal_versions_finds_no_difference_and_goes_back(stack):
    """Two versions sleeping the same 4 ms: every variant's difference is "none", the summary
    says so, and the traffic goes back to the reference. The verdict's intervals are 95%
    ones (p50 and p95), so two truly equal versions show a "difference" about one split in
    ten by chance: a second split is run then, and must say "no difference" (both wrong by
    chance: about 1 in 100). A verdict that says "worse"/"better" for equal versions every
    time still fails. Two clients, not four: with four, each version's single instance
    queues requests, and on a busy 2-core machine one stub process falling behind the
    other made a real (if accidental) 3 ms p50 difference in both splits of a run."""
    world = stack
    world.version(2, config=slow_config(2, 4))
    for _attempt in range(2):
        ended = run_ab(world, 2, clients=2)
        verdict = ended.verdict
        assert verdict["reference"] == 1
        assert verdict["samples"]["1"] >= 150 and verdict["samples"]["2"] >= 150, verdict
        if all(v["difference"] == "none" for v in verdict["variants"]):
            break
    assert all(v["difference"] == "none" for v in verdict["variants"]), verdict
    assert verdict["summary"].startswith("no difference"), verdict["summary"]
    assert verdict["winner"] is None
    assert ended.reason.startswith("no difference")
    assert weights_now(world) == {1: 100, 2: 0}
    assert set(variants_answering(world, 10)) == {"v1-triton"}
    assert ended.events.filter(kind="analysis", message__startswith="verdict: no difference").exists()


def test_an_ab_split_with_a_real_difference_names_the_slower_version_worse(stack):
    """v2 sleeps 8 ms, v1 (the reference) 4 ms: v2 is "worse", its p50 difference interval
    lies above zero (it excludes it), and no winner is promoted."""
    world = stack
    world.version(2, config=slow_config(2, 8))
    ended = run_ab(world, 2, sample_size=100)
    (row,) = ended.verdict["variants"]
    assert row["version"] == 2 and row["difference"] == "worse", row
    assert row["p50_diff_ms"]["low"] > 0, row["p50_diff_ms"]
    # At least the 4 ms it sleeps longer (more with the queueing behind its one instance).
    assert row["p50_diff_ms"]["estimate"] >= 3, row["p50_diff_ms"]
    assert ended.verdict["summary"] == "v2 worse than v1"
    assert ended.verdict["winner"] is None
    assert weights_now(world) == {1: 100, 2: 0}


def test_a_sticky_ab_split_keeps_each_key_on_one_variant(stack):
    """With sticky_header, requests carrying one key always reach the same variant (the
    X-Switchyard-Variant nginx answers with), while the keys spread over both variants."""
    world = stack
    world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, strategy=Rollout.Strategy.AB,
        variants=[{"version": 1, "weight": 50}, {"version": 2, "weight": 50}],
        duration_s=2, promote=False, sticky_header="X-User",
    )
    split = wait_until(made.pk, lambda r: bool(r.weights))
    assert split.state == State.PROGRESSING and split.weights == {"1": 50, "2": 50}, split.reason
    route = Route.objects.get(pk=world.deployment.pk)
    assert route.policy == "sticky" and route.sticky_header == "X-User"

    by_key = {f"user-{i}": variants_answering(world, 6, {"X-User": f"user-{i}"}) for i in range(16)}

    assert all(len(seen) == 1 for seen in by_key.values()), by_key
    reached = {name for seen in by_key.values() for name in seen}
    assert reached == {"v1-triton", "v2-triton"}, by_key  # 16 keys, 50/50: both (1 in 32768)
    ended = rollout_reconciler.run_to_end(made.pk, max_ticks=100)
    assert ended.state == State.SUCCEEDED, ended.reason
    assert weights_now(world) == {1: 100, 2: 0}
    # Judged per user: each of the 16 keys, hashed, is one user of 6 requests.
    (row,) = ended.verdict["variants"]
    assert row["unit"] == "user", row
    assert 1 <= row["users"] < row["samples"] and 1 <= row["reference_users"] < row["reference_samples"]
    assert row["users"] + row["reference_users"] <= 16, row
    assert "judged per user of X-User" in ended.verdict["summary"]


# --------------------------------------------------------------------------------------------
# A canary whose server is killed
# --------------------------------------------------------------------------------------------


def test_a_canary_whose_own_triton_is_killed_is_rolled_back_within_ticks(stack, canary_triton):
    """The candidate runs on a second, real Triton of its own (the rollout's ``servers``),
    the baseline on the first. SIGKILL of that Triton (its process group) under traffic: its requests fail
    upstream (nginx answers 502), the watch of the next tick sees it, puts every request
    back on the baseline with the evidence, and the baseline keeps answering 200."""
    world = stack
    interval = 0.5  # SWITCHYARD_ROLLOUT_INTERVAL_S of the stack
    proc = canary_triton.running()
    second = second_server(world, proc, "triton-canary")
    v2 = world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2, servers=["triton-canary"],
        steps=[{"set_weight": 50}, {"pause": {"seconds": 600}}], analysis_settings=quick(),
    )
    assert made.servers == ["triton-canary"]
    try:
        with Traffic(world.route_url, world.model.name, clients=4, limit_s=90) as traffic:
            canary = wait_until(made.pk, lambda r: r.step_index == 1)
            assert canary.state == State.PROGRESSING, (canary.state, canary.reason)
            assert weights_now(world) == {1: 50, 2: 50}
            route = Route.objects.get(pk=world.deployment.pk)
            assert {m["server"] for m in route.variants.values() if m["version"] == 2} == {"triton-canary"}
            assert {m["server"] for m in route.variants.values() if m["version"] == 1} == {"triton"}
            time.sleep(1.0)  # both answer for a while
            before_kill = dict(traffic.statuses)
            assert before_kill.get(200, 0) > 20 and set(before_kill) == {200}, before_kill

            # The server and its Python backend stubs (its process group) die at once, as
            # in a crash of its host.
            os.killpg(proc.pid, signal.SIGKILL)
            killed_at = time.time()
            ended = rollout_reconciler.run_to_end(made.pk, max_ticks=120, tick_s=interval)
            took = ended.finished_at.timestamp() - killed_at

            # After the rollback: only the baseline answers, and every answer is a 200.
            time.sleep(0.5)
            after = dict(traffic.statuses)
            time.sleep(1.5)
            final = dict(traffic.statuses)
        assert not proc.is_running()
        assert ended.state == State.ROLLED_BACK, (ended.state, ended.reason)
        assert "v2's server did not answer" in ended.reason, ended.reason
        rollback = ended.events.get(kind="rollback")
        health = rollback.data["health"]
        assert health["upstream_failures"] >= canary_analysis.UPSTREAM_MIN, health
        assert health["upstream_failures"] >= canary_analysis.UPSTREAM_SHARE * health["requests"], health
        assert 502 in health["statuses"], health
        assert weights_now(world) == {1: 100, 2: 0}
        # The bound: the failures are seen by the first tick after UPSTREAM_MIN of them have
        # come (under 4 clients at 50%: well under a tick), so at most two ticks, plus the
        # tick's own work (the way back is an nginx reload, ~1 s), plus 5 s of slack for a
        # loaded 2-core machine shared with other test runs: 2 * 0.5 + 1 + 5 = 7 s.
        assert took < 2 * interval + 6, f"rolled back {took:.2f} s after the kill"
        gained = {code: final.get(code, 0) - after.get(code, 0) for code in final}
        assert gained.get(200, 0) > 20 and {c for c, n in gained.items() if n} == {200}, gained
        assert set(variants_answering(world, 10)) == {"v1-triton"}
    finally:
        # The unload of v2 asked for by the rollback cannot reach the dead server.
        load_reconciler.forget_server_state(second, "the test killed its Triton")
        world.deployment.servers.remove(second)
        assert ModelLoad.objects.filter(version=v2, state__in=ModelLoad.IN_FLIGHT).count() == 0


# --------------------------------------------------------------------------------------------
# People's actions
# --------------------------------------------------------------------------------------------


def test_pause_holds_the_weights_resume_goes_on_and_promote_now_skips_the_rest(stack):
    world = stack
    world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2, alias="production",
        steps=[{"set_weight": 20}, {"pause": {"seconds": 600}}, {"set_weight": 50},
               {"analysis": {}}],
        analysis_settings=quick(),
    )
    canary = wait_until(made.pk, lambda r: r.step_index == 1)
    assert canary.state == State.PROGRESSING and weights_now(world) == {1: 80, 2: 20}

    rollouts.request_action(world.user, canary, "pause", reason="reading the dashboards")
    paused = rollout_reconciler.run_to_end(made.pk, max_ticks=20)
    assert paused.state == State.PAUSED, paused.reason
    assert "paused by" in paused.waiting_for
    revisions = RouteRevision.objects.filter(route_id=world.deployment.pk).count()
    for _ in range(3):  # ticks of a paused rollout watch it and change nothing
        rollout_reconciler.advance(made.pk, force=True)
        time.sleep(0.1)
    still = Rollout.objects.get(pk=made.pk)
    assert (still.state, still.step_index, still.weights) == (State.PAUSED, 1, {"1": 80, "2": 20})
    assert RouteRevision.objects.filter(route_id=world.deployment.pk).count() == revisions
    assert weights_now(world) == {1: 80, 2: 20}
    assert set(variants_answering(world, 40)) == {"v1-triton", "v2-triton"}  # 0.8^40: never v2

    rollouts.request_action(world.user, still, "resume")
    resumed = wait_until(made.pk, lambda r: r.state == State.PROGRESSING and not r.requested_action)
    assert resumed.state == State.PROGRESSING and resumed.step_index == 1  # a timed pause goes on
    assert weights_now(world) == {1: 80, 2: 20}

    rollouts.request_action(world.user, resumed, "promote", reason="enough seen")
    ended = rollout_reconciler.run_to_end(made.pk, max_ticks=40)
    assert ended.state == State.SUCCEEDED, (ended.state, ended.reason)
    assert weights_now(world).get(2) == 100 and weights_now(world).get(1, 0) == 0
    assert Alias.objects.get(model=world.model, name="production").version.version == 2
    assert revisions_of(world, {1: 50, 2: 50}) == 0  # the remaining steps were skipped
    assert not RolloutAnalysis.objects.filter(rollout=ended).exists()
    assert any("the remaining steps are skipped" in m for m in messages(ended, "action"))
    assert set(variants_answering(world, 10)) == {"v2-triton"}


def test_abort_goes_back_to_the_baseline_and_a_retry_starts_again_from_step_0(stack):
    world = stack
    world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2,
        steps=[{"set_weight": 30}, {"pause": {}}], analysis_settings=quick(),
    )
    paused = rollout_reconciler.run_to_end(made.pk, max_ticks=100)
    assert paused.state == State.PAUSED and weights_now(world) == {1: 70, 2: 30}

    rollouts.request_action(world.user, paused, "abort", reason="wrong day")
    aborted = rollout_reconciler.run_to_end(made.pk, max_ticks=20)
    assert aborted.state == State.ABORTED, aborted.reason
    assert aborted.reason.startswith("aborted by") and "wrong day" in aborted.reason
    assert aborted.weights == {"1": 100}
    assert weights_now(world).get(1) == 100 and weights_now(world).get(2, 0) == 0
    assert set(variants_answering(world, 10)) == {"v1-triton"}
    # The candidate is unloaded (beat's load tick does it; run_to_end advances only the
    # loads a rollout asked for, not this unload).
    (unload,) = ModelLoad.objects.filter(version__model=world.model, version__version=2)
    assert load_reconciler.run_to_end(unload.pk).state == ModelLoad.State.UNLOADED

    again = rollouts.retry(world.user, aborted, reason="right day")
    assert (again.state, again.attempt, again.step_index, again.weights) == (
        State.LOADING, 2, 0, {})
    repeated = rollout_reconciler.run_to_end(made.pk, max_ticks=200)
    assert repeated.state == State.PAUSED and repeated.step_index == 1, (
        repeated.reason, repeated.waiting_for)
    assert weights_now(world) == {1: 70, 2: 30}
    assert revisions_of(world, {1: 70, 2: 30}) == 2  # step 0 once per attempt
    assert sum("30% of the traffic" in m for m in messages(repeated, "step")) == 2
    rollouts.request_action(world.user, repeated, "abort")
    assert rollout_reconciler.run_to_end(made.pk, max_ticks=20).state == State.ABORTED


def test_an_approval_step_waits_for_an_approver_who_is_not_the_requester(stack):
    world = stack
    world.version(2, config=slow_config(2, 4))
    tag = uuid.uuid4().hex[:6]
    requester, other = (
        MembershipFactory(user=UserFactory(username=f"{who}-{tag}"), tenant=world.tenant,
                          role=Membership.Role.APPROVER).user
        for who in ("requester", "approver")
    )
    made, _ = rollouts.create_rollout(
        requester, world.deployment, version=2,
        steps=[{"set_weight": 20}, {"approval": {}}, {"set_weight": 60}],
        analysis_settings=quick(), unload_previous=False,
    )
    waiting = rollout_reconciler.run_to_end(made.pk, max_ticks=100)
    assert waiting.state == State.PENDING_APPROVAL and waiting.step_index == 1, waiting.reason
    assert waiting.waiting_for.startswith("an approver who is not the requester")
    for _ in range(2):  # ticks leave it waiting, at its weights
        rollout_reconciler.advance(made.pk, force=True)
    assert Rollout.objects.get(pk=made.pk).state == State.PENDING_APPROVAL
    assert weights_now(world) == {1: 80, 2: 20}

    with pytest.raises(PermissionDenied, match="four-eyes"):
        rollouts.approve(requester, waiting)
    with pytest.raises(PermissionDenied, match="approver role"):
        rollouts.approve(world.user, waiting)  # a deployer
    assert Rollout.objects.get(pk=made.pk).state == State.PENDING_APPROVAL

    approved = rollouts.approve(other, waiting, reason="dashboards fine")
    assert approved.state == State.PROGRESSING and approved.step_index == 2
    ended = rollout_reconciler.run_to_end(made.pk, max_ticks=100)
    assert ended.state == State.SUCCEEDED, ended.reason
    assert revisions_of(world, {1: 40, 2: 60}) == 1
    assert weights_now(world).get(2) == 100
    (approval,) = ended.approvals.all()
    assert (approval.step_index, approval.approved_by) == (1, other)


# --------------------------------------------------------------------------------------------
# Failures
# --------------------------------------------------------------------------------------------


def test_a_candidate_whose_load_fails_is_rolled_back_with_its_error_and_a_retry_starts_over(stack):
    """The candidate's artifact in S3 is corrupt (its sha256 is not the version's): the load
    fails, the rollout rolls back with the load's own error and the route never moves off
    the baseline. Once the right bytes are uploaded, a retry (attempt 2) loads it and goes
    through its steps from step 0."""
    world = stack
    good = make_artifact(world.model.name, 2)
    v2 = world.version(2, blob=good, config=slow_config(2, 4))
    corrupt = bytearray(good)
    corrupt[len(corrupt) // 2] ^= 0xFF
    world.store.put(v2.artifact_uri, bytes(corrupt))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2,
        steps=[{"set_weight": 50}, {"pause": {"seconds": 1}}], analysis_settings=quick(),
        unload_previous=False,
    )
    ended = rollout_reconciler.run_to_end(made.pk, max_ticks=100)

    assert ended.state == State.ROLLED_BACK, (ended.state, ended.reason)
    load = ModelLoad.objects.get(version=v2)
    assert load.state == ModelLoad.State.FAILED and "sha256" in load.error, load.error
    assert ended.reason == f"loading v2 on triton failed: {load.error}"
    rollback = ended.events.get(kind="rollback")
    assert rollback.data["error"] == load.error and rollback.data["load"] == load.pk
    moved = RouteRevision.objects.filter(route_id=world.deployment.pk)
    assert moved.exists() and all(r.weights == {"1": 100} for r in moved), [r.weights for r in moved]
    assert weights_now(world) == {1: 100}

    world.store.put(v2.artifact_uri, good)
    again = rollouts.retry(world.user, ended, reason="artifact uploaded again")
    assert (again.attempt, again.state, again.step_index) == (2, State.LOADING, 0)
    finished = rollout_reconciler.run_to_end(made.pk, max_ticks=200)
    assert finished.state == State.SUCCEEDED, (finished.state, finished.reason)
    assert finished.attempt == 2
    assert revisions_of(world, {1: 50, 2: 50}) == 1
    assert weights_now(world).get(2) == 100


def test_a_candidate_that_fails_on_one_of_its_servers_stays_loaded_on_none(stack, canary_triton,
                                                                          tmp_path):
    """All or none: v2 goes to two servers; the second's model repository cannot be written
    (a path under a plain file), so its load fails while the first's is still on its way. The
    rollout goes back with that server's error, lets the other load end, then takes it back:
    v2 is loaded nowhere and the quota holds what it held before."""
    world = stack
    proc = canary_triton.running()
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    second = second_server(world, proc, "triton-broken", str(blocker / "models"))
    before = held(world)
    v2 = world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2, servers=["triton", "triton-broken"],
        steps=[{"set_weight": 50}], analysis_settings=quick(), unload_previous=False,
    )
    ended = rollout_reconciler.run_to_end(made.pk, max_ticks=200)

    assert ended.state == State.ROLLED_BACK, (ended.state, ended.reason)
    failed = ModelLoad.objects.get(version=v2, server=second)
    assert failed.state == ModelLoad.State.FAILED
    assert ended.reason == f"loading v2 on triton-broken failed: {failed.error}"
    # The other load was still on its way when the failure was seen: it was let end, then
    # taken back.
    waited = ended.events.get(message__contains="loads still on their way to triton")
    assert waited.kind == "rollback"
    other = ModelLoad.objects.get(version=v2, server=world.server)
    assert load_reconciler.run_to_end(other.pk, max_steps=100).state == ModelLoad.State.UNLOADED
    assert index_state(world.triton, world.served).get("2", "UNAVAILABLE") == "UNAVAILABLE"
    assert held(world) == before
    assert weights_now(world)[1] == 100 and weights_now(world).get(2, 0) == 0
    assert "model repository" in failed.error and "Not a directory" in failed.error
    # The server's repository is for platform admins: the tenant's error does not name it.
    assert str(blocker) not in failed.error and str(blocker) not in ended.reason


def test_a_candidate_running_different_configs_on_its_servers_never_gets_traffic(stack,
                                                                                  canary_triton):
    """One version behind a route runs one configuration: the second server's repository
    already holds the model's base config with another setting, so v2 is ready on both with
    two config hashes. The rollout goes back naming both, before any traffic moved, and takes
    v2 off both."""
    world = stack
    proc = canary_triton.running()
    second_server(world, proc, "triton-drifted")
    base = (proc.model_repository / world.served)
    base.mkdir(parents=True, exist_ok=True)
    config = make_config_text(world.served).replace(
        'key: "sleep_ms" value { string_value: "4" }', 'key: "sleep_ms" value { string_value: "9" }')
    (base / "config.pbtxt").write_text(config)
    before = held(world)
    v2 = world.version(2)
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2, servers=["triton", "triton-drifted"],
        steps=[{"set_weight": 50}], analysis_settings=quick(), unload_previous=False,
    )
    ended = rollout_reconciler.run_to_end(made.pk, max_ticks=200)

    assert ended.state == State.ROLLED_BACK, (ended.state, ended.reason)
    hashes = dict(ModelLoad.objects.filter(version=v2).values_list("server__name", "config_hash"))
    assert len(set(hashes.values())) == 2, hashes
    assert ended.reason == ("v2 runs with different configs on its servers: "
                            f"triton {hashes['triton'][:12]}, triton-drifted "
                            f"{hashes['triton-drifted'][:12]}")
    assert revisions_of(world, {1: 50, 2: 50}) == 0
    for load in ModelLoad.objects.filter(version=v2):
        assert load_reconciler.run_to_end(load.pk, max_steps=100).state == ModelLoad.State.UNLOADED
    assert held(world) == before


def test_a_canary_on_one_server_is_promoted_onto_every_server_before_it_takes_all_traffic(
        stack, canary_triton):
    """The canary runs on a server of its own; its promotion first loads it on the rest of
    the deployment's servers, then moves all the traffic, then drains and unloads the
    baseline everywhere: the deployment ends consistent, on one version."""
    world = stack
    proc = canary_triton.running()
    second_server(world, proc, "triton-canary")
    v2 = world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2, servers=["triton-canary"],
        steps=[{"set_weight": 50}, {"pause": {"seconds": 1}}], analysis_settings=quick(),
    )
    with Traffic(world.route_url, world.model.name, clients=2) as traffic:
        ended = rollout_reconciler.run_to_end(made.pk, max_ticks=200)
        for load in ModelLoad.objects.filter(state__in=ModelLoad.IN_FLIGHT):
            load_reconciler.run_to_end(load.pk, max_steps=200)

    assert ended.state == State.SUCCEEDED, (ended.state, ended.reason)
    ready = set(ModelLoad.objects.filter(version=v2, state=ModelLoad.State.READY)
                .values_list("server__name", flat=True))
    assert ready == {"triton", "triton-canary"}
    assert not ModelLoad.objects.filter(version=world.v1, state=ModelLoad.State.READY).exists()
    route = Route.objects.get(pk=world.deployment.pk)
    serving = {m["server"] for name, m in route.variants.items()
               if m["version"] == 2 and route.weights.get(name, 0) > 0}
    assert serving == {"triton", "triton-canary"}
    assert any(e.message == "loading v2 on triton" for e in ended.events.all()), [
        e.message for e in ended.events.all()]
    assert set(traffic.statuses) == {200}, traffic.failures
    assert consistency.view(world.deployment).consistent


def test_with_failure_limit_1_a_first_failed_look_judges_again_and_the_second_rolls_back(stack):
    world = stack
    world.version(3, config=slow_config(3, 8))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=3,
        steps=[{"set_weight": 50}, {"analysis": {}}], analysis_settings=quick(failure_limit=1),
    )
    with Traffic(world.route_url, world.model.name, clients=4, limit_s=120):
        ended = rollout_reconciler.run_to_end(made.pk, max_ticks=600)

    assert ended.state == State.ROLLED_BACK, (ended.state, ended.reason)
    assert ended.reason.startswith("analysis failed at 50% to v3"), ended.reason
    judged = RolloutAnalysis.objects.get(rollout=ended)
    assert judged.verdict == RolloutAnalysis.Verdict.FAIL and judged.failed_looks == 2
    events = list(RolloutEvent.objects.filter(rollout=ended).order_by("created_at", "id"))
    looks = [e for e in events if "failed a look" in e.message]
    assert len(looks) == 1, [e.message for e in events]
    first = looks[0]
    assert first.message.startswith("analysis failed a look (1 of 1 allowed)"), first.message
    assert first.state == State.PROGRESSING and first.data["judgement"]
    (rollback,) = [e for e in events if e.kind == "rollback"]
    assert events.index(rollback) > events.index(first)
    # The first failed look did not move the traffic: the way back is applied after it.
    back = [r for r in RouteRevision.objects.filter(route_id=world.deployment.pk)
            if r.created_at >= first.created_at]
    assert len(back) == 1 and {k: v for k, v in back[0].weights.items() if v} == {"1": 100}, [
        r.weights for r in back]
    assert weights_now(world).get(1) == 100


# --------------------------------------------------------------------------------------------
# Workers dying mid-rollout
# --------------------------------------------------------------------------------------------

THREE_STEPS = [{"set_weight": 20}, {"set_weight": 50}, {"pause": {"seconds": 1}}]


def assert_each_step_once(world, ended: Rollout) -> None:
    assert revisions_of(world, {1: 80, 2: 20}) == 1
    assert revisions_of(world, {1: 50, 2: 50}) == 1
    assert revisions_of(world, {2: 100}) == 1
    steps = messages(ended, "step")
    for text in ("20% of the traffic", "50% of the traffic", "paused 1 s"):
        assert sum(text in m for m in steps) == 1, steps


def test_a_worker_that_died_holding_the_lease_is_taken_over_and_no_step_runs_twice(stack, settings):
    """In-process: a worker claims the rollout (the lease of ``_claim``), puts step 1's
    weight in force and dies before it records the step. While its lease holds nobody
    touches the rollout; once it ran out the next advance() takes over (and says so),
    finds the weight in force already (no second route change) and records the step once;
    what the dead worker would still write is refused. The test below does the same with
    real Celery worker processes and SIGKILL."""
    settings.SWITCHYARD_ROLLOUT_LEASE_S = 1.0
    world = stack
    world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(world.user, world.deployment, version=2, steps=THREE_STEPS,
                                      analysis_settings=quick(), unload_previous=False)
    ready = wait_until(made.pk, lambda r: r.state == State.PROGRESSING)
    assert ready.step_index == 0 and not ready.weights

    dead = rollout_reconciler._claim(made.pk, force=True)
    rollout_actions.route(dead, {1: 80, 2: 20}, "step 1: 20% to v2")  # ...and the worker dies here
    assert rollout_reconciler.advance(made.pk, force=True) == (None, False)  # its lease still holds
    time.sleep(1.2)
    state, again = rollout_reconciler.advance(made.pk, force=True)

    assert (state, again) == (State.PROGRESSING, True)
    took = Rollout.objects.get(pk=made.pk)
    assert (took.step_index, took.weights) == (1, {"1": 80, "2": 20})
    assert any(m.startswith("took over from a worker whose lease ran out "
                            f"({dead.lease_owner[:8]})") for m in messages(took, "error"))
    with pytest.raises(leases.LostLease):
        rollout_actions.update(dead, step_index=7)  # the dead worker's late write changes nothing
    ended = rollout_reconciler.run_to_end(made.pk, max_ticks=100)
    assert ended.state == State.SUCCEEDED, ended.reason
    assert_each_step_once(world, ended)


@pytest.fixture
def worker_env(stack, use_route_nginx, collector, tmp_path, monkeypatch):
    """What a worker process needs to change this stack's routes: the session's nginx (its
    prefix under a data directory of the worker's), the collector the routes log to, the
    Redis prefix of the samples, short leases."""
    data = tmp_path / "worker-data"
    (data / "local").mkdir(parents=True)
    (data / "local" / "nginx").symlink_to(use_route_nginx.process.prefix)
    ports = use_route_nginx.ports
    for name, value in {
        "SWITCHYARD_DATA_DIR": str(data),
        "SWITCHYARD_LOCAL_NGINX_STATUS_PORT": str(use_route_nginx.process.port),
        "SWITCHYARD_ROUTE_PORTS": f"{min(ports)}-{max(ports)}",
        "SWITCHYARD_COLLECTOR_HOST": "127.0.0.1",
        "SWITCHYARD_COLLECTOR_PORT": str(collector.port),
        "SWITCHYARD_REDIS_PREFIX": PREFIX,
        "SWITCHYARD_ROLLOUT_INTERVAL_S": "0.5",
        "SWITCHYARD_ROLLOUT_LEASE_S": "2",
        "SWITCHYARD_ROUTE_APPLY_LEASE_S": "5",
    }.items():
        monkeypatch.setenv(name, value)
    return stack


@pytest.mark.worker
def test_a_celery_worker_killed_mid_step_leaves_a_rollout_another_worker_finishes(worker_env, tmp_path):
    """Two real Celery workers on the test database. Worker A is SIGKILLed while it holds the
    rollout's lease in step 1 (putting 20% in force through nginx). Worker B, sent a tick
    every 0.5 s as beat would, is refused while A's lease (2 s) holds, then takes over
    (an event says so) and finishes the rollout: every step done exactly once."""
    from django.conf import settings as django_settings
    from django.db import connection

    from rollouts import tasks

    world = worker_env
    world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(world.user, world.deployment, version=2, steps=THREE_STEPS,
                                      analysis_settings=quick(), unload_previous=False)
    ready = wait_until(made.pk, lambda r: r.state == State.PROGRESSING)
    assert ready.step_index == 0 and not ready.weights
    database, broker = database_url(connection.settings_dict), django_settings.REDIS_URL
    workers: list[CeleryWorker] = []
    try:
        a = start_worker(tmp_path / "a.log", database, broker)
        workers.append(a)
        b = start_worker(tmp_path / "b.log", database, broker)
        workers.append(b)
        a.send(tasks.advance_rollout, made.pk)
        held = a.wait_for(
            lambda: Rollout.objects.filter(pk=made.pk, step_index=0).exclude(lease_owner="").first(),
            timeout=30, interval=0.005, what="worker A claiming the rollout")
        os.killpg(a.popen.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        a.popen.wait(10)
        assert " succeeded in " not in a.log(), a.log_tail()  # A never finished its task
        assert Rollout.objects.get(pk=made.pk).lease_owner == held.lease_owner  # died holding it

        ended = None
        while time.monotonic() - killed_at < 60:
            b.send(tasks.advance_rollout, made.pk)
            time.sleep(0.5)
            found = Rollout.objects.get(pk=made.pk)
            if found.state in Rollout.FINAL:
                ended = found
                break
        b.assert_alive()
    finally:
        for worker in workers:
            worker.stop()
            forget_queue(django_settings.REDIS_URL, worker.queue)
    assert ended is not None and ended.state == State.SUCCEEDED, (
        Rollout.objects.get(pk=made.pk).state, messages(made), b.log_tail())
    took_over = [e for e in ended.events.filter(kind="error")
                 if e.message.startswith("took over from a worker whose lease ran out")]
    assert len(took_over) == 1 and held.lease_owner[:8] in took_over[0].message
    # Not before A's lease ran out.
    assert took_over[0].created_at >= held.lease_expires_at
    assert_each_step_once(world, ended)
    assert weights_now(world).get(2) == 100
    assert set(variants_answering(world, 10)) == {"v2-triton"}


def _benchmark(world, version: int) -> None:
    from rollouts.benchmarks import reconciler as benchmark_reconciler
    from rollouts.benchmarks import requests as benchmark_requests

    job, _ = benchmark_requests.create_job(
        world.user, world.deployment, version=version, levels=[1, 2, 4], duration_s=1.5,
        warmup_s=0.3, refine_steps=0, slo={"p99_ms": 60},
    )
    done = benchmark_reconciler.run_to_end(job.pk)
    assert done.state == "succeeded", (done.state, done.error)


def test_the_benchmark_and_cost_gates_roll_back_a_canary_that_carries_less_and_costs_more(stack):
    """Both versions benchmarked for real on the deployment's Triton (v1 ready there, v3 loaded
    by its job and unloaded again): v3 sleeps three times as long per request, so it carries
    about a third of v1's load within the SLO, far past the 10% drop allowed, and each model
    instance serving about a third of v1's requests, it costs about three times as much per
    request, past the 10% more allowed. Each gate rolls its rollout back before any traffic;
    the cost readings are the recorded numbers, computed by hand, and the evidence is kept on
    each rollback. (One test for both: the two benchmarks are most of its time.)"""
    from rollouts.models import BenchmarkJob
    from rollouts.registry import costs

    world = stack
    world.version(3, config=slow_config(3, 12))
    _benchmark(world, 1)
    _benchmark(world, 3)

    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=3,
        steps=[{"benchmark": {"max_drop_pct": 10}}, {"set_weight": 50}],
    )
    ended = rollout_reconciler.run_to_end(made.pk, max_ticks=200)

    assert ended.state == State.ROLLED_BACK, (ended.state, ended.reason)
    assert "benchmark gate failed" in ended.reason and "below v1" in ended.reason
    evidence = ended.events.get(kind="rollback").data["benchmark"]
    assert evidence["candidate_rps"] < evidence["baseline_rps"] * 0.9
    # No traffic ever reached the candidate.
    assert Route.objects.get(pk=world.deployment.pk).version_weights.get(3, 0) == 0
    for load in ModelLoad.objects.filter(state__in=ModelLoad.IN_FLIGHT):
        load_reconciler.run_to_end(load.pk)

    for number in (1, 3):
        version = world.model.versions.get(version=number)
        job = BenchmarkJob.objects.filter(version=version).latest("finished_at")
        reading = costs.benchmark_reading(version)
        units = reading.numbers["units"]
        by_hand = units * 1000 / job.summary["best"]["max_load_rps"]
        assert reading.unit_seconds_per_1000 == pytest.approx(by_hand, rel=0.01)
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=3,
        steps=[{"cost": {"max_increase_pct": 10}}, {"set_weight": 50}],
    )
    ended = rollout_reconciler.run_to_end(made.pk, max_ticks=200)

    assert ended.state == State.ROLLED_BACK, (ended.state, ended.reason)
    assert "cost gate failed" in ended.reason and "more per request than v1" in ended.reason
    evidence = ended.events.get(kind="rollback").data["cost"]
    assert evidence["source"] == "benchmark" and evidence["change_pct"] > 100
    assert evidence["max_increase_pct"] == 10
    assert Route.objects.get(pk=world.deployment.pk).version_weights.get(3, 0) == 0
    for load in ModelLoad.objects.filter(state__in=ModelLoad.IN_FLIGHT):
        load_reconciler.run_to_end(load.pk)


def test_the_benchmark_gate_without_benchmarks_pauses_for_a_person(stack):
    world = stack
    world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2, steps=[{"benchmark": {}}, {"set_weight": 100}],
    )
    paused = rollout_reconciler.run_to_end(made.pk, max_ticks=200)
    assert paused.state == State.PAUSED, (paused.state, paused.reason)
    assert "benchmark gate" in paused.waiting_for
    assert "no benchmark of v2 and v1" in paused.events.filter(kind="state").last().message
    rollouts.request_action(world.user, paused, "abort")
    assert rollout_reconciler.run_to_end(made.pk, max_ticks=200).state == State.ABORTED


# --------------------------------------------------------------------------------------------
# The shadow step: copies judged before anyone is served
# --------------------------------------------------------------------------------------------


def served_by_the_baseline(world, statuses: dict[int, int]) -> None:
    """Every answer the clients got was a 200 from the baseline, but for a keep-alive
    connection nginx's old workers closed at a reload, at most one a route change (``0``:
    no answer; the client's POST is not retried)."""
    changes = RouteRevision.objects.filter(route_id=world.deployment.pk,
                                           result=RouteRevision.Result.APPLIED).count()
    assert set(statuses) <= {200, 0} and statuses.get(0, 0) <= changes, (statuses, changes)


def candidate_weights_applied(world, version: int) -> list[int]:
    """The candidate's weight in every route revision applied (what nginx was given)."""
    found = RouteRevision.objects.filter(route_id=world.deployment.pk,
                                         result=RouteRevision.Result.APPLIED).order_by("number")
    return [int(r.weights.get(str(version), 0)) for r in found]


def test_a_slow_candidate_is_stopped_on_its_shadow_copies_before_it_serves_anyone(stack):
    """A shadow step first: the candidate (twice as slow by its config) gets copies of a
    quarter of the requests (not all: its one model instance would queue copies for seconds,
    which the judge fails too, but the teardown then waits them out) while v1 answers them
    all; the judge compares each copy's time with the same request's time on v1, fails it,
    and the copies stop. No client was ever routed to it: every route revision gave it 0%,
    and every answer came from v1."""
    world = stack
    world.version(3, config=slow_config(3, 8))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=3,
        steps=[{"shadow": {"percent": 25}}, {"set_weight": 50}, {"analysis": {}}],
        analysis_settings=quick(min_samples=50))

    with Traffic(world.route_url, world.model.name) as traffic:
        ended = rollout_reconciler.run_to_end(made.pk, max_ticks=400)
        served = variants_answering(world, 10)

    assert ended.state == State.ROLLED_BACK, (ended.state, ended.reason)
    assert ended.reason.startswith("analysis failed on its shadow copies v3"), (
        ended.reason, [(a.step_index, a.reasons, a.judgement) for a in ended.analyses.all()])
    judged = RolloutAnalysis.objects.get(rollout=ended)
    assert (judged.weight, judged.verdict, judged.config["shadow_percent"]) == (0, "fail", 25)
    paired = next(m for m in judged.judgement["metrics"] if m["name"] == "paired")
    assert paired["state"] == "fail" and paired["low"] > math.log(1.05), paired
    assert paired["canary"] > paired["baseline"], paired  # the servers' own times, paired
    # Nobody was served by v3: 0% in every revision; the copies are gone again.
    assert set(candidate_weights_applied(world, 3)) == {0}
    route = Route.objects.get(pk=world.deployment.pk)
    assert route.mirror_percent == 0 and route.version_weights.get(1) == 100
    assert set(served) == {n for n in served if n.startswith("v1-")} and traffic.statuses.get(200)
    served_by_the_baseline(world, traffic.statuses)


def test_an_identical_candidate_passes_its_shadow_and_only_then_gets_its_first_weight(stack):
    world = stack
    world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2,
        steps=[{"shadow": {"percent": 50}}, {"set_weight": 25}, {"pause": {}}, {"analysis": {}}],
        analysis_settings=quick(min_samples=100))

    with Traffic(world.route_url, world.model.name):
        paused = rollout_reconciler.run_to_end(made.pk, max_ticks=400)

    shadow = RolloutAnalysis.objects.get(rollout=made, step_index=0)
    assert paused.state == State.PAUSED and paused.step_index == 2, (paused.state, shadow.reasons)
    assert shadow.verdict == "pass" and shadow.judgement["canary_samples"] >= 100, shadow.reasons
    assert "copies" in shadow.reasons[0]
    # The copies first (at 0%), then its first weight, with the copies stopped.
    applied = candidate_weights_applied(world, 2)
    assert applied[-1] == 25 and set(applied[:-1]) == {0}, applied
    route = Route.objects.get(pk=world.deployment.pk)
    assert route.mirror_percent == 0 and route.version_weights == {1: 75, 2: 25}
    mirrors = [r.mirror for r in RouteRevision.objects.filter(route_id=world.deployment.pk)]
    assert any(m and m["variant"].startswith("v2-") and m["percent"] == 50 for m in mirrors)
    steps = messages(paused, "step")
    assert any("shadow: copies of 50% of the requests go to v2" in m for m in steps), steps
    rollouts.request_action(world.user, paused, "abort", reason="enough")
    assert rollout_reconciler.run_to_end(made.pk).state == State.ABORTED


def test_a_dry_run_judges_copies_at_each_weight_and_ends_without_moving_traffic(stack):
    """A dry run of the steps 50%, analysis: the candidate gets copies of half the requests
    (none of them served), the analysis judges the copies against v1's answers, and the end
    promotes nothing: the route still sends everything to v1 with no copies, the production
    alias stays, and the candidate is unloaded."""
    world = stack
    world.version(2, config=slow_config(2, 4))
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=2, alias="production", dry_run=True,
        steps=[{"set_weight": 50}, {"analysis": {}}],
        analysis_settings=quick(planned_samples=20000, timeout_s=120, error_tolerance_pct=1.0))

    with Traffic(world.route_url, world.model.name) as traffic:
        ended = rollout_reconciler.run_to_end(made.pk, max_ticks=800)

    judged = RolloutAnalysis.objects.get(rollout=made)
    assert ended.state == State.SUCCEEDED, (ended.state, ended.reason, judged.reasons)
    assert ended.reason.startswith("dry run: every step passed on copies of the requests; "
                                   "v2 would have been promoted. All traffic stayed on v1")
    assert judged.weight == 0 and judged.verdict == "pass"
    assert any(m["name"] == "paired" and m["state"] == "within"
               for m in judged.judgement["metrics"]), judged.judgement["metrics"]
    assert set(candidate_weights_applied(world, 2)) == {0}
    served_by_the_baseline(world, traffic.statuses)
    mirrors = [r.mirror for r in RouteRevision.objects.filter(route_id=world.deployment.pk)]
    assert any(m and m["variant"].startswith("v2-") and m["percent"] == 50 for m in mirrors)
    route = Route.objects.get(pk=world.deployment.pk)
    assert route.mirror_percent == 0 and route.version_weights.get(1) == 100
    assert not Alias.objects.filter(model=world.model, name="production", version__version=2).exists()
    unload = ModelLoad.objects.filter(version__version=2, version__model=world.model).order_by(
        "-created_at").first()
    assert unload.is_unload and unload.state in (ModelLoad.State.UNLOADING, ModelLoad.State.UNLOADED)
