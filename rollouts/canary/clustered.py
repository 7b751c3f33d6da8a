"""The numbers of a sticky A/B split, per user: plain numpy and scipy, no Django.

A split by a sticky header sends all of one user's requests to one variant, and a user's
requests are alike (a heavy user with long prompts is slow on either variant), so they are not
independent draws: judged per request, the intervals are too narrow and an A/A split says
"better" or "worse" far more often than ``alpha``. Here the unit is the user (the requests of
one sample ``key``, :func:`rollouts.traffic.sample_types.split_key`; a request without a key is
a user of its own), with cluster-robust variances:

* a quantile's standard error is Woodruff's, as :meth:`rollouts.canary.sequential.Sorted.
  quantile_se` reads it (resolution-aware: a recorded value spreads evenly over its step), with
  the variance of the share of requests below the quantile taken over users (the ratio
  estimator): ``k/(k-1) * sum_i (y_i - p m_i)^2 / M^2``, ``y_i`` the user's requests below,
  ``m_i`` its requests, ``M`` all of them, ``k`` the users;
* an error rate's variance is the same estimator over the users' failed requests; the
  difference's Newcombe interval (:func:`rollouts.canary.abtest.compare_errors`) is widened by the
  square root of the design effect (the variance over users against the per-request one);
* the sample needed is :func:`rollouts.canary.abtest.samples_needed` times the design effect of
  the median, and said in users too, at the requests a user made so far;
* the Mann-Whitney p-value compares the users' median latencies (one value a user).

A design effect below 1 is taken as 1: the intervals are never narrower than per request. Below
:data:`MIN_USERS` users on a side the variances over users are not trusted and the intervals are
unbounded (no difference is claimed), and a side's intervals use Student's t with one degree of
freedom fewer than the smaller side's users.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy import stats

from rollouts.canary import sequential
from rollouts.canary.abtest import VariantDifference, compare_errors, samples_needed
from rollouts.canary.arms import is_failure
from rollouts.canary.verdicts import Interval

# Fewer users than this on a side: no variance over users is trusted.
MIN_USERS = 10
_Z = 1.959963984540054  # Woodruff's 95% band, as sequential.Sorted.quantile_se


@dataclass(frozen=True)
class UserArm:
    """One side's requests by user: the answered requests' latencies (ms) and the user of each
    (``users``, an index), and per user the requests the error rate counts (answered or
    failed) and the failed ones; 4xx answers are counted apart (``client_errors``), as in
    :class:`rollouts.canary.judge.Arm`."""

    latencies: np.ndarray
    users: np.ndarray
    requests: np.ndarray
    failed: np.ndarray
    client_errors: int

    @property
    def errors(self) -> int:
        return int(self.failed.sum())

    @property
    def total(self) -> int:
        return len(self.latencies) + self.errors + self.client_errors

    @property
    def user_count(self) -> int:
        """Users with a request the error rate counts."""
        return int(np.count_nonzero(self.requests))

    @classmethod
    def of(cls, samples: Sequence[Any]) -> UserArm:
        """From route samples (``rollouts.traffic.sample_types.Sample``), grouped by ``key``."""
        index: dict[str, int] = {}
        latencies, answered_by, failed_by, client, k = [], [], [], 0, 0
        for s in samples:
            failed = is_failure(s.status, s.upstream_failed)
            if not failed and s.status >= 400:
                client += 1
                continue
            user = index.get(s.key) if s.key else None
            if user is None:  # a new key, or a request without one: a user of its own
                user, k = k, k + 1
                if s.key:
                    index[s.key] = user
            if failed:
                failed_by.append(user)
            else:
                latencies.append(s.latency_ms)
                answered_by.append(user)
        users = np.asarray(answered_by, dtype=np.int64)
        failed_at = np.asarray(failed_by, dtype=np.int64)
        failed = np.bincount(failed_at, minlength=k)
        return cls(np.asarray(latencies, dtype=float), users,
                   np.bincount(users, minlength=k) + failed, failed, client)


def share_variance(below: np.ndarray, sizes: np.ndarray) -> float:
    """The variance over users of the share ``sum(below) / sum(sizes)`` (the ratio estimator):
    ``k/(k-1) * sum_i (below_i - p sizes_i)^2 / M^2`` over the ``k`` users with requests."""
    kept = sizes > 0
    below, sizes = below[kept], sizes[kept]
    k, total = len(sizes), float(sizes.sum())
    if k < 2:
        return math.nan
    p = float(below.sum()) / total
    return k / (k - 1) * float(np.sum((below - p * sizes) ** 2)) / total**2


def _below(ordered: sequential.Sorted, values: np.ndarray, x: float) -> np.ndarray:
    """How much of each value lies at or below ``x``: 0 or 1, or, for values recorded in steps,
    the share of its step (``[v - step/2, v + step/2)``, never below 0) below ``x``."""
    if ordered.step <= 0:
        return (values <= x).astype(float)
    low = np.maximum(values - ordered.step / 2, 0.0)
    high = values + ordered.step / 2
    return np.clip((x - low) / (high - low), 0.0, 1.0)


@dataclass(frozen=True)
class UserQuantile:
    """A quantile of one side, its standard error over users (None: too few to trust), and the
    variance of the share of requests below it over users (at least the per-request one) and
    per request (both 0 when not trusted)."""

    estimate: float
    se: float | None
    variance: float = 0.0
    per_request: float = 0.0


def quantile_by_user(ordered: sequential.Sorted, arm: UserArm, q: float) -> UserQuantile:
    """The ``q`` quantile of ``arm``'s latencies (``ordered``, read with the step both sides
    share) with Woodruff's standard error on the variance over users of the share below it."""
    n = len(ordered)
    estimate = ordered.quantile(q)
    sizes = np.bincount(arm.users, minlength=len(arm.requests))
    if (n < sequential.MIN_FOR_QUANTILE or n * (1 - q) < sequential.TAIL_COUNT
            or np.count_nonzero(sizes) < MIN_USERS):
        return UserQuantile(estimate, None)
    below = np.bincount(arm.users, weights=_below(ordered, arm.latencies, estimate),
                        minlength=len(sizes))
    per_request = q * (1 - q) / n
    variance = max(share_variance(below, sizes), per_request)
    half = _Z * math.sqrt(variance)
    width = ordered.quantile(q + half) - ordered.quantile(q - half)
    # A floor: even identical values carry the uncertainty of their recording step.
    floor = (ordered.step or 0.0) / math.sqrt(12 * n) * math.sqrt(variance / per_request)
    return UserQuantile(estimate, max(width / (2 * _Z), floor, 1e-9), variance, per_request)


def design_effect(a: UserQuantile, b: UserQuantile) -> float:
    """How many times the per-request variance the difference of two sides' quantiles has
    over users (1 when either is not trusted)."""
    if a.se is None or b.se is None:
        return 1.0
    return (a.variance + b.variance) / (a.per_request + b.per_request)


@lru_cache(maxsize=1024)
def _multiplier(confidence: float, users: int) -> float:
    """Student's t for ``users - 1`` degrees of freedom (the normal's at many users)."""
    return float(stats.t.isf((1 - confidence) / 2, max(users - 1, 1)))


def quantile_difference(a: UserQuantile, b: UserQuantile, confidence: float,
                        users: int) -> Interval:
    """``a - b`` with an interval at ``confidence`` (unbounded when either error is unknown)."""
    estimate = a.estimate - b.estimate
    if a.se is None or b.se is None:
        return Interval(estimate, -math.inf, math.inf)
    half = _multiplier(confidence, users) * math.hypot(a.se, b.se)
    return Interval(estimate, estimate - half, estimate + half)


def rate_variances(arm: UserArm) -> tuple[float, float]:
    """The variance of ``arm``'s error rate over users, and per request (binomial)."""
    total = float(arm.requests.sum())
    p = arm.errors / total
    over_users = share_variance(arm.failed.astype(float), arm.requests.astype(float))
    return (0.0 if math.isnan(over_users) else over_users), p * (1 - p) / total


def error_difference(a: UserArm, b: UserArm, confidence: float, users: int) -> Interval:
    """The difference of the error rates (percentage points, ``a - b``): Newcombe's interval
    with its half-widths widened by the root of the design effect over users."""
    plain = compare_errors(a.errors, int(a.requests.sum()), b.errors, int(b.requests.sum()),
                           confidence).difference_pct
    if users < MIN_USERS:
        return Interval(plain.estimate, -math.inf, math.inf)
    (users_a, plain_a), (users_b, plain_b) = rate_variances(a), rate_variances(b)
    per_request = plain_a + plain_b
    effect = max((users_a + users_b) / per_request, 1.0) if per_request > 0 else 1.0
    # t for few users, as the quantiles: the normal quantile Newcombe used, replaced.
    normal = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    widen = math.sqrt(effect) * _multiplier(confidence, users) / normal
    return Interval(plain.estimate, plain.estimate - widen * (plain.estimate - plain.low),
                    plain.estimate + widen * (plain.high - plain.estimate))


def user_medians(arm: UserArm) -> np.ndarray:
    """Each user's median latency (users with an answered request)."""
    if not len(arm.latencies):
        return arm.latencies
    order = np.lexsort((arm.latencies, arm.users))
    values = arm.latencies[order]
    counts = np.bincount(arm.users)
    counts = counts[counts > 0]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return (values[starts + (counts - 1) // 2] + values[starts + counts // 2]) / 2


def ab_difference_by_user(
    variant: str, a: UserArm, reference: str, b: UserArm, *, effect_pct: float = 5.0,
    alpha: float = 0.05, power: float = 0.8, confidence: float = 0.95,
) -> VariantDifference:
    """:func:`rollouts.canary.abtest.ab_difference`'s numbers with the user as the unit:
    intervals over users, the sample needed inflated by the design effect of the median (in
    requests and users), the Mann-Whitney p-value on the users' median latencies."""
    if len(a.latencies) < 2 or len(b.latencies) < 2:
        raise ValueError("each variant needs at least 2 samples")
    step = max(sequential.resolution(a.latencies), sequential.resolution(b.latencies))
    sa, sb = sequential.Sorted(a.latencies, step), sequential.Sorted(b.latencies, step)
    users = min(a.user_count, b.user_count)
    p50a, p50b = quantile_by_user(sa, a, 0.50), quantile_by_user(sb, b, 0.50)
    p95a, p95b = quantile_by_user(sa, a, 0.95), quantile_by_user(sb, b, 0.95)
    effect = design_effect(p50a, p50b)
    needed = math.ceil(samples_needed(b.latencies, effect_pct, alpha, power) * effect)
    have = min(len(a.latencies), len(b.latencies))
    per_user = (len(a.latencies) + len(b.latencies)) / max(a.user_count + b.user_count, 1)
    ma, mb = user_medians(a), user_medians(b)
    p_value = math.nan
    if len(ma) >= 2 and len(mb) >= 2:
        p_value = float(stats.mannwhitneyu(ma, mb, method="asymptotic").pvalue)
    enough = have >= needed and users >= MIN_USERS
    return VariantDifference(
        variant=variant, reference=reference, samples=len(a.latencies),
        reference_samples=len(b.latencies),
        p50_diff_ms=quantile_difference(p50a, p50b, confidence, users),
        p95_diff_ms=quantile_difference(p95a, p95b, confidence, users),
        error_diff_pct=error_difference(a, b, confidence, users),
        latency_p_value=p_value, enough=enough, more_needed=0 if enough else max(needed - have, 0),
        unit="user", users=a.user_count, reference_users=b.user_count,
        design_effect=round(effect, 3),
        more_users_needed=0 if enough else max(
            max(math.ceil(needed / per_user), MIN_USERS) - users, 1),
    )
