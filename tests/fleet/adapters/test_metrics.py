"""fleet.adapters.metrics: parsers, windows and quantiles, scraping, PrometheusSource.

The parser tests read REAL ``/metrics`` pages captured from the local Triton 2.51 and vLLM
0.32 servers (``tests/fixtures/metrics``, re-created by ``capture.py`` there; the exact
numbers below are read off those files). The live tests re-check against the session's
servers (markers ``triton`` and ``vllm``) and a real Prometheus (Debian's package; skipped
when not installed) scraping the session Triton.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet.adapters.base import AdapterError
from fleet.adapters.metrics import parsing
from fleet.adapters.metrics.parsing import TRITON_SUMMARY_QUANTILES, parse_triton, parse_vllm
from fleet.adapters.metrics.prometheus import PrometheusSource
from fleet.adapters.metrics.rates import histogram_quantile, nearest_quantile, window, windows
from fleet.adapters.metrics.scraping import scrape
from fleet.adapters.metrics.values import (
    Counters,
    Histogram,
    RequestLogSource,
    Snapshot,
    dump_series,
    load_series,
)
from local.fleetsim_metrics import Series, Traffic, triton_page, vllm_page
from local.triton import TritonProcess
from local.vllm import VLLMProcess
from tests.fixtures.http_server import QuietHTTPServer

if TYPE_CHECKING:  # imported by pytest as a plugin (below): not imported here first
    from tests.fixtures.prometheus import PrometheusProcess


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "metrics"
INFER_BODY = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                          "data": [0.1, 0.2, 0.3, 0.4]}]}
FS1, FS2 = ("fraud-scorer", "1"), ("fraud-scorer", "2")
COPY1, COPY2 = ("fraud-scorer-reload", "1"), ("fraud-scorer-reload", "2")
SMOL = ("smollm2", "")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture(scope="module")
def triton_first() -> dict[tuple[str, str], Counters]:
    return parse_triton(fixture_text("triton_metrics.txt"))


@pytest.fixture(scope="module")
def triton_reloaded() -> dict[tuple[str, str], Counters]:
    return parse_triton(fixture_text("triton_metrics_after_reload.txt"))


@pytest.fixture(scope="module")
def vllm_counters() -> Counters:
    return parse_vllm(fixture_text("vllm_metrics.txt"))[SMOL]


# --------------------------------------------------------------------------------------------
# Parsers against the stored captures
# --------------------------------------------------------------------------------------------


def test_parse_triton_capture(triton_first: dict[tuple[str, str], Counters]) -> None:
    assert set(triton_first) == {FS1, FS2, ("sentiment", "1"), COPY1, COPY2}
    fs1 = triton_first[FS1]
    assert fs1.engine == "triton"
    assert fs1.success == 40  # the 3 requests with a wrong input name are counted nowhere
    assert fs1.failure == 0
    assert fs1.request_us == 240191
    assert fs1.queue_us == 5046
    assert fs1.compute_us == 928 + 211696 + 22342
    assert fs1.timed == 40
    assert fs1.quantiles_us == {0.5: 4587, 0.9: 7102, 0.95: 7461, 0.99: 7671, 0.999: 7671}
    assert fs1.gauges == {"pending": 0.0}
    assert fs1.histograms == {}
    assert (fs1.prompt_tokens, fs1.generation_tokens) == (0, 0)
    assert set(fs1.failure_reasons) == {"BACKEND", "CANCELED", "OTHER", "REJECTED"}

    assert triton_first[FS2].success == 30
    assert triton_first[FS2].request_us == 460411
    assert triton_first[FS2].quantiles_us[0.5] == 12780  # v2 sleeps 12 ms, v1 4 ms
    assert triton_first[("sentiment", "1")].success == 5
    assert triton_first[COPY1].success == 20


def test_parse_triton_failures_and_nan_quantiles(
    triton_first: dict[tuple[str, str], Counters],
) -> None:
    failing = triton_first[COPY2]  # its execute() raises: reason BACKEND
    assert (failing.success, failing.failure) == (0, 4)
    assert failing.failure_reasons == {"BACKEND": 4, "CANCELED": 0, "OTHER": 0, "REJECTED": 0}
    assert failing.request_us == 0  # failed requests add no duration
    assert failing.quantiles_us == {}  # its summary reads "Nan": dropped


def test_parse_triton_after_reload(triton_reloaded: dict[tuple[str, str], Counters]) -> None:
    assert triton_reloaded[FS1].success == 50
    assert triton_reloaded[FS1].request_us == 286217
    # unload + load of the copy: success and durations restarted at 0 ...
    assert triton_reloaded[COPY1].success == 6
    assert triton_reloaded[COPY1].request_us == 43623
    # ... but Triton 2.51 kept the failure series: 4 before + 2 after
    assert triton_reloaded[COPY2].failure == 6


def test_parse_triton_leaves_out_unloaded_versions() -> None:
    # After an unload only nv_inference_request_failure remains for a version.
    text = "\n".join(
        line for line in fixture_text("triton_metrics.txt").splitlines()
        if 'model="fraud-scorer-reload"' not in line or "nv_inference_request_failure" in line
    )
    parsed = parse_triton(text)
    assert COPY1 not in parsed and COPY2 not in parsed
    assert FS1 in parsed


def test_parse_vllm_capture(vllm_counters: Counters) -> None:
    c = vllm_counters
    assert c.engine == "vllm"
    assert c.success == 5  # 4 completions ("length") + 1 streamed chat ("stop")
    assert c.failure == 0
    assert c.prompt_tokens == 56
    assert c.generation_tokens == 72
    assert c.timed == 5
    assert c.request_us == pytest.approx(2.602545738220215e6)
    assert c.queue_us == pytest.approx(0.00011026299944205675e6)
    assert c.compute_us > 0
    assert c.gauges == {"running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0}
    assert set(c.failure_reasons) == {"abort", "error", "rejected:max_num_queued_reqs",
                                      "rejected:max_num_queued_tokens"}
    assert {"e2e", "ttft", "itl", "tpot", "queue", "prefill", "decode"} <= set(c.histograms)
    e2e = c.histograms["e2e"]
    assert (e2e.count, e2e.sum) == (5, pytest.approx(2.602545738220215))
    assert e2e.buckets[:3] == ((0.3, 0), (0.5, 1), (0.8, 5))
    assert e2e.buckets[-1] == (math.inf, 5)
    ttft = c.histograms["ttft"]
    assert ttft.buckets[0] == (0.001, 0) and ttft.buckets[-2] == (2560.0, 5)
    assert c.histograms["itl"].count == 67  # 72 tokens - 5 first tokens
    assert c.quantiles_us == {}


def test_parse_vllm_accepts_old_names(vllm_counters: Counters) -> None:
    old = (fixture_text("vllm_metrics.txt")
           .replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
           .replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"))
    assert "vllm:inter_token_latency_seconds" not in old
    parsed = parse_vllm(old)[SMOL]
    assert parsed.histograms["itl"] == vllm_counters.histograms["itl"]
    assert parsed.gauges["kv_cache_usage"] == 0.0


def test_parse_vllm_adds_up_engines(vllm_counters: Counters) -> None:
    lines = []
    for line in fixture_text("vllm_metrics.txt").splitlines():
        lines.append(line)
        if not line.startswith("#") and 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    doubled = parse_vllm("\n".join(lines) + "\n")[SMOL]
    assert doubled.success == 2 * vllm_counters.success
    assert doubled.generation_tokens == 2 * vllm_counters.generation_tokens
    assert doubled.histograms["e2e"].count == 10
    assert doubled.histograms["e2e"].buckets[2] == (0.8, 10)


def test_parse_vllm_failed_finish_reasons() -> None:
    text = (
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0\n'
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 2.0\n'
        'vllm:request_success_total{engine="0",finished_reason="error",model_name="m"} 1.0\n'
    )
    c = parse_vllm(text)[("m", "")]
    assert (c.success, c.failure) == (7, 3)
    assert c.failure_reasons == {"abort": 2, "error": 1}


def test_parsers_reject_non_prometheus_text() -> None:
    with pytest.raises(ValueError):
        parse_triton("<html>not metrics</html>\n")
    with pytest.raises(ValueError):
        parse_vllm('vllm:request_success_total{model_name="m",finished_reason="stop"}\n')


def reference_samples(text: str, names) -> Iterator[tuple[str, dict[str, str], float]]:
    """What prometheus_client's own parser reads of ``text``, in the shape of
    parsing.samples."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                yield sample.name, dict(sample.labels), float(sample.value)


HOSTILE_PAGE = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="a\\"b}{",version="1"} 5
nv_inference_request_success{model="line\\nbreak",version="2"} 7 1700000000000
nv_inference_request_success{ model = "spaced" , version="3" } 2
nv_inference_request_failure{model="a\\"b}{",reason="BACKEND",version="1"} 1
nv_inference_request_summary_us{model="spaced",version="3",quantile="0.99"} +Inf
nv_inference_request_summary_us{model="spaced",version="3",quantile="0.5"} 1.5e3
nv_inference_request_duration_us{model="spaced",version="3"} NaN
"""


@pytest.mark.parametrize(("kind", "page"), [
    ("triton", "triton_metrics.txt"), ("triton", "triton_metrics_after_reload.txt"),
    ("vllm", "vllm_metrics.txt"), ("triton", HOSTILE_PAGE), ("triton", "sim:triton"),
    ("vllm", "sim:vllm"),
])
def test_the_line_reader_reads_what_prometheus_clients_parser_reads(kind, page, monkeypatch):
    """The scrape's single-pass reader gives the same Counters as prometheus_client's parser
    on the real servers' captured pages, the fleet simulator's and escaped labels."""
    if page.startswith("sim:"):
        series = [Series(kind, "model-0", "1" if kind == "triton" else "", Traffic(rps=25.0))]
        text = (triton_page if kind == "triton" else vllm_page)(series, now=1234.5)
    else:
        text = page if "\n" in page else fixture_text(page)
    fast = parsing.parse(kind, text)
    assert fast
    monkeypatch.setattr(parsing, "samples", reference_samples)
    assert repr(parsing.parse(kind, text)) == repr(fast)  # repr: NaN equals NaN


# --------------------------------------------------------------------------------------------
# Windows, resets, quantiles
# --------------------------------------------------------------------------------------------


def test_window_between_the_two_triton_captures(
    triton_first: dict[tuple[str, str], Counters],
    triton_reloaded: dict[tuple[str, str], Counters],
) -> None:
    w = window(triton_first[FS1], triton_reloaded[FS1], 5.0)
    assert not w.reset
    assert (w.requests, w.failures, w.rps, w.error_rate) == (10, 0, 2.0, 0.0)
    assert w.avg_ms == pytest.approx((286217 - 240191) / 10 / 1000)
    # Triton: the current summary's nearest quantiles (0.5, 0.95, 0.99 all exist)
    assert (w.p50_ms, w.p95_ms, w.p99_ms) == (4.562, 7.323, 7.671)
    assert w.quantile_source == {"p50": 0.5, "p95": 0.95, "p99": 0.99}
    assert w.quantiles_available == TRITON_SUMMARY_QUANTILES
    assert w.ttft_p50_ms is None and w.itl_p99_ms is None and w.tokens_per_s is None
    assert (w.running, w.waiting) == (None, 0.0)


def test_window_after_unload_and_load_is_a_reset(
    triton_first: dict[tuple[str, str], Counters],
    triton_reloaded: dict[tuple[str, str], Counters],
) -> None:
    w = window(triton_first[COPY1], triton_reloaded[COPY1], 10.0)
    assert w.reset
    assert w.requests == 6  # counted from zero, not 6 - 20
    assert w.avg_ms == pytest.approx(43623 / 6 / 1000)
    assert w.p50_ms == 3.536

    # The failing version: success stayed 0, failures went 4 -> 6 across the reload
    # (Triton keeps failure series): 2 new failures, not 6.
    w2 = window(triton_first[COPY2], triton_reloaded[COPY2], 10.0)
    assert (w2.requests, w2.failures, w2.error_rate) == (2, 2, 1.0)
    assert w2.p50_ms is None and w2.avg_ms is None


def test_windows_over_snapshots(
    triton_first: dict[tuple[str, str], Counters],
    triton_reloaded: dict[tuple[str, str], Counters],
) -> None:
    result = windows(Snapshot(100.0, triton_first), Snapshot(104.0, triton_reloaded))
    assert result[FS1].seconds == 4.0 and result[FS1].rps == 2.5
    assert result[FS2].requests == 0 and result[FS2].p50_ms is None  # no traffic: no latency
    assert result[COPY1].reset
    first = windows(None, Snapshot(1.0, triton_first))
    assert all(w.reset for w in first.values()) and first[FS1].requests == 40


def test_window_reset_on_synthetic_counters() -> None:
    prev = Counters(success=100, failure=10, request_us=1_000_000, timed=100)
    cur = Counters(success=30, failure=3, request_us=150_000, timed=30)
    w = window(prev, cur, 10.0)
    assert w.reset
    assert (w.requests, w.failures) == (33, 3)
    assert w.error_rate == pytest.approx(3 / 33)
    assert w.avg_ms == pytest.approx(5.0)
    assert w.rps == pytest.approx(3.3)

    grown = window(prev, Counters(success=150, failure=15, request_us=1_500_000, timed=150), 5.0)
    assert not grown.reset
    assert (grown.requests, grown.failures, grown.rps) == (55, 5, 11.0)
    assert grown.avg_ms == pytest.approx(10.0)

    # Any single cumulative figure going down is a restart.
    assert window(prev, Counters(success=200, failure=20, request_us=10, timed=200), 1.0).reset
    # No previous scrape: same as a reset; no time elapsed: no rates.
    first = window(None, cur, 0.0)
    assert first.reset and first.requests == 33 and first.rps == 0.0
    # No requests: no error rate, no latency.
    idle = window(cur, cur, 10.0)
    assert (idle.requests, idle.error_rate, idle.avg_ms) == (0, 0.0, None)


def test_window_triton_nearest_quantiles() -> None:
    prev = Counters(engine="triton", success=1, timed=1)
    cur = Counters(engine="triton", success=5, timed=5,
                   quantiles_us={0.5: 4000.0, 0.9: 5000.0, 0.99: 6000.0})
    w = window(prev, cur, 1.0)
    assert w.quantile_source == {"p50": 0.5, "p95": 0.99, "p99": 0.99}  # 0.95 not exposed
    assert (w.p50_ms, w.p95_ms, w.p99_ms) == (4.0, 6.0, 6.0)
    assert w.quantiles_available == (0.5, 0.9, 0.99)
    assert nearest_quantile(0.95, [0.5, 0.9, 0.99]) == 0.99
    assert nearest_quantile(0.7, [0.5, 0.9]) == 0.9  # tie: the higher one
    assert nearest_quantile(0.5, []) is None


def test_window_vllm_from_the_capture(vllm_counters: Counters) -> None:
    w = window(None, vllm_counters, 10.0)
    assert w.reset and w.requests == 5
    # e2e buckets: le 0.3 -> 0, 0.5 -> 1, 0.8 -> 5. Rank 2.5 falls in (0.5, 0.8]:
    # 0.5 + 0.3 * (2.5 - 1) / 4 = 0.6125 s.
    assert w.p50_ms == pytest.approx(612.5)
    assert w.p95_ms == pytest.approx(781.25)
    assert w.p99_ms == pytest.approx(796.25)
    # ttft buckets: 0.04 -> 2, 0.06 -> 3, 0.08 -> 3, 0.1 -> 5
    assert w.ttft_p50_ms == pytest.approx(50.0)
    assert w.ttft_p99_ms == pytest.approx(99.5)
    # itl: all 67 in (0.025, 0.05]
    assert w.itl_p50_ms == pytest.approx(37.5)
    assert w.itl_p99_ms == pytest.approx(25 + 25 * (0.99 * 67) / 67)
    assert w.tokens_per_s == pytest.approx(7.2)
    assert w.avg_ms == pytest.approx(2602.545738220215 / 5)
    assert (w.running, w.waiting) == (0.0, 0.0)
    assert w.quantile_source == {}


def test_window_vllm_uses_bucket_deltas(vllm_counters: Counters) -> None:
    e2e = vllm_counters.histograms["e2e"]
    # An earlier scrape that had seen only the fastest request (in (0.3, 0.5]).
    earlier = Histogram(
        buckets=tuple((le, min(count, 1.0)) for le, count in e2e.buckets), sum=0.45, count=1
    )
    prev = Counters(engine="vllm", success=1, timed=1, request_us=0.45e6,
                    generation_tokens=16, histograms={"e2e": earlier})
    w = window(prev, vllm_counters, 4.0)
    assert not w.reset
    assert w.requests == 4
    # the 4 later requests all lie in (0.5, 0.8]: p50 = 0.5 + 0.3 * 2 / 4
    assert w.p50_ms == pytest.approx(650.0)
    assert w.tokens_per_s == pytest.approx((72 - 16) / 4)
    assert w.avg_ms == pytest.approx((2.602545738220215 - 0.45) * 1000 / 4)


def test_histogram_quantile_known_buckets() -> None:
    buckets = [(0.1, 10), (0.2, 30), (0.5, 90), (math.inf, 100)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.3)  # 0.2 + 0.3 * 20/60
    assert histogram_quantile(0.05, buckets) == pytest.approx(0.05)  # 0 + 0.1 * 5/10
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.9, buckets) == pytest.approx(0.5)
    assert histogram_quantile(0.95, buckets) == 0.5  # in +Inf: the highest finite bound
    assert histogram_quantile(0.5, list(reversed(buckets))) == pytest.approx(0.3)  # any order
    assert histogram_quantile(0.5, [(1.0, 0), (math.inf, 0)]) is None  # no observations
    assert histogram_quantile(0.5, [(1.0, 3), (2.0, 4)]) is None  # no +Inf bucket
    assert histogram_quantile(0.5, [(math.inf, 4)]) is None  # one bucket only
    assert histogram_quantile(0.5, [(1.0, 5), (2.0, 4), (math.inf, 10)]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        histogram_quantile(1.5, buckets)


def test_histogram_minus() -> None:
    cur = Histogram(buckets=((1.0, 5), (math.inf, 8)), sum=9.0, count=8)
    prev = Histogram(buckets=((1.0, 2), (math.inf, 3)), sum=2.0, count=3)
    assert cur.minus(prev) == Histogram(buckets=((1.0, 3), (math.inf, 5)), sum=7.0, count=5)
    assert cur.minus(None) is cur
    assert prev.decreased_from(cur) and not cur.decreased_from(prev)


def test_request_log_source_is_a_protocol() -> None:
    class Fake:
        def samples(self, since: float) -> list[tuple[str, float, bool]]:
            return [("canary", 12.5, True)]

    assert isinstance(Fake(), RequestLogSource)
    assert not isinstance(object(), RequestLogSource)


# --------------------------------------------------------------------------------------------
# Scraping and PrometheusSource against fake and closed endpoints
# --------------------------------------------------------------------------------------------

Route = tuple[int, str, bytes, float]  # status, content type, body, delay


@pytest.fixture
def fake_http() -> Iterator[Callable[[dict[str, Route]], str]]:
    """Serve canned answers by path on 127.0.0.1; returns the base URL."""
    servers: list[QuietHTTPServer] = []

    def serve(routes: dict[str, Route]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, ctype, body, delay = routes.get(
                    self.path.split("?")[0], (404, "text/plain", b"no such path", 0.0))
                time.sleep(delay)
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_scrape_parses_a_served_page(fake_http: Callable[[dict[str, Route]], str]) -> None:
    body = (FIXTURES / "triton_metrics.txt").read_bytes()
    base = fake_http({"/metrics": (200, "text/plain", body, 0.0)})
    before = time.time()
    snap = scrape("triton", f"{base}/metrics", timeout=5.0)
    assert before <= snap.taken_at <= time.time()
    assert snap.series[FS1].success == 40


def test_scrape_errors(fake_http: Callable[[dict[str, Route]], str]) -> None:
    url = f"{closed_port_url()}/metrics"
    with pytest.raises(AdapterError) as refused:
        scrape("triton", url, timeout=2.0)
    assert not refused.value.permanent and url in refused.value.message

    base = fake_http({
        "/slow": (200, "text/plain", b"", 5.0),
        "/html": (200, "text/html", b"<html>\n<body>hello</body>\n</html>\n", 0.0),
        "/boom": (503, "text/plain", b"overloaded", 0.0),
    })
    started = time.monotonic()
    with pytest.raises(AdapterError) as slow:
        scrape("vllm", f"{base}/slow", timeout=0.5)
    assert time.monotonic() - started < 2.0
    assert not slow.value.permanent and "timed out" in slow.value.message
    assert f"{base}/slow" in slow.value.message

    with pytest.raises(AdapterError) as html:
        scrape("triton", f"{base}/html", timeout=2.0)
    assert html.value.permanent and "Prometheus text" in html.value.message
    with pytest.raises(AdapterError) as missing:
        scrape("triton", f"{base}/nothing", timeout=2.0)
    assert missing.value.permanent and "404" in missing.value.message
    with pytest.raises(AdapterError) as busy:
        scrape("triton", f"{base}/boom", timeout=2.0)
    assert not busy.value.permanent and "503" in busy.value.message
    with pytest.raises(ValueError):
        scrape("onnx", f"{base}/metrics", timeout=1.0)


def _api(payload: object, status: int = 200) -> Route:
    return (status, "application/json", json.dumps(payload).encode(), 0.0)


def test_prometheus_source_answers_and_errors(
    fake_http: Callable[[dict[str, Route]], str],
) -> None:
    vector = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"model": "m", "version": "1"}, "value": [1.0, "12.5"]},
        {"metric": {"model": "m", "version": "2"}, "value": [1.0, "NaN"]},
    ]}}
    base = fake_http({"/api/v1/query": _api(vector)})
    result = PrometheusSource(base, timeout=2.0).query("up")
    assert result[0] == ({"model": "m", "version": "1"}, 12.5)
    assert math.isnan(result[1][1])
    assert PrometheusSource(base, timeout=2.0).latency("m", "1", 0.99) == 12.5  # NaN ignored

    scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "3"]}}
    assert PrometheusSource(fake_http({"/api/v1/query": _api(scalar)})).query("3") == [({}, 3.0)]

    matrix = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    with pytest.raises(AdapterError, match="instant vector"):
        PrometheusSource(fake_http({"/api/v1/query": _api(matrix)})).query("up[1m]")

    bad = {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}
    with pytest.raises(AdapterError) as rejected:
        PrometheusSource(fake_http({"/api/v1/query": _api(bad, 400)})).query("up{")
    assert rejected.value.permanent and "bad_data: parse error" in rejected.value.message

    down = {"status": "error", "errorType": "unavailable", "error": "shutting down"}
    with pytest.raises(AdapterError) as unavailable:
        PrometheusSource(fake_http({"/api/v1/query": _api(down, 503)})).query("up")
    assert not unavailable.value.permanent

    html = (200, "text/html", b"<html>grafana</html>", 0.0)
    with pytest.raises(AdapterError, match="not a Prometheus API answer"):
        PrometheusSource(fake_http({"/api/v1/query": html})).query("up")


def test_prometheus_source_closed_port() -> None:
    base = closed_port_url()
    with pytest.raises(AdapterError) as refused:
        PrometheusSource(base, timeout=2.0).latency("fraud-scorer", "1", 0.99)
    assert not refused.value.permanent
    assert "connection refused" in refused.value.message and base in refused.value.message


def test_prometheus_latency_queries() -> None:
    q = PrometheusSource.latency_query
    assert q("fraud-scorer", "2", 0.99) == (
        'max(max_over_time(nv_inference_request_summary_us{model="fraud-scorer", '
        'version="2", quantile="0.99"}[1m])) / 1000'
    )
    assert 'quantile="0.5"' in q("m", "1", 0.6)  # nearest exposed quantile
    assert q("smollm2", "", 0.5, "5m", metric="ttft") == (
        'histogram_quantile(0.5, sum by (le) (rate({__name__=~'
        '"vllm:time_to_first_token_seconds_bucket", model_name="smollm2"}[5m]))) * 1000'
    )
    assert "time_per_output_token" in q("smollm2", "", 0.99, metric="itl")
    assert 'model="a\\"b"' in q('a"b', "1", 0.5)
    assert PrometheusSource.avg_latency_query("m", "1") == (
        'sum(rate(nv_inference_request_duration_us{model="m", version="1"}[1m])) / '
        'sum(rate(nv_inference_request_success{model="m", version="1"}[1m])) / 1000'
    )
    with pytest.raises(ValueError):
        q("m", "1", 0.5, metric="ttft")  # Triton has no TTFT
    with pytest.raises(ValueError):
        q("m", "", 0.5, kind="onnx")


# --------------------------------------------------------------------------------------------
# Live: the session's Triton, vLLM and a real Prometheus
# --------------------------------------------------------------------------------------------


def _infer(client: httpx.Client, model: str, version: str, count: int) -> None:
    for _ in range(count):
        response = client.post(f"/v2/models/{model}/versions/{version}/infer", json=INFER_BODY)
        assert response.status_code == 200, response.text


@pytest.mark.triton
def test_live_triton_window(local_triton: TritonProcess) -> None:
    n = 25
    before = scrape("triton", local_triton.metrics_url, timeout=5.0)
    with httpx.Client(base_url=local_triton.http_url, timeout=30.0) as client:
        _infer(client, *FS2, n)
    after = scrape("triton", local_triton.metrics_url, timeout=5.0)
    w = window(before.series.get(FS2), after.series[FS2], after.taken_at - before.taken_at)
    assert not w.reset
    assert (w.requests, w.failures, w.error_rate) == (n, 0, 0.0)
    assert w.rps > 0
    assert w.avg_ms is not None and w.avg_ms > 0
    assert w.p50_ms is not None and w.p99_ms is not None
    assert 0 < w.p50_ms <= w.p99_ms
    assert w.quantiles_available == TRITON_SUMMARY_QUANTILES
    assert w.quantile_source == {"p50": 0.5, "p95": 0.95, "p99": 0.99}
    assert w.waiting == 0


@pytest.mark.vllm
def test_live_vllm_window(local_vllm: VLLMProcess) -> None:
    url = f"{local_vllm.http_url}/metrics"
    key = (local_vllm.served_model_name, "")
    before = scrape("vllm", url, timeout=10.0)
    prev = before.series.get(key)
    with httpx.Client(base_url=local_vllm.http_url, timeout=60.0) as client:
        for prompt in ("One, two, three,", "The capital of France is", "Water boils at"):
            client.post("/v1/completions", json={
                "model": local_vllm.served_model_name, "prompt": prompt, "max_tokens": 8,
                "temperature": 0, "ignore_eos": True,
            }).raise_for_status()
    seen = prev.requests if prev else 0.0
    deadline = time.monotonic() + 15.0
    while True:  # the API server records a request's metrics as it finishes
        after = scrape("vllm", url, timeout=10.0)
        if after.series[key].requests >= seen + 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    w = window(prev, after.series[key], after.taken_at - before.taken_at)
    assert not w.reset
    assert (w.requests, w.failures) == (3, 0)
    for value in (w.p50_ms, w.ttft_p50_ms, w.ttft_p99_ms, w.itl_p50_ms, w.itl_p99_ms):
        assert value is not None and 0 < value < 60_000
    assert w.tokens_per_s is not None and w.tokens_per_s > 0
    assert after.series[key].generation_tokens - (prev.generation_tokens if prev else 0) == 24


@pytest.mark.triton
def test_prometheus_source_against_a_real_prometheus(
    local_triton: TritonProcess, local_prometheus: PrometheusProcess
) -> None:
    source = PrometheusSource(local_prometheus.url, timeout=5.0)
    selector = 'nv_inference_request_success{model="fraud-scorer",version="1"}'
    with httpx.Client(base_url=local_triton.http_url, timeout=30.0) as client:
        _infer(client, *FS1, 10)
        expected = scrape("triton", local_triton.metrics_url, timeout=5.0).series[FS1].success
        deadline = time.monotonic() + 20.0
        stored: list[tuple[dict[str, str], float]] = []
        while time.monotonic() < deadline:  # a few 1 s scrape intervals
            stored = source.query(selector)
            if stored and stored[0][1] >= expected:
                break
            time.sleep(0.5)
        assert stored and stored[0][1] >= expected, stored
        assert stored[0][0]["job"] == "triton"
        assert stored[0][0]["model"] == "fraud-scorer"

        p99 = source.latency("fraud-scorer", "1", 0.99)
        p50 = source.latency("fraud-scorer", "1", 0.5)
        assert p99 is not None and p50 is not None and 0 < p50 <= p99 < 10_000

        avg = None  # rate() needs two scrapes that saw traffic in between
        deadline = time.monotonic() + 20.0
        while avg is None and time.monotonic() < deadline:
            _infer(client, *FS1, 5)
            time.sleep(1.2)
            avg = source.avg_latency("fraud-scorer", "1")
        assert avg is not None and 0 < avg < 10_000
    assert source.latency("no-such-model", "1", 0.99) is None
    with pytest.raises(AdapterError) as rejected:
        source.query("nv_inference_request_success{")
    assert rejected.value.permanent and "bad_data" in rejected.value.message


@pytest.mark.triton
def test_histogram_quantile_matches_prometheus(local_prometheus: PrometheusProcess) -> None:
    """Our histogram_quantile against PromQL's on the stored vLLM capture, served to the real
    Prometheus as a static page."""
    assert local_prometheus.static is not None
    local_prometheus.static.text = fixture_text("vllm_metrics.txt")
    source = PrometheusSource(local_prometheus.url, timeout=5.0)
    deadline = time.monotonic() + 20.0
    while not source.query('vllm:e2e_request_latency_seconds_count{job="static"}'):
        assert time.monotonic() < deadline, "Prometheus never scraped the static page"
        time.sleep(0.3)
    counters = parse_vllm(fixture_text("vllm_metrics.txt"))[SMOL]
    for name, family in (("e2e", "vllm:e2e_request_latency_seconds"),
                         ("ttft", "vllm:time_to_first_token_seconds"),
                         ("itl", "vllm:inter_token_latency_seconds")):
        for q in (0.05, 0.5, 0.9, 0.99):
            ((_, promql),) = source.query(
                f'histogram_quantile({q}, sum by (le) ({family}_bucket{{job="static"}}))')
            ours = histogram_quantile(q, counters.histograms[name].buckets)
            assert ours == pytest.approx(promql), (name, q)
    # Constant counters: no requests in the window, rate() is 0 and the quantile NaN.
    assert source.latency("smollm2", "", 0.5) is None


@pytest.mark.parametrize(("kind", "page"), [
    ("triton", "triton_metrics.txt"), ("triton", "triton_metrics_after_reload.txt"),
    ("vllm", "vllm_metrics.txt"),
])
def test_a_scrape_kept_for_the_next_tick_reads_back_as_parsed(kind, page):
    """What the scrape tick keeps of a page (compact JSON of its counters) reads back equal to
    the page parsed, and is a small part of it."""
    series = parsing.parse(kind, fixture_text(page))
    kept = dump_series(series)
    assert load_series(kept) == series
    assert len(kept) * 10 < len(fixture_text(page))


class _SlowChunks(BaseHTTPRequestHandler):
    """A metrics page sent in three chunks 50 ms apart (chunked transfer encoding)."""

    protocol_version = "HTTP/1.1"
    PAGE = (FIXTURES / "triton_metrics.txt").read_bytes()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        third = len(self.PAGE) // 3 + 1
        for i in range(0, len(self.PAGE), third):
            part = self.PAGE[i:i + third]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.flush()
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


def test_the_fetcher_reads_a_page_that_comes_in_pieces_whole_and_refuses_a_huge_one(monkeypatch):
    from fleet.adapters.metrics import fetcher

    server = QuietHTTPServer(("127.0.0.1", 0), _SlowChunks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        got = fetcher.fetcher().fetch([("a", url)], timeout=5.0).get(timeout=10)
        assert got.text == _SlowChunks.PAGE.decode()
        monkeypatch.setattr(fetcher, "MAX_BODY", 1000)
        too_big = fetcher.fetcher().fetch([("b", url)], timeout=5.0).get(timeout=10)
        assert too_big.text is None and "over" in too_big.error
    finally:
        server.shutdown()
        server.server_close()
