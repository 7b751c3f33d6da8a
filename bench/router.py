"""Traffic-router bench: what nginx adds to a request, how soon a weight change is in force,
and what 20 reloads under steady load do to requests.

    python bench/router.py [--requests N] [--changes N] [--reloads N] [--json]

Starts everything it needs and stops it again (also on Ctrl-C, SIGTERM or an error): a
real tritonserver (its runtime the cached one, as for the other benches) serving fraud-scorer
versions 1 and 2 made to answer at once (``sleep_ms`` 0, two instances), and a real nginx
(Debian package) run by ``local.nginx``, whose routes the traffic-router
adapter (``fleet.adapters.routers.nginx.NginxRouter``) writes, each access-log line going to
a UDP syslog socket as in production (and to a file, to check which requests nginx saw).
Django runs in this process on a temporary SQLite database, for the weight changes made
through the API; the local cluster's nginx is the bench's.

Three measurements:

* overhead: the same inference sent straight to Triton
  (``/v2/models/fraud-scorer/versions/1/infer``) and through a route sending everything to
  version 1 (``/v2/models/fraud-scorer/infer``, rewritten by nginx), at concurrency 1 and 16,
  by keep-alive clients; rounds alternate the two targets so drift favours neither. With wrk
  (Debian's ``wrk``, which ``scripts/test`` installs) each round is a ``--seconds`` run of
  ``wrk --latency`` and each figure the median of the rounds' own percentiles; without it
  (or with ``--no-wrk``) the clients are Python threads, each with one ``http.client``
  keep-alive connection, timing every request with ``perf_counter``. Either way what the
  client costs is the same on both sides, so the difference is nginx's.
* weight change: a route flipped between 100/0 and 0/100 ``--changes`` times while a probe
  sends one request after the other, each on a new connection; the change is in force at the
  first request after which every answer comes from the new variant. Measured twice: from a
  ``PUT /api/v1/routes/<id>/`` (Django on a temporary SQLite database, in this process: the
  API's checks, the database rows and the audit, then the adapter) and from calling the
  adapter's ``apply`` (which tests the config with ``nginx -t`` twice, swaps it in, reloads
  and waits for nginx to serve it), each to that request.
* reloads: 4 clients (2 keep-alive, 2 with a new connection per request) send without pause
  while the route's weights change ``--reloads`` times, one reload every 0.25 s. A request
  that failed is "raw failed"; a keep-alive client's request that met a connection the old
  worker had just closed never reached nginx and is retried once on a new connection, as
  HTTP clients do; what still fails after that is "failed". The access log confirms that no
  retried request had reached nginx.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# bench/ is this script's folder, first on sys.path: the other benches' helpers are shared.
from freshness import deferred_signals
from loads import REPO_ROOT, check_stop, run_bench, runtime_cache, say

MODEL = "fraud-scorer"
TENANT = "bench"
# On a shared Triton a tenant's model goes by a name its slug qualifies; clients of a route
# call MODEL and nginx rewrites it.
SERVED = f"{TENANT}.{MODEL}"
DIRECT_PATH = f"/v2/models/{SERVED}/versions/1/infer"
ROUTE_PATH = f"/v2/models/{MODEL}/infer"
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}]}
).encode()
HEADERS = {"Content-Type": "application/json"}
CONCURRENCY = (1, 16)
ROUNDS = 4  # alternating direct/route rounds per concurrency (--rounds)
WARMUP = 200
RELOAD_PAUSE_S = 0.25
CHANGE_TIMEOUT_S = 15.0
# A keep-alive connection the server closed while the request was on its way: nothing of it
# reached the server, and HTTP clients retry such a request on a new connection.
UNSENT = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
          ConnectionAbortedError)


# --------------------------------------------------------------------------------------------
# The servers
# --------------------------------------------------------------------------------------------


def bench_repository(dest: Path) -> list[str]:
    """The demo fraud scorer, both versions answering at once, two instances."""
    from local.triton import write_demo_repository

    write_demo_repository(dest, prefix=f"{TENANT}.")
    shutil.rmtree(dest / f"{TENANT}.sentiment", ignore_errors=True)
    config = dest / SERVED / "config.pbtxt"
    text = config.read_text()
    text = re.sub(r'(key: "sleep_ms(?:_v2)?" value \{ string_value: )"\d+"', r'\1"0"', text)
    text = text.replace("count: 1", "count: 2")
    config.write_text(text)
    return [SERVED]


class UdpSink:
    """A bound UDP socket nobody reads: the syslog target nginx sends every line to."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------


def url_parts(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


class Client:
    """One keep-alive HTTP/1.1 connection (or, with ``fresh``, a new one per request)."""

    def __init__(self, url: str, *, fresh: bool = False) -> None:
        self.host, self.port = url_parts(url)
        self.fresh = fresh
        self.conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        return self.conn

    def post(self, path: str, request_id: str = "") -> tuple[int, str]:
        """(status, variant header); raises what the connection raised."""
        headers = dict(HEADERS)
        if request_id:
            headers["X-Request-Id"] = request_id
        if self.fresh:
            headers["Connection"] = "close"
        conn = self._connection()
        try:
            conn.request("POST", path, BODY, headers)
            response = conn.getresponse()
            response.read()
        except BaseException:
            self.close()
            raise
        if self.fresh or response.will_close:
            self.close()
        return response.status, response.getheader("X-Switchyard-Variant") or ""

    @property
    def reused(self) -> bool:
        return self.conn is not None and self.conn.sock is not None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def run_load(url: str, path: str, concurrency: int, requests: int) -> tuple[list[float], float]:
    """``requests`` POSTs spread over ``concurrency`` keep-alive clients; latencies (ms) and
    the wall time (s)."""
    per_client = [requests // concurrency + (i < requests % concurrency) for i in range(concurrency)]
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[str] = []
    start = threading.Barrier(concurrency + 1)

    def work(index: int) -> None:
        client = Client(url)
        try:
            start.wait()
            out = latencies[index]
            for _ in range(per_client[index]):
                began = time.perf_counter()
                status, _ = client.post(path)
                out.append((time.perf_counter() - began) * 1000.0)
                if status != 200:
                    errors.append(f"status {status}")
                    return
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"load on {url}{path} failed: {errors[0]}")
    return [v for chunk in latencies for v in chunk], wall


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


_WRK_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def wrk_script(dest: Path) -> Path:
    """The Lua script that makes wrk send the bench's inference (a POST with its body)."""
    dest.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = [[{BODY.decode()}]]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    return dest


def run_wrk(url: str, path: str, concurrency: int, seconds: float,
            script: Path) -> dict[str, float]:
    """One wrk run (``--latency``): its p50 and p99 (ms), requests per second and count.

    Raises when any request failed (a socket error or a status other than 2xx/3xx)."""
    threads = min(concurrency, 2)  # two cores: more load threads only compete with nginx
    done = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{seconds:g}s", "--latency",
         "--timeout", "10s", "-s", str(script), f"{url}{path}"],
        capture_output=True, text=True, timeout=seconds + 60, check=False,
    )
    out = done.stdout
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or out}")
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    if failed or errors:
        raise RuntimeError(f"wrk saw failed requests on {url}{path}:\n{out}")
    found: dict[str, float] = {}
    for label, key in (("50%", "p50"), ("99%", "p99")):
        match = re.search(rf"^\s+{re.escape(label)}\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
        if match is None:
            raise RuntimeError(f"no {label} latency in wrk's output:\n{out}")
        found[key] = float(match.group(1)) * _WRK_UNITS[match.group(2)]
    found["rps"] = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    found["requests"] = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return found


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def measure_overhead_wrk(direct: str, routed: str, seconds: float, script: Path,
                         rounds: int = ROUNDS) -> dict[str, Any]:
    """The overhead with wrk: per concurrency, ``rounds`` runs of ``seconds`` on each target,
    alternating; each figure is the median over the rounds of wrk's own percentiles."""
    out: dict[str, Any] = {}
    run_wrk(direct, DIRECT_PATH, 4, 1, script)  # warm-up: connections, Triton's first requests
    run_wrk(routed, ROUTE_PATH, 4, 1, script)
    for concurrency in CONCURRENCY:
        check_stop()
        runs: dict[str, list[dict[str, float]]] = {"direct": [], "route": []}
        for round_ in range(rounds):
            order = [("direct", direct, DIRECT_PATH), ("route", routed, ROUTE_PATH)]
            for name, url, path in order if round_ % 2 == 0 else order[::-1]:
                runs[name].append(run_wrk(url, path, concurrency, seconds, script))
        for name, found in runs.items():
            for stat in ("p50", "p99"):
                out[f"{name}_{stat}_ms_c{concurrency}"] = statistics.median(r[stat] for r in found)
            out[f"{name}_rps_c{concurrency}"] = statistics.median(r["rps"] for r in found)
            out[f"{name}_requests_c{concurrency}"] = int(sum(r["requests"] for r in found))
        out[f"requests_c{concurrency}"] = min(out[f"direct_requests_c{concurrency}"],
                                              out[f"route_requests_c{concurrency}"])
        for stat in ("p50", "p99"):
            out[f"overhead_{stat}_ms_c{concurrency}"] = (
                out[f"route_{stat}_ms_c{concurrency}"] - out[f"direct_{stat}_ms_c{concurrency}"]
            )
        say(f"  concurrency {concurrency}: p50 {out[f'direct_p50_ms_c{concurrency}']:.3f} ms "
            f"direct, {out[f'route_p50_ms_c{concurrency}']:.3f} ms through the route (wrk)")
    return out


def measure_overhead(direct: str, routed: str, requests: int,
                     rounds: int = ROUNDS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    run_load(direct, DIRECT_PATH, 4, WARMUP)
    run_load(routed, ROUTE_PATH, 4, WARMUP)
    for concurrency in CONCURRENCY:
        check_stop()
        per_round = max(requests // rounds, concurrency)
        found: dict[str, list[float]] = {"direct": [], "route": []}
        walls: dict[str, float] = {"direct": 0.0, "route": 0.0}
        for round_ in range(rounds):
            order = [("direct", direct, DIRECT_PATH), ("route", routed, ROUTE_PATH)]
            for name, url, path in order if round_ % 2 == 0 else order[::-1]:
                latencies, wall = run_load(url, path, concurrency, per_round)
                found[name] += latencies
                walls[name] += wall
        for name, latencies in found.items():
            out[f"{name}_p50_ms_c{concurrency}"] = pct(latencies, 0.50)
            out[f"{name}_p99_ms_c{concurrency}"] = pct(latencies, 0.99)
            out[f"{name}_rps_c{concurrency}"] = len(latencies) / walls[name]
            out[f"requests_c{concurrency}"] = len(latencies)
        for stat in ("p50", "p99"):
            out[f"overhead_{stat}_ms_c{concurrency}"] = (
                out[f"route_{stat}_ms_c{concurrency}"] - out[f"direct_{stat}_ms_c{concurrency}"]
            )
        say(f"  concurrency {concurrency}: p50 {out[f'direct_p50_ms_c{concurrency}']:.3f} ms "
            f"direct, {out[f'route_p50_ms_c{concurrency}']:.3f} ms through the route")
    return out


class Probe:
    """Sends one request after another, each on a new connection, noting (sent, variant)."""

    def __init__(self, url: str) -> None:
        self.client = Client(url, fresh=True)
        self.seen: list[tuple[float, str]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.perf_counter()
            try:
                status, variant = self.client.post(ROUTE_PATH)
            except Exception as exc:
                self.errors.append(repr(exc))
                continue
            if status != 200:
                self.errors.append(f"status {status}")
            self.seen.append((sent, variant))

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)


def measure_weight_changes(change: Callable[[int, int], bool], changes: int, url: str,
                           names: tuple[str, str] = ("v1", "v2")) -> dict[str, list[float]]:
    """Flip the route between 100/0 and 0/100 ``changes`` times with ``change(w1, w2)``
    (which returns whether nginx reloaded), timing each flip to the new split in force."""
    probe = Probe(url)
    in_force, applied = [], []
    try:
        first, second = names
        current = first
        for _ in range(changes):
            check_stop()
            target = second if current == first else first
            weights = (0, 100) if target == second else (100, 0)
            began = time.perf_counter()
            reloaded = change(*weights)
            applied.append(time.perf_counter() - began)
            if not reloaded:
                raise RuntimeError(f"the change to {target} reloaded nothing")
            deadline = time.monotonic() + CHANGE_TIMEOUT_S
            while True:  # 20 answers in a row from the new variant after apply returned
                after = [v for t, v in list(probe.seen) if t >= began + applied[-1]]
                if len(after) >= 20 and all(v == target for v in after[-20:]):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{target} not in force {CHANGE_TIMEOUT_S:.0f} s after "
                                       f"the change (last answers {after[-5:]})")
                time.sleep(0.01)
            seen = [(t, v) for t, v in list(probe.seen) if t >= began]
            old = [t for t, v in seen if v != target]
            first_new = next((t for t, v in seen if not old or t > old[-1]), None)
            if first_new is None:
                raise RuntimeError("no request after the change")
            in_force.append(first_new - began)
            current = target
            time.sleep(0.2)
    finally:
        probe.stop()
    if probe.errors:
        raise RuntimeError(f"the probe failed {len(probe.errors)} time(s): {probe.errors[0]}")
    return {"in_force": in_force, "applied": applied}


def measure_reloads(router: Any, spec: Callable[[int, int], Any], reloads: int, url: str,
                    access_log: Path) -> dict[str, Any]:
    router.apply(spec(90, 10))
    stop = threading.Event()
    modes = ("keepalive", "keepalive", "fresh", "fresh")
    results: list[dict[str, list[str]]] = [
        {"ok": [], "raw_failed": [], "failed": [], "retried": []} for _ in modes
    ]

    def run(index: int) -> None:
        out = results[index]
        client = Client(url, fresh=modes[index] == "fresh")
        try:
            while not stop.is_set():
                request_id = uuid.uuid4().hex
                reused = client.reused
                try:
                    status, _ = client.post(ROUTE_PATH, request_id)
                except UNSENT as exc:
                    out["raw_failed"].append(request_id)
                    if not reused:  # a new connection refused or reset: a real failure
                        out["failed"].append(f"{request_id}: {exc!r}")
                        continue
                    out["retried"].append(request_id)
                    retry = uuid.uuid4().hex
                    try:
                        status, _ = client.post(ROUTE_PATH, retry)
                    except Exception as again:
                        out["failed"].append(f"{retry}: {again!r}")
                        continue
                    request_id = retry
                except Exception as exc:
                    out["raw_failed"].append(request_id)
                    out["failed"].append(f"{request_id}: {exc!r}")
                    continue
                if status == 200:
                    out["ok"].append(request_id)
                else:
                    out["raw_failed"].append(request_id)
                    out["failed"].append(f"{request_id}: status {status}")
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(modes))]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    began = time.perf_counter()
    done = 0
    try:
        for i in range(reloads):
            check_stop()
            weight = 80 if i % 2 == 0 else 90
            if router.apply(spec(weight, 100 - weight)).reloaded:
                done += 1
            time.sleep(RELOAD_PAUSE_S)
    finally:
        time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join(30)
    wall = time.perf_counter() - began
    logged = access_log.read_text(errors="replace")
    retried = [rid for r in results for rid in r["retried"]]
    by_mode = {
        mode: {k: sum(len(results[i][k]) for i in range(len(modes)) if modes[i] == mode)
               for k in ("ok", "raw_failed", "failed", "retried")}
        for mode in ("keepalive", "fresh")
    }
    return {
        "reloads": done,
        "seconds": wall,
        "requests": sum(len(r["ok"]) + len(r["failed"]) for r in results),
        "raw_failed": sum(len(r["raw_failed"]) for r in results),
        "failed": sum(len(r["failed"]) for r in results),
        "failures": [f for r in results for f in r["failed"]][:5],
        "retried_reached_nginx": sum(1 for rid in retried if rid in logged),
        "by_mode": by_mode,
    }


# --------------------------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------------------------


def nginx_version(binary: str) -> str:
    done = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False)
    return (done.stderr or done.stdout).strip().removeprefix("nginx version: nginx/")


def api_world(triton_url: str) -> tuple[Any, int]:
    """A deployer's API client and a deployment of fraud-scorer on the local cluster, with
    versions 1 and 2 ready on the bench's Triton (rows only: the bench loaded them itself)."""
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from fleet.models import Cluster, InferenceServer, Membership, Tenant
    from rollouts.models import Deployment, Model, ModelLoad, ModelVersion

    tenant = Tenant.objects.create(slug=TENANT, name="Bench")
    user = get_user_model().objects.create_user("bench-deployer")
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.DEPLOYER)
    cluster = Cluster.objects.create(name="local", kind=Cluster.Kind.LOCAL)
    server = InferenceServer.objects.create(
        cluster=cluster, name="triton", runtime=InferenceServer.Runtime.TRITON, http_url=triton_url
    )
    model = Model.objects.create(tenant=tenant, name=MODEL)
    deployment = Deployment.objects.create(tenant=tenant, model=model, cluster=cluster,
                                           name="bench")
    deployment.servers.add(server)
    for number in (1, 2):
        version = ModelVersion.objects.create(
            model=model, version=number, artifact_uri=f"s3://bench/{MODEL}/{number}.tar.gz",
            sha256=f"{number}" * 64, size_bytes=1, runtime=ModelVersion.Runtime.TRITON,
            backend="python",
        )
        ModelLoad.objects.create(tenant=tenant, deployment=deployment, server=server,
                                 version=version, state=ModelLoad.State.READY,
                                 requested_by_label="bench")
    client = APIClient(SERVER_NAME="127.0.0.1")  # a host the settings allow
    client.force_authenticate(user)
    return client, deployment.pk


def bench(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    from loads import prepare_environment, setup_django

    # Django on a temporary SQLite database and data dir: weight changes go through the API.
    data_dir = prepare_environment(tmp)
    from fleet.adapters.routers.base import RouteSpec, Variant
    from fleet.adapters.routers.nginx import NginxRouter, syslog_target
    from local.nginx import start_nginx
    from local.processes import free_port, free_ports
    from local.triton import ensure_runtime, server_version, start_triton

    say("starting tritonserver (fraud-scorer v1 and v2, answering at once) and nginx…")
    runtime = ensure_runtime(runtime_cache().parent, progress=say)
    names = bench_repository(tmp / "models")
    with deferred_signals():
        triton = start_triton(runtime, tmp / "models", load_models=names,
                              log_path=tmp / "tritonserver.log")
        stack.callback(triton.stop)
    with deferred_signals():
        # Where the settings put the local cluster's nginx: the API's routes land on it too.
        nginx = start_nginx(data_dir / "local" / "nginx", worker_processes=2)
        stack.callback(nginx.stop)
    sink = UdpSink()
    stack.callback(sink.close)
    first = free_port("127.0.0.1")
    os.environ.update({
        "SWITCHYARD_LOCAL_NGINX_STATUS_PORT": str(nginx.port),
        "SWITCHYARD_ROUTE_PORTS": f"{first}-{min(first + 49, 65535)}",
        "SWITCHYARD_COLLECTOR_HOST": "127.0.0.1",
        "SWITCHYARD_COLLECTOR_PORT": str(sink.port),
    })
    setup_django()
    access_file = tmp / "access.log"
    router = NginxRouter(
        **nginx.router_options(),  # type: ignore[arg-type]
        ports=free_ports("127.0.0.1", 4),
        access_log=[syslog_target("127.0.0.1", sink.port), str(access_file)],
    )

    def spec(name: str) -> Callable[[int, int], RouteSpec]:
        def make(w1: int, w2: int) -> RouteSpec:
            return RouteSpec(name=name, protocol="kserve-v2", variants=(
                Variant("v1", triton.http_url, w1, model=SERVED, version=1),
                Variant("v2", triton.http_url, w2, model=SERVED, version=2),
            ))
        return make

    wrk = shutil.which("wrk") is not None and not args.no_wrk
    result: dict[str, Any] = {
        "nginx_version": nginx_version(nginx.nginx),
        "triton_version": server_version(triton.http_url),
        "overhead_rounds": args.rounds,
        "load_tool": f"wrk, {args.seconds:g} s a run" if wrk
        else "python http.client threads" + ("" if args.no_wrk else " (wrk not installed)"),
    }
    overhead_url = router.apply(spec("overhead")(100, 0)).url
    if wrk:
        say(f"overhead: wrk, {args.rounds} rounds of {args.seconds:g} s per target and "
            "concurrency…")
        result |= measure_overhead_wrk(triton.http_url, overhead_url, args.seconds,
                                       wrk_script(tmp / "post.lua"), args.rounds)
    else:
        say(f"overhead: {args.requests} requests per target and concurrency, in {args.rounds} "
            "rounds…")
        result |= measure_overhead(triton.http_url, overhead_url, args.requests, args.rounds)

    client, deployment_id = api_world(triton.http_url)
    api_url = f"/api/v1/routes/{deployment_id}/"

    def through_api(w1: int, w2: int) -> bool:
        response = client.put(api_url, {"weights": {"1": w1, "2": w2}, "reason": "bench"},
                              format="json")
        if response.status_code != 200:
            raise RuntimeError(f"PUT {api_url}: {response.status_code} {response.content[:300]!r}")
        revision = client.get(f"{api_url}revisions/").json()["results"][0]
        return bool(revision["reloaded"])

    through_api(100, 0)
    route_url = client.get(api_url).json()["url"]
    say(f"weight changes through the API: {args.changes} flips between 100/0 and 0/100…")
    changes = measure_weight_changes(through_api, args.changes, route_url,
                                     names=("v1-triton", "v2-triton"))
    switch = spec("switch")
    switch_url = router.apply(switch(100, 0)).url
    say(f"weight changes through the adapter: {args.changes} flips…")
    direct = measure_weight_changes(lambda w1, w2: router.apply(switch(w1, w2)).reloaded,
                                    args.changes, switch_url)
    for key, values in (("weight_change_s", changes["in_force"]), ("apply_s", changes["applied"]),
                        ("adapter_weight_change_s", direct["in_force"]),
                        ("adapter_apply_s", direct["applied"])):
        result[f"{key}_median"] = statistics.median(values)
        result[f"{key}_max"] = max(values)
        result[f"{key}_min"] = min(values)
    result["weight_changes"] = len(changes["in_force"])

    steady = spec("steady")
    steady_url = router.apply(steady(90, 10)).url
    say(f"reloads: {args.reloads} under steady load from 4 clients…")
    reloads = measure_reloads(router, steady, args.reloads, steady_url, access_file)
    result |= {
        "reloads": reloads["reloads"],
        "requests_during_reloads": reloads["requests"],
        "failed_during_reloads": reloads["failed"],
        "failed_during_reloads_raw": reloads["raw_failed"],
        "retried_requests_that_reached_nginx": reloads["retried_reached_nginx"],
        "reload_seconds": reloads["seconds"],
        "reload_clients": reloads["by_mode"],
        "reload_failures": reloads["failures"],
    }
    return result


def print_table(r: dict[str, Any]) -> None:
    out = [
        f"Traffic router: nginx {r['nginx_version']} in front of Triton {r['triton_version']} "
        f"(fraud-scorer answering at once; load: {r['load_tool']})",
        "",
        f"{'overhead (ms)':28}{'p50 direct':>12}{'p50 route':>11}{'+p50':>8}"
        f"{'p99 direct':>12}{'p99 route':>11}{'+p99':>8}{'req/s direct':>14}{'req/s route':>13}",
    ]
    for c in CONCURRENCY:
        label = f"concurrency {c} ({r[f'requests_c{c}']} req)"
        out.append(
            f"{label:28}"
            f"{r[f'direct_p50_ms_c{c}']:12.3f}{r[f'route_p50_ms_c{c}']:11.3f}"
            f"{r[f'overhead_p50_ms_c{c}']:+8.3f}"
            f"{r[f'direct_p99_ms_c{c}']:12.3f}{r[f'route_p99_ms_c{c}']:11.3f}"
            f"{r[f'overhead_p99_ms_c{c}']:+8.3f}"
            f"{r[f'direct_rps_c{c}']:14.0f}{r[f'route_rps_c{c}']:13.0f}"
        )
    label = f"weight change ({r['weight_changes']} flips, s)"
    rows = (("  API PUT -> new split in force", "weight_change_s"),
            ("  API PUT answered", "apply_s"),
            ("  adapter apply() -> new split in force", "adapter_weight_change_s"),
            ("  adapter apply() returned", "adapter_apply_s"))
    out += ["", f"{label:42}{'median':>9}{'max':>9}{'min':>9}"]
    out += [f"{text:42}{r[f'{key}_median']:9.3f}{r[f'{key}_max']:9.3f}{r[f'{key}_min']:9.3f}"
            for text, key in rows]
    out += [
        "",
        f"reloads under steady load: {r['reloads']} reloads in {r['reload_seconds']:.1f} s, "
        f"{r['requests_during_reloads']} requests from 4 clients",
        f"  failed (after one retry of a request nginx never received): "
        f"{r['failed_during_reloads']}",
        f"  failed raw (before that retry): {r['failed_during_reloads_raw']}; retried requests "
        f"found in nginx's access log: {r['retried_requests_that_reached_nginx']}",
    ]
    for mode, counts in r["reload_clients"].items():
        out.append(f"  {mode:10} ok {counts['ok']}, raw failed {counts['raw_failed']}, retried "
                   f"{counts['retried']}, failed {counts['failed']}")
    if r["reload_failures"]:
        out.append(f"  first failures: {r['reload_failures']}")
    print("\n".join(out))  # noqa: T201


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000,
                        help="requests per target and concurrency (default 4000)")
    parser.add_argument("--changes", type=int, default=10, help="weight changes (default 10)")
    parser.add_argument("--reloads", type=int, default=20, help="reloads under load (default 20)")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="length of each wrk run (default 5)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"overhead rounds per concurrency, alternating the targets "
                        f"(default {ROUNDS})")
    parser.add_argument("--no-wrk", action="store_true",
                        help="measure the overhead with Python clients even where wrk is installed")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    if (args.requests < 16 or args.changes < 1 or args.reloads < 1 or args.seconds < 1
            or args.rounds < 1):
        parser.error("--requests must be at least 16, --changes, --reloads and --rounds at "
                     "least 1, --seconds at least 1")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))

    return run_bench("switchyard-router-", lambda tmp, stack: bench(args, tmp, stack), args.json,
                     print_table)


if __name__ == "__main__":
    sys.exit(main())
