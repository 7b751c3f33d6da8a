"""The load engine: its arithmetic and HTTP framing on their own, and its levels against a real
Triton (the session's fraud scorer: v1 sleeps 4 ms per request on one instance, v2 12 ms).

Timing assertions compare figures with each other or with the model's own sleep (a floor no
machine beats), never with an absolute speed: the machine is small and shared.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import threading
import time
from collections import Counter

import pytest

from rollouts.benchmarks import engine, lean_http
from rollouts.benchmarks.engine import run_level
from rollouts.benchmarks.level import KINDS, RECONNECT_PAUSE_S, Level, Tally, Target
from rollouts.benchmarks.stats import percentiles, summarize

MODEL = "fraud-scorer"
SLEEP_S = 0.004  # fraud-scorer v1's simulated service time (one instance)
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}]}
).encode()


# ----------------------------------------------------------------------------------------
# percentiles() and summarize()


def test_percentiles_are_nearest_rank_in_milliseconds():
    values = [i / 1000 for i in range(100, 0, -1)]  # 1..100 ms, unsorted on purpose

    out = percentiles(values)

    assert out == {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "mean": 50.5, "max": 100.0}
    # Few samples: p99 of ten values is the largest, p50 the fifth; one value is every rank.
    ten = percentiles([i / 1000 for i in range(1, 11)])
    assert (ten["p50"], ten["p90"], ten["p99"], ten["max"]) == (5.0, 9.0, 10.0, 10.0)
    assert set(percentiles([0.002]).values()) == {2.0}
    assert percentiles([3.0], scale=1.0)["p50"] == 3.0


def test_percentiles_of_nothing_are_none():
    assert percentiles([]) == {"p50": None, "p90": None, "p95": None, "p99": None,
                               "mean": None, "max": None}


def test_summarize_counts_requests_errors_throughput_and_goodput():
    tally = Tally(latencies=[0.001, 0.002, 0.003, 0.010], window_s=2.0)
    tally.error("http_500", "boom")
    tally.error("connect", "refused")
    level = Level(mode="concurrency", value=4, duration_s=5.0)

    out = summarize(level, tally, goodput={"latency_ms": 2.5})

    assert out["requests"] == 6 and out["ok"] == 4
    assert out["errors"] == {"http_500": 1, "connect": 1}
    assert out["error_rate"] == round(2 / 6, 6)
    assert out["first_error"] == "http_500: boom"
    assert out["window_s"] == 2.0  # the measured window, not the level's duration
    assert out["throughput_rps"] == 2.0  # successful requests only
    assert out["offered_rps"] is None and out["mode"] == "concurrency" and out["value"] == 4
    assert out["latency_ms"]["p50"] == 2.0 and out["latency_ms"]["max"] == 10.0
    assert out["goodput_rps"] == 1.0  # two requests within 2.5 ms, over 2 s
    assert out["cancelled"] is False
    assert "ttft_ms" not in out and "output_tokens" not in out


def test_summarize_of_an_open_loop_level_names_the_offered_rate_and_llm_figures():
    tally = Tally(latencies=[0.5, 1.0], ttft=[0.1, 0.3], itl=[0.02, 0.04, 0.06], tpot=[0.02, 0.05],
                  output_tokens=40)
    level = Level(mode="rate", value=7.5, duration_s=4.0)

    out = summarize(level, tally, goodput={"latency_ms": None, "ttft_ms": 200, "itl_ms": 30})

    assert out["offered_rps"] == 7.5
    assert out["window_s"] == 4.0  # no window measured: the level's duration
    assert out["throughput_rps"] == 0.5
    assert out["ttft_ms"]["p50"] == 100.0 and out["itl_ms"]["max"] == 60.0
    assert out["output_tokens"] == 40 and out["output_tokens_per_s"] == 10.0
    assert out["goodput_rps"] == 0.25  # only the first request met both TTFT and ITL limits


def test_summarize_counts_throughput_from_the_answers_inside_the_window_when_tracked():
    # 10 requests sent in the window all succeeded, but only 4 answers came inside it.
    tally = Tally(latencies=[0.5] * 10, window_s=2.0, answered_in_window=4)

    out = summarize(Level(mode="rate", value=5, duration_s=2.0), tally)

    assert out["ok"] == 10 and out["throughput_rps"] == 2.0


def test_summarize_without_requests_is_all_zero_and_goodput_without_limits_is_left_out():
    out = summarize(Level(mode="concurrency", value=1), Tally(), goodput={"latency_ms": None})

    assert (out["requests"], out["ok"], out["error_rate"], out["throughput_rps"]) == (0, 0, 0.0, 0.0)
    assert out["latency_ms"]["p99"] is None
    assert "goodput_rps" not in out


# ----------------------------------------------------------------------------------------
# The HTTP/1.1 framing of _HttpConnection, fed bytes split at awkward places


class FakeDriver:
    """Stands in for _HttpDriver: records what the connection reports."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, bytes]] = []
        self.failures: list[tuple[str, str]] = []

    def answered(self, conn, status, body):
        self.answers.append((status, body))

    def failed(self, conn, kind, detail):
        self.failures.append((kind, detail))

    def lost(self, conn, exc):
        pass


def response(status: str, headers: list[str], body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode() + body


def chunked(*chunks: bytes, last: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + last


OK_BODY = b'{"model_name":"fraud-scorer","outputs":[{"name":"SCORE","data":[0.56]}]}'
RESPONSES = [
    # Content-Length as Triton writes it
    (response("200 OK", ["Content-Type: application/json", f"Content-Length: {len(OK_BODY)}"],
              OK_BODY), 200, False),
    # chunked, several chunks, one of them holding what looks like the last chunk
    (response("200 OK", ["Transfer-Encoding: chunked"],
              chunked(b'{"a":', b"\r\n0\r\n\r\n", b'"tail"}')), 200, False),
    # headers in lower case, an empty body
    (response("200 OK", ["content-length: 0"], b""), 200, False),
    # an error with a chunked body: the body is kept; a chunk extension and trailers
    (response("400 Bad Request", ["transfer-encoding: Chunked", "X-Count: 0"],
              chunked(b'{"error":"Request for unknown model"}',
                      last=b"0;ext=1\r\nX-Trailer: yes\r\n\r\n")), 400, True),
    # chunked with no data at all
    (response("200 OK", ["Transfer-Encoding: chunked"], b"0\r\n\r\n"), 200, False),
    # an error framed by Content-Length
    (response("503 Service Unavailable", ["Content-Length: 4"], b"busy"), 503, True),
]
STREAM = b"".join(r for r, _, _ in RESPONSES)
EXPECTED = [(status, raw if keep else b"") for raw, status, keep in RESPONSES]


def feed(pieces: list[bytes]) -> tuple[FakeDriver, lean_http.HttpConnection]:
    driver = FakeDriver()
    conn = lean_http.HttpConnection(driver)  # type: ignore[arg-type]
    for piece in pieces:
        conn.data_received(piece)
    return driver, conn


def test_responses_in_one_piece_are_framed_one_by_one():
    driver, conn = feed([STREAM])

    assert driver.answers == EXPECTED
    assert not conn.buf and not driver.failures


def test_responses_split_at_every_byte_are_framed_the_same():
    driver, conn = feed([STREAM[i:i + 1] for i in range(len(STREAM))])

    assert driver.answers == EXPECTED
    assert not conn.buf


@pytest.mark.parametrize("width", [2, 3, 5, 7, 11, 64])
def test_responses_split_at_every_offset_are_framed_the_same(width):
    for first in range(len(STREAM)):  # one cut at every offset, then pieces of ``width``
        pieces = [STREAM[:first]] + [STREAM[i:i + width] for i in range(first, len(STREAM), width)]
        driver, conn = feed(pieces)
        assert driver.answers == EXPECTED, (width, first)
        assert not conn.buf


def test_a_response_is_only_answered_once_its_last_byte_is_in():
    raw = RESPONSES[3][0]
    driver, conn = feed([raw[:-1]])
    assert driver.answers == []

    conn.data_received(raw[-1:])

    assert driver.answers == [(400, raw)]


def test_an_unreadable_response_is_a_protocol_failure():
    driver, _ = feed([response("200 OK", ["Transfer-Encoding: chunked"], b"zz\r\nxx\r\n")])

    assert driver.answers == []
    assert [kind for kind, _ in driver.failures] == ["protocol"]


# ----------------------------------------------------------------------------------------
# Levels against the session's real Triton


def http_target(triton, model: str = MODEL, version: str = "1", **kwargs) -> Target:
    return Target(kind="triton_http", url=triton.http_url, model=model, version=version,
                  bodies=(BODY,), **kwargs)


def closed(value: int, duration_s: float = 1.5, **kwargs) -> Level:
    return Level(mode="concurrency", value=value, duration_s=duration_s,
                 warmup_s=kwargs.pop("warmup_s", 0.3), **kwargs)


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tally_of(target: Target, level: Level) -> Tally:
    """The raw tally of a level (latencies in the order the answers came)."""
    loop = engine.new_loop()
    try:
        return loop.run_until_complete(engine._run_async(target, level, lambda: False))
    finally:
        loop.close()


def test_the_kinds_are_the_documented_ones():
    assert KINDS == ("triton_http", "triton_grpc", "openai_completions", "openai_chat")


@pytest.mark.triton
def test_closed_loop_at_concurrency_1_is_bounded_by_the_service_time(local_triton):
    out = run_level(http_target(local_triton), closed(1))

    assert out["errors"] == {} and out["ok"] > 20
    assert out["latency_ms"]["p50"] >= SLEEP_S * 1000
    assert out["throughput_rps"] <= 1 / SLEEP_S
    # One request in flight: throughput x mean latency is one request (Little's law), less the
    # moments between an answer and the next send.
    in_flight = out["throughput_rps"] * out["latency_ms"]["mean"] / 1000
    assert 0.8 <= in_flight <= 1.05, out


@pytest.mark.triton
def test_concurrency_4_on_one_instance_queues(local_triton):
    one = run_level(http_target(local_triton), closed(1))
    four = run_level(http_target(local_triton), closed(4))

    assert one["errors"] == {} and four["errors"] == {}
    # One instance serves one request at a time: four in flight wait about four service times
    # (ideal ratio 4) and the server carries no more than at concurrency 1.
    ratio = four["latency_ms"]["p50"] / one["latency_ms"]["p50"]
    assert ratio >= 2.5, (one["latency_ms"], four["latency_ms"])
    assert four["throughput_rps"] <= 1 / SLEEP_S
    assert four["throughput_rps"] <= one["throughput_rps"] * 1.5


@pytest.mark.triton
def test_open_loop_below_capacity_delivers_the_offered_rate(local_triton):
    rate, duration = 100.0, 3.0  # 40% of the one instance's 250 req/s
    out = run_level(http_target(local_triton),
                    Level(mode="rate", value=rate, duration_s=duration, warmup_s=0.3, seed=7))

    assert out["errors"] == {} and out["offered_rps"] == rate
    # Poisson arrivals: 300 expected in the window, standard deviation sqrt(300) ~ 17; +-25%
    # (75 requests) is more than four standard deviations.
    expected = rate * duration
    assert abs(out["requests"] - expected) <= 0.25 * expected, out
    assert abs(out["throughput_rps"] - rate) <= 0.25 * rate
    assert out["latency_ms"]["p50"] >= SLEEP_S * 1000


@pytest.mark.triton
def test_open_loop_above_capacity_shows_the_backlog_as_latency(local_triton):
    # 400 req/s offered to a server that does at most 250: the backlog grows all through the
    # window, and latency counts from each request's scheduled time, so it grows with it.
    level = Level(mode="rate", value=400, duration_s=1.5, warmup_s=0, seed=3)
    tally = tally_of(http_target(local_triton), level)
    out = summarize(level, tally)

    assert out["errors"] == {}, out["first_error"]
    # Throughput is what the server delivered inside the window (at most one answer per 4 ms),
    # not the offered rate, although every request sent in the window was answered in the end.
    assert out["throughput_rps"] <= 1 / SLEEP_S + 1 / level.duration_s
    assert out["ok"] >= 1.3 * out["throughput_rps"] * out["window_s"], out
    # p99 far above the 4 ms service time: at 150 missing req/s the last ones wait ~ 1 s.
    assert out["latency_ms"]["p99"] >= 50 * SLEEP_S * 1000, out["latency_ms"]
    # And it grows through the window: the last answers waited far longer than the first.
    quarter = len(tally.latencies) // 4
    first = sum(tally.latencies[:quarter]) / quarter
    last = sum(tally.latencies[-quarter:]) / quarter
    assert last >= 3 * first, (first, last)


@pytest.mark.triton
def test_warm_up_requests_are_not_counted(local_triton):
    out = run_level(http_target(local_triton), closed(1, duration_s=1.0, warmup_s=1.0))

    assert out["window_s"] == 1.0
    # The server does at most one request per 4 ms: what was counted fits in the 1 s window,
    # where counting the warm-up as well could reach twice as much.
    assert 0 < out["requests"] <= 1.0 / SLEEP_S + 1


@pytest.mark.triton
def test_max_requests_ends_the_window_early(local_triton):
    started = time.perf_counter()
    out = run_level(http_target(local_triton), closed(2, duration_s=30, warmup_s=0, max_requests=40))
    took = time.perf_counter() - started

    # The window closes after 40 measured requests; the one still in flight is counted too.
    assert 40 <= out["requests"] <= 41 and out["errors"] == {}
    assert out["window_s"] < 5 and took < 5  # 40 x 4 ms is 0.16 s; the level is 30 s
    assert out["throughput_rps"] == pytest.approx(out["ok"] / out["window_s"], rel=0.01)


@pytest.mark.triton
def test_grpc_works_and_agrees_with_http(local_triton):
    grpc = run_level(Target(kind="triton_grpc", url=local_triton.grpc_url, model=MODEL, version="1",
                            bodies=(BODY,)), closed(1))
    http = run_level(http_target(local_triton), closed(1))

    assert grpc["errors"] == {} and grpc["ok"] > 20
    assert grpc["latency_ms"]["p50"] >= SLEEP_S * 1000
    # Both are the 4 ms sleep plus a fraction of a millisecond of protocol: within a factor 2.
    assert 0.5 <= grpc["latency_ms"]["p50"] / http["latency_ms"]["p50"] <= 2.0
    assert 0.5 <= grpc["throughput_rps"] / http["throughput_rps"] <= 2.0


@pytest.mark.triton
def test_an_unknown_model_is_counted_as_http_errors(local_triton):
    out = run_level(http_target(local_triton, model="no-such-model", version=""),
                    closed(2, duration_s=0.5, warmup_s=0.1))

    assert out["ok"] == 0 and out["requests"] > 0
    assert set(out["errors"]) <= {"http_400", "http_404"} and out["errors"], out["errors"]
    assert out["error_rate"] == 1.0
    assert out["first_error"].startswith("http_4") and "no-such-model" in out["first_error"]


@pytest.mark.parametrize("mode,value", [("concurrency", 4), ("rate", 50)])
def test_a_dead_port_gives_connect_errors_and_no_hang(mode, value):
    level = Level(mode=mode, value=value, duration_s=1.0, warmup_s=0.2, seed=1)
    started = time.perf_counter()
    out = run_level(Target(kind="triton_http", url=f"http://127.0.0.1:{dead_port()}", model=MODEL,
                           bodies=(BODY,), timeout_s=5), level)
    took = time.perf_counter() - started

    assert took < level.warmup_s + level.duration_s + 1.0
    assert out["ok"] == 0 and set(out["errors"]) == {"connect"}
    assert out["first_error"].startswith("connect: ") and len(out["first_error"]) > len("connect: ")
    tries = out["errors"]["connect"]
    if mode == "concurrency":
        # Each slot tries again every RECONNECT_PAUSE_S, and a try counts once, inside the window.
        assert tries <= value * (level.duration_s / RECONNECT_PAUSE_S + 1), tries
    else:  # one try per arrival: 50 expected, +-50% is seven standard deviations
        assert abs(tries - value * level.duration_s) <= 0.5 * value * level.duration_s, tries


@pytest.mark.triton
def test_stop_from_another_thread_ends_the_level_within_a_second(local_triton):
    flag = threading.Event()
    stopped_at: list[float] = []

    def stop_later():
        time.sleep(1.0)
        stopped_at.append(time.perf_counter())
        flag.set()

    threading.Thread(target=stop_later, daemon=True).start()
    out = run_level(http_target(local_triton), closed(4, duration_s=30, warmup_s=0), stop=flag.is_set)
    lag = time.perf_counter() - stopped_at[0]

    # The level polls stop() every STOP_POLL_S (0.1 s), then drops what is in flight.
    assert out["cancelled"] is True
    assert lag < 1.0, lag
    assert out["ok"] > 0 and out["window_s"] < 5
    # What was in flight is dropped, not counted as failed.
    assert out["errors"] == {}, out["errors"]


@pytest.mark.triton
def test_a_server_killed_mid_level_gives_connection_errors_and_the_level_ends(
        triton_runtime, tmp_path):
    from local.triton import start_triton, write_demo_repository

    write_demo_repository(tmp_path / "models")
    server = start_triton(triton_runtime, tmp_path / "models", load_models=[MODEL],
                          log_path=tmp_path / "tritonserver.log")
    try:
        def kill_later():
            time.sleep(1.0)
            os.killpg(server.pid, signal.SIGKILL)

        level = closed(4, duration_s=2.5, warmup_s=0.2)
        threading.Thread(target=kill_later, daemon=True).start()
        started = time.perf_counter()
        out = run_level(http_target(server, timeout_s=5), level)
        took = time.perf_counter() - started
    finally:
        server.stop()

    assert took < level.warmup_s + level.duration_s + 1.0
    assert out["ok"] > 0
    kinds = Counter(out["errors"])
    assert kinds and set(kinds) <= {"connection", "connect"}, out["errors"]
    # After the kill every slot keeps trying (every RECONNECT_PAUSE_S) until the window ends.
    assert kinds["connect"] >= 4, out["errors"]
    assert not math.isnan(out["error_rate"]) and 0 < out["error_rate"] < 1


def test_run_level_refuses_an_unknown_mode_or_kind():
    with pytest.raises(ValueError, match="mode"):
        run_level(Target(kind="triton_http", url="http://127.0.0.1:1", model=MODEL),
                  Level(mode="bursts", value=1))
    with pytest.raises(ValueError, match="kind"):
        run_level(Target(kind="smtp", url="http://127.0.0.1:1", model=MODEL),
                  Level(mode="rate", value=1, duration_s=0.1, warmup_s=0))


def test_new_loop_runs_coroutines():
    loop = engine.new_loop()
    try:
        assert loop.run_until_complete(asyncio.sleep(0, result=5)) == 5
    finally:
        loop.close()
