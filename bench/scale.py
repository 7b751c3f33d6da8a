"""Switchyard at fleet size: the scrape tick and health rounds over a simulated fleet of
1,000 servers, with 1 and then 2 worker processes sharing the shards.

    .venv/bin/python bench/scale.py                  # 1,000 Triton servers, a table (~3 min)
    .venv/bin/python bench/scale.py --servers 200 --seconds 5 --json

What it starts, and stops again at the end (also on an error): the fleet simulator
(``local/fleetsim.py``, its own process) with ``--servers`` Triton servers serving one model
at 10 requests a second each; a PostgreSQL database of its own on 127.0.0.1:5432
(``switchyard_bench_scale``, made and dropped again); Redis on 127.0.0.1:6379 (database 7,
keys under ``switchyard-bench-scale``); Celery workers (solo pool: one process each) on a
queue of their own. The database holds one tenant, one model and, per simulated server, a
server row and a deployment of the model on it.

What it measures:

* **tick**: ``scrape_tick.tick()`` of the whole fleet in this process, 5 times after 2 warm-up
  ticks: wall time, CPU per server scraped (this process: parsing, diffing, writing), SQL
  statements per tick;
* **health round**: ``health.check_all()`` with the first 20 servers hung (2 s probe timeout);
* **workers**: beat's role played here, ``rollouts.tasks.scrape_latency`` sent every second
  to 1, then 2 workers for ``--seconds``: the oldest server's last scrape, sampled every
  0.25 s (p50 and max: "every server fresh within 2 s"), and the workers' CPU share;
* **scale out**: rounds of every shard's task sent back to back (the next as soon as every
  server was scraped) for ``--seconds``: server scrapes a second with 1 and with 2 workers,
  and their ratio;
* **takeover**: with 2 workers ticking, one is killed (SIGKILL) while it holds shard leases
  (read from the leases' tokens, which name their process): seconds until another worker
  holds every shard it held, and until every server has been scraped again after the kill;
* **rollout looks**: ``bench/looks.py --processes 2`` (100 rollouts at a busy last analysis
  step, two worker processes sharing them, each looking at its own once a second): the looks
  made a second.

The page and API figures of issue 25 are measured by ``bench/pages.py``. ``--json`` prints one
object: ``tick_s_1000``, ``cpu_ms_per_scrape``, ``sql_per_tick``, ``health_round_s``,
``fresh_max_s`` (workers -> s), ``scrapes_per_s`` (workers -> rate), ``scale_out_ratio``,
``shard_takeover_s`` (owned again), ``shard_takeover_tick`` (at which tick after the kill),
``rescraped_s``, ``shards_held_at_kill``,
``rollout_looks_per_s``, ``rollout_looks_cpu_share``, and ``servers``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB_NAME = "switchyard_bench_scale"
PG = "postgres://postgres@127.0.0.1:5432"
REDIS_URL = "redis://127.0.0.1:6379/7"
PREFIX = "switchyard-bench-scale"
QUEUE = f"bench-scale-{uuid.uuid4().hex[:8]}"
HUNG = 20
SHARDS = 8


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # noqa: T201


def environment(servers: int) -> dict[str, str]:
    return {
        **os.environ, "DJANGO_SETTINGS_MODULE": "console.settings",
        "DATABASE_URL": f"{PG}/{DB_NAME}", "REDIS_URL": REDIS_URL,
        "SWITCHYARD_REDIS_PREFIX": PREFIX, "SWITCHYARD_SHARDS": str(SHARDS),
        "SWITCHYARD_DB_CONN_MAX_AGE": "60", "PYTHONUNBUFFERED": "1",
    }


@contextlib.contextmanager
def database() -> Iterator[None]:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB_NAME}")
    try:
        yield
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


@contextlib.contextmanager
def simulator(servers: int, seconds: float) -> Iterator[dict[str, Any]]:
    command = [sys.executable, "-m", "local.fleetsim", "--triton", str(servers), "--models", "1",
               "--model-prefix", "bench.scorer", "--seconds", str(seconds), "--json"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        yield json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(10)


def seed(described: dict[str, Any]) -> list[int]:
    """A tenant ``bench``, its model ``scorer-0`` (``bench.scorer-0`` on a shared Triton), and
    per simulated server a server row and a deployment on it; the server ids."""
    from fleet.models import Cluster, InferenceServer, Tenant
    from rollouts.models import Deployment, Model

    tenant = Tenant.objects.create(slug="bench", name="Bench")
    model = Model.objects.create(tenant=tenant, name="scorer-0")
    cluster = Cluster.objects.create(name="sim", kind=Cluster.Kind.STATIC)
    rows = InferenceServer.objects.bulk_create([
        InferenceServer(cluster=cluster, name=f"sim-{s['index']}", runtime=InferenceServer.Runtime.TRITON,
                        http_url=s["http_url"],
                        metrics_url=s["metrics_url"]) for s in described["servers"]])
    deployments = Deployment.objects.bulk_create([
        Deployment(tenant=tenant, model=model, cluster=cluster, name=f"dep-{row.pk}")
        for row in rows])
    Deployment.servers.through.objects.bulk_create([
        Deployment.servers.through(deployment_id=d.pk, inferenceserver_id=row.pk)
        for d, row in zip(deployments, rows, strict=True)])
    return [row.pk for row in rows]


def control(described: dict[str, Any], which: str, body: dict[str, Any]) -> None:
    httpx.post(f"{described['control_url']}/control/servers/{which}", json=body, timeout=30)


# --------------------------------------------------------------------------------------------
# In this process
# --------------------------------------------------------------------------------------------


def measure_ticks(count: int) -> dict[str, float]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from rollouts.traffic import scrape_tick

    for _ in range(2):
        scrape_tick.tick()
        time.sleep(1.0)
    walls, cpus, sqls = [], [], []
    for _ in range(count):
        started, cpu = time.monotonic(), time.process_time()
        with CaptureQueriesContext(connection) as queries:
            result = scrape_tick.tick()
        walls.append(time.monotonic() - started)
        cpus.append((time.process_time() - cpu) / max(result["servers"], 1))
        sqls.append(len([q for q in queries if not q["sql"].startswith(("BEGIN", "COMMIT"))]))
        time.sleep(max(0.0, 1.0 - walls[-1]))
    return {"tick_s": statistics.median(walls), "tick_s_max": max(walls),
            "cpu_ms_per_scrape": 1000 * statistics.median(cpus), "sql_per_tick": max(sqls)}


def measure_health(described: dict[str, Any]) -> float:
    from fleet.inventory import health

    for index in range(HUNG):
        control(described, str(index), {"state": "hung"})
    try:
        started = time.monotonic()
        health.check_all(timeout=2.0)
        return time.monotonic() - started
    finally:
        for index in range(HUNG):
            control(described, str(index), {"state": "ok"})


# --------------------------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------------------------


def start_worker(env: dict[str, str], name: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool", "solo",
           "--loglevel", "warning", "-Q", QUEUE, "-n", f"{name}@%h",
           "--without-gossip", "--without-mingle", "--without-heartbeat"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def scraped_at(server_ids: list[int]) -> list[float]:
    """When each server's last scrape was taken (0: never)."""
    from fleet.inventory import loadstats

    found = loadstats.server_loads(server_ids)
    return [found.get(pk, {}).get("t", 0.0) for pk in server_ids]


def send_tick() -> None:
    from rollouts import tasks

    tasks.scrape_latency.apply_async(queue=QUEUE)


def freshness(server_ids: list[int], workers: list[psutil.Process], seconds: float) -> dict[str, float]:
    """Beat's schedule for ``seconds``: the oldest server's age, sampled every 0.25 s."""
    ages, next_tick = [], time.monotonic()
    cpu = sum(sum(w.cpu_times()[:2]) for w in workers)
    started = time.monotonic()
    end = started + seconds
    while time.monotonic() < end:
        if time.monotonic() >= next_tick:
            send_tick()
            next_tick += 1.0
        if time.monotonic() - started > 3.0:  # after the first rounds
            ages.append(time.time() - min(scraped_at(server_ids)))
        time.sleep(0.25)
    cpu = sum(sum(w.cpu_times()[:2]) for w in workers) - cpu
    return {"fresh_p50_s": statistics.median(ages), "fresh_max_s": max(ages),
            "cpu_share": cpu / (time.monotonic() - started) / psutil.cpu_count()}


def throughput(server_ids: list[int], seconds: float,
               workers: list[psutil.Process]) -> dict[str, float]:
    """Rounds back to back, every shard's task sent at once (no expiry), the next round as
    soon as every server was scraped: server scrapes a second, and the cores the workers got
    and the rest of the machine took meanwhile (the simulator, Redis, PostgreSQL, this)."""
    from rollouts import tasks
    from rollouts.traffic import scrape_tick

    plan = scrape_tick.shards()
    machine = psutil.cpu_times()
    own = sum(sum(w.cpu_times()[:2]) for w in workers)
    rounds, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        sent = time.time()
        for index, ids in plan.items():
            tasks.scrape_latency_shard.apply_async((index, ids), queue=QUEUE)
        while min(scraped_at(server_ids)) < sent:
            time.sleep(0.02)
            if time.time() - sent > 60:
                stale = [pk for pk, t in zip(server_ids, scraped_at(server_ids), strict=True)
                         if t < sent]
                raise RuntimeError(f"a round did not finish in 60 s: {len(stale)} servers not "
                                   f"scraped (ids {stale[:10]}...): are the workers running?")
        rounds += 1
    took = time.monotonic() - started
    after = psutil.cpu_times()
    busy = sum(after[:3]) - sum(machine[:3])  # user, nice, system
    workers_cpu = sum(sum(w.cpu_times()[:2]) for w in workers) - own
    return {"rate": rounds * len(server_ids) / took, "worker_cores": workers_cpu / took,
            "other_cores": max(busy - workers_cpu, 0.0) / took}


def takeover(server_ids: list[int], workers: list[subprocess.Popen]) -> dict[str, float]:
    """Kill one of two ticking workers while it holds shard leases (the worst case: they run
    their whole length); seconds from the kill until another worker holds every shard it
    held (the leases name their process: ``fleet.inventory.shard_leases``), and until every
    server was scraped again."""
    import redis

    from fleet.inventory import shard_leases

    store = redis.Redis.from_url(REDIS_URL)
    keys = [f"{PREFIX}:latency:shard:{i}" for i in range(SHARDS)]
    victim = workers[0].pid
    next_tick = time.monotonic()

    sent: list[float] = []

    def tick_when_due() -> None:
        nonlocal next_tick
        if time.monotonic() >= next_tick:
            send_tick()
            sent.append(time.time())
            next_tick += 1.0

    def holders(names: list[str]) -> list[int | None]:
        return [(h[1] if (h := shard_leases.holder(v)) else None) for v in store.mget(names)]

    steady = time.monotonic() + 8  # steady ticks first
    held: list[str] = []
    while not held:
        tick_when_due()
        if time.monotonic() >= steady:
            held = [k for k, pid in zip(keys, holders(keys), strict=True) if pid == victim]
            if time.monotonic() > steady + 30:
                raise SystemExit("the worker to kill never held a shard's lease")
        time.sleep(0.002)
    os.killpg(victim, signal.SIGKILL)
    killed = time.time()
    owned: dict[str, float] = {}
    rescraped = None
    while len(owned) < len(held) or rescraped is None:
        tick_when_due()
        for key, pid in zip(held, holders(held), strict=True):
            if key not in owned and pid is not None and pid != victim:
                owned[key] = time.time() - killed
        if rescraped is None and min(scraped_at(server_ids)) >= killed:
            rescraped = time.time() - killed
        if time.time() - killed > 30:
            break
        time.sleep(0.01)
    last = max(owned.values()) if len(owned) == len(held) else float("inf")
    return {"owned_s": last, "rescraped_s": rescraped if rescraped is not None else float("inf"),
            "held": len(held),
            # The ticks sent after the kill up to the last shard's new owner: 2 is the second.
            "owned_at_tick": sum(1 for t in sent if killed < t <= killed + last)}


@contextlib.contextmanager
def workers(env: dict[str, str], count: int) -> Iterator[list[subprocess.Popen]]:
    procs = [start_worker(env, f"scale-{count}-{i}") for i in range(count)]
    try:
        time.sleep(4.0)  # Celery's start
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(1.0)


def run(servers: int, seconds: float) -> dict[str, Any]:
    env = environment(servers)
    os.environ.update(env)
    import django

    with database():
        django.setup()
        from django.core.management import call_command

        say("migrating the bench's database…")
        call_command("migrate", verbosity=0)
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()
        with simulator(servers, 900) as described:
            ids = seed(described)
            say(f"{servers} simulated servers registered; ticking in this process…")
            ticks = measure_ticks(5)
            say("health round with 20 hung servers…")
            health_s = measure_health(described)
            fresh: dict[int, dict[str, float]] = {}
            rates: dict[int, dict[str, float]] = {}
            for count in (1, 2):
                say(f"{count} worker(s)…")
                with workers(env, count) as procs:
                    fresh[count] = freshness(ids, [psutil.Process(p.pid) for p in procs], seconds)
                    rates[count] = throughput(ids, seconds,
                                              [psutil.Process(p.pid) for p in procs])
                    taken_over = takeover(ids, procs) if count == 2 else None
        return {
            "servers": servers, "tick_s_1000": round(ticks["tick_s"], 3),
            "tick_s_max": round(ticks["tick_s_max"], 3),
            "cpu_ms_per_scrape": round(ticks["cpu_ms_per_scrape"], 3),
            "sql_per_tick": ticks["sql_per_tick"], "health_round_s": round(health_s, 2),
            "fresh_p50_s": {str(k): round(v["fresh_p50_s"], 2) for k, v in fresh.items()},
            "fresh_max_s": {str(k): round(v["fresh_max_s"], 2) for k, v in fresh.items()},
            "worker_cpu_share": {str(k): round(v["cpu_share"], 2) for k, v in fresh.items()},
            "scrapes_per_s": {str(k): round(v["rate"]) for k, v in rates.items()},
            "scale_out_ratio": round(rates[2]["rate"] / rates[1]["rate"], 2),
            # The cores the workers got, and what the rest of the machine took meanwhile.
            "worker_cores": {str(k): round(v["worker_cores"], 2) for k, v in rates.items()},
            "other_cores": {str(k): round(v["other_cores"], 2) for k, v in rates.items()},
            # Scrapes a second per core the workers got: equal for 1 and 2 workers when the
            # work divides without loss.
            "scrapes_per_worker_core": {str(k): round(v["rate"] / max(v["worker_cores"], 1e-9))
                                        for k, v in rates.items()},
            "shard_takeover_s": round(taken_over["owned_s"], 2) if taken_over else None,
            "rescraped_s": round(taken_over["rescraped_s"], 2) if taken_over else None,
            "shards_held_at_kill": taken_over["held"] if taken_over else None,
            "shard_takeover_tick": taken_over["owned_at_tick"] if taken_over else None,
        }


def rollout_looks(rollouts: int) -> dict[str, Any]:
    """``bench/looks.py --processes 2`` (its own database and Redis prefix)."""
    command = [sys.executable, str(ROOT / "bench" / "looks.py"), "--processes", "2",
               "--rollouts", str(rollouts), "--json"]
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "SWITCHYARD_REDIS_PREFIX")}
    done = subprocess.run(command, cwd=ROOT, env={**env, "REDIS_URL": REDIS_URL},
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench/looks.py failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", type=int, default=1000)
    p.add_argument("--rollouts", type=int, default=100, help="for the rollout looks (0: none)")
    p.add_argument("--seconds", type=float, default=15.0, help="per worker measurement")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = run(args.servers, args.seconds)
    if args.rollouts:
        say(f"rollout looks: {args.rollouts} rollouts, 2 worker processes…")
        looks = rollout_looks(args.rollouts)
        result["rollout_looks_per_s"] = looks["looks_per_s"]
        result["rollout_looks_cpu_share"] = looks["cpu_share"]
    if args.json:
        print(json.dumps(result))  # noqa: T201
        return 0
    rows = [
        ("scrape tick, whole fleet, one process (median / max)",
         f"{result['tick_s_1000']} s / {result['tick_s_max']} s", "every server fresh within 2 s"),
        ("CPU per server scraped", f"{result['cpu_ms_per_scrape']} ms", "<= 0.5 ms"),
        ("SQL statements per tick", str(result["sql_per_tick"]), "<= 20"),
        ("health round, 20 hung servers", f"{result['health_round_s']} s", "<= 3 s"),
    ]
    for count in ("1", "2"):
        rows.append((f"oldest scrape with {count} worker(s), p50 / max",
                     f"{result['fresh_p50_s'][count]} s / {result['fresh_max_s'][count]} s",
                     "<= 2 s"))
        rows.append((f"workers' CPU share with {count} worker(s)",
                     f"{result['worker_cpu_share'][count]:.0%}", ""))
        rows.append((f"server scrapes a second, rounds back to back, {count} worker(s)",
                     str(result["scrapes_per_s"][count]), ""))
        rows.append((f"  cores: the worker(s) / the rest of the machine, {count} worker(s)",
                     f"{result['worker_cores'][count]} / {result['other_cores'][count]}", ""))
        rows.append((f"  scrapes a second per worker core, {count} worker(s)",
                     str(result["scrapes_per_worker_core"][count]), ""))
    rows.append(("scale out, 2 workers / 1", f"{result['scale_out_ratio']}x", ">= 1.7x"))
    rows.append(("a worker killed holding leases: its shards owned again after",
                 f"{result['shard_takeover_s']} s, tick {result['shard_takeover_tick']}",
                 "<= 2 ticks"))
    rows.append(("a worker killed: every server scraped again after",
                 f"{result['rescraped_s']} s", ""))
    if "rollout_looks_per_s" in result:
        rows.append((f"rollout looks a second, {args.rollouts} rollouts, 2 processes",
                     f"{result['rollout_looks_per_s']} ({result['rollout_looks_cpu_share']:.0%} "
                     "CPU)", ">= 100"))
    width = max(len(r[0]) for r in rows)
    print(f"{result['servers']} simulated Triton servers, {SHARDS} shards")  # noqa: T201
    for name, value, goal in rows:
        print(f"{name:<{width}}  {value:>16}  {goal}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
