"""The judge: is a canary worse than its baseline, on the same window of real requests? A pure
function over per-request samples and a config (:func:`judge`), no Django; an analysis look
(:func:`rollouts.canary.analysis.look`) hands it the canary's and the baseline's requests and
keeps everything it answers.

What it judges, as users feel it (each a *metric*, with its own tolerance):

* ``median``: the canary's median latency over the baseline's, as a ratio (``+7%``); on a
  shadow (copies of the same requests on both sides) ``paired`` instead: each request's time
  on the canary over its own time on the baseline (:func:`paired_ratio`);
* ``tail``: the geometric mean of the requests slower than the baseline's p95, canary over
  baseline (a version slow for one request in fifty shows here, not in the median); every
  request in the tail counts, so it sees a tail regression far sooner than a p99 would;
* ``tail99``: the share of the canary's requests slower than the baseline's p99, over the
  baseline's own share (about 1 in 100): a version whose slowest hundredth grew slower moves
  requests past that line long before a p99 can be told apart (:func:`share_ratio`);
* ``errors``: the canary's error rate against what is allowed, the baseline's rate times
  ``1 + error_ratio_pct/100`` plus ``error_tolerance_pct`` points. Errors are 5xx answers,
  answers no server gave, and timeouts (408, 499, 504); 4xx answers are the client's and are
  counted apart. Only answered requests (below 400) and timed-out ones (at least as slow as
  they waited) enter the latency metrics (:class:`rollouts.canary.arms.Arm`), so fast
  failures cannot make a canary look fast, nor do requests that never end drop out;
* on an LLM route (``streamed``), ``ttft`` and ``tpot``: the streamed answers' time to the first
  token and per output token after it, median over median (:func:`streamed_ratio`); without
  token counts from the router, ``generation`` (the time after the first token) for ``tpot``.

And the SLO gates: the canary alone against the ceilings set (p50/p95/p99 in ms, error rate in
percent), failing it when it is *shown* above one.

How (see :mod:`rollouts.canary.sequential`): every metric's estimate gets a lower and an upper
bound that hold at every look at once (a confidence sequence), so the judge may look every
second from the first requests on. **One error budget**: ``alpha`` is the chance, over the
whole analysis, of failing a canary that is within every tolerance; it is split evenly over the
metrics and gates judged (and over the fresh starts ``failure_limit`` allows), and each lower
bound is drawn at its share. A pass needs every metric within, so each upper bound is drawn at
``alpha`` alone (:meth:`JudgeConfig.alpha_within`): a wrong pass stays under ``alpha`` too.
The verdict never contradicts the bounds:

* ``fail`` when a metric's lower bound is beyond its tolerance (or a gate's beyond its ceiling);
* ``within`` (``Judgement.within``) when the median's and the errors' upper bounds are within
  their tolerances: the canary is shown to be at most that much worse; the analysis step
  decides what to do with it. The tail is a guard: it fails a canary whose slowest requests
  are shown beyond its tolerance, but does not hold a pass (on the demo's real tail, 10,000
  requests a side bound it only to about +-10%, and a p99 ratio to about +-20%); the last
  analysis step alone waits for ``tail99``'s upper bound to be under :data:`SHARE_HOLD_PCT`
  (:func:`rollouts.canary.policy.tail_bounded`);
* otherwise no verdict yet; and a tolerance finer than the data's recording step can resolve
  (0.2 ms at a 4 ms median with whole-millisecond samples) is said so, and never passes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rollouts.canary import sequential
from rollouts.canary.arms import Arm
from rollouts.canary.verdicts import FAIL, GUARDS, INCONCLUSIVE, Judgement, Metric, describe
from rollouts.canary.verdicts import PASS as PASS  # re-exported: the judge's verdicts
from rollouts.traffic.columns import Columns, ended_since

# The mixture of each bound is tightest for effects about this many times its tolerance: large
# enough that a gross regression is stopped after a handful of requests, small enough that the
# tolerance itself is shown within a few hundred.
TAU_FACTOR = 2.0
# A metric's tolerance in ms must be at least this share of the data's recording step to be
# resolved (the spreading of ties over their step is exact for a flat density within a step).
RESOLVABLE_SHARE = 0.1
# The fewest answered requests a side before latency is judged at all.
MIN_LATENCY_SAMPLES = sequential.MIN_FOR_QUANTILE
# The tail metric compares the requests slower than the baseline's p95; the share metric
# counts the requests slower than its p99.
TAIL_FROM = 0.95
SHARE_FROM = 0.99
# The last analysis step holds its pass until the canary's share past the baseline's p99 is
# shown at most this many percent above the baseline's own (at most twice it): a version whose
# slowest hundredth grew much slower moves about twice the requests past that line, so it is
# kept collecting until ``tail99`` shows it beyond its tolerance, where a pass on the median and
# the errors alone would promote it first. The same share is what the ``tail99`` bounds are
# tightest for (the mixture's scale), since it is the effect they must catch.
SHARE_HOLD_PCT = 100.0
SHARE_TAU = math.log1p(SHARE_HOLD_PCT / 100)


@dataclass(frozen=True)
class JudgeConfig:
    """How a canary is judged.

    ``latency_tolerance_pct``: how much slower its median may be; ``tail_tolerance_pct``: its
    requests slower than the baseline's p95, on average (geometric); ``error_tolerance_pct`` (points) and ``error_ratio_pct`` (percent of the
    baseline's rate): how many more errors it may have. ``alpha``: the chance of failing a
    canary within every tolerance, over every look; ``fresh_starts``: how many times the
    analysis may start again on a fresh window (each gets its share of ``alpha``).
    ``max_*``: the SLO ceilings (None: not gated).
    """

    latency_tolerance_pct: float = 5.0
    tail_tolerance_pct: float = 10.0
    error_tolerance_pct: float = 0.2
    error_ratio_pct: float = 100.0
    alpha: float = 0.05
    fresh_starts: int = 1
    max_p50_ms: float | None = None
    max_p95_ms: float | None = None
    max_p99_ms: float | None = None
    max_error_rate: float | None = None
    streamed: bool = False
    ttft_tolerance_pct: float = 10.0
    generation_tolerance_pct: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError("alpha must be between 0 and 0.5")
        if min(self.latency_tolerance_pct, self.tail_tolerance_pct, self.error_tolerance_pct,
               self.error_ratio_pct) < 0:
            raise ValueError("tolerances cannot be negative")
        if self.fresh_starts < 1:
            raise ValueError("fresh_starts must be at least 1")

    def gates(self) -> list[tuple[str, float | None, float]]:
        """The SLO gates set: (name, quantile or None for the error rate, ceiling)."""
        out = [(f"p{round(q * 100)}", q, limit) for q, limit in
               ((0.50, self.max_p50_ms), (0.95, self.max_p95_ms), (0.99, self.max_p99_ms))
               if limit is not None]
        if self.max_error_rate is not None:
            out.append(("error rate", None, self.max_error_rate))
        return out

    def alpha_per_test(self, with_baseline: bool = True) -> float:
        """Each bound's share of the budget: ``alpha`` over the fresh starts and the tests
        (with a baseline: the median, the tail, the share past the baseline's p99, the errors
        and the recent window, and on a ``streamed`` (LLM) route the time to first token and
        the time per output token, or the generation time where tokens are not counted)."""
        tests = ((7 if self.streamed else 5) if with_baseline else 0) + len(self.gates())
        return self.alpha / self.fresh_starts / max(tests, 1)

    def alpha_within(self) -> float:
        """Each upper bound's level: ``alpha`` over the fresh starts only. A pass needs every
        metric it rests on shown within (an intersection-union test, Berger 1982): a version
        beyond one tolerance passes only if that metric's own upper bound is wrong, so each
        upper bound at ``alpha`` keeps a wrong pass under ``alpha``, while the lower bounds, any
        one of which fails the canary, share ``alpha`` between them."""
        return self.alpha / self.fresh_starts


def block_alpha(alpha: float, block: int) -> float:
    """The recent window's share for its ``block``-th minute (1, 2, ...): ``alpha`` times
    6 / (pi^2 k^2), which sums to ``alpha`` over every block however long the analysis runs."""
    return alpha * 6 / (math.pi ** 2 * max(block, 1) ** 2)


@dataclass(frozen=True)
class Levels:
    """A look's two levels: ``fail``, each lower bound's share of the budget
    (:meth:`JudgeConfig.alpha_per_test`), and ``within``, each upper bound's
    (:meth:`JudgeConfig.alpha_within`)."""

    fail: float
    within: float

    def of_block(self, block: int) -> Levels:
        """Both levels for the ``block``-th block of a sliding look (:func:`block_alpha`)."""
        return Levels(block_alpha(self.fail, block), block_alpha(self.within, block))


def _bounded(name: str, unit: str, estimate: float, variance: float, tolerance: float,
             tau: float, levels: Levels, canary: float | None, baseline: float | None,
             note: str = "", resolved: bool = True) -> Metric:
    """The metric with its lower bound at ``levels.fail``, its upper bound at
    ``levels.within``, and its state."""
    sd = math.sqrt(max(variance, 1e-300))
    low = estimate - sequential.bound_multiplier(variance, tau, levels.fail) * sd
    high = estimate + sequential.bound_multiplier(variance, tau, levels.within) * sd
    if low > tolerance:
        state = FAIL
    elif not resolved:
        state = "unresolved"
    elif high <= tolerance:
        state = "within"
    else:
        state = "open"
    distance = (estimate - tolerance) / sd
    log_ratio = (sequential.log_mixture_ratio(distance, tau * tau / max(variance, 1e-300))
                 if distance > 0 else 0.0)
    evidence = min(max(log_ratio, 0.0) / math.log(1 / levels.fail), 99.0)
    return Metric(name, unit, state, estimate, low, high, tolerance, canary, baseline,
                  evidence, note)


def _waiting(name: str, unit: str, tolerance: float, note: str) -> Metric:
    return Metric(name, unit, "waiting", None, None, None, tolerance, None, None, 0.0, note)


def quantile_ratio(name: str, q: float, canary: sequential.Sorted, baseline: sequential.Sorted,
                   tolerance_pct: float, levels: Levels) -> Metric:
    """The canary's ``q`` quantile over the baseline's, on the log scale (``unit`` log-ratio;
    :meth:`~rollouts.canary.verdicts.Metric.shown` gives it in percent)."""
    tolerance = math.log1p(tolerance_pct / 100)
    se_c, se_b = canary.quantile_se(q), baseline.quantile_se(q)
    if se_c is None or se_b is None:
        need = max(sequential.MIN_FOR_QUANTILE, math.ceil(sequential.TAIL_COUNT / (1 - q)))
        return _waiting(name, "log-ratio", tolerance,
                        f"needs {need} answered requests a side (has {len(canary)} and {len(baseline)})")
    step = max(canary.step, baseline.step)
    floor = step / 4 if step > 0 else 1e-6
    qc, qb = max(canary.quantile(q), floor), max(baseline.quantile(q), floor)
    variance = (se_c / qc) ** 2 + (se_b / qb) ** 2
    tolerance_ms = qb * tolerance_pct / 100
    resolved = step == 0 or tolerance_ms >= RESOLVABLE_SHARE * step
    note = "" if resolved else (
        f"{tolerance_pct:g}% of {qb:.3g} ms is {tolerance_ms:.2g} ms, finer than the "
        f"{step:g} ms the samples are recorded in can show")
    return _bounded(name, "log-ratio", math.log(qc / qb), variance, tolerance,
                    TAU_FACTOR * max(tolerance, 0.01), levels, qc, qb, note, resolved)


def paired_ratio(canary_ms: np.ndarray, baseline_ms: np.ndarray, tolerance_pct: float,
                 levels: Levels, step: float) -> Metric:
    """Each request's time on the canary over the same request's time on the baseline (a
    shadow's copy and its original), as the mean of the log ratios: the geometric mean of the
    per-request slowdowns (``unit`` log-ratio). Pairing takes out what both sides share (each
    request's own size, the server's load at that moment), so it sees a slowdown in far fewer
    requests than two independent samples do; on the log scale a copy that queued for
    seconds counts as one large ratio, not as a variance that swamps the rest. A time recorded
    as 0 in a ``step`` is read as half a step, not nothing (adding half a step to every time
    instead would pull each ratio towards 1: +5% at the demo's 5 ms median read as +4.6%),
    and the rounding's own variance (``step``² / 12 a side) is added, so identical
    whole-millisecond times never make a zero-width interval."""
    tolerance = math.log1p(tolerance_pct / 100)
    n = len(canary_ms)
    if n < MIN_LATENCY_SAMPLES:
        return _waiting("paired", "log-ratio", tolerance,
                        f"needs {MIN_LATENCY_SAMPLES} requests answered on both sides (has {n})")
    both = np.concatenate([canary_ms, baseline_ms])
    if np.ptp(both) == 0:
        return _waiting("paired", "log-ratio", tolerance,
                        f"every request took the same {both[0]:g} ms on both sides: no spread "
                        "yet to bound the difference by")
    step = max(step, sequential.resolution(both))
    half = step / 2 if step > 0 else 1e-3
    log_c, log_b = np.log(np.maximum(canary_ms, half)), np.log(np.maximum(baseline_ms, half))
    ratios = log_c - log_b
    typical = max(float(np.median(baseline_ms)), half)
    variance = (float(np.var(ratios, ddof=1)) + 2 * (step / typical) ** 2 / 12) / n
    tolerance_ms = typical * tolerance_pct / 100
    resolved = step == 0 or tolerance_ms >= RESOLVABLE_SHARE * step
    note = "each request against its own copy" if resolved else (
        f"{tolerance_pct:g}% of {typical:.3g} ms is {tolerance_ms:.2g} ms, finer than the "
        f"{step:g} ms the samples are recorded in can show")
    return _bounded("paired", "log-ratio", float(ratios.mean()), variance, tolerance,
                    TAU_FACTOR * max(tolerance, 0.01), levels, math.exp(float(log_c.mean())),
                    math.exp(float(log_b.mean())), note, resolved)


def tail_ratio(canary: sequential.Sorted, baseline: sequential.Sorted, tolerance_pct: float,
               levels: Levels) -> Metric:
    """How much slower the canary's slowest requests are: the geometric mean of its requests
    above the baseline's p95 over the baseline's own (on the log scale). Every request in the
    tail counts, so it sees a tail regression with far fewer requests than a p99 does (on
    the demo's tail, a p99's bounds are still +-20% at 10,000 requests a side)."""
    tolerance = math.log1p(tolerance_pct / 100)
    if len(baseline) < 2 * sequential.MIN_FOR_QUANTILE / (1 - TAIL_FROM):
        return _waiting("tail", "log-ratio", tolerance,
                        f"needs {math.ceil(2 * sequential.MIN_FOR_QUANTILE / (1 - TAIL_FROM))} "
                        f"answered baseline requests (has {len(baseline)})")
    threshold = baseline.quantile(TAIL_FROM)
    sides = [sequential.log_moments(s, threshold) for s in (canary, baseline)]
    if min(k for k, _, _ in sides) < sequential.MIN_FOR_QUANTILE:
        return _waiting("tail", "log-ratio", tolerance,
                        f"needs {sequential.MIN_FOR_QUANTILE} answered requests a side above the "
                        f"baseline's p95 of {threshold:.3g} ms (has {sides[0][0]} and {sides[1][0]})")
    (k_c, mean_c, var_c), (k_b, mean_b, var_b) = sides
    variance = max(var_c, 1e-6) / k_c + max(var_b, 1e-6) / k_b
    return _bounded("tail", "log-ratio", mean_c - mean_b, variance, tolerance,
                    TAU_FACTOR * max(tolerance, 0.01), levels, math.exp(mean_c), math.exp(mean_b),
                    f"the requests above the baseline's p95 of {threshold:.3g} ms")


def share_ratio(canary: sequential.Sorted, baseline: sequential.Sorted, tolerance_pct: float,
                levels: Levels) -> Metric:
    """How much more often the canary is slower than the baseline's p99: the share of its
    requests past that line over the baseline's own (on the log scale, each share with half a
    request added, so that none past it is not taken for certainty). A version whose slowest
    hundredth grew 50% slower while its p95 stayed put doubles the share past the line, which
    shows in a few thousand canary requests, where a p99 ratio is still bounded only to about
    +-20% at ten thousand a side."""
    tolerance = math.log1p(tolerance_pct / 100)
    need = math.ceil(2 * sequential.MIN_FOR_QUANTILE / (1 - SHARE_FROM))
    if len(baseline) < need:
        return _waiting("tail99", "log-ratio", tolerance,
                        f"needs {need} answered baseline requests (has {len(baseline)})")
    threshold = baseline.quantile(SHARE_FROM)
    k_c, k_b = (sequential.log_moments(s, threshold)[0] for s in (canary, baseline))
    if len(canary) < need / 2:
        return _waiting("tail99", "log-ratio", tolerance,
                        f"needs {math.ceil(need / 2)} answered canary requests (has {len(canary)})")
    p_c = (k_c + 0.5) / (len(canary) + 1)
    p_b = (k_b + 0.5) / (len(baseline) + 1)
    variance = (1 - p_c) / (k_c + 0.5) + (1 - p_b) / (k_b + 0.5)
    return _bounded("tail99", "log-ratio", math.log(p_c / p_b), variance, tolerance,
                    max(SHARE_TAU, TAU_FACTOR * tolerance), levels, 100 * p_c, 100 * p_b,
                    f"requests slower than the baseline's p99 of {threshold:.3g} ms")


def streamed_ratio(name: str, canary_ms: np.ndarray, baseline_ms: np.ndarray,
                   tolerance_pct: float, levels: Levels) -> Metric:
    """An LLM route's streamed answers, median over median (a guard): ``ttft``, ``tpot`` or
    ``generation`` (the time after the first token: with requests split at random, its ratio
    is the time per token's times the answers' lengths', both of which users feel)."""
    return quantile_ratio(name, 0.5, *_aligned(canary_ms, baseline_ms), tolerance_pct, levels)


def _aligned(canary_ms: np.ndarray, baseline_ms: np.ndarray) -> tuple[sequential.Sorted, sequential.Sorted]:
    """Both sides sorted on the coarser of their recording steps."""
    c, b = sequential.Sorted(canary_ms), sequential.Sorted(baseline_ms)
    step = max(c.step, b.step)
    return (c if c.step == step else c.with_step(step)), (b if b.step == step else b.with_step(step))


def recent_median(recent: Recent, config: JudgeConfig, levels: Levels, step: float) -> Metric:
    """The median ratio over the current block only, at its block's share of the levels: a
    guard (it fails a canary that turned slow; it does not hold a pass)."""
    c = sequential.Sorted(recent.canary.latencies, step)
    b = sequential.Sorted(recent.baseline.latencies, step)
    found = quantile_ratio("recent", 0.5, c, b, config.latency_tolerance_pct,
                           levels.of_block(recent.block))
    return replace(found, note=(f"the last {recent.seconds:g} s window (number {recent.block})"
                                + (f"; {found.note}" if found.note else "")))


def error_excess(canary: Arm, baseline: Arm, config: JudgeConfig, levels: Levels) -> Metric:
    """The canary's error rate over what is allowed relative to the baseline's (a share, not
    percent: ``0.004`` is 0.4 points)."""
    n_c, n_b = canary.total, baseline.total
    tolerance = config.error_tolerance_pct / 100
    if n_c < 1 or n_b < 1:
        return _waiting("errors", "share", tolerance, "no requests yet")
    k = 1 + config.error_ratio_pct / 100
    p_c, p_b = canary.errors / n_c, baseline.errors / n_b
    variance = (sequential.proportion_variance(canary.errors, n_c)
                + k * k * sequential.proportion_variance(baseline.errors, n_b))
    found = _bounded("errors", "share", p_c - k * p_b, variance, tolerance,
                     TAU_FACTOR * max(tolerance, 0.001), levels, p_c, p_b)
    # What the excess can be at all (from every baseline request failing and none of the
    # canary's, to the reverse): a few requests' bounds are shown within it, not as -270 points.
    return replace(found, low=max(found.low, -k), high=min(found.high, 1.0))


def gate(name: str, q: float | None, ceiling: float, canary: Arm, ordered: sequential.Sorted,
         levels: Levels) -> Metric:
    """The canary alone against an SLO ceiling (ms for a quantile, percent for the error
    rate): it fails when its lower bound is above the ceiling."""
    if q is None:
        n = canary.total
        if n < 1:
            return _waiting(name, "share", ceiling / 100, "no requests yet")
        rate = canary.errors / n
        return _bounded(name, "share", rate, sequential.proportion_variance(canary.errors, n),
                        ceiling / 100, TAU_FACTOR * max(ceiling / 100, 0.005), levels, rate, None)
    se = ordered.quantile_se(q)
    tolerance = math.log(ceiling)
    if se is None:
        return _waiting(name, "log-ms", tolerance, f"needs more answered requests (has {len(ordered)})")
    value = max(ordered.quantile(q), ordered.step / 4 if ordered.step else 1e-6)
    return _bounded(name, "log-ms", math.log(value), (se / value) ** 2, tolerance,
                    TAU_FACTOR * 0.2, levels, value, None)


# --------------------------------------------------------------------------------------------
# The look
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recent:
    """The requests of the current block of a sliding look (the ``block``-th stretch of
    ``seconds`` since the analysis began): both sides' arms."""

    canary: Arm
    baseline: Arm
    block: int
    seconds: float


def judge(canary: Arm, baseline: Arm | None, config: JudgeConfig,
          recent: Recent | None = None,
          pairs: tuple[np.ndarray, np.ndarray] | None = None) -> Judgement:
    """One look at a canary against its baseline over the same window (``baseline`` None:
    the canary carries all the traffic and only the SLO gates judge it). ``recent``: the
    current block's requests, whose median alone is judged too, so a version that turns slow
    late is not hidden by the requests it served well before. ``pairs``: the canary's and the
    baseline's times for the same requests (a shadow), judged request by request in place of
    the medians (:func:`paired_ratio`)."""
    with_baseline = baseline is not None
    levels = Levels(config.alpha_per_test(with_baseline), config.alpha_within())
    c_sorted = sequential.Sorted(canary.latencies)
    metrics: list[Metric] = []
    step = c_sorted.step
    if baseline is not None:
        c_sorted, b_sorted = _aligned(canary.latencies, baseline.latencies)
        step = c_sorted.step
        central = (paired_ratio(*pairs, config.latency_tolerance_pct, levels, step)
                   if pairs is not None else
                   quantile_ratio("median", 0.5, c_sorted, b_sorted, config.latency_tolerance_pct,
                                  levels))
        metrics = [
            central,
            tail_ratio(c_sorted, b_sorted, config.tail_tolerance_pct, levels),
            share_ratio(c_sorted, b_sorted, config.tail_tolerance_pct, levels),
            error_excess(canary, baseline, config, levels),
        ]
        if config.streamed:
            metrics += [streamed_ratio("ttft", canary.ttft, baseline.ttft,
                                       config.ttft_tolerance_pct, levels),
                        # Per output token where the router counts both sides' tokens.
                        streamed_ratio(*(("tpot", canary.tpot, baseline.tpot)
                                         if len(canary.tpot) and len(baseline.tpot) else
                                         ("generation", canary.generation, baseline.generation)),
                                       config.generation_tolerance_pct, levels)]
        if recent is not None and recent.block >= 2:  # the first block is all the evidence
            metrics.append(recent_median(recent, config, levels, step))
    gates = [gate(name, q, ceiling, canary, c_sorted, levels) for name, q, ceiling in config.gates()]
    failed = [m for m in metrics + gates if m.state == FAIL]
    # Without a baseline (the canary carries all the traffic) the gates alone decide: within
    # once each has the requests it needs and none is shown above its ceiling. The tail is a
    # guard: it fails a canary, but showing the slowest requests within their tolerance takes
    # tens of thousands of requests on real tails, so it does not hold a pass.
    within = not failed and (all(m.state == "within" for m in metrics if m.name not in GUARDS)
                             if with_baseline else all(m.state != "waiting" for m in gates))
    # The reasons: what failed, or every metric with its numbers (and the gates that have
    # them), so a verdict always shows what it rests on.
    reasons = [describe(m, config.error_ratio_pct) for m in failed] or (
        [describe(m, config.error_ratio_pct) for m in metrics]
        + [describe(g, config.error_ratio_pct) for g in gates if g.state != "waiting"])
    client = {"canary": canary.client_errors, "baseline": baseline.client_errors if baseline else 0}
    return Judgement(FAIL if failed else INCONCLUSIVE, within, reasons, canary.total,
                     baseline.total if baseline else 0, levels.fail, step, metrics, gates, client,
                     levels.within)


def judge_samples(canary: Sequence[Any] | Columns, baseline: Sequence[Any] | Columns | None,
                  config: JudgeConfig, *, recent_from: float | None = None, block: int = 1,
                  seconds: float = 0.0) -> Judgement:
    """:func:`judge` over route samples (``rollouts.traffic.sample_types.Sample``, or their
    :class:`~rollouts.traffic.columns.Columns`); with
    ``recent_from``, the requests from then on are the current block (:class:`Recent`)."""
    recent = None
    if recent_from is not None and baseline is not None:
        recent = Recent(Arm.of(ended_since(canary, recent_from)),
                        Arm.of(ended_since(baseline, recent_from)), block, seconds)
    return judge(Arm.of(canary), Arm.of(baseline) if baseline is not None else None, config,
                 recent)


def judge_pairs(canary: Sequence[Any], baseline: Sequence[Any], config: JudgeConfig) -> Judgement:
    """:func:`judge` on a shadow: ``canary[i]`` is the copy of the request the baseline
    served as ``baseline[i]``. Both sides' times are the servers' own (``upstream_ms``), which
    the router measures alike for a copy and its original; the pairs both answered are judged
    request by request, the errors and the tail as two samples."""
    both = [(c.upstream_ms, b.upstream_ms) for c, b in zip(canary, baseline, strict=True)
            if c.upstream_ms is not None and b.upstream_ms is not None
            and c.status < 400 and b.status < 400
            and not c.upstream_failed and not b.upstream_failed]
    pairs = (np.asarray([c for c, _ in both], dtype=float),
             np.asarray([b for _, b in both], dtype=float))
    return judge(Arm.of(canary, upstream=True), Arm.of(baseline, upstream=True), config,
                 pairs=pairs)


