"""The autoscaling signal and the replica recommendation (rollouts.workloads.autoscaling).

GIVEN a deployment whose traffic is written into Redis the way Switchyard writes it (route
samples through ``rollouts.traffic.samples.record``, the scraper's points through
``rollouts.traffic.latency`` from two real Triton ``/metrics`` captures), and benchmark jobs as the
reconciler leaves them, THEN the signal is what that traffic was over the last minute and the
recommendation is ceil(rate / (capacity x target)), with a readable reason when there is none.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from fleet.adapters.metrics.values import Window
from fleet.models import InferenceServer
from rollouts.models import BenchmarkJob, ModelLoad, Route, ServerWorkload
from rollouts.traffic import latency, live_window, samples, scrape_tick
from rollouts.workloads import autoscaling
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

pytestmark = pytest.mark.django_db
CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "metrics"


# --------------------------------------------------------------------------------------------
# Builders, shared with the /metrics and console tests
# --------------------------------------------------------------------------------------------


def make_deployment(tenant=None, *, name: str = "fraud-scorer", slo_p99_ms: int = 50,
                    cluster_name: str = "gpu-east") -> Any:
    """A deployment (and model) called ``name`` on one Triton server, v1 ready there."""
    cluster = ClusterFactory(name=cluster_name)
    server = InferenceServerFactory(cluster=cluster, name=f"triton-{uuid.uuid4().hex[:6]}",
                                    runtime=InferenceServer.Runtime.TRITON)
    model = ModelFactory(name=name, **({"tenant": tenant} if tenant else {}))
    dep = DeploymentFactory(tenant=model.tenant, model=model, cluster=cluster, name=name,
                            slo_p99_ms=slo_p99_ms)
    dep.servers.set([server])
    v1 = ModelVersionFactory(model=model, version=1)
    ModelLoad.objects.create(tenant=dep.tenant, deployment=dep, server=server, version=v1,
                             state=ModelLoad.State.READY, requested_by_label="seed")
    return dep


def benchmark(dep: Any, version_number: int = 1, *, max_load_rps: float | None = 1.0,
              p99_ms: float | None = None, state: str = BenchmarkJob.State.SUCCEEDED,
              finished_ago_s: float = 60.0) -> BenchmarkJob:
    """A benchmark job as the reconciler leaves it: its best config's sweep summary."""
    version = dep.model.versions.get(version=version_number)
    best = {"max_load": 4, "max_load_rps": max_load_rps} if max_load_rps is not None else None
    return BenchmarkJob.objects.create(
        tenant=dep.tenant, deployment=dep, version=version, server=dep.servers.first(),
        protocol=BenchmarkJob.Protocol.TRITON_HTTP, levels=[1, 2, 4, 8], state=state,
        slo={"p99_ms": float(p99_ms if p99_ms is not None else dep.slo_p99_ms),
             "error_rate": 0.01},
        summary={"device_class": "a100-80gb", "best_config": 0 if best else None, "best": best},
        requested_by_label="seed",
        finished_at=timezone.now() - timedelta(seconds=finished_ago_s),
    )


def route_lines(dep: Any, variant: str, latencies_ms: list[float], *, end: float,
                span_s: float = 50.0, status: int = 200, mirror: bool = False) -> list[str]:
    """nginx's JSON access-log lines for requests through the deployment's route, spread
    evenly over the ``span_s`` seconds before ``end``."""
    step = span_s / max(len(latencies_ms), 1)
    return [json.dumps({
        "route": f"dep-{dep.pk}", "variant": variant, "mirror": mirror,
        "msec": round(end - span_s + i * step, 3), "status": status,
        "request_time": ms / 1000.0, "bytes_sent": 10, "upstream_status": str(status),
        "upstream_response_time": f"{ms / 1000.0:.3f}", "upstream_addr": "10.0.0.7:8000",
        "method": "POST", "path": "/v2/models/fraud-scorer/infer", "request_id": uuid.uuid4().hex,
    }) for i, ms in enumerate(latencies_ms)]


def record(lines: list[str], now: float) -> None:
    result = samples.record(lines, store=samples.connect(), now=now)
    assert result.counts["stored"] == len(lines), result


def scrape_twice(dep: Any, first_at: float, seconds: float = 10.0) -> None:
    """Two scrapes of the deployment's server ``seconds`` apart, from real Triton captures
    (fraud-scorer v1 served 10 requests in between, p99 7.671 ms), through the scraper's own
    windowing and writing."""
    server = dep.servers.get()
    store = live_window.connect()
    found = {}
    for at, name in ((first_at, "triton_metrics.txt"),
                     (first_at + seconds, "triton_metrics_after_reload.txt")):
        # Captured from a Triton serving the demo's fraud-scorer; on a shared Triton the
        # tenant's model goes by a name its slug qualifies.
        text = (CAPTURES / name).read_text().replace('model="fraud-scorer"',
                                                      f'model="{dep.model.name_on(server)}"')
        pipe = store.pipeline()
        found[server.pk] = scrape_tick.windows(scrape_tick.Scraped(server, at, text),
                                               store.get(live_window.prev_key(server.pk)), pipe)
        pipe.execute()
    (target,) = scrape_tick.served([dep.pk])
    assert scrape_tick.write(store, [(target, first_at + seconds)], found) == 2  # v1 and v2


# --------------------------------------------------------------------------------------------
# The signal
# --------------------------------------------------------------------------------------------


def test_the_signal_counts_every_routed_request_of_the_last_minute():
    dep = make_deployment()
    now = time.time()
    fast = [float(ms) for ms in range(1, 91)]  # 90 requests, 1..90 ms
    slow = [float(ms) for ms in range(101, 111)]  # 10 more, 101..110 ms
    record(
        route_lines(dep, "v1-a", fast, end=now - 1)
        + route_lines(dep, "v2-b", slow, end=now - 1, status=503)
        # Copies mirrored to a candidate are not traffic the deployment serves.
        + route_lines(dep, "v2-b", [900.0] * 20, end=now - 1, mirror=True)
        # Older than the minute: not in the signal.
        + route_lines(dep, "v1-a", [500.0] * 30, end=now - 70, span_s=5),
        now,
    )

    sig = autoscaling.signal(dep, now=now)

    assert sig.source == "router"
    assert sig.requests == 100
    assert sig.rps == pytest.approx(100 / 60)
    assert sig.p99_ms == 109.0  # nearest rank: the 99th of 100 sorted latencies
    assert sig.error_rate == pytest.approx(10.0)
    assert sig.queue_ms is None  # nginx cannot see a server's queue
    assert sig.updated_at == pytest.approx(now - 1 - 50 / 90, abs=0.01)  # the newest v1 request


def test_without_route_samples_the_signal_comes_from_the_scrapers_points():
    dep = make_deployment()
    now = time.time()
    scrape_twice(dep, now - 15, seconds=10.0)

    sig = autoscaling.signal(dep, now=now)

    assert sig.source == "servers"
    assert sig.requests == 10
    assert sig.rps == pytest.approx(1.0)  # 10 requests to v1 in 10 s, none to v2
    assert sig.p99_ms == pytest.approx(7.671)  # Triton's own p99 summary of v1
    assert sig.error_rate == 0.0
    assert sig.updated_at == pytest.approx(now - 5)


@pytest.mark.skipif("queue_ms" not in Window.__dataclass_fields__,
                    reason="the scraper's windows do not carry the queue time yet")
def test_the_queue_time_comes_from_the_servers_queue_counters():
    dep = make_deployment()
    now = time.time()
    scrape_twice(dep, now - 15, seconds=10.0)

    sig = autoscaling.signal(dep, now=now)

    assert sig.queue_ms == pytest.approx(0.028)  # (5326 - 5046) us over v1's 10 requests


def test_points_older_than_the_minute_are_not_the_signal():
    dep = make_deployment()
    now = time.time()
    scrape_twice(dep, now - 90, seconds=10.0)

    sig = autoscaling.signal(dep, now=now)

    assert not sig.measured and sig.rps is None and sig.p99_ms is None


def test_the_queue_time_is_the_request_weighted_mean_of_the_servers_points():
    """Points that carry the servers' mean queue time per request (``queue_ms``) give the
    signal's queue time, weighted by the requests of each point; router samples keep the
    rate and p99 but cannot see the queue, so it still comes from the points."""
    dep = make_deployment()
    now = time.time()
    store = latency._redis()
    key = latency._series_key(dep.pk, "v1")
    for t, requests, queue_ms in ((now - 20, 30, 2.0), (now - 10, 10, 6.0), (now - 5, 0, 50.0)):
        point = {"t": t, "seconds": 5.0, "requests": requests, "failures": 0, "rps": requests / 5,
                 "error_rate": 0.0, "p99_ms": 12.0, "queue_ms": queue_ms}
        store.zadd(key, {json.dumps(point): t})
    store.sadd(latency._labels_key(dep.pk), "v1")

    served = autoscaling.signal(dep, now=now)
    record(route_lines(dep, "v1-a", [20.0] * 60, end=now - 1), now)
    routed = autoscaling.signal(dep, now=now)

    assert served.source == "servers" and served.rps == pytest.approx(40 / 15)
    assert served.queue_ms == pytest.approx((30 * 2.0 + 10 * 6.0) / 40)
    assert routed.source == "router" and routed.rps == pytest.approx(1.0)
    assert routed.p99_ms == 20.0
    assert routed.queue_ms == pytest.approx(3.0)


def test_nothing_in_redis_is_nothing_measured_not_zero():
    dep = make_deployment()

    sig = autoscaling.signal(dep)

    assert sig.source == "" and not sig.measured
    assert sig.rps is None and sig.requests is None and sig.error == ""


def test_an_unreachable_redis_is_said_so(settings):
    dep = make_deployment()
    benchmark(dep)
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens on the discard port

    started = time.monotonic()
    recs = list(autoscaling.recommendations())
    took = time.monotonic() - started

    assert [r.deployment for r in recs] == [dep]
    assert recs[0].state == autoscaling.NO_TRAFFIC
    assert "live window in Redis cannot be read" in recs[0].explanation
    assert took < 5


# --------------------------------------------------------------------------------------------
# The recommendation
# --------------------------------------------------------------------------------------------


def test_it_recommends_the_rate_over_capacity_at_the_target_utilisation():
    dep = make_deployment(slo_p99_ms=50)
    job = benchmark(dep, max_load_rps=1.0)
    now = time.time()
    record(route_lines(dep, "v1-a", [10.0] * 150, end=now - 1), now)  # 2.5 req/s

    rec = autoscaling.recommend_replicas(dep, now=now)

    # 2.5 / (1.0 x 0.7) = 3.57 -> 4
    assert rec.state == autoscaling.OK
    assert rec.recommended == 4
    assert rec.current == 1 and rec.replicas_from == "servers"
    assert rec.capacity_rps == 1.0 and rec.benchmark == job and rec.version.version == 1
    assert rec.utilization == pytest.approx(2.5)
    assert rec.target_utilization == 0.7
    assert "2.5 req/s" in rec.explanation and "= 3.57 → 4 replicas" in rec.explanation
    assert f"benchmark #{job.pk}" in rec.explanation and "a100-80gb" in rec.explanation
    assert rec.notes == ()


def test_the_target_utilisation_is_a_setting(settings):
    dep = make_deployment()
    benchmark(dep, max_load_rps=1.0)
    now = time.time()
    record(route_lines(dep, "v1-a", [10.0] * 150, end=now - 1), now)
    settings.SWITCHYARD_AUTOSCALE_TARGET_UTILIZATION = 0.5

    assert autoscaling.recommend_replicas(dep, now=now).recommended == 5  # 2.5 / 0.5

    settings.SWITCHYARD_AUTOSCALE_TARGET_UTILIZATION = "nonsense"
    assert autoscaling.recommend_replicas(dep, now=now).recommended == 4  # the default, 0.7


def test_exactly_at_the_target_needs_no_extra_replica():
    dep = make_deployment()
    benchmark(dep, max_load_rps=10.0)
    now = time.time()
    record(route_lines(dep, "v1-a", [10.0] * 420, end=now - 1), now)  # 7 req/s = 70% of 10

    assert autoscaling.recommend_replicas(dep, now=now).recommended == 1


def test_no_requests_measured_is_the_minimum_of_one():
    dep = make_deployment()
    benchmark(dep, max_load_rps=10.0)
    now = time.time()
    store = latency._redis()
    point = {"t": now - 2, "seconds": 1.0, "requests": 0, "failures": 0, "rps": 0.0}
    store.zadd(latency._series_key(dep.pk, "v1"), {json.dumps(point): now - 2})
    store.sadd(latency._labels_key(dep.pk), "v1")

    rec = autoscaling.recommend_replicas(dep, now=now)

    assert rec.state == autoscaling.OK and rec.recommended == 1
    assert "(the minimum)" in rec.explanation


def test_it_is_capped_at_the_workload_ceiling_and_says_so():
    dep = make_deployment()
    benchmark(dep, max_load_rps=0.01)
    now = time.time()
    record(route_lines(dep, "v1-a", [10.0] * 120, end=now - 1), now)  # 2 req/s

    rec = autoscaling.recommend_replicas(dep, now=now)

    assert rec.recommended == autoscaling.MAX_REPLICAS
    assert any("needs 286 replicas; capped at 100" in note for note in rec.notes)


def test_a_p99_over_the_slo_and_a_looser_benchmark_slo_are_noted():
    dep = make_deployment(slo_p99_ms=50)
    job = benchmark(dep, max_load_rps=100.0, p99_ms=200.0)
    now = time.time()
    record(route_lines(dep, "v1-a", [80.0] * 60, end=now - 1), now)

    rec = autoscaling.recommend_replicas(dep, now=now)

    assert rec.state == autoscaling.OK
    notes = " | ".join(rec.notes)
    assert "p99 is 80.0 ms now, over the SLO of 50 ms" in notes
    assert f"benchmark #{job.pk} measured the capacity within a p99 of 200 ms" in notes
    assert "overstated" in notes


def test_without_a_benchmark_it_says_to_run_one():
    dep = make_deployment()
    benchmark(dep, state=BenchmarkJob.State.FAILED)  # a failed one measured nothing
    now = time.time()
    record(route_lines(dep, "v1-a", [10.0] * 60, end=now - 1), now)

    rec = autoscaling.recommend_replicas(dep, now=now)

    assert rec.state == autoscaling.NO_BENCHMARK and rec.recommended is None
    assert rec.signal.rps == pytest.approx(1.0)
    assert "No benchmark of v1 yet" in rec.explanation
    assert "Benchmarks panel" in rec.explanation


def test_without_traffic_it_says_what_to_check():
    dep = make_deployment()
    benchmark(dep, max_load_rps=5.0)

    rec = autoscaling.recommend_replicas(dep)

    assert rec.state == autoscaling.NO_TRAFFIC and rec.recommended is None
    assert rec.capacity_rps == 5.0
    assert "No traffic measured in the last 60 s" in rec.explanation
    assert "scraper" in rec.explanation


def test_a_benchmark_that_found_no_load_within_the_slo_has_no_capacity():
    dep = make_deployment()
    benchmark(dep, max_load_rps=None)
    now = time.time()
    record(route_lines(dep, "v1-a", [10.0] * 60, end=now - 1), now)

    rec = autoscaling.recommend_replicas(dep, now=now)

    assert rec.state == autoscaling.NO_CAPACITY and rec.recommended is None
    assert "found no load within its SLO" in rec.explanation


def test_the_newest_succeeded_benchmark_is_the_capacity():
    dep = make_deployment()
    benchmark(dep, max_load_rps=1.0, finished_ago_s=3600)
    newest = benchmark(dep, max_load_rps=2.0, finished_ago_s=60)
    now = time.time()
    record(route_lines(dep, "v1-a", [10.0] * 150, end=now - 1), now)

    rec = autoscaling.recommend_replicas(dep, now=now)

    assert rec.benchmark == newest and rec.recommended == 2  # 2.5 / (2 x 0.7) = 1.79


def test_the_version_carrying_most_of_the_route_is_the_one_measured():
    dep = make_deployment()
    server = dep.servers.get()
    v2 = ModelVersionFactory(model=dep.model, version=2)
    ModelLoad.objects.create(tenant=dep.tenant, deployment=dep, server=server, version=v2,
                             state=ModelLoad.State.READY, requested_by_label="seed")
    benchmark(dep, 1, max_load_rps=1.0)
    v2_job = benchmark(dep, 2, max_load_rps=10.0)
    Route.objects.create(
        deployment=dep, name=f"dep-{dep.pk}", state=Route.State.IN_FORCE,
        spec={"variants": [{"name": "v1-a", "weight": 10, "upstream": "http://a"},
                           {"name": "v2-a", "weight": 90, "upstream": "http://a"}]},
        variants={"v1-a": {"version": 1}, "v2-a": {"version": 2}})

    rec = autoscaling.recommend_replicas(dep)

    assert rec.version == v2 and rec.benchmark == v2_job
    assert "the route sends it 90% of the traffic" in rec.explanation


def test_a_deployment_serving_nothing_has_no_version_to_measure():
    dep = make_deployment()
    ModelLoad.objects.filter(deployment=dep).update(state=ModelLoad.State.UNLOADED)

    rec = autoscaling.recommend_replicas(dep)

    assert rec.state == autoscaling.NO_VERSION and rec.version is None
    assert "serves no version yet" in rec.explanation


def workload(dep: Any, name: str, replicas: int, *, state: str = ServerWorkload.State.READY,
             namespace: str = "serving") -> ServerWorkload:
    return ServerWorkload.objects.create(
        tenant=dep.tenant, deployment=dep, cluster=dep.cluster,
        version=dep.model.versions.get(version=1), name=name, namespace=namespace,
        runtime=InferenceServer.Runtime.TRITON, image="nvcr.io/nvidia/tritonserver:24.08-py3",
        replicas=replicas, state=state, requested_by_label="seed")


def test_kubernetes_workloads_are_the_current_replicas_and_name_the_deployment():
    dep = make_deployment()
    benchmark(dep, max_load_rps=1.0)
    workload(dep, "triton-fraud-v1", 3)
    workload(dep, "triton-fraud-old", 5, state=ServerWorkload.State.DELETED)
    now = time.time()
    record(route_lines(dep, "v1-a", [10.0] * 150, end=now - 1), now)

    one = autoscaling.recommend_replicas(dep, now=now)
    workload(dep, "triton-fraud-v2", 2)
    two = autoscaling.recommend_replicas(dep, now=now)

    assert (one.current, one.replicas_from) == (3, "workloads")
    assert (one.namespace, one.kube_deployment) == ("serving", "triton-fraud-v1")
    assert one.utilization == pytest.approx(2.5 / 3)
    assert "The 3 replicas now run at 83% of their measured capacity" in one.explanation
    # Two Kubernetes Deployments: no single object to scale.
    assert (two.current, two.namespace, two.kube_deployment) == (5, "serving", "")


def test_archived_deployments_are_left_out_of_the_recommendations():
    kept = make_deployment(name="kept")
    gone = make_deployment(name="gone", tenant=kept.tenant)
    gone.archived_at = timezone.now()
    gone.save(update_fields=["archived_at"])

    assert [r.deployment for r in autoscaling.recommendations()] == [kept]
