"""The nginx traffic router against a REAL nginx (Debian package) and the session's REAL Triton.

One nginx is started for the module (``local.nginx``); its routes point at the
session's ``local_triton``, which serves fraud-scorer versions 1 and 2 side by side. Version 1
answers ``sigmoid(mean(x))`` in about 4 ms, version 2 ``sigmoid(mean(x) + 0.5 * max(x))`` in
about 12 ms, and Triton counts each version's inferences in ``/versions/<n>/stats``, so a test
can see where requests went without trusting the router's own headers. Every test uses a
route of its own (routes differ by name and port), so they do not disturb one another.
"""

from __future__ import annotations

import collections
import http.server
import json
import math
import os
import signal
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest

from fleet.adapters.base import AdapterError
from fleet.adapters.routers.base import (
    Mirror,
    RouteSpec,
    RouteSpecError,
    TrafficRouter,
    Variant,
    validate_route,
)
from fleet.adapters.routers.nginx import NginxRouter, syslog_target
from fleet.adapters.routers.nginx_conf import PROXY_READ_TIMEOUT
from local.nginx import NginxProcess, start_nginx, stop_pid
from local.processes import free_ports
from local.triton import TritonProcess
from rollouts.canary.arms import Arm
from rollouts.traffic.samples import parse_line
from tests.fixtures.http_server import QuietHTTPServer

pytestmark = pytest.mark.triton

FEATURES = [0.1, 0.5, 2.0]
INFER = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": FEATURES}]}
SCORE_V1 = 1 / (1 + math.exp(-sum(FEATURES) / 3))
SCORE_V2 = 1 / (1 + math.exp(-(sum(FEATURES) / 3 + 0.5 * max(FEATURES))))
INFER_PATH = "/v2/models/fraud-scorer/infer"
WORKER_PROCESSES = 2


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


class SyslogListener:
    """A UDP socket on 127.0.0.1 collecting the syslog messages nginx sends it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.messages: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="syslog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            with self._lock:
                self.messages.append(data.decode("utf-8", "replace"))

    def records(self) -> list[dict]:
        """The JSON access-log records received so far (the syslog header stripped)."""
        with self._lock:
            messages = list(self.messages)
        return [json.loads(m.split("switchyard: ", 1)[1]) for m in messages]

    def wait_for(self, request_id: str, count: int = 1, timeout: float = 1.0) -> list[dict]:
        """The records of ``request_id`` once ``count`` have arrived (or all there are)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in self.records() if r.get("request_id") == request_id]
            if len(found) >= count or time.monotonic() >= deadline:
                return found
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxProcess]:
    proc = start_nginx(tmp_path_factory.mktemp("nginx"), worker_processes=WORKER_PROCESSES)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def syslog() -> Iterator[SyslogListener]:
    listener = SyslogListener()
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture(scope="module")
def access_file(nginx: NginxProcess) -> Path:
    return nginx.prefix / "logs" / "routes.access.log"


@pytest.fixture(scope="module")
def router(nginx: NginxProcess, syslog: SyslogListener, access_file: Path) -> NginxRouter:
    return NginxRouter(
        **nginx.router_options(),  # type: ignore[arg-type]
        ports=free_ports("127.0.0.1", 16),
        access_log=[syslog_target("127.0.0.1", syslog.port), str(access_file)],
    )


def fraud_route(
    name: str,
    triton: TritonProcess,
    w1: int,
    w2: int,
    *,
    policy: str = "weighted",
    sticky_header: str = "",
    mirror: Mirror | None = None,
) -> RouteSpec:
    """A route splitting fraud-scorer between versions 1 and 2 of the session's Triton."""
    return RouteSpec(
        name=name,
        protocol="kserve-v2",
        variants=(
            Variant("v1", triton.http_url, w1, model="fraud-scorer", version=1),
            Variant("v2", triton.http_url, w2, model="fraud-scorer", version=2),
        ),
        policy=policy,
        sticky_header=sticky_header,
        mirror=mirror,
    )


def inference_count(triton: TritonProcess, version: int) -> int:
    """Triton's own count of fraud-scorer inferences of ``version``."""
    url = f"{triton.http_url}/v2/models/fraud-scorer/versions/{version}/stats"
    response = httpx.get(url, timeout=5)
    response.raise_for_status()
    return int(response.json()["model_stats"][0]["inference_count"])


def split_of(url: str, n: int, headers: dict[str, str] | None = None) -> collections.Counter:
    """Send ``n`` inferences through the route; count the variant each answer names."""
    seen: collections.Counter = collections.Counter()
    with httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(n):
            response = client.post(INFER_PATH, json=INFER, headers=headers)
            assert response.status_code == 200, response.text
            seen[response.headers["x-switchyard-variant"]] += 1
    return seen


def settled_workers(nginx: NginxProcess) -> set[int]:
    """nginx's workers once those of an earlier configuration have finished and exited
    (after a reload the old ones live on until their requests are done)."""
    deadline = time.monotonic() + 10
    while len(workers := nginx.worker_pids()) != WORKER_PROCESSES:
        assert time.monotonic() < deadline, workers
        time.sleep(0.05)
    return workers


def score_of(response: httpx.Response) -> float:
    return response.json()["outputs"][0]["data"][0]


# --------------------------------------------------------------------------------------------
# Routing
# --------------------------------------------------------------------------------------------


def test_the_router_satisfies_the_traffic_router_interface(router):
    assert isinstance(router, TrafficRouter)


def test_a_route_reaches_triton_and_infers(router, local_triton):
    route = fraud_route("infer", local_triton, 100, 0)
    result = router.apply(route)
    assert result.changed and result.reloaded
    assert result.url == router.url("infer")
    assert router.read("infer") == route

    with httpx.Client(base_url=result.url, timeout=10) as client:
        response = client.post(INFER_PATH, json=INFER)
        assert response.status_code == 200, response.text
        assert response.json()["model_version"] == "1"
        assert score_of(response) == pytest.approx(SCORE_V1, rel=1e-6)
        assert response.headers["x-switchyard-variant"] == "v1"
        assert len(response.headers["x-request-id"]) == 32
        # The metadata and health paths a Triton client calls work through the route too.
        metadata = client.get("/v2/models/fraud-scorer")
        assert metadata.status_code == 200
        assert metadata.json()["versions"] == ["1"]
        assert client.get("/v2/health/ready").status_code == 200
        # The server's admin API is not part of a route.
        assert client.post("/v2/repository/index", json={}).status_code == 404


def test_the_variant_version_is_the_one_triton_runs(router, local_triton):
    """GIVEN a route sending everything to version 2 WHEN 20 requests go through it
    THEN Triton counts 20 more inferences of version 2 and none of version 1."""
    url = router.apply(fraud_route("rewrite", local_triton, 0, 100)).url
    before = {v: inference_count(local_triton, v) for v in (1, 2)}
    with httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(20):
            response = client.post(INFER_PATH, json=INFER)
            assert response.json()["model_version"] == "2"
            assert score_of(response) == pytest.approx(SCORE_V2, rel=1e-6)
    # The session's Triton is shared, but no other test runs at the same time.
    assert inference_count(local_triton, 2) - before[2] == 20
    assert inference_count(local_triton, 1) - before[1] == 0


def test_a_weighted_split_is_within_the_binomial_bound(router, local_triton):
    """N = 400 requests at 90/10: the count X on v2 is Binomial(400, 0.1), mean 40 and
    standard deviation sqrt(400 * 0.1 * 0.9) = 6. The test allows |X - 40| <= 4 sd = 24, so a
    correct router fails it with probability about 6e-5 (normal tail beyond 4 sd), while a
    router ignoring the weights (50/50: X near 200) or inverting them (X near 360) is far
    outside. Triton's per-version counts must agree with the variant headers."""
    url = router.apply(fraud_route("split", local_triton, 90, 10)).url
    before = {v: inference_count(local_triton, v) for v in (1, 2)}
    seen = split_of(url, 400)
    assert set(seen) <= {"v1", "v2"}
    assert abs(seen["v2"] - 40) <= 4 * 6, seen
    assert inference_count(local_triton, 1) - before[1] == seen["v1"]
    assert inference_count(local_triton, 2) - before[2] == seen["v2"]


def test_weight_zero_takes_a_variant_out_of_traffic_at_once(router, local_triton):
    url = router.apply(fraud_route("zero", local_triton, 50, 50)).url
    assert split_of(url, 40)["v2"] > 0  # P(no v2 in 40 at 50%) = 1e-12
    router.apply(fraud_route("zero", local_triton, 100, 0))
    # The first request after apply() returns already sees the new weights.
    assert split_of(url, 100) == {"v1": 100}


def test_sticky_keys_never_change_variant_while_the_weights_stay(router, local_triton):
    """50 keys each sent 5 times through a 50/50 sticky route keep one variant each, also
    across a reload that changes nothing but the mirror; the keys spread over both
    variants (all 50 on one side would have probability 2 * 0.5**50)."""
    route = fraud_route("sticky", local_triton, 50, 50, policy="sticky", sticky_header="X-User")
    url = router.apply(route).url

    def variants_by_key() -> dict[str, set[str]]:
        seen: dict[str, set[str]] = collections.defaultdict(set)
        with httpx.Client(base_url=url, timeout=10) as client:
            for _ in range(5):
                for key in range(50):
                    response = client.post(INFER_PATH, json=INFER, headers={"X-User": f"u{key}"})
                    assert response.status_code == 200
                    seen[f"u{key}"].add(response.headers["x-switchyard-variant"])
        return seen

    first = variants_by_key()
    assert all(len(v) == 1 for v in first.values()), first
    assert {next(iter(v)) for v in first.values()} == {"v1", "v2"}

    mirrored = fraud_route(
        "sticky",
        local_triton,
        50,
        50,
        policy="sticky",
        sticky_header="X-User",
        mirror=Mirror("v2", 1),
    )
    assert router.apply(mirrored).reloaded
    assert variants_by_key() == first


def test_least_pending_sends_more_to_the_variant_that_answers_faster(router, local_triton):
    """8 clients at once through a 50/50 least-pending route: version 2 takes about three
    times as long as version 1, so requests pile up on it and nginx picks version 1 more
    often (about 70% measured). Under a plain 50/50 split v1 would get 160 of 320 with
    standard deviation sqrt(320 * 0.25) = 8.9; the test asks for at least 60% (192, 3.6 sd
    above it). Weight 0 still takes a variant out."""
    url = router.apply(fraud_route("pending", local_triton, 50, 50, policy="least-pending")).url
    seen: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def client_run(_: int) -> None:
        found = split_of(url, 40)
        with lock:
            seen.update(found)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client_run, range(8)))
    assert sum(seen.values()) == 320
    assert seen["v1"] >= 192, seen

    router.apply(fraud_route("pending", local_triton, 0, 100, policy="least-pending"))
    assert split_of(url, 30) == {"v2": 30}


# --------------------------------------------------------------------------------------------
# Putting changes in force
# --------------------------------------------------------------------------------------------


def test_applying_the_route_in_force_again_changes_and_reloads_nothing(router, nginx, local_triton):
    route = fraud_route("twice", local_triton, 80, 20)
    router.apply(route)
    workers = settled_workers(nginx)
    path = router.routes_dir / "twice.conf"
    mtime = path.stat().st_mtime_ns

    again = router.apply(route)
    assert (again.changed, again.reloaded) == (False, False)
    assert settled_workers(nginx) == workers  # a reload would have replaced every worker
    assert path.stat().st_mtime_ns == mtime

    changed = router.apply(fraud_route("twice", local_triton, 70, 30))
    assert changed.changed and changed.reloaded
    assert settled_workers(nginx).isdisjoint(workers)


def test_a_config_nginx_refuses_leaves_the_old_route_in_force(router, nginx, local_triton):
    """An upstream host that does not resolve passes validation (DNS is nginx's business)
    but fails ``nginx -t``: the error carries nginx's message and nothing changes."""
    good = fraud_route("refused", local_triton, 100, 0)
    url = router.apply(good).url
    text = (router.routes_dir / "refused.conf").read_text()
    workers = settled_workers(nginx)
    bad = RouteSpec(
        name="refused",
        protocol="kserve-v2",
        variants=(
            Variant("v1", local_triton.http_url, 50, model="fraud-scorer", version=1),
            Variant("v2", "http://no-such-host.invalid:8000", 50, model="fraud-scorer"),
        ),
    )
    with pytest.raises(AdapterError) as refused:
        router.apply(bad)
    assert refused.value.permanent
    assert 'host not found in upstream "no-such-host.invalid:8000"' in refused.value.message
    assert router.read("refused") == good
    assert (router.routes_dir / "refused.conf").read_text() == text
    assert settled_workers(nginx) == workers
    assert split_of(url, 10) == {"v1": 10}
    assert not list(router.routes_dir.glob(".*.tmp"))
    assert not list(router.conf_dir.glob(".staging-*"))


def test_a_reload_nginx_cannot_complete_restores_the_last_good_files(router, nginx, local_triton):
    """A port that another process holds passes ``nginx -t`` (it binds nothing) but fails
    the reload: nginx keeps its configuration, logs ``[emerg] bind()``, and the adapter
    raises that message and removes the new route's file, so disk matches what runs. It
    returns only once nginx has given up (its last word, ``still could not bind()``, comes
    after 5 tries), so the next change is not blamed for this one."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    try:
        blocked = NginxRouter(
            **nginx.router_options(),  # type: ignore[arg-type]
            ports=[taken],
            check_ports=False,
            reload_timeout=8,
        )
        with pytest.raises(AdapterError) as failed:
            blocked.apply(fraud_route("blocked", local_triton, 100, 0))
        assert "bind()" in failed.value.message
        assert "Address already in use" in failed.value.message
        assert "still could not bind()" in failed.value.message
        assert blocked.read("blocked") is None
        assert router.health().ok, router.health().message
    finally:
        holder.close()
    after = router.apply(fraud_route("after-blocked", local_triton, 100, 0))
    assert after.reloaded
    assert split_of(after.url, 3) == {"v1": 3}
    assert router.remove("after-blocked")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Not A Slug"}, "name"),
        ({"protocol": "grpc"}, "protocol"),
        ({"policy": "random"}, "policy"),
        ({"weights": (90, 20)}, "weights"),
        ({"weights": (110, -10)}, "variants.0.weight"),
        ({"weights": (99.5, 0.5)}, "variants.0.weight"),
        ({"policy": "sticky"}, "sticky_header"),
        ({"policy": "sticky", "sticky_header": "X User"}, "sticky_header"),
        ({"policy": "sticky", "sticky_header": "x_user"}, "sticky_header"),
        ({"sticky_header": "X-User"}, "sticky_header"),
        ({"names": ("v1", "v1")}, "variants.1.name"),
        ({"upstream": "ftp://127.0.0.1:8000"}, "variants.0.upstream"),
        ({"upstream": "http://127.0.0.1:8000/a;b"}, "variants.0.upstream"),
        ({"model": ""}, "variants.0.model"),
        ({"version": 0}, "variants.0.version"),
        ({"mirror": Mirror("v3", 10)}, "mirror.variant"),
        ({"mirror": Mirror("v2", 101)}, "mirror.percent"),
        ({"variants": ()}, "variants"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": 3601}, "timeout_s"),
        ({"timeout_s": float("nan")}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"timeout_s": True}, "timeout_s"),
        ({"timeout_s": "5"}, "timeout_s"),
    ],
)
def test_an_invalid_spec_is_refused_naming_the_field(router, change, field):
    w1, w2 = change.get("weights", (90, 10))
    n1, n2 = change.get("names", ("v1", "v2"))
    upstream = change.get("upstream", "http://127.0.0.1:8000")
    variants = (
        Variant(
            n1,
            upstream,
            w1,
            model=change.get("model", "fraud-scorer"),
            version=change.get("version", 1),
        ),
        Variant(n2, "http://127.0.0.1:8000", w2, model="fraud-scorer", version=2),
    )
    spec = RouteSpec(
        name=change.get("name", "invalid"),
        protocol=change.get("protocol", "kserve-v2"),
        variants=change.get("variants", variants),
        policy=change.get("policy", "weighted"),
        sticky_header=change.get("sticky_header", ""),
        mirror=change.get("mirror"),
        timeout_s=change.get("timeout_s"),
    )
    with pytest.raises(RouteSpecError) as refused:
        router.apply(spec)
    assert refused.value.field == field, refused.value.message
    assert router.read(spec.name) is None


def test_a_valid_spec_passes_validation_and_round_trips_through_json():
    spec = RouteSpec(
        name="chat",
        protocol="openai",
        variants=(Variant("base", "http://127.0.0.1:8001", 100), Variant("lora", "http://h:2", 0)),
        policy="sticky",
        sticky_header="X-Session-Id",
        mirror=Mirror("lora", 25),
        timeout_s=2.5,
    )
    validate_route(spec)
    assert RouteSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    # A spec stored before routes had a deadline reads as one without.
    old = {k: v for k, v in spec.to_json().items() if k != "timeout_s"}
    assert RouteSpec.from_json(old).timeout_s is None
    with pytest.raises(RouteSpecError) as missing:
        RouteSpec.from_json({"name": "x", "protocol": "openai", "variants": [{"name": "a"}]})
    assert missing.value.field == "variants.0.upstream"


def test_reloads_under_steady_traffic_fail_no_request(router, local_triton, access_file):
    """Two clients send inferences without pause while the weights change 5 times (5
    reloads). A client opening a connection per request never fails. A keep-alive client
    may find that nginx's old worker closed its idle connection at the moment it sent the
    next request (HTTP/1.1 lets a server close idle connections; clients retry on a new
    one): such a request never reached nginx (its id is not in the access log) and its
    retry succeeds. Every request nginx received got its answer."""
    url = router.apply(fraud_route("steady", local_triton, 90, 10)).url
    stop = threading.Event()
    results: dict[str, dict[str, list]] = {
        mode: {"ok": [], "failed": [], "unsent": [], "stopped": []}
        for mode in ("close", "keepalive")
    }

    def run(mode: str) -> None:
        out = results[mode]
        headers = {"Connection": "close"} if mode == "close" else {}
        with httpx.Client(base_url=url, timeout=10) as client:
            for _ in range(2000):  # bounded: about 10 s at the slowest
                if stop.is_set():
                    out["stopped"].append(True)  # sent until the end, never died on its way
                    return
                for attempt in (1, 2):
                    request_id = uuid.uuid4().hex  # each attempt its own, to find it in the log
                    try:
                        response = client.post(
                            INFER_PATH, json=INFER, headers={**headers, "X-Request-Id": request_id}
                        )
                    except (httpx.RemoteProtocolError, httpx.ReadError):
                        if mode == "keepalive" and attempt == 1:
                            out["unsent"].append(request_id)
                            continue
                        out["failed"].append(request_id)
                        break
                    except httpx.HTTPError as exc:
                        out["failed"].append(f"{request_id}: {exc!r}")
                        break
                    (out["ok"] if response.status_code == 200 else out["failed"]).append(request_id)
                    break

    threads = [threading.Thread(target=run, args=(mode,)) for mode in results]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    reloads = []
    for weight in (80, 90, 70, 90, 60):
        reloads.append(router.apply(fraud_route("steady", local_triton, weight, 100 - weight)))
        time.sleep(0.15)
    time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(30)

    assert all(r.reloaded for r in reloads)
    for mode, out in results.items():
        assert out["failed"] == [], mode
        assert out["stopped"] == [True], mode
        assert len(out["ok"]) >= 50, (mode, len(out["ok"]))
    logged = access_file.read_text()
    assert all(rid not in logged for rid in results["keepalive"]["unsent"])
    assert results["close"]["unsent"] == []


# --------------------------------------------------------------------------------------------
# Mirror, samples, health, removal
# --------------------------------------------------------------------------------------------


def test_a_mirror_copies_requests_to_the_candidate_and_discards_its_answers(
    router, local_triton, syslog
):
    mirror = Mirror("v2", 100)
    url = router.apply(fraud_route("shadow", local_triton, 100, 0, mirror=mirror)).url
    before = inference_count(local_triton, 2)
    ids = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(30):
            request_id = uuid.uuid4().hex
            ids.append(request_id)
            response = client.post(INFER_PATH, json=INFER, headers={"X-Request-Id": request_id})
            assert response.headers["x-switchyard-variant"] == "v1"
            assert response.json()["model_version"] == "1"
            assert score_of(response) == pytest.approx(SCORE_V1, rel=1e-6)
    deadline = time.monotonic() + 5
    while inference_count(local_triton, 2) - before < 30 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert inference_count(local_triton, 2) - before == 30
    # Each request yields its own sample and its copy's, under the same request id.
    records = syslog.wait_for(ids[-1], count=2)
    assert sorted((r["variant"], r["mirror"]) for r in records) == [("v1", False), ("v2", True)]
    assert all(r["status"] == 200 for r in records)


def test_a_slower_candidate_mirrored_to_slows_neither_the_primarys_clients_nor_its_samples(
    router, local_triton, syslog
):
    """nginx finishes a request, and reads a keep-alive connection's next one, only once its
    mirror subrequests are done; the route's mirror relay answers at once, so a primary
    mirrored to a candidate three times slower serves as fast as without the mirror."""

    def timed(url: str, n: int = 20) -> tuple[float, float, list[str]]:
        """Median client latency and recorded request_time (ms) of the primary, and the ids."""
        walls, ids = [], []
        with httpx.Client(base_url=url, timeout=10) as client:  # one keep-alive connection
            for _ in range(n):
                ids.append(uuid.uuid4().hex)
                began = time.perf_counter()
                client.post(INFER_PATH, json=INFER, headers={"X-Request-Id": ids[-1]})
                walls.append((time.perf_counter() - began) * 1000)
        recorded = [r["request_time"] * 1000 for i in ids for r in syslog.wait_for(i)
                    if not r["mirror"]]
        return statistics.median(walls), statistics.median(recorded), ids

    primary = timed(router.apply(fraud_route("fast", local_triton, 100, 0)).url)
    candidate = timed(router.apply(fraud_route("slow", local_triton, 0, 100)).url)
    shadowed = timed(router.apply(
        fraud_route("fast-shadowed", local_triton, 100, 0, mirror=Mirror("v2", 100))).url)

    # v2 answers about three times slower than v1: the margin is half the gap between them.
    assert candidate[0] > primary[0] + 4, (primary, candidate)
    assert shadowed[0] < (primary[0] + candidate[0]) / 2, (primary, candidate, shadowed)
    assert shadowed[1] < (primary[1] + candidate[1]) / 2, (primary, candidate, shadowed)
    # Every copy still reached the candidate and was recorded as a mirrored sample of it, with
    # the client's path.
    copies = [r for i in shadowed[2] for r in syslog.wait_for(i, count=2, timeout=5) if r["mirror"]]
    assert len(copies) == 20
    assert {(r["variant"], r["path"], r["status"]) for r in copies} == {("v2", INFER_PATH, 200)}


def test_every_request_sends_a_json_sample_to_syslog_with_every_field(router, local_triton, syslog):
    url = router.apply(fraud_route("samples", local_triton, 100, 0)).url
    request_id = uuid.uuid4().hex
    sent = time.time()
    response = httpx.post(f"{url}{INFER_PATH}", json=INFER, headers={"X-Request-Id": request_id})
    assert response.headers["x-request-id"] == request_id
    (record,) = syslog.wait_for(request_id, timeout=1.0)
    assert set(record) == {
        "time",
        "msec",
        "route",
        "variant",
        "mirror",
        "method",
        "path",
        "status",
        "upstream_addr",
        "upstream_status",
        "upstream_response_time",
        "upstream_header_time",
        "content_type",
        "key",
        "request_time",
        "bytes_sent",
        "request_id",
    }
    assert record["route"] == "samples"
    assert record["variant"] == "v1"
    assert record["mirror"] is False
    assert (record["method"], record["path"], record["status"]) == ("POST", INFER_PATH, 200)
    assert record["upstream_addr"] == local_triton.http_url.removeprefix("http://")
    assert record["upstream_status"] == "200"
    assert 0 < float(record["upstream_response_time"]) <= record["request_time"] + 0.001
    assert 0 < float(record["upstream_header_time"]) <= float(record["upstream_response_time"])
    assert record["content_type"] == "application/json"
    assert record["key"] == ""  # not a sticky route
    # The body plus the status line and headers nginx wrote.
    assert len(response.content) < record["bytes_sent"] < len(response.content) + 1024
    assert abs(record["msec"] - sent) < 5
    # A path the route does not serve is answered by nginx itself: a sample, no variant.
    other = uuid.uuid4().hex
    httpx.get(f"{url}/metrics", headers={"X-Request-Id": other})
    (missed,) = syslog.wait_for(other)
    assert (missed["status"], missed["variant"], missed["upstream_addr"]) == (404, "", "")


class EchoHandler(http.server.BaseHTTPRequestHandler):
    """Answers what it received as JSON; ``/v1/stream`` streams two SSE events 1 s apart;
    ``/v1/hang`` answers nothing for HANG_S (a hung server); ``/v1/tokens`` sends its header
    at once and, TOKENS_AFTER_S later, TOKEN_EVENTS events each written in two pieces cut
    inside ``data: {`` (with ``?usage=1`` then a usage event whose count is cut in two), as an
    LLM server streams tokens."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.endswith("/v1/hang"):
            time.sleep(HANG_S)
            return
        if "/v1/tokens" in self.path:
            self._tokens("usage=1" in self.path)
            return
        if self.path.endswith("/v1/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event, pause in ((b"data: 1\n\n", 1.0), (b"data: [DONE]\n\n", 0.0)):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(pause)
            self.wfile.write(b"0\r\n\r\n")
            return
        body = json.dumps(
            {
                "port": self.server.server_address[1],
                "path": self.path,
                "host": self.headers["Host"],
                "request_id": self.headers["X-Request-Id"],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _tokens(self, usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        time.sleep(TOKENS_AFTER_S)
        pieces = []
        for i in range(TOKEN_EVENTS):
            pieces += [b"da", b'ta: {"choices":[{"text":"t%d"}]}\n\n' % i]
        if usage:
            pieces += [b'data: {"choices":[],"usage":{"completion_tokens":1',
                       b'%d}}\n\n' % (USAGE_TOKENS % 10)]
        pieces.append(b"data: [DONE]\n\n")
        for piece in pieces:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            time.sleep(TOKEN_GAP_S)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


TOKENS_AFTER_S = 0.3
TOKEN_EVENTS = 5
TOKEN_GAP_S = 0.02  # between pieces: nginx passes each on as a chunk of its own
USAGE_TOKENS = 12  # what the usage event says (its "1" and "2" are written apart)


@pytest.fixture(scope="module")
def echo_servers() -> Iterator[list[str]]:
    """Two plain HTTP servers standing in for vLLM servers (the router is under test)."""
    servers = [QuietHTTPServer(("127.0.0.1", 0), EchoHandler) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("policy", ["weighted", "least-pending", "sticky"])
def test_an_openai_route_passes_paths_through_and_streams(router, echo_servers, syslog, policy):
    """OpenAI routes pass the client's path and query through (after the upstream URL's own
    path), stream answers as they come, mirror, and refuse the adapter-loading admin paths."""
    base, lora = echo_servers
    spec = RouteSpec(
        name=f"chat-{policy}",
        protocol="openai",
        variants=(Variant("base", base, 0), Variant("lora", f"{lora}/prefix", 100)),
        policy=policy,
        sticky_header="X-Session-Id" if policy == "sticky" else "",
        mirror=Mirror("base", 100),
    )
    url = router.apply(spec).url
    request_id = uuid.uuid4().hex
    routed = httpx.get(f"{url}/v1/models?limit=1", headers={"X-Request-Id": request_id})
    assert routed.headers["x-switchyard-variant"] == "lora"
    assert routed.json() == {
        "port": int(lora.rsplit(":", 1)[1]),
        "path": "/prefix/v1/models?limit=1",
        "host": lora.removeprefix("http://"),
        "request_id": request_id,
    }
    records = syslog.wait_for(request_id, count=2)
    assert sorted((r["variant"], r["mirror"]) for r in records) == [
        ("base", True),
        ("lora", False),
    ]

    started = time.monotonic()
    with httpx.stream("GET", f"{url}/v1/stream", timeout=10) as response:
        chunks = response.iter_text()
        assert next(chunks).startswith("data: 1")
        first = time.monotonic() - started
        assert "".join(chunks).strip().endswith("data: [DONE]")
    assert first < 0.8  # the second event comes 1 s later: the first was not held back

    admin = httpx.post(f"{url}/v1/load_lora_adapter", json={})
    assert admin.status_code == 403
    assert "x-switchyard-variant" not in admin.headers
    assert router.remove(spec.name)


def test_a_sticky_routes_lines_carry_the_key_and_the_servers_time_to_its_first_byte(
    router, echo_servers, syslog
):
    """A sticky route logs the sticky header's value as ``key`` (its first 256 bytes, control
    bytes escaped; "" without the header and in a mirrored copy's line), and every line the
    server's time to its response header: a streamed answer's first event comes at once and its
    end a second later, so ``upstream_header_time`` is the time to its first token."""
    base, lora = echo_servers
    spec = RouteSpec(
        name="chat-keys", protocol="openai",
        variants=(Variant("base", base, 0), Variant("lora", lora, 100)),
        policy="sticky", sticky_header="X-User", mirror=Mirror("base", 100),
    )
    url = router.apply(spec).url
    streamed, plain, hostile = (uuid.uuid4().hex for _ in range(3))
    with httpx.stream("GET", f"{url}/v1/stream", timeout=10,
                      headers={"X-User": "alice@example.com", "X-Request-Id": streamed}) as answer:
        assert answer.headers["content-type"] == "text/event-stream"
        answer.read()
    assert httpx.get(f"{url}/v1/models", headers={"X-Request-Id": plain}).status_code == 200
    # A control byte and 5,000 bytes (httpx sends neither): as a client may send them.
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Request-Id: " + hostile.encode()
                    + b"\r\nX-User: \x01" + b"u" * 5000 + b"\r\nConnection: close\r\n\r\n")
        assert raw.recv(64).startswith(b"HTTP/1.1 200")

    records = {r["mirror"]: r for r in syslog.wait_for(streamed, count=2)}
    line, copy = records[False], records[True]
    assert (line["variant"], line["key"], copy["key"]) == ("lora", "alice@example.com", "")
    assert line["content_type"] == "text/event-stream"
    assert 0 <= float(line["upstream_header_time"]) < 0.5 < 0.9 < line["request_time"]
    assert float(line["upstream_response_time"]) > 0.9
    (line,) = [r for r in syslog.wait_for(plain, count=2) if not r["mirror"]]
    assert line["key"] == "" and line["content_type"] == "application/json"
    (line,) = [r for r in syslog.wait_for(hostile, count=2) if not r["mirror"]]
    assert line["key"] == "\x01" + "u" * 255
    assert router.remove(spec.name)


HANG_S = 8.0
DEADLINE_S = 2.5  # the stream's 1 s pause between events passes it with 1.5 s to spare


@pytest.mark.parametrize("policy", ["weighted", "least-pending"])
def test_a_routes_deadline_ends_a_hung_request_with_504_counted_slow_and_failed(
    router, echo_servers, syslog, policy
):
    """A request its server leaves unanswered ends at the route's deadline with 504 (not at
    nginx's 300 s), and its line reaches the judge as a failure at least the deadline slow; a
    stream whose events keep coming inside the deadline is not cut."""
    spec = RouteSpec(name=f"dep-9{len(policy)}", protocol="openai",
                     variants=(Variant("base", echo_servers[0], 100),), policy=policy,
                     timeout_s=DEADLINE_S)
    url = router.apply(spec).url
    assert router.read(spec.name) == spec
    hung = uuid.uuid4().hex
    started = time.monotonic()
    answer = httpx.get(f"{url}/v1/hang", headers={"X-Request-Id": hung}, timeout=HANG_S + 5)
    waited = time.monotonic() - started
    assert answer.status_code == 504
    # nginx's timer fires at the deadline; its end is checked once a second at worst.
    assert DEADLINE_S <= waited < HANG_S, waited
    (line,) = syslog.wait_for(hung)
    sample = parse_line(json.dumps(line))
    assert (sample.status, sample.upstream_status) == (504, "504")
    arm = Arm.of([sample])
    assert arm.errors == 1
    assert list(arm.latencies) == [sample.latency_ms]
    assert sample.latency_ms >= DEADLINE_S * 1000

    with httpx.stream("GET", f"{url}/v1/stream", timeout=10) as streamed:
        assert streamed.status_code == 200
        assert "".join(streamed.iter_text()).strip().endswith("data: [DONE]")

    # Without a deadline the route waits as long as the router's own limit.
    assert router.apply(replace(spec, timeout_s=None)).changed
    assert f"proxy_read_timeout {PROXY_READ_TIMEOUT};" in (
        router.routes_dir / f"{spec.name}.conf").read_text()
    assert router.remove(spec.name)


@pytest.mark.parametrize("policy", ["weighted", "least-pending"])
def test_an_llm_routes_streamed_answers_are_timed_token_by_token(
    router, echo_servers, syslog, policy
):
    """With the Lua module, a streamed answer's line says when its first event left (here
    TOKENS_AFTER_S after a header sent at once, so not the header's time) and how many tokens
    it had: its events, an event cut in two counted once, or the usage's count where the
    answer carries one. An answer that streamed nothing logs neither; the judge's arm turns
    them into the time per output token."""
    assert router.token_timing
    spec = RouteSpec(name=f"dep-7{len(policy)}", protocol="openai",
                     variants=(Variant("base", echo_servers[0], 100),), policy=policy)
    url = router.apply(spec).url
    counted, reported, plain = (uuid.uuid4().hex for _ in range(3))
    for rid, query in ((counted, ""), (reported, "?usage=1")):
        with httpx.stream("GET", f"{url}/v1/tokens{query}", timeout=10,
                          headers={"X-Request-Id": rid}) as answer:
            text = "".join(answer.iter_text())
        assert text.count("data: {") == TOKEN_EVENTS + (query != "")
    assert httpx.get(f"{url}/v1/models", headers={"X-Request-Id": plain}).status_code == 200

    (line,) = syslog.wait_for(counted)
    assert line["tokens"] == str(TOKEN_EVENTS)
    assert float(line["upstream_header_time"]) < TOKENS_AFTER_S <= float(line["first_token"])
    assert float(line["first_token"]) < line["request_time"]
    sample = parse_line(json.dumps(line))
    assert (sample.tokens, sample.first_ms) == (TOKEN_EVENTS, float(line["first_token"]) * 1000)
    arm = Arm.of([sample])
    assert list(arm.ttft) == [sample.first_ms]
    expected = (sample.latency_ms - sample.first_ms) / (TOKEN_EVENTS - 1)
    assert arm.tpot.tolist() == pytest.approx([expected])
    # Two pieces an event, TOKEN_GAP_S apart: at least that long a token.
    assert expected >= 2 * TOKEN_GAP_S * 1000 * 0.9

    (line,) = syslog.wait_for(reported)
    assert line["tokens"] == str(USAGE_TOKENS)
    (line,) = syslog.wait_for(plain)
    assert (line["first_token"], line["tokens"]) == ("", "")
    sample = parse_line(json.dumps(line))
    assert (sample.first_ms, sample.tokens) == (None, None)
    assert router.remove(spec.name)


def test_a_kserve_route_gets_no_token_timing_even_where_nginx_has_lua(router, local_triton):
    """Triton's answers are not token streams: its routes pass through untouched."""
    assert router.token_timing
    url = router.apply(fraud_route("dep-76", local_triton, 100, 0)).url
    text = (router.routes_dir / "dep-76.conf").read_text()
    assert "body_filter_by_lua" not in text and "sy_tokens" not in text
    assert sum(split_of(url, 3).values()) == 3
    assert router.remove("dep-76")


VLLM_TOKENS = 12


@pytest.mark.vllm
def test_a_real_vllm_answer_is_timed_token_by_token_as_its_client_sees_it(
    router, syslog, local_vllm
):
    """Through the route, a real vLLM's streamed completion: the line's token count is the
    events the client read (one a token) and, when the client asks for usage, vLLM's own
    count; the time per output token the judge computes from the line is the client's own
    time between the first and the last token, within 15% (the router adds the last event's
    end, a fraction of a millisecond on loopback)."""
    spec = RouteSpec(name="dep-77", protocol="openai",
                     variants=(Variant("base", local_vllm.http_url, 100),))
    url = router.apply(spec).url
    body = {"model": local_vllm.served_model_name, "prompt": "The sea is",
            "max_tokens": VLLM_TOKENS, "ignore_eos": True, "temperature": 0, "stream": True}
    seen = {}
    for usage in (False, True):
        rid = uuid.uuid4().hex
        arrivals, text = [], ""
        extra = {"stream_options": {"include_usage": True}} if usage else {}
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, **extra}, timeout=120,
                          headers={"X-Request-Id": rid}) as answer:
            assert answer.status_code == 200
            for event in answer.iter_lines():
                if event.startswith("data: {") and '"text"' in event:
                    choices = json.loads(event[6:])["choices"]
                    if choices and choices[0]["text"]:
                        arrivals.append(time.monotonic())
                text += event + "\n"
        (line,) = syslog.wait_for(rid)
        seen[usage] = (line, arrivals, text)

    line, arrivals, text = seen[False]
    assert int(line["tokens"]) == text.count("data: {") == VLLM_TOKENS
    sample = parse_line(json.dumps(line))
    (tpot,) = Arm.of([sample]).tpot
    client = (arrivals[-1] - arrivals[0]) * 1000 / (len(arrivals) - 1)
    assert tpot == pytest.approx(client, rel=0.15), (tpot, client)
    assert float(line["first_token"]) >= float(line["upstream_header_time"])

    line, _, text = seen[True]
    reported = json.loads(text.split("data: ")[-2])["usage"]["completion_tokens"]
    assert int(line["tokens"]) == reported == VLLM_TOKENS
    assert router.remove(spec.name)


def test_without_the_lua_module_an_llm_route_logs_no_token_timing(nginx, syslog, echo_servers):
    """An nginx that loads no Lua module gets no body filter (its ``nginx -t`` would refuse
    one), and its lines carry no token fields: the judge falls back to the generation time."""
    options = {**nginx.router_options(), "load_modules": ()}
    plain = NginxRouter(**options, ports=free_ports("127.0.0.1", 1),  # type: ignore[arg-type]
                        access_log=[syslog_target("127.0.0.1", syslog.port)])
    assert not plain.token_timing
    spec = RouteSpec(name="dep-70", protocol="openai",
                     variants=(Variant("base", echo_servers[0], 100),))
    url = plain.apply(spec).url
    assert "lua" not in (plain.routes_dir / f"{spec.name}.conf").read_text()
    rid = uuid.uuid4().hex
    with httpx.stream("GET", f"{url}/v1/tokens", timeout=10, headers={"X-Request-Id": rid}) as a:
        a.read()
    (line,) = syslog.wait_for(rid)
    assert "tokens" not in line and "first_token" not in line
    sample = parse_line(json.dumps(line))
    assert (sample.first_ms, sample.tokens, sample.stream) == (None, None, True)
    arm = Arm.of([sample])
    assert len(arm.tpot) == 0 and len(arm.generation) == 1
    assert plain.remove(spec.name)


def test_health_reports_the_routes_in_force_and_removal_takes_a_route_out(router, local_triton):
    url = router.apply(fraud_route("gone", local_triton, 100, 0)).url
    health = router.health()
    assert health.ok, health.message
    assert health.routes["gone"] is True
    assert health.active_connections is not None and health.active_connections >= 1

    assert router.remove("gone") is True
    assert router.read("gone") is None and router.url("gone") is None
    assert "gone" not in router.health().routes
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}{INFER_PATH}", json=INFER, timeout=2)
    assert router.remove("gone") is False


def test_health_says_so_when_nginx_does_not_serve_what_was_applied(nginx, local_triton, tmp_path):
    """A route file nginx was never reloaded with is not in force; a dead status URL is
    reported, not raised."""
    stale = NginxRouter(
        tmp_path / "conf",
        reload_command=["true"],
        status_url="http://127.0.0.1:9/nginx_status",
        ports=free_ports("127.0.0.1", 1),
        reload_timeout=0.5,
    )
    with pytest.raises(AdapterError):
        stale.apply(fraud_route("never", local_triton, 100, 0))
    assert stale.read("never") is None  # restored: nothing on disk that nginx does not run
    health = stale.health()
    assert not health.ok
    assert "did not answer" in health.message


def test_nginx_started_again_after_a_kill_serves_the_last_good_routes(local_triton, tmp_path):
    """nginx killed hard (master and workers) leaves its unix sockets behind; started again
    on the same prefix it binds them anew and serves the routes last put in force, at the
    same URLs. Stopping it ends every process of it."""
    first = start_nginx(tmp_path / "nginx", worker_processes=1)
    options = first.router_options()
    router = NginxRouter(**options, ports=free_ports("127.0.0.1", 2))  # type: ignore[arg-type]
    url = router.apply(fraud_route("again", local_triton, 50, 50, policy="least-pending")).url
    assert list(router.socket_dir.glob("*.sock"))
    os.killpg(first.pid, signal.SIGKILL)
    first.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/v2/health/ready", timeout=2)
    assert list(router.socket_dir.glob("*.sock"))  # left behind by the kill

    second = start_nginx(tmp_path / "nginx", worker_processes=1)
    try:
        assert router.health().routes == {"again": True}
        assert sum(split_of(url, 10).values()) == 10
        workers = second.worker_pids()
        assert workers
    finally:
        second.stop()
    assert not second.is_running()
    assert not any(psutil.pid_exists(pid) for pid in workers)
    assert stop_pid(os.getpid()) is False  # not an nginx master: left alone
