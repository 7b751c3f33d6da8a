"""Anytime-valid bounds: the statistics under every look of the canary judge, plain numpy and
scipy, no Django.

A canary is looked at every tick while its requests arrive, as many times as the rollout lasts,
so a bound that holds at one planned look only would raise false alarms (peeking). The bounds
here are **confidence sequences**: for an estimate that is approximately normal with variance
``V`` (shrinking as samples arrive), the one-sided normal-mixture martingale of Robbins (a
half-normal mixture over the effect, with scale ``tau``) crosses ``1/alpha`` with probability at
most ``alpha`` over *all* looks (Ville's inequality), so "the effect exceeds ``theta0``" may be
claimed the first time its mixture ratio at ``theta0`` reaches ``1/alpha``, whenever and however
often one looks. Inverted, this gives a lower bound (and, mirrored, an upper bound) that is
valid at every look at once: :func:`bound_multiplier`. The normality is asymptotic (the
"asymptotic confidence sequences" of Waudby-Smith et al.); its error rates on latency-shaped and
rounded data are measured by ``bench/judge.py``.

Quantiles are read **resolution-aware**: latencies a router logs in whole milliseconds are
tied, and the plain sample median of tied data moves in whole steps (a 7% slowdown at a 5 ms
median does not move it at all). :func:`resolution` finds the step the data are recorded in,
and :func:`quantile` spreads each recorded value evenly over its step (the expected quantile of
the data "jittered" back to continuous), so shifts finer than the step still show. The
standard error of a quantile is Woodruff's: the quantiles at ``q +- z sqrt(q(1-q)/n)``, whose
distance is read off the data, not a density guessed for them.
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

# Below this many values, a quantile's standard error is not trusted (the test says "not yet").
MIN_FOR_QUANTILE = 10
# A quantile q needs at least this many values above it (n (1 - q) >= TAIL_COUNT) before its
# standard error is trusted: the p99 from 200 requests rests on two of them.
TAIL_COUNT = 5


# --------------------------------------------------------------------------------------------
# The boundary
# --------------------------------------------------------------------------------------------


def log_mixture_ratio(z: float, rho: float) -> float:
    """The logarithm of the one-sided normal-mixture likelihood ratio at standardised distance
    ``z`` from the null (``(estimate - theta0) / sqrt(V)``), mixing scale ``rho = tau**2 / V``."""
    a = rho / (1.0 + rho)
    return float(math.log(2.0) - 0.5 * math.log1p(rho) + 0.5 * a * z * z
                 + stats.norm.logcdf(math.sqrt(a) * z))


@lru_cache(maxsize=4096)
def _multiplier(log_rho: float, alpha: float) -> float:
    rho = math.exp(log_rho)
    target = math.log(1.0 / alpha)
    return float(optimize.brentq(lambda z: log_mixture_ratio(z, rho) - target, 0.0, 1e5,
                                 xtol=1e-6))


def bound_multiplier(variance: float, tau: float, alpha: float) -> float:
    """How many standard errors from the estimate the anytime-valid one-sided bound lies, at
    ``alpha``, for an estimate of ``variance`` and a mixture of scale ``tau`` (the size of
    effect the boundary is tightest for). Rounded to 1/20 on the log scale of ``rho`` so a busy
    judge solves each boundary once."""
    rho = tau * tau / max(variance, 1e-300)
    log_rho = round(math.log(min(max(rho, 1e-6), 1e12)) * 20) / 20
    return _multiplier(log_rho, round(alpha, 12))


# --------------------------------------------------------------------------------------------
# Resolution-aware quantiles
# --------------------------------------------------------------------------------------------


def resolution(values: np.ndarray) -> float:
    """The step the values are recorded in (1.0 for whole milliseconds, 0.001 for nginx's
    ``request_time`` in seconds read as ms), or 0.0 when they look continuous: a step is found
    when the values fall on a grid of their smallest gap and repeat (fewer distinct values than
    half the count)."""
    return _step_of(np.unique(values), len(values))


def _step_of(distinct: np.ndarray, n: int) -> float:
    if n < 2 or len(distinct) < 2 or len(distinct) * 2 > n:
        return 0.0
    step = float(np.min(np.diff(distinct)))
    if step <= 0:
        return 0.0
    on_grid = np.abs(distinct / step - np.round(distinct / step)) < 1e-6
    return step if bool(on_grid.all()) else 0.0


class Sorted:
    """Values sorted once (as distinct values and their counts), with their recording step,
    for every quantile asked of them."""

    __slots__ = ("_n", "below", "counts", "distinct", "step", "values")

    def __init__(self, values: np.ndarray, step: float | None = None) -> None:
        self.distinct, self.counts = np.unique(np.asarray(values, dtype=float), return_counts=True)
        self._n = int(self.counts.sum())
        self.below = np.concatenate(([0], np.cumsum(self.counts)[:-1])) if self._n else self.counts
        self._read_with(_step_of(self.distinct, self._n) if step is None else step)

    def _read_with(self, step: float) -> None:
        # Continuous values are read in full (np.quantile); values on a step by their counts.
        self.step = step
        self.values = np.repeat(self.distinct, self.counts) if step <= 0 else self.distinct

    def with_step(self, step: float) -> Sorted:
        """The same values read with another recording step (the other side's coarser one)."""
        other = copy.copy(self)
        other._read_with(step)
        return other

    def __len__(self) -> int:
        return self._n

    def quantile(self, q: float) -> float:
        """The ``q`` quantile; tied values spread evenly over their recording step (a value
        ``v`` stands for ``[v - step/2, v + step/2)``, never below 0)."""
        n = self._n
        q = min(max(q, 0.0), 1.0)
        if self.step <= 0:
            return float(np.quantile(self.values, q))
        rank = q * n
        j = int(np.searchsorted(self.below + self.counts, rank, side="right"))
        j = min(j, len(self.distinct) - 1)
        low = max(self.distinct[j] - self.step / 2, 0.0)
        high = self.distinct[j] + self.step / 2
        fraction = min(max((rank - self.below[j]) / self.counts[j], 0.0), 1.0)
        return float(low + (high - low) * fraction)

    def quantile_se(self, q: float) -> float | None:
        """Woodruff's standard error of the ``q`` quantile, or None when the values are too
        few to trust it (fewer than :data:`MIN_FOR_QUANTILE`, or fewer than
        :data:`TAIL_COUNT` above ``q``)."""
        n = self._n
        if n < MIN_FOR_QUANTILE or n * (1 - q) < TAIL_COUNT:
            return None
        z = 1.959963984540054
        half = z * math.sqrt(q * (1 - q) / n)
        width = self.quantile(q + half) - self.quantile(q - half)
        # A floor: even identical values carry the uncertainty of their recording step.
        floor = (self.step or 0.0) / math.sqrt(12 * n)
        return max(width / (2 * z), floor, 1e-9)


# --------------------------------------------------------------------------------------------
# Proportions
# --------------------------------------------------------------------------------------------


def proportion_variance(count: int, n: int) -> float:
    """The variance of a proportion's estimate, with one success and one failure added
    (Agresti-Caffo), so that no errors in a few requests is not taken for certainty."""
    p = (count + 1) / (n + 2)
    return p * (1 - p) / (n + 2)


def log_moments(ordered: Sorted, threshold: float) -> tuple[int, float, float]:
    """How many values are above ``threshold``, and the mean and variance of their logarithms
    (recorded values as they are: a value tied at the threshold's step counts when above it)."""
    if ordered.step > 0:
        values, weights = ordered.distinct, ordered.counts
    else:
        values, weights = ordered.values, np.ones(len(ordered.values))
    above = values > max(threshold, 1e-9)
    k = int(weights[above].sum())
    if k < 2:
        return k, 0.0, 0.0
    logs, w = np.log(values[above]), weights[above]
    mean = float(np.average(logs, weights=w))
    var = float(np.sum(w * (logs - mean) ** 2) / (k - 1))
    return k, mean, var
