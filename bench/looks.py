"""Looks bench: how many canary analysis looks one worker process makes a second, with 100
rollouts in flight on busy routes.

    python bench/looks.py [--rollouts 100] [--rate 75] [--history 150] [--rounds 10] [--json]
    python bench/looks.py --processes 2      # worker processes sharing the rollouts, PostgreSQL

Everything it uses is real except the traffic: a temporary SQLite database (migrated quietly)
with a deployment, a route, two versions, a rollout at its last analysis step (50% on the
candidate) and its analysis row for each of ``--rollouts`` rollouts; Redis at ``REDIS_URL``
(default redis://127.0.0.1:6379/0), under a key prefix of its own that is deleted at the end.

The route samples are stored as the collector stores them (untimed): ``--history`` seconds of ``--rate`` requests a second per route before the first
round (the analysis step has been running that long), then each round adds one more second
to every route (all that passed since the last write: the traffic never pauses) and looks
once at every rollout, as a reconcile tick does:
``analysis.evidence_windows`` (a query), the samples of the window by version, and
``analysis.look`` (the judge, the step's end, one UPDATE of the row). Two ways are timed, each
over the same rounds:

* **cached**: ``analysis.columns_by_version``, what the worker does now: the samples as
  columns, read from Redis and parsed only since this process's previous look at the route
  (``rollouts.traffic.window_cache``);
* **full**: ``analysis.samples_by_version``, the whole window read and parsed into sample
  objects at every look (as every look did before the cache).

Per way: looks a second (one process: rollouts / the round's wall time), CPU ms per look
(``time.process_time``: this process's own, which is what a worker core spends; Redis runs
apart) and samples parsed per look. Goal (issue 25): 100 rollouts looked at every second,
at least 100 looks a second.

With ``--processes N`` (2 or more) the looks are made as a deployment makes them: N worker
processes, each with its share of the rollouts (every N-th), each looking at all of its
rollouts once a second, starting on the same second, through its own window cache, while
this process writes every second's traffic to Redis as the collector would. The database is
PostgreSQL then (``--database-url``, default a database ``switchyard_bench_looks`` on
127.0.0.1:5432, made and dropped), as SQLite takes one writer at a time. Reported: the looks
the processes made a second in all (each round lasts a second unless its looks take longer),
what they could make (each process's rollouts over its median round's wall time, summed),
CPU ms a look, and the processes' CPU share of the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201


def setup(tmp: Path, redis_url: str, database_url: str = "", migrate: bool = True,
          prefix: str = "") -> str:
    prefix = prefix or f"switchyard-bench-looks-{uuid.uuid4().hex[:8]}"
    os.environ.update({
        "DATABASE_URL": database_url or f"sqlite:///{tmp / 'bench.sqlite3'}",
        "REDIS_URL": redis_url, "SWITCHYARD_REDIS_PREFIX": prefix,
        "DJANGO_SETTINGS_MODULE": "console.settings", "SWITCHYARD_LOG_LEVEL": "WARNING",
        "SWITCHYARD_DB_CONN_MAX_AGE": "60",
    })
    sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()
    if migrate:
        from loads import migrate as migrate_database

        migrate_database()
    return prefix


def seed_rows(count: int, started: float) -> list[tuple[Any, dict[str, Any], Any]]:
    """``count`` rollouts at their last analysis step, each with its route and analysis row."""
    from fleet.models import Cluster, Tenant
    from rollouts.canary import analysis
    from rollouts.models import (
        Deployment,
        Model,
        ModelVersion,
        Rollout,
        RolloutAnalysis,
        Route,
    )

    tenant = Tenant.objects.create(slug="bench", name="Bench")
    cluster = Cluster.objects.create(name=f"bench-{uuid.uuid4().hex[:6]}", kind=Cluster.Kind.LOCAL)
    out = []
    for i in range(count):
        model = Model.objects.create(tenant=tenant, name=f"model-{i}")
        v1, v2 = (ModelVersion.objects.create(
            model=model, version=n, artifact_uri=f"s3://bench/{i}/{n}.tar.gz", sha256="0" * 64,
            size_bytes=1, runtime=ModelVersion.Runtime.TRITON) for n in (1, 2))
        deployment = Deployment.objects.create(tenant=tenant, name=f"dep-{i}", model=model,
                                               cluster=cluster)
        Route.objects.create(deployment=deployment, name=f"dep-{i}", url="http://127.0.0.1:1",
                             state=Route.State.IN_FORCE,
                             variants={"v1": {"version": 1}, "v2": {"version": 2}})
        rollout = Rollout.objects.create(
            tenant=tenant, deployment=deployment, baseline=v1, candidate=v2,
            state=Rollout.State.PROGRESSING, steps=[{"set_weight": 50}, {"analysis": {}}],
            step_index=1, weights={"1": 50, "2": 50})
        config = analysis.analysis_config(rollout)
        row = analysis.analysis_row(rollout, config)
        RolloutAnalysis.objects.filter(pk=row.pk).update(window_start=started, weight=50)
        row.refresh_from_db()
        out.append((rollout, config, row))
    return out


def requests(rng: np.random.Generator, start: float, seconds: float,
             rate: float) -> list[tuple[float, float, str]]:
    """Poisson requests over ``seconds`` from ``start``: (end time, latency s, variant),
    half to each version, latencies around 5 ms in whole milliseconds."""
    n = int(rng.poisson(rate * seconds))
    ends = np.sort(start + seconds * rng.random(n))
    latency = np.floor(5.0 * np.exp(0.3 * rng.standard_normal(n)) + rng.random(n)) / 1000
    return [(float(t), float(lat), "v1" if j % 2 else "v2")
            for j, (t, lat) in enumerate(zip(ends, latency, strict=True))]


def traffic(deployment_ids: list[int], start: float, seconds: float, rate: float,
            rng: np.random.Generator) -> None:
    """``seconds`` of requests from ``start`` on every route, stored as the collector stores
    samples (the members and the route's index; this process parsing 7,500 log lines a
    second would take as long as the traffic itself, and the collector is not what is
    measured here)."""
    from rollouts.traffic import samples
    from rollouts.traffic.sample_types import Sample

    store = samples.connect()
    for dep in deployment_ids:
        pipe = store.pipeline(transaction=False)
        members: dict[str, dict[str, float]] = {"v1": {}, "v2": {}}
        for t, lat, variant in requests(rng, start, seconds, rate):
            sample = Sample(round(t, 3), dep, variant, False, 200, 1000 * lat,
                            max(1000 * lat - 0.5, 0.0), 120, "200", "127.0.0.1:1", "POST",
                            "/v2/models/m/infer", uuid.uuid4().hex)
            members[variant][sample.to_member()] = sample.t
        for variant, found in members.items():
            pipe.zadd(samples.key(dep, variant, False), found)
            pipe.zadd(samples.index_key(dep), {f"p:{variant}": start + seconds})
        pipe.execute()


def one_round(rows: list, cached: bool) -> tuple[float, float, int]:
    """Look once at every rollout; (wall s, CPU s, samples parsed from Redis)."""
    from rollouts.canary import analysis
    from rollouts.traffic import window_cache

    parsed, full = window_cache.CACHE.parsed, 0
    wall, cpu = time.perf_counter(), time.process_time()
    for rollout, config, row in rows:
        windows = analysis.evidence_windows(row, config)
        if cached:  # as rollouts.canary.steps does
            by_version, now = analysis.columns_by_version(rollout, windows[0].start)
        else:
            by_version, now = analysis.samples_by_version(
                rollout, max(time.time() - windows[0].start, 0.001))
        full += 0 if cached else sum(len(found) for found in by_version.values())
        analysis.look(row, config, by_version.get(2, []), by_version.get(1, []), now,
                      windows=windows, last=True)
    return (time.perf_counter() - wall, time.process_time() - cpu,
            window_cache.CACHE.parsed - parsed + full)


def seeded(args: argparse.Namespace, rng: np.random.Generator) -> tuple[list, list[int], float]:
    """The rollouts, their routes' deployment ids, and ``--history`` seconds of traffic
    written behind them; (rows, deployment ids, when the written traffic ends)."""
    started = time.time() - args.history
    rows = seed_rows(args.rollouts, started)
    deps = [rollout.deployment_id for rollout, _, _ in rows]
    say(f"writing {args.history:g} s of {args.rate:g} requests/s on {len(deps)} routes…")
    traffic(deps, started, args.history, args.rate, rng)
    return rows, deps, started + args.history


def bench(args: argparse.Namespace) -> dict[str, Any]:
    from rollouts.traffic import window_cache

    rng = np.random.default_rng(0)
    rows, deps, written = seeded(args, rng)
    while time.time() - written > 1.0:  # catch up with the time the writing took
        tick = time.time()
        traffic(deps, written, tick - written, args.rate, rng)
        written = tick
    out: dict[str, Any] = {"rollouts": args.rollouts, "rate": args.rate,
                           "history_s": args.history, "rounds": args.rounds,
                           "full_rounds": min(args.rounds, args.full_rounds)}
    for way in ("cached", "full"):
        window_cache.CACHE.clear()
        one_round(rows, way == "cached")  # a worker's first look at a route reads it whole
        walls, cpus, parsed = [], [], []
        # A whole window a look takes a second or more a round: a few rounds tell.
        for _ in range(args.rounds if way == "cached" else min(args.rounds, args.full_rounds)):
            time.sleep(max(0.0, written + 1.0 - time.time()))  # a tick a second at most
            tick = time.time()
            traffic(deps, written, tick - written, args.rate, rng)  # what passed since
            written = tick
            wall, cpu, read = one_round(rows, way == "cached")
            walls.append(wall)
            cpus.append(cpu)
            parsed.append(read / len(rows))
        out[way] = {
            "looks_per_s": round(len(rows) / statistics.median(walls), 1),
            "cpu_ms_per_look": round(1000 * statistics.median(cpus) / len(rows), 2),
            "wall_s_per_round": round(statistics.median(walls), 3),
            "parsed_per_look": round(statistics.median(parsed), 1),
        }
        say(f"  {way}: {out[way]}")
    out["speedup"] = round(out["cached"]["looks_per_s"] / out["full"]["looks_per_s"], 1)
    out["cpus"] = os.cpu_count()
    out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return out


def rows_of(share: int, of: int) -> list[tuple[Any, dict[str, Any], Any]]:
    """A worker process's rollouts (every ``of``-th from the ``share``-th), as seeded."""
    from rollouts.canary import analysis
    from rollouts.models import Rollout, RolloutAnalysis

    out = []
    for rollout in list(Rollout.objects.order_by("pk"))[share::of]:
        config = analysis.analysis_config(rollout)
        row = RolloutAnalysis.objects.filter(rollout=rollout).order_by("-pk").first()
        out.append((rollout, config, row))
    return out


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One worker process of ``--processes``: its first look at each rollout (reading the
    window whole, as a worker's first look does), then a round a second from ``--start-at``."""
    rows = rows_of(args.child, args.processes)
    one_round(rows, True)
    walls, cpus, late = [], [], 0
    for index in range(args.rounds):
        wait = args.start_at + index - time.time()
        if wait > 0:
            time.sleep(wait)
        else:
            late += 1  # the last round took more than its second
        wall, cpu, _ = one_round(rows, True)
        walls.append(wall)
        cpus.append(cpu)
    return {"rollouts": len(rows), "walls": walls, "cpus": cpus, "late": late,
            "ended": time.time()}


def bench_processes(args: argparse.Namespace, database_url: str, prefix: str) -> dict[str, Any]:
    """``--processes`` worker processes sharing the rollouts (see the module docstring)."""
    rng = np.random.default_rng(0)
    _rows, deps, written = seeded(args, rng)
    # Long enough for every process to start and make its first (whole) read of its routes.
    # (A process that is not ready in time starts late: its rounds count as late.)
    start_at = time.time() + 4 + 0.05 * args.rollouts
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    common = [sys.executable, __file__, "--rollouts", str(args.rollouts), "--rounds",
              str(args.rounds), "--processes", str(args.processes), "--database-url",
              database_url, "--prefix", prefix, "--start-at", repr(start_at)]
    procs = [subprocess.Popen([*common, "--child", str(i)], stdout=subprocess.PIPE, text=True,
                              env=env) for i in range(args.processes)]
    watched = [psutil.Process(p.pid) for p in procs]
    cpu_before = cpu_after = None
    while any(p.poll() is None for p in procs):
        tick = time.time()
        traffic(deps, written, tick - written, args.rate, rng)  # what passed since
        written = tick
        if cpu_before is None and tick >= start_at:
            cpu_before = (tick, _cpu(watched))
        if cpu_before is not None and tick < start_at + args.rounds - 1:
            cpu_after = (tick, _cpu(watched))
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
    found = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"a worker process failed (exit {proc.returncode})")
        found.append(json.loads(out.strip().splitlines()[-1]))
    looks = sum(f["rollouts"] * len(f["walls"]) for f in found)
    # Round k starts at start_at + k: the rounds take their seconds, or longer when late.
    span = max(max(f["ended"] for f in found) - start_at, float(args.rounds))
    share = None
    if cpu_before and cpu_after and cpu_after[0] > cpu_before[0]:
        share = (cpu_after[1] - cpu_before[1]) / ((cpu_after[0] - cpu_before[0])
                                                  * (os.cpu_count() or 1))
    return {
        "rollouts": args.rollouts, "rate": args.rate, "history_s": args.history,
        "rounds": args.rounds, "processes": args.processes,
        "looks_per_s": round(looks / span, 1),
        "capacity_looks_per_s": round(sum(f["rollouts"] / statistics.median(f["walls"])
                                          for f in found), 1),
        "cpu_ms_per_look": round(1000 * sum(sum(f["cpus"]) for f in found) / looks, 2),
        "wall_s_per_round": [round(statistics.median(f["walls"]), 3) for f in found],
        "late_rounds": sum(f["late"] for f in found),
        "cpu_share": round(share, 3) if share is not None else None,
        "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


@contextlib.contextmanager
def database(url: str) -> Any:
    """A PostgreSQL database of the bench's own at ``url``: made, then dropped."""
    import psycopg

    server, name = url.rsplit("/", 1)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def cleanup(prefix: str) -> None:
    from rollouts.traffic import samples

    store = samples.connect()
    for name in store.scan_iter(f"{prefix}:*", count=1000):
        store.delete(name)


def print_table(result: dict[str, Any]) -> None:
    say("")
    print(f"{result['rollouts']} rollouts at their last analysis step, 50% on the candidate; "  # noqa: T201
          f"{result['rate']:g} requests/s a route, {result['history_s']:g} s of history; "
          f"{result['rounds']} rounds; one process; {result['cpus']} CPUs, load "
          f"{result['loadavg']}")
    print(f"{'':28}{'cached':>10}{'full':>10}")  # noqa: T201
    for key, label in (("looks_per_s", "looks a second"), ("cpu_ms_per_look", "CPU ms a look"),
                       ("wall_s_per_round", "s a round (every rollout)"),
                       ("parsed_per_look", "samples parsed a look")):
        print(f"{label:28}{result['cached'][key]:>10}{result['full'][key]:>10}")  # noqa: T201
    goal = result["cached"]["looks_per_s"] >= 100
    print(f"\n  {'met ' if goal else 'MISS'} looks a second >= 100 (cached, one process)")  # noqa: T201


def print_processes_table(result: dict[str, Any]) -> None:
    say("")
    print(f"{result['rollouts']} rollouts at their last analysis step, 50% on the candidate; "  # noqa: T201
          f"{result['rate']:g} requests/s a route, {result['history_s']:g} s of history; "
          f"{result['rounds']} rounds; {result['processes']} worker processes; "
          f"{result['cpus']} CPUs, load {result['loadavg']}")
    for key, label in (("looks_per_s", "looks a second, made"),
                       ("capacity_looks_per_s", "looks a second, possible"),
                       ("cpu_ms_per_look", "CPU ms a look"),
                       ("wall_s_per_round", "s a round, each process"),
                       ("late_rounds", "rounds over their second"),
                       ("cpu_share", "CPU share of the machine")):
        print(f"{label:28}{result[key]!s:>14}")  # noqa: T201
    goal = result["looks_per_s"] >= 100
    print(f"\n  {'met ' if goal else 'MISS'} looks a second >= 100 (made, "  # noqa: T201
          f"{result['processes']} processes)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--rate", type=float, default=75.0, help="requests a second a route")
    parser.add_argument("--history", type=float, default=150.0,
                        help="seconds the analysis has run before the first round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--full-rounds", type=int, default=3,
                        help="rounds of the full reads (each takes many seconds)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--processes", type=int, default=1,
                        help="worker processes sharing the rollouts (2 or more: PostgreSQL)")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/"
                        "switchyard_bench_looks", help="with --processes: made and dropped")
    # A worker process of --processes (internal).
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not (1 <= args.rollouts <= 1000 and 1 <= args.rate <= 1000 and 10 <= args.history <= 3600
            and 1 <= args.rounds <= 100 and 1 <= args.full_rounds <= 100):
        parser.error("--rollouts 1-1000, --rate 1-1000, --history 10-3600, "
                     "--rounds and --full-rounds 1-100")
    if not 1 <= args.processes <= 16:
        parser.error("--processes 1-16")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if args.child is not None:
        setup(Path(), redis_url, args.database_url, migrate=False, prefix=args.prefix)
        print(json.dumps(child(args)))  # noqa: T201
        return 0
    if args.processes > 1:
        with database(args.database_url):
            prefix = setup(Path(), redis_url, args.database_url)
            try:
                result = bench_processes(args, args.database_url, prefix)
            finally:
                cleanup(prefix)
        if args.json:
            print(json.dumps(result, sort_keys=True))  # noqa: T201
        else:
            print_processes_table(result)
        return 0
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-looks-") as tmp:
        prefix = setup(Path(tmp), redis_url)
        try:
            result = bench(args)
        finally:
            cleanup(prefix)
    if args.json:
        print(json.dumps(result, sort_keys=True))  # noqa: T201
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
