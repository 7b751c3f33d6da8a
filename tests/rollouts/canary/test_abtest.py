"""The numbers of an A/B split (rollouts/canary/abtest.py, and per user rollouts/canary/clustered.py)
on simulated request samples: log-normal latencies around 5 ms (sigma 0.3), each test from its
own seeded generator."""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np
import pytest

from rollouts.canary import clustered, sequential
from rollouts.canary.abtest import (
    VariantDifference,
    ab_difference,
    classify,
    compare_errors,
    quantile_difference,
    samples_needed,
)
from rollouts.canary.analysis import ab_verdict
from rollouts.canary.clustered import UserArm, ab_difference_by_user
from rollouts.models import Deployment, ModelVersion, Rollout
from rollouts.traffic.sample_types import Sample


def latencies(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    return rng.lognormal(math.log(5.0), 0.3, n) * scale


def test_the_error_interval_and_test_agree_with_the_counts():
    worse = compare_errors(50, 1000, 10, 1000)
    same = compare_errors(10, 1000, 10, 1000)

    assert worse.canary_rate_pct == 5.0 and worse.baseline_rate_pct == 1.0
    assert worse.difference_pct.low > 0 and worse.p_value < 1e-6
    assert same.difference_pct.low < 0 < same.difference_pct.high and same.p_value > 0.4


def test_an_ab_split_between_equal_variants_shows_no_difference():
    rng = np.random.default_rng(19)

    result = ab_difference("v2", latencies(rng, 3000), 30, "v1", latencies(rng, 3000), 30)

    assert result.p50_diff_ms.low < 0 < result.p50_diff_ms.high
    assert result.p95_diff_ms.low < 0 < result.p95_diff_ms.high
    assert result.error_diff_pct.low < 0 < result.error_diff_pct.high
    assert result.latency_p_value > 0.01
    assert result.enough and result.more_needed == 0


def test_an_ab_split_with_a_real_difference_has_its_sign_and_an_interval_without_zero():
    rng = np.random.default_rng(20)

    faster = ab_difference("v2", latencies(rng, 3000, 0.8), 30, "v1", latencies(rng, 3000), 30)

    assert faster.p50_diff_ms.high < 0  # v2 is faster: its p50 minus v1's is negative
    assert faster.p50_diff_ms.estimate == pytest.approx(-1.0, abs=0.2)
    assert faster.latency_p_value < 1e-6


def test_too_small_an_ab_sample_says_how_many_more_requests_it_needs():
    rng = np.random.default_rng(21)
    baseline = latencies(rng, 200)

    small = ab_difference("v2", latencies(rng, 200), 2, "v1", baseline, 2, effect_pct=2)
    needed = samples_needed(baseline, 2)

    assert not small.enough
    assert small.more_needed == needed - 200 > 0
    # Half the effect needs about four times the sample.
    assert samples_needed(baseline, 1) == pytest.approx(4 * needed, rel=0.01)


def _rounded(rng, n, scale=1.0):
    x = latencies(rng, n, scale)
    return np.floor(x + rng.random(n))


def test_an_aa_split_says_no_difference_at_the_stated_rate_on_millisecond_samples():
    """300 A/A splits of 2,000 requests a variant, recorded in whole milliseconds, judged as
    the rollout does (each interval at 1 - alpha/3): "none" at least 1 - alpha of the time,
    where intervals without the minimum effect said "better" or "worse" far more often."""
    rng = np.random.default_rng(30)
    verdicts, naive = [], 0
    for _ in range(300):
        a, b = _rounded(rng, 2000), _rounded(rng, 2000)
        diff = ab_difference("v2", a, 2, "v1", b, 2, confidence=1 - 0.05 / 3)
        verdicts.append(classify(diff, float(np.median(b)), float(np.quantile(b, 0.95)), 5.0, 0.2))
        loose = ab_difference("v2", a, 2, "v1", b, 2, confidence=0.95)
        naive += classify(loose, 1.0, 1.0, 0.0, 0.0) != "none"
    assert verdicts.count("none") >= 0.95 * 300, {v: verdicts.count(v) for v in set(verdicts)}
    assert naive > verdicts.count("better") + verdicts.count("worse")


def test_a_difference_counts_only_beyond_the_minimum_effect():
    rng = np.random.default_rng(31)
    b = _rounded(rng, 20000)

    faster = ab_difference("v2", _rounded(rng, 20000, 0.8), 10, "v1", b, 10, confidence=0.98)
    slightly = ab_difference("v2", _rounded(rng, 20000, 0.98), 10, "v1", b, 10, confidence=0.98)
    errors = ab_difference("v2", _rounded(rng, 20000), 400, "v1", b, 10, confidence=0.98)

    ref = float(np.median(b)), float(np.quantile(b, 0.95))
    assert classify(faster, *ref, 5.0, 0.2) == "better"
    assert classify(slightly, *ref, 5.0, 0.2) == "none"  # 2% faster: below the 5% that counts
    assert classify(slightly, *ref, 0.0, 0.2) == "better"  # ... which a zero minimum would call
    assert classify(errors, *ref, 5.0, 0.2) == "worse"  # 2% errors against 0.05%


# --------------------------------------------------------------------------------------------
# Sticky splits, judged per user (rollouts/canary/clustered.py)
# --------------------------------------------------------------------------------------------


def sticky_arm(rng: np.random.Generator, users: int, scale: float = 1.0) -> UserArm:
    """One variant of a sticky split: ``users`` users of 1 to 20 requests each, whose latencies
    are log-normal around 5 ms (sigma 0.3) times a factor of the user's own (log-normal, sigma
    0.5: a heavy user is slow on either variant) times ``scale``, recorded in whole ms; each user
    fails a share of its requests of its own (beta, mean 1%), its first ones."""
    counts = rng.integers(1, 21, users)
    user = np.repeat(np.arange(users), counts)
    factor = rng.lognormal(0.0, 0.5, users)
    ms = np.floor(latencies(rng, len(user), scale) * factor[user] + rng.random(len(user)))
    failed = rng.binomial(counts, rng.beta(0.5, 49.5, users))
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    answered = np.arange(len(user)) - first[user] >= failed[user]
    return UserArm(ms[answered], user[answered], counts, failed, 0)


def judged(a: UserArm, b: UserArm, per_user: bool, confidence: float = 1 - 0.05 / 3) -> str:
    """The verdict ab_verdict gives (5% latency, 0.2 points of errors): per user, or on
    ab_difference's per-request intervals, as if the split were not sticky (its p-value and
    sample size, which no verdict reads, left out to keep 1,000 runs quick)."""
    if per_user:
        diff = ab_difference_by_user("v2", a, "v1", b, confidence=confidence)
    else:
        step = max(sequential.resolution(a.latencies), sequential.resolution(b.latencies))
        sa, sb = sequential.Sorted(a.latencies, step), sequential.Sorted(b.latencies, step)
        errors = compare_errors(a.errors, len(a.latencies) + a.errors, b.errors,
                                len(b.latencies) + b.errors, confidence)
        diff = VariantDifference(
            "v2", "v1", len(a.latencies), len(b.latencies),
            quantile_difference(sa, sb, 0.50, confidence),
            quantile_difference(sa, sb, 0.95, confidence), errors.difference_pct, math.nan,
            False, 0)
    ref = float(np.median(b.latencies)), float(np.quantile(b.latencies, 0.95))
    return classify(diff, *ref, 5.0, 0.2)


def test_sticky_aa_splits_judged_per_user_say_no_difference_at_the_stated_rate():
    """1,000 A/A sticky splits of 200 users a variant (about 4,000 requests): judged per user,
    "none" at least 1 - alpha of the time; judged per request, the users' own speeds (which
    variant drew the heavy users) pass for a difference far more often."""
    rng = np.random.default_rng(40)
    runs, alpha = 1000, 0.05
    per_user, per_request = collections.Counter(), collections.Counter()
    for _ in range(runs):
        a, b = sticky_arm(rng, 200), sticky_arm(rng, 200)
        per_user[judged(a, b, True)] += 1
        per_request[judged(a, b, False)] += 1

    said_user = 1 - per_user["none"] / runs
    said_request = 1 - per_request["none"] / runs
    shown = f"per user {dict(per_user)}, per request {dict(per_request)} of {runs}"
    assert per_user["none"] / runs >= 1 - alpha, f"'none' below 1 - alpha = {1 - alpha}: {shown}"
    assert said_request > max(2 * said_user, 0.10), shown


def test_a_variant_30_percent_slower_for_every_user_is_found_worse_per_user():
    """200 sticky splits of 300 users a variant whose candidate is 30% slower for every user:
    judged per user, "worse" at least 90% of the time."""
    rng = np.random.default_rng(41)
    runs = 200
    found = collections.Counter(
        judged(sticky_arm(rng, 300, 1.3), sticky_arm(rng, 300), True) for _ in range(runs))

    assert found["worse"] >= 0.9 * runs, dict(found)
    # The sample was big enough to see 30%, not 5%: and says how many more users 5% needs.
    a, b = sticky_arm(rng, 300, 1.3), sticky_arm(rng, 300)
    wide = ab_difference_by_user("v2", a, "v1", b, effect_pct=30)
    narrow = ab_difference_by_user("v2", a, "v1", b, effect_pct=5)
    plain = ab_difference("v2", a.latencies, a.errors, "v1", b.latencies, b.errors, effect_pct=5)
    assert wide.enough and wide.more_needed == wide.more_users_needed == 0
    assert not narrow.enough and narrow.more_users_needed > 300
    # A user's ten-odd requests, alike, are worth a few independent ones: the sample needed
    # grows by the design effect, so what per request looks enough is not.
    assert plain.enough and narrow.design_effect > 3
    needed = min(len(a.latencies), len(b.latencies)) + narrow.more_needed
    assert needed == pytest.approx(samples_needed(b.latencies, 5) * narrow.design_effect, rel=1e-3)


def test_requests_without_a_key_are_users_of_their_own_and_judged_as_per_request():
    rng = np.random.default_rng(42)
    a, b = _rounded(rng, 3000), _rounded(rng, 3000)

    def alone(values: np.ndarray, errors: int) -> UserArm:
        n = len(values)
        return UserArm(values, np.arange(n), np.r_[np.ones(n, int), np.ones(errors, int)],
                       np.r_[np.zeros(n, int), np.ones(errors, int)], 0)

    users = ab_difference_by_user("v2", alone(a, 30), "v1", alone(b, 30))
    requests = ab_difference("v2", a, 30, "v1", b, 30)

    assert (users.unit, users.users, users.reference_users) == ("user", 3030, 3030)
    for name in ("p50_diff_ms", "p95_diff_ms", "error_diff_pct"):
        mine, theirs = getattr(users, name), getattr(requests, name)
        assert mine.estimate == pytest.approx(theirs.estimate)
        assert mine.high - mine.low == pytest.approx(theirs.high - theirs.low, rel=0.02), name
    assert users.design_effect == pytest.approx(1.0)


def test_a_users_requests_are_grouped_by_key_and_counted_as_ab_verdict_counts_them():
    def sample(key: str, status: int = 200, ms: float = 5.0, upstream: str = "200") -> Sample:
        return Sample(1.0, 1, "v1", False, status, ms, ms, 10, upstream, "a", "POST", "/", "r",
                      key=key)

    arm = UserArm.of([sample("k1"), sample("k1", ms=7.0), sample("k2"),
                      sample("k1", 502, upstream="502"), sample(""), sample(""),
                      sample("k2", 404), sample("k3", 200, upstream="")])

    # k1: two answered and a 502; k2: one answered (its 404 is a client error); two requests
    # without a key, a user each; k3's request reached no server, a failure.
    assert arm.user_count == 5 and arm.client_errors == 1 and arm.errors == 2
    assert arm.latencies.tolist() == [5.0, 7.0, 5.0, 5.0, 5.0]
    assert arm.users.tolist() == [0, 0, 1, 2, 3]
    assert arm.requests.tolist() == [3, 1, 1, 1, 1] and arm.failed.tolist() == [1, 0, 0, 0, 1]
    assert clustered.user_medians(arm).tolist() == [6.0, 5.0, 5.0, 5.0]


def test_a_sticky_rollouts_verdict_is_per_user_and_says_how_many_users_each_side_had():
    """ab_verdict on a rollout with a sticky header: its rows are per user, with each side's
    users (40 keys of 10 requests; a request without a key is a user of its own); without the
    header, the same requests are judged per request."""
    rng = np.random.default_rng(43)

    def side(version: int, keys: int, unkeyed: int) -> list[Sample]:
        factor = rng.lognormal(0.0, 0.5, keys)
        found = [Sample(float(i), 1, f"v{version}-triton", False, 200,
                        float(np.floor(5 * factor[i % keys] + rng.random())), None, 10, "200",
                        "a", "POST", "/", f"r{i}", key=f"user-{i % keys}")
                 for i in range(10 * keys)]
        return found + [dataclasses.replace(s, key="") for s in found[:unkeyed]]

    by_version = {1: side(1, 40, 0), 2: side(2, 40, 5)}
    rollout = Rollout(strategy=Rollout.Strategy.AB, baseline=ModelVersion(version=1),
                      deployment=Deployment(slo_p99_ms=500, slo_error_rate=1),
                      variants=[{"version": 1, "weight": 50}, {"version": 2, "weight": 50}],
                      sticky_header="X-User")

    verdict = ab_verdict(rollout, by_version)
    (row,) = verdict["variants"]
    assert (row["unit"], row["users"], row["reference_users"]) == ("user", 45, 40)
    assert (row["samples"], row["reference_samples"]) == (405, 400)
    assert row["design_effect"] > 1 and row["more_users_needed"] > 0
    assert verdict["summary"].endswith("judged per user of X-User (v1 40, v2 45 users)")

    rollout.sticky_header = ""
    (plain,) = ab_verdict(rollout, by_version)["variants"]
    assert (plain["unit"], plain["users"], plain["design_effect"]) == ("request", None, 1.0)
    # Sticky, but no request has a key (an Envoy gateway's lines): per request, and says so.
    rollout.sticky_header = "X-User"
    keyless = {n: [dataclasses.replace(s, key="") for s in found] for n, found in by_version.items()}
    verdict = ab_verdict(rollout, keyless)
    assert verdict["variants"][0]["unit"] == "request" and "per user" not in verdict["summary"]
    # Per request the intervals are narrower: ten alike requests passed for ten draws.
    assert row["p50_diff_ms"]["high"] - row["p50_diff_ms"]["low"] > (
        plain["p50_diff_ms"]["high"] - plain["p50_diff_ms"]["low"])
