"""A sample's split key, time to the server's response header and stream flag: parsed from
nginx's line (rollouts/traffic/samples.py), stored in Redis (sample_types.Sample.to_member) and
read back, members stored before these fields existed included. Lines are written here as
nginx writes them (the real nginx's are in tests/fleet/adapters/test_nginx_router.py)."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from rollouts.traffic import samples
from rollouts.traffic.columns import Columns
from rollouts.traffic.sample_types import Sample, SampleError, split_key

LINE = {
    "time": "t", "msec": 1_700_000_000.5, "route": "dep-41", "variant": "v1-triton",
    "mirror": False, "method": "POST", "path": "/v1/chat/completions", "status": 200,
    "upstream_addr": "10.0.0.7:8000", "upstream_status": "200",
    "upstream_response_time": "1.250", "upstream_header_time": "0.040",
    "content_type": "text/event-stream; charset=utf-8", "key": "alice@example.com",
    "request_time": 1.251, "bytes_sent": 4096, "request_id": "r1",
}


def parse(**changes) -> Sample:
    line = {k: v for k, v in {**LINE, **changes}.items() if v is not None}
    sample = samples.parse_line(b"<190>Jan  1 00:00:00 switchyard: " + json.dumps(line).encode())
    assert isinstance(sample, Sample)
    return sample


def test_a_sticky_routes_line_keeps_a_keyed_hash_of_the_user_never_the_value(settings):
    sample = parse()

    assert re.fullmatch(r"[0-9a-f]{16}", sample.key), sample.key
    assert sample.key == split_key(41, "alice@example.com", settings.SECRET_KEY)
    assert "alice" not in sample.to_member()
    # One user is one key within a deployment; another user, deployment or secret is another.
    assert parse(request_id="r2").key == sample.key
    assert parse(key="bob@example.com").key != sample.key
    assert parse(route="dep-42").key != sample.key
    settings.SECRET_KEY = "another secret"
    assert parse().key != sample.key
    # No header (or a route that is not sticky): no key.
    assert parse(key="").key == ""


def test_the_time_to_the_response_header_and_the_stream_flag_are_read():
    sample = parse()

    assert (sample.latency_ms, sample.upstream_ms, sample.header_ms) == (1251.0, 1250.0, 40.0)
    assert sample.stream is True
    # Retries are summed as upstream_response_time's are; no server reached: None.
    assert parse(upstream_header_time="0.004, 0.002").header_ms == 6.0
    assert parse(upstream_header_time="-", upstream_status="").header_ms is None
    assert parse(content_type="application/json").stream is False
    assert parse(content_type="TEXT/EVENT-STREAM").stream is True
    assert parse(content_type="").stream is False


def test_a_line_of_a_route_file_older_than_the_fields_is_a_sample_without_them():
    sample = parse(key=None, upstream_header_time=None, content_type=None)

    assert (sample.key, sample.header_ms, sample.stream) == ("", None, False)
    assert sample.upstream_ms == 1250.0


def test_hostile_keys_are_capped_and_hashed_like_any_other_bytes():
    """nginx logs at most 256 bytes of the header, as JSON escapes (a NUL as \\u0000); the
    parser hashes at most 256 characters whatever they are, and rejects a key that is no
    string."""
    huge = "\0" + "x" * 10_000

    capped = parse(key=huge)

    assert re.fullmatch(r"[0-9a-f]{16}", capped.key)
    assert capped.key == parse(key=huge[:256]).key != parse(key=huge[:255]).key
    assert parse(key="\0").key not in ("", parse(key="").key, parse(key="\1").key)
    assert len(capped.to_member()) < 300
    with pytest.raises(SampleError, match="key must be str"):
        parse(key=7)
    with pytest.raises(SampleError, match="upstream_header_time must be str"):
        parse(upstream_header_time=0.04)


def test_a_member_round_trips_and_one_stored_before_the_fields_still_loads():
    sample = parse(first_token="0.300", tokens="17")
    old = json.dumps([1.5, 200, 4.0, 3.0, 10, "200", "a:1", "POST", "/p", "r9"])
    older_than_tokens = json.dumps([1.5, 200, 4.0, 3.0, 10, "200", "a:1", "POST", "/p", "r9",
                                    "k", 2.0, 1])

    assert Sample.from_member(sample.to_member(), 41, "v1-triton", False) == sample
    loaded = Sample.from_member(old, 41, "v1-triton", False)
    assert (loaded.request_id, loaded.upstream_ms, loaded.key, loaded.header_ms,
            loaded.stream, loaded.first_ms, loaded.tokens) == ("r9", 3.0, "", None, False,
                                                              None, None)
    loaded = Sample.from_member(older_than_tokens, 41, "v1-triton", False)
    assert (loaded.key, loaded.header_ms, loaded.stream, loaded.first_ms,
            loaded.tokens) == ("k", 2.0, True, None, None)
    columns = Columns.of_members([old, older_than_tokens, sample.to_member()])
    assert np.array_equal(columns.first, [np.nan, np.nan, 300.0], equal_nan=True)
    assert np.array_equal(columns.tokens, [np.nan, np.nan, 17], equal_nan=True)


def test_the_first_token_and_the_token_count_are_read_where_the_router_times_them():
    sample = parse(first_token="0.300", tokens="17")

    assert (sample.first_ms, sample.tokens, sample.header_ms) == (300.0, 17, 40.0)
    # An answer that streamed nothing, and a line of a router that does not time tokens.
    assert (parse(first_token="", tokens="").first_ms, parse().tokens) == (None, None)
    # A count no answer has is capped; one that is no count is none.
    assert parse(tokens="9" * 40).tokens == samples.MAX_TOKENS
    assert parse(tokens="-3").tokens is None and parse(tokens="\uff11\uff12").tokens is None
    with pytest.raises(SampleError, match="tokens must be str"):
        parse(tokens=12)


def test_redis_keeps_the_hash_and_gives_back_the_fields(redis_prefix):
    now = time.time()
    line = {**LINE, "msec": now}
    store = samples.connect()

    samples.record([json.dumps(line), json.dumps({**line, "key": "", "request_id": "r2"})],
                   store=store, now=now)
    (found,) = samples.window(41, 60, now=now, store=store).values()

    assert [(s.request_id, len(s.key), s.header_ms, s.stream) for s in found] == [
        ("r1", 16, 40.0, True), ("r2", 0, 40.0, True)]
    stored = b"".join(m for k in store.scan_iter(f"{redis_prefix}:*")
                      if store.type(k) == b"zset" for m in store.zrange(k, 0, -1))
    assert b"r1" in stored and b"alice" not in stored
    for key in store.scan_iter(f"{redis_prefix}:*"):
        store.delete(key)
