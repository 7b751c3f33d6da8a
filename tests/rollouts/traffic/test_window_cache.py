"""A worker's window cache (rollouts/traffic/window_cache.py) and the columns it answers in
(rollouts/traffic/columns.py): look after look it answers what a fresh read of the window
answers, parsing only what arrived since, on the real Redis the suite runs against."""

from __future__ import annotations

import json
import time
from dataclasses import fields

import numpy as np
import pytest

from rollouts.canary.arms import Arm
from rollouts.traffic import samples
from rollouts.traffic.columns import Columns
from rollouts.traffic.window_cache import LATE_S, WindowCache

DEP = 4242


@pytest.fixture(autouse=True)
def _own_prefix(redis_prefix):
    """Each test's keys under its own prefix (tests/conftest.py)."""
    yield
    store = samples.connect()
    for name in store.scan_iter(f"{redis_prefix}:*"):
        store.delete(name)


def line(t: float, i: int, *, variant: str = "v1", status: int = 200,
         upstream_status: str = "200", upstream_time: str = "0.004", mirror: bool = False,
         header_time: str | None = None, stream: bool = False,
         first_token: str | None = None, tokens: str | None = None) -> bytes:
    record = {"time": "t", "msec": t, "route": f"dep-{DEP}", "variant": variant,
              "mirror": mirror, "method": "POST", "path": "/v2/models/m/infer",
              "status": status, "upstream_addr": "127.0.0.1:1", "upstream_status": upstream_status,
              "upstream_response_time": upstream_time, "request_time": 0.001 * (1 + i % 17),
              "bytes_sent": 100, "request_id": f"r{variant}{i}"}
    if header_time is not None:
        record["upstream_header_time"] = header_time
    if stream:
        record["content_type"] = "text/event-stream"
    if first_token is not None:
        record |= {"first_token": first_token, "tokens": tokens or ""}
    return b"<190>Jan  1 00:00:00 switchyard: " + json.dumps(record).encode()


def same(found: Columns, expected: list) -> bool:
    fresh = Columns.of(expected)
    return len(found) == len(fresh) and all(
        np.array_equal(getattr(found, f.name), getattr(fresh, f.name), equal_nan=True)
        for f in fields(Columns))


def check(cache: WindowCache, seconds: float, now: float) -> dict[str, Columns]:
    """The cache's window against a fresh read of the same window."""
    found = cache.window(DEP, now - seconds, now=now)
    fresh = samples.window(DEP, seconds, now=now)
    assert sorted(found) == sorted(fresh)
    for variant, expected in fresh.items():
        assert same(found[variant], expected), variant
    return found


def test_look_after_look_it_answers_a_fresh_read_and_parses_only_what_arrived():
    cache = WindowCache()
    now = time.time()
    start = now - 150
    samples.record([line(start + i / 10, i) for i in range(1000)], now=now)
    first = check(cache, 200, now)
    assert len(first["v1"]) == 1000 and cache.parsed == 1000

    # A second of traffic later, and a sample that ended 2 s ago but landed only now (late,
    # within LATE_S), and a second variant: read are the last LATE_S seconds and the newcomer.
    now += 1
    samples.record([line(now - 0.5 + i / 100, 1000 + i) for i in range(50)]
                   + [line(now - 2, 2000), line(now - 0.2, 3000, variant="v2")], now=now)
    parsed = cache.parsed
    second = check(cache, 200, now)
    assert len(second["v1"]) == 1051 and len(second["v2"]) == 1
    read = cache.parsed - parsed
    recent = sum(1 for s in samples.window(DEP, 200, now=now)["v1"] if s.t >= now - 1 - LATE_S)
    assert read == recent + 1 < 200, read  # the last LATE_S seconds of v1, and v2 whole

    # The window slides past the oldest samples: they leave the answer as they leave a read.
    now += 60
    third = check(cache, 200, now)
    assert len(third["v1"]) < len(second["v1"])
    # Asked for further back than it holds, it reads the window whole again.
    parsed = cache.parsed
    check(cache, 250, now)
    assert cache.parsed - parsed == sum(len(v) for v in samples.window(DEP, 250, now=now).values())


def test_what_redis_no_longer_keeps_leaves_the_answer_too(settings):
    settings.SWITCHYARD_SAMPLES_MAX_PER_VARIANT = 30
    cache = WindowCache()
    now = time.time()
    samples.record([line(now - 10 + i / 10, i) for i in range(20)], now=now)
    check(cache, 60, now)
    now += 1
    samples.record([line(now - 0.5 + i / 100, 100 + i) for i in range(25)], now=now)
    found = check(cache, 60, now)
    assert len(found["v1"]) == 30  # the newest 30, as Redis keeps them


def test_a_clock_far_ahead_is_kept_where_redis_keeps_it():
    """A sample dated minutes ahead is stored at its arrival (``MAX_FUTURE_S``): the cache
    keeps it look after look, as a fresh read does."""
    cache = WindowCache()
    now = time.time()
    samples.record([line(now - 1, 1), line(now + 3600, 2)], now=now)
    check(cache, 60, now)
    for i in range(3):
        now += LATE_S + 1
        samples.record([line(now - 0.1, 3 + i)], now=now)
        assert len(check(cache, 60, now)["v1"]) == 3 + i


def test_it_holds_at_most_its_rows_forgetting_the_least_recent_window():
    cache = WindowCache(max_rows=150)
    now = time.time()
    for dep in (DEP, DEP + 1):
        samples.record([line(now - 5 + i / 100, i).replace(
            f'dep-{DEP}"'.encode(), f'dep-{dep}"'.encode()) for i in range(100)], now=now)
    cache.window(DEP, now - 60, now=now)
    cache.window(DEP + 1, now - 60, now=now)
    parsed = cache.parsed
    cache.window(DEP + 1, now - 60, now=now + 0.5)  # still held: only its last LATE_S read again
    cache.window(DEP, now - 60, now=now + 0.5)  # forgotten: read whole
    assert cache.parsed - parsed == 200


def test_columns_make_the_arm_the_samples_make():
    """Errors, timeouts (counted slow, not dropped), 4xx apart, upstream failures and streamed
    answers' first-token and generation times, from the stored members."""
    now = time.time()
    lines = [line(now - 1, 1), line(now - 1, 2, status=502, upstream_status="502"),
             line(now - 1, 3, status=504, upstream_status="504", upstream_time="2.5"),
             line(now - 1, 4, status=499, upstream_status="", upstream_time="-"),
             line(now - 1, 5, status=404, upstream_status="404"),
             line(now - 1, 6, status=200, upstream_status="502, 200"),
             line(now - 1, 7, header_time="0.050", upstream_time="0.900", stream=True),
             line(now - 1, 8, header_time="0.040", stream=False),
             # Timed token by token: 2 ms to the first of 11 tokens, 10 ms in all.
             line(now - 1, 9, header_time="0.001", upstream_time="0.500", stream=True,
                  first_token="0.002", tokens="11"),
             line(now - 1, 25, header_time="0.001", stream=True, first_token="0.003",
                  tokens="1"),
             line(now - 1, 26, header_time="0.001", stream=True, first_token="", tokens="")]
    samples.record(lines, now=now)
    read = samples.window(DEP, 60, now=now)["v1"]
    columns = Columns.of_members([s.to_member() for s in read])
    for upstream in (False, True):
        by_samples, by_columns = (reference_arm(read, upstream), Arm.of(columns, upstream=upstream))
        assert by_columns.errors == by_samples.errors == 4  # 502, 504, 499, a failed try
        assert by_columns.client_errors == by_samples.client_errors == 1
        for name in ("latencies", "ttft", "generation", "tpot"):
            assert np.array_equal(getattr(by_columns, name), getattr(by_samples, name)), name
    arm = Arm.of(columns)
    # The router's first-token time where it timed one, else the server's header time.
    assert sorted(arm.ttft.tolist()) == [1.0, 2.0, 3.0, 50.0]
    assert sorted(arm.generation.tolist()) == [3.0, 3.0, 499.0, 850.0]
    # Only the answer of two tokens or more: (10 ms - 2 ms) / 10 tokens after the first.
    assert arm.tpot.tolist() == [pytest.approx(0.8)]


def reference_arm(found: list, upstream: bool) -> Arm:
    """The arm, request by request, as the judge's rules are written (arms.py)."""
    answered, ttft, generation, tpot, errors, client = [], [], [], [], 0, 0
    for s in found:
        own = s.upstream_ms if upstream else s.latency_ms
        timeout = s.status in (408, 499, 504) or "504" in s.upstream_status
        if s.status >= 500 or s.upstream_failed or s.status in (408, 499):
            errors += 1
            if timeout:
                answered.append(s.latency_ms if own is None else own)
        elif s.status >= 400:
            client += 1
        else:
            if own is not None:
                answered.append(own)
            first = s.first_ms if s.first_ms is not None else s.header_ms
            if s.stream and first is not None:
                ttft.append(first)
                if s.upstream_ms is not None and s.header_ms is not None:
                    generation.append(max(s.upstream_ms - s.header_ms, 0.0))
                if s.first_ms is not None and (s.tokens or 0) >= 2:
                    tpot.append(max(s.latency_ms - s.first_ms, 0.0) / (s.tokens - 1))
    return Arm(np.asarray(answered, dtype=float), errors, client,
               np.asarray(ttft, dtype=float), np.asarray(generation, dtype=float),
               np.asarray(tpot, dtype=float))


def test_with_no_rows_to_keep_every_look_reads_the_window_whole(settings):
    settings.SWITCHYARD_LOOK_CACHE_ROWS = 0
    cache = WindowCache()
    now = time.time()
    samples.record([line(now - 5 + i / 100, i) for i in range(100)], now=now)
    check(cache, 60, now)
    check(cache, 60, now + 0.5)
    assert cache.parsed == 200
