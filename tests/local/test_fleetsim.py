"""local.fleetsim: the fleet simulator serves what Switchyard's probes and scrapers read, its
counters move as configured, its slow, hung and dead servers behave so, and its ``/metrics``
text is the real servers' text (against the stored captures of the real Triton and vLLM, and
live against the session's servers: markers ``triton`` and ``vllm``)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.core.management import CommandError, call_command
from prometheus_client.parser import text_string_to_metric_families

from fleet.adapters import triton as triton_probe
from fleet.adapters import vllm as vllm_probe
from fleet.adapters.base import AdapterError
from fleet.adapters.metrics.parsing import TRITON_SUMMARY_QUANTILES, parse_triton, parse_vllm
from fleet.adapters.metrics.parsing import VLLM_HISTOGRAMS as PARSED_VLLM_HISTOGRAMS
from fleet.adapters.metrics.scraping import fetch_text, scrape
from fleet.adapters.metrics.values import Counters
from local.fleetsim import Fleet, FleetConfig, FleetThread
from local.fleetsim_metrics import Traffic, mean
from local.triton import TritonProcess
from local.vllm import VLLMProcess

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "tests" / "fixtures" / "metrics"
# The families fleet.adapters.metrics.parsing reads.
TRITON_PARSED = {
    "nv_inference_request_success", "nv_inference_request_failure",
    "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
    "nv_inference_request_summary_us",
}
VLLM_PARSED = {
    "vllm:request_success", "vllm:admission_rejections", "vllm:prompt_tokens",
    "vllm:generation_tokens", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc", *(family for family, _ in PARSED_VLLM_HISTOGRAMS),
}
INFER_BODY = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                          "data": [0.1, 0.2, 0.3, 0.4]}]}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """Two Triton servers (two models of two versions) and two vLLM servers, 200 req/s on
    each model version, 5% failing, 40 ms median latency."""
    traffic = Traffic(rps=200, error_rate=0.05, latency_ms=40, spread=0.4, ttft_ms=30)
    config = FleetConfig(triton=2, vllm=2, models=2, versions=2, traffic=traffic, seconds=120)
    with FleetThread(config) as running:
        yield running


def control(fleet: Fleet, which: int | str, body: dict) -> httpx.Response:
    return httpx.post(f"{fleet.control_url}/control/servers/{which}", json=body, timeout=5)


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Family name -> (type, label names of its samples, ``le`` and ``quantile`` aside)."""
    out = {}
    for family in text_string_to_metric_families(text):
        labels = {name for s in family.samples for name in s.labels} - {"le", "quantile"}
        out[family.name] = (family.type, frozenset(labels))
    return out


def assert_same_families(simulated: str, real: str, parsed: set[str]) -> None:
    """Every family the simulator emits is on the real page with the same type and labels,
    and every family Switchyard reads that the real page has, the simulator has too."""
    ours, theirs = families(simulated), families(real)
    assert {name: ours[name] for name in ours} == {name: theirs.get(name) for name in ours}
    assert {name for name in theirs if name in parsed} <= set(ours)


def shape(counters: Counters) -> dict:
    """What a parsed series holds, values aside."""
    return {
        "engine": counters.engine,
        "failure_reasons": sorted(counters.failure_reasons),
        "histograms": {k: [le for le, _ in h.buckets] for k, h in counters.histograms.items()},
        "quantiles": sorted(counters.quantiles_us),
        "gauges": sorted(counters.gauges),
    }


def active(series: dict) -> Counters:
    """The parsed series with the most requests."""
    return max(series.values(), key=lambda c: c.success)


def sim_text(kind: str) -> str:
    """A simulated ``kind`` server's page, some requests failed (a 10% error rate)."""
    config = FleetConfig(triton=int(kind == "triton"), vllm=int(kind == "vllm"),
                         traffic=Traffic(rps=100, error_rate=0.1), seconds=30)
    with FleetThread(config) as running:
        time.sleep(0.3)
        return fetch_text(kind, running.servers[0].metrics_url)


# -- what Switchyard's probes and scrapers read --------------------------------------------------
def test_switchyards_probes_find_the_servers_ready_with_their_models(fleet: Fleet):
    triton, vllm = fleet.servers[0], fleet.servers[2]
    probe = triton_probe.probe(triton.http_url, timeout=2)
    assert (probe.ready, probe.live, probe.version, probe.error) == (True, True, "2.51.0", "")
    assert sorted((m.name, m.version, m.state) for m in probe.models) == [
        ("model-0", "1", "READY"), ("model-0", "2", "READY"),
        ("model-1", "1", "READY"), ("model-1", "2", "READY")]
    probe = vllm_probe.probe(vllm.http_url, timeout=2)
    assert (probe.ready, probe.version, probe.error) == (True, "0.32.0", "")
    assert sorted(m.name for m in probe.models) == ["model-0", "model-1"]
    meta = triton_probe.model_metadata(triton.http_url, "model-1", 2)
    assert meta["name"] == "model-1"


def test_triton_counters_move_at_the_configured_rate_and_latency(fleet: Fleet):
    url = fleet.servers[0].metrics_url
    first = scrape("triton", url, timeout=2)
    time.sleep(1.0)
    second = scrape("triton", url, timeout=2)
    dt = second.taken_at - first.taken_at
    assert set(second.series) == {(f"model-{m}", str(v)) for m in (0, 1) for v in (1, 2)}
    a, b = first.series[("model-0", "1")], second.series[("model-0", "1")]
    assert (b.success - a.success) / dt == pytest.approx(200 * 0.95, rel=0.1)
    assert (b.failure - a.failure) / dt == pytest.approx(200 * 0.05, rel=0.25)
    assert set(b.failure_reasons) == {"BACKEND", "CANCELED", "OTHER", "REJECTED"}
    mean_us = (b.request_us - a.request_us) / (b.success - a.success)
    assert mean_us == pytest.approx(mean(40_000, 0.4), rel=0.02)
    assert sorted(b.quantiles_us) == list(TRITON_SUMMARY_QUANTILES)
    assert b.quantiles_us[0.5] == pytest.approx(40_000, rel=0.01)
    assert b.quantiles_us[0.99] > b.quantiles_us[0.9] > b.quantiles_us[0.5]


def test_vllm_histograms_and_gauges_move_at_the_configured_rate(fleet: Fleet):
    url = fleet.servers[2].metrics_url
    first = scrape("vllm", url, timeout=2)
    time.sleep(1.0)
    second = scrape("vllm", url, timeout=2)
    dt = second.taken_at - first.taken_at
    a, b = first.series[("model-0", "")], second.series[("model-0", "")]
    assert (b.success - a.success) / dt == pytest.approx(190, rel=0.1)
    assert (b.failure - a.failure) / dt == pytest.approx(10, rel=0.25)
    assert set(b.histograms) == {"e2e", "ttft", "itl", "tpot", "queue", "prefill", "decode",
                                 "inference"}
    e2e_a, e2e_b = a.histograms["e2e"], b.histograms["e2e"]
    assert (e2e_b.sum - e2e_a.sum) / (e2e_b.count - e2e_a.count) == pytest.approx(
        mean(0.040, 0.4), rel=0.02)
    ttft = b.histograms["ttft"]
    below_median = dict(ttft.buckets)[0.02] / ttft.count  # 20 ms, under the 30 ms median
    assert 0.05 < below_median < 0.3
    assert b.histograms["itl"].count == pytest.approx(63 * b.histograms["e2e"].count, rel=0.01)
    assert b.gauges["running"] == round(200 * 0.040) and b.gauges["waiting"] == 0
    assert b.generation_tokens == pytest.approx(64 * b.success, rel=0.01)


def test_counters_never_go_down_when_traffic_changes(fleet: Fleet):
    url = fleet.servers[1].metrics_url
    before = scrape("triton", url, timeout=2).series[("model-0", "1")]
    assert control(fleet, 1, {"traffic": {"rps": 0}}).status_code == 200
    time.sleep(0.3)
    still = scrape("triton", url, timeout=2).series[("model-0", "1")]
    time.sleep(0.3)
    after = scrape("triton", url, timeout=2).series[("model-0", "1")]
    assert before.success <= still.success == after.success
    assert after.quantiles_us == {}  # Triton's summaries read Nan over an empty window
    assert control(fleet, 1, {"traffic": {"rps": 200}, "models": ["model-0:1", "new:1"]}
                   ).status_code == 200
    series = scrape("triton", url, timeout=2).series
    assert set(series) == {("model-0", "1"), ("new", "1")}
    assert series[("model-0", "1")].success >= after.success


# -- slow, hung, dead ---------------------------------------------------------------------------
def test_hung_dead_and_slow_servers_behave_as_told(fleet: Fleet):
    server = fleet.servers[3]
    url = server.metrics_url
    try:
        assert control(fleet, 3, {"state": "hung"}).json()[0]["state"] == "hung"
        started = time.monotonic()
        with pytest.raises(AdapterError, match="timed out"):
            scrape("vllm", url, timeout=0.5)
        assert time.monotonic() - started < 1.5
        assert not vllm_probe.probe(server.http_url, timeout=0.5).ready

        control(fleet, 3, {"state": "dead"})
        with pytest.raises(AdapterError, match="refused"):
            scrape("vllm", url, timeout=0.5)

        control(fleet, 3, {"state": "slow", "delay_s": 0.8})
        with pytest.raises(AdapterError, match="timed out"):
            scrape("vllm", url, timeout=0.3)
        started = time.monotonic()
        assert scrape("vllm", url, timeout=3).series
        assert 0.7 < time.monotonic() - started < 2.5

        control(fleet, 3, {"state": "unready"})
        probe = vllm_probe.probe(server.http_url, timeout=2)
        assert (probe.live, probe.ready) == (True, False)
    finally:
        control(fleet, 3, {"state": "ok"})
    assert server.port == int(url.rsplit(":", 1)[1].split("/")[0])  # back on its own port
    assert scrape("vllm", url, timeout=2).series


def test_the_control_api_refuses_what_it_cannot_do(fleet: Fleet):
    assert control(fleet, 99, {"state": "hung"}).status_code == 404
    answer = control(fleet, 0, {"state": "asleep"})
    assert (answer.status_code, "state must be one of" in answer.json()["error"]) == (400, True)
    assert control(fleet, 0, {"traffic": {"rps": -1}}).status_code == 400
    assert control(fleet, 0, {"colour": "red"}).status_code == 400
    assert control(fleet, 0, {"traffic": {"rps": None}, "delay_s": None}).status_code == 400
    assert control(fleet, 0, {"models": "m:1"}).status_code == 400
    listed = httpx.get(f"{fleet.control_url}/control/servers", timeout=5).json()
    assert [s["kind"] for s in listed["servers"]] == ["triton", "triton", "vllm", "vllm"]


def test_a_fleet_starts_in_the_states_it_is_given_and_stops_by_itself():
    """GIVEN ``--dead 1 --hung 2`` and ``--seconds 2`` WHEN run as a process THEN it prints
    where every server is, server 1 refuses connections, server 2 never answers, and the
    process ends by itself."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "local.fleetsim", "--triton", "2", "--vllm", "1", "--dead", "1",
         "--hung", "2", "--seconds", "2", "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        described = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        servers = described["servers"]
        assert [s["state"] for s in servers] == ["ok", "dead", "hung"]
        assert scrape("triton", servers[0]["metrics_url"], timeout=2).series
        with pytest.raises(AdapterError, match="refused"):
            scrape("triton", servers[1]["metrics_url"], timeout=0.5)
        with pytest.raises(AdapterError, match="timed out"):
            scrape("vllm", servers[2]["metrics_url"], timeout=0.5)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_switchyards_health_round_sees_each_simulated_server_as_it_is(db):
    """GIVEN 40 simulated servers registered as Switchyard's (two hung, one dead, one
    unready, one slow) WHEN one health round probes them all with a 1 s timeout THEN each is
    recorded as it is, and the hung ones cost one timeout in parallel, not one each."""
    from fleet.inventory import health
    from fleet.models import InferenceServer
    from tests.factories import ClusterFactory, InferenceServerFactory

    states = {0: "hung", 1: "hung", 2: "dead", 3: "unready", 4: "slow"}
    config = FleetConfig(triton=30, vllm=10, models=2, states=states, delay_s=2, seconds=60)
    with FleetThread(config) as running:
        cluster = ClusterFactory()
        for server in running.servers:
            InferenceServerFactory(cluster=cluster, name=f"sim-{server.index}",
                                   runtime=server.kind, http_url=server.http_url,
                                   metrics_url=server.metrics_url)
        started = time.monotonic()
        counts = health.check_all(timeout=1.0)
        took = time.monotonic() - started
    assert counts == {"healthy": 35, "unreachable": 4, "unhealthy": 1}
    assert took < 3.0
    recorded = dict(InferenceServer.objects.values_list("name", "health"))
    assert [recorded[f"sim-{i}"] for i in range(6)] == [
        "unreachable", "unreachable", "unreachable", "unhealthy", "unreachable", "healthy"]
    reported = InferenceServer.objects.get(name="sim-35").reported_models
    assert sorted(m["name"] for m in reported) == ["model-0", "model-1"]


def test_the_command_prints_where_each_server_is_and_ends_by_itself():
    out = io.StringIO()
    started = time.monotonic()
    call_command("fleet_sim", "--triton", "2", "--vllm", "1", "--slow", "0", "--seconds", "0.5",
                 "--json", stdout=out)
    assert time.monotonic() - started < 5
    described = json.loads(out.getvalue())
    assert [(s["kind"], s["state"]) for s in described["servers"]] == [
        ("triton", "slow"), ("triton", "ok"), ("vllm", "ok")]
    assert all(s["metrics_url"] == s["http_url"] + "/metrics" for s in described["servers"])
    with pytest.raises(CommandError):
        call_command("fleet_sim", "--triton", "0", "--seconds", "1", stdout=io.StringIO(),
                     stderr=io.StringIO())


# -- the real servers' text ---------------------------------------------------------------------
def test_triton_text_matches_the_captured_real_triton():
    real = (CAPTURES / "triton_metrics.txt").read_text()
    ours = sim_text("triton")
    assert_same_families(ours, real, TRITON_PARSED)
    assert shape(active(parse_triton(ours))) == shape(active(parse_triton(real)))


def test_vllm_text_matches_the_captured_real_vllm():
    real = (CAPTURES / "vllm_metrics.txt").read_text()
    ours = sim_text("vllm")
    assert_same_families(ours, real, VLLM_PARSED)
    assert shape(active(parse_vllm(ours))) == shape(active(parse_vllm(real)))


@pytest.mark.triton
def test_triton_text_matches_the_running_real_triton(local_triton: TritonProcess):
    with httpx.Client(base_url=local_triton.http_url, timeout=30) as client:
        for _ in range(5):
            client.post("/v2/models/fraud-scorer/versions/1/infer", json=INFER_BODY)
    real = httpx.get(local_triton.metrics_url, timeout=10).text
    ours = sim_text("triton")
    assert_same_families(ours, real, TRITON_PARSED)
    # The version just sent traffic: its summaries cover the last minute (a version the
    # session served more, but longer ago, reads NaN there).
    assert shape(active(parse_triton(ours))) == shape(parse_triton(real)[("fraud-scorer", "1")])


@pytest.mark.vllm
def test_vllm_text_matches_the_running_real_vllm(local_vllm: VLLMProcess):
    real = httpx.get(f"{local_vllm.http_url}/metrics", timeout=10).text
    ours = sim_text("vllm")
    assert_same_families(ours, real, VLLM_PARSED)
    assert shape(active(parse_vllm(ours))) == shape(active(parse_vllm(real)))


def test_it_answers_a_hundred_servers_each_within_a_scrape_budget():
    """One process carries a fleet: 100 servers are each scraped in turn well within 1 s."""
    with FleetThread(FleetConfig(triton=100, models=2, seconds=60)) as fl, httpx.Client() as c:
        started = time.monotonic()
        for server in fl.servers:
            assert c.get(server.metrics_url, timeout=2).status_code == 200
        assert time.monotonic() - started < 5
