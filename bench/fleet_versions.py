"""Fleet versions bench: one version on all of a deployment's servers or on none, on three real
Triton servers behind nginx at steady traffic.

    python bench/fleet_versions.py [--runs N] [--rate R] [--json]

Starts what ``bench/rollback.py`` starts (moto S3, a real tritonserver, a real nginx as the
local cluster's router, redis-server, the sample collector; all on 127.0.0.1 in a temporary
folder) and two more tritonservers, each a server of the one deployment. Loads run as a
worker pool runs them: one thread a load (``rollouts.loads.reconciler.run_to_end``), at once.
Measured, ``--runs`` times each:

1. ``all_ready_s``: from the request for v1 on the deployment (a load a server) to the moment
   all three are ready; ``slowest_bare_s``: the slowest of the three servers' bare loads of the
   same model through Triton's own API (files placed by hand, ``load_model`` until READY).
   Goal: all-ready within 0.5 s of the slowest bare load.
2. ``failed_during_promotion``: requests that failed (no answer, or not 200) while a canary of
   the next version goes to 50% on all three servers, is promoted, and the previous version is
   drained and unloaded everywhere (from the rollout's request until every unload ended).
   ``resent``: requests a reload closed unanswered on an idle keep-alive connection, sent again
   on a new one (counted apart: nothing reached a server). Goal: 0 failed.
3. ``undo_s``: a canary whose load fails on the third server (its model repository cannot be
   written): from the moment that load failed to the moment the candidate is loaded nowhere
   (every other load of it unloaded). Goal: at most 2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

# bench/ is this script's folder, first on sys.path: the other benches' helpers are shared.
from loads import REPO_ROOT, bare_round, check_stop, run_bench, runtime_cache, say
from rollback import Reconciler, World, artifact_store, loadavg, start_servers, triton_config
from router import ROUTE_PATH, Client

SERVERS = 3


class Traffic:
    """Keep-alive clients paced to ``rate`` requests a second in all, counting what failed; a
    request a reload closed unanswered is sent again on a new connection, counted apart."""

    def __init__(self, url: str, clients: int, rate: float) -> None:
        self.stop_event = threading.Event()
        self.sent = self.failed = self.resent = 0
        self.why: Counter[str] = Counter()
        self.period = clients / rate
        self.threads = [threading.Thread(target=self._run, args=(url,), daemon=True)
                        for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def _send(self, client: Client) -> bool:
        try:
            try:
                status, _variant = client.post(ROUTE_PATH)
            except ConnectionError as exc:
                # Closed unanswered: the request never reached a server (a broken pipe on
                # sending it, a reset, or closed before any answer).
                if "closed connection without response" not in str(exc) and not isinstance(
                        exc, ConnectionResetError | BrokenPipeError):
                    raise
                self.resent += 1
                status, _variant = client.post(ROUTE_PATH)
        except Exception as exc:
            self.why[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
            return False
        if status != 200:
            self.why[f"HTTP {status}"] += 1
        return status == 200

    def _run(self, url: str) -> None:
        client = Client(url)
        due = time.monotonic()
        while not self.stop_event.is_set():
            wait = due - time.monotonic()
            if wait > 0:
                self.stop_event.wait(wait)
            due = max(due + self.period, time.monotonic() - 1.0)
            ok = self._send(client)
            self.sent += 1
            self.failed += not ok
        client.close()

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(10)


class Workers(Reconciler):
    """The bench's reconciler with loads driven as a worker pool drives them: each load in
    flight in a thread of its own (``run_to_end``), at once, not one step after another in
    the bench's loop."""

    def __init__(self, interval: float) -> None:
        super().__init__(interval)
        self.driving: dict[int, threading.Thread] = {}

    def step(self) -> None:
        from rollouts.models import ModelLoad

        for load_id in ModelLoad.objects.filter(state__in=ModelLoad.IN_FLIGHT).values_list(
                "pk", flat=True):
            thread = self.driving.get(load_id)
            if thread is None or not thread.is_alive():
                self.driving[load_id] = threading.Thread(target=drive, args=(load_id,))
                self.driving[load_id].start()
        super().step()


def drive(load_id: int, ended: dict[int, float] | None = None) -> None:
    """A worker's ``advance_load`` chain for one load, on a database connection of its own."""
    from django.db import connection

    from rollouts.loads import reconciler as load_reconciler

    try:
        load_reconciler.run_to_end(load_id, max_steps=400)
        if ended is not None:
            ended[load_id] = time.perf_counter()
    finally:
        connection.close()


def load_everywhere(world: World, version: Any) -> tuple[float, list[Any]]:
    """Ask for ``version`` on every server of the deployment and drive each load in a thread
    of its own; seconds from the request until all are ready, and the loads."""
    from rollouts.loads import requests as loads

    started = time.perf_counter()
    rows, _ = loads.request_load(world.user, world.deployment, version)
    ended: dict[int, float] = {}
    threads = [threading.Thread(target=drive, args=(row.pk, ended)) for row in rows]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    from rollouts.models import ModelLoad

    states = {load.server.name: load.state for load in ModelLoad.objects.filter(
        pk__in=[r.pk for r in rows]).select_related("server")}
    if set(states.values()) != {ModelLoad.State.READY}:
        raise RuntimeError(f"v{version.version} did not load everywhere: {states}")
    return max(ended.values()) - started, rows


def bench(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    load_start = loadavg()
    servers = start_servers(tmp, stack)
    triton = servers["triton"]

    from django.conf import settings
    from tritonclient.http import InferenceServerClient

    import console.celery
    from fleet.models import InferenceServer
    from local.triton import ensure_runtime, start_triton
    from rollouts.canary import requests as rollouts
    from rollouts.loads import reconciler as load_reconciler
    from rollouts.models import ModelLoad, Rollout
    from rollouts.traffic import routes

    store = artifact_store(servers, tmp, stack)
    rec = Workers(float(settings.SWITCHYARD_ROLLOUT_INTERVAL_S))
    console.celery.send_now = rec.send_now

    runtime = ensure_runtime(runtime_cache().parent, progress=say)
    tritons = [triton]
    for index in range(2, SERVERS + 1):
        (tmp / f"models-{index}").mkdir()
        proc = start_triton(runtime, tmp / f"models-{index}",
                            log_path=tmp / f"tritonserver-{index}.log")
        stack.callback(proc.stop)
        tritons.append(proc)
    world = World(triton, store, "bench-artifacts", triton_config({}, {}))
    for index, proc in enumerate(tritons[1:], start=2):
        world.deployment.servers.add(InferenceServer.objects.create(
            cluster=world.server.cluster, node=world.server.node, name=f"triton-{index}",
            runtime=InferenceServer.Runtime.TRITON, http_url=proc.http_url,
            model_repository=str(proc.model_repository), log_path=str(proc.log_path)))

    all_ready, bare = [], []
    for run in range(args.runs):
        check_stop()
        slowest = 0.0
        for proc in tritons:
            client = InferenceServerClient(proc.http_url.removeprefix("http://"))
            slowest = max(slowest, bare_round(client, proc.model_repository)[0])
            client.close()
        version = world.version(100 + run)
        took, rows = load_everywhere(world, version)
        all_ready.append(took)
        bare.append(slowest)
        say(f"run {run + 1}/{args.runs}: all {SERVERS} ready in {took:.2f} s; slowest bare load "
            f"{slowest:.2f} s")
        if run + 1 < args.runs:  # the next run loads afresh
            for row in rows:
                load_reconciler.run_to_end(row.pk)
            from rollouts.loads import requests as loads

            for row in loads.unload_for(None, world.deployment, version):
                load_reconciler.run_to_end(row.pk, max_steps=200)

    stable = 100 + args.runs - 1
    route, _ = routes.ensure_route(world.user, world.deployment)
    traffic = Traffic(route.url, 4, args.rate)
    stack.callback(traffic.stop)
    time.sleep(2.0)
    promotions = []
    for run in range(args.runs):
        check_stop()
        number = 200 + run
        world.version(number)
        failed, resent, sent = traffic.failed, traffic.resent, traffic.sent
        made, _ = rollouts.create_rollout(
            world.user, world.deployment, version=number,
            steps=[{"set_weight": 50}, {"pause": {"seconds": 5}}], unload_previous=True)
        ended = rec.until(made.pk, lambda r: r.state in Rollout.FINAL)
        rec.settle_loads()
        promotions.append({"version": number, "outcome": ended.state,
                           "failed": traffic.failed - failed, "resent": traffic.resent - resent,
                           "requests": traffic.sent - sent})
        say(f"promotion {run + 1}/{args.runs} (v{stable} -> v{number}): {ended.state}, "
            f"{promotions[-1]['failed']} failed of {promotions[-1]['requests']} requests, "
            f"{promotions[-1]['resent']} sent again")
        stable = number

    third = InferenceServer.objects.get(name=f"triton-{SERVERS}")
    good_repository = third.model_repository
    blocker = tmp / "not-a-directory"
    blocker.write_text("")
    third.model_repository = str(blocker / "models")
    third.save(update_fields=["model_repository"])
    undos = []
    for run in range(args.runs):
        check_stop()
        number = 300 + run
        candidate = world.version(number)
        made, _ = rollouts.create_rollout(
            world.user, world.deployment, version=number,
            steps=[{"set_weight": 50}], unload_previous=False)
        rec.until(made.pk, lambda r: r.state in Rollout.FINAL)
        rec.settle_loads()
        failed = ModelLoad.objects.get(version=candidate, server=third)
        others = ModelLoad.objects.filter(version=candidate).exclude(pk=failed.pk)
        left = [o for o in others if o.state != ModelLoad.State.UNLOADED]
        if failed.state != ModelLoad.State.FAILED or left:
            raise RuntimeError(f"v{number} was not undone: {failed.state}, "
                               f"{[(o.server.name, o.state) for o in left]}")
        done = max(o.finished_at for o in others) if others else failed.finished_at
        undos.append((done - failed.finished_at).total_seconds())
        say(f"undo {run + 1}/{args.runs}: v{number} failed on {third.name}; loaded nowhere "
            f"{undos[-1]:.2f} s later")
    third.model_repository = good_repository
    third.save(update_fields=["model_repository"])
    traffic.stop()
    return {
        "servers": SERVERS,
        "runs": args.runs,
        "rate": args.rate,
        "all_ready_s": round(statistics.median(all_ready), 3),
        "slowest_bare_s": round(statistics.median(bare), 3),
        "all_ready_runs": [round(x, 3) for x in all_ready],
        "slowest_bare_runs": [round(x, 3) for x in bare],
        "failed_during_promotion": sum(p["failed"] for p in promotions),
        "resent_during_promotion": sum(p["resent"] for p in promotions),
        "promotions": promotions,
        "failures": dict(traffic.why),
        "undo_s": round(max(undos), 3) if undos else None,
        "undo_runs": [round(x, 3) for x in undos],
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
    }


def print_table(r: dict[str, Any]) -> None:
    rows = [
        ("all servers ready (median s)", f"{r['all_ready_s']:.2f}",
         f"<= {r['slowest_bare_s'] + 0.5:.2f}"),
        ("slowest bare load of the three (median s)", f"{r['slowest_bare_s']:.2f}", ""),
        ("failed requests during the promotions", str(r["failed_during_promotion"]), "0"),
        ("  sent again (closed unanswered by a reload)", str(r["resent_during_promotion"]), ""),
        ("undo of a failed all-or-none load (max s)", f"{r['undo_s']:.2f}", "<= 2"),
    ]
    out = [f"Fleet versions: {r['servers']} Triton servers behind nginx, {r['rate']:g} req/s, "
           f"{r['runs']} runs each; load average {r['loadavg_start'][0]:.2f} at the start, "
           f"{r['loadavg_end'][0]:.2f} at the end ({r['cpus']} CPUs)",
           f"{'':52}{'value':>10}{'goal':>10}"]
    out += [f"{name:52}{value:>10}{goal:>10}" for name, value, goal in rows]
    print("\n".join(out))  # noqa: T201


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each measure (default 3)")
    parser.add_argument("--rate", type=float, default=75.0,
                        help="requests a second on the route (default 75, the demo's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 50 or not 1 <= args.rate <= 2000:
        parser.error("--runs from 1 to 50, --rate from 1 to 2000")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return run_bench("switchyard-fleet-versions-", lambda tmp, stack: bench(args, tmp, stack),
                     args.json, print_table)


if __name__ == "__main__":
    sys.exit(main())
