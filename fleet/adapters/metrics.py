"""Engine-neutral serving metrics: scrape Triton and vLLM, turn two scrapes into rates.

Three sources of latency and traffic figures, all plain Python (no Django):

* :func:`scrape` reads a server's Prometheus ``/metrics`` page into a :class:`Snapshot` of
  cumulative :class:`Counters` per (model, version); :func:`window` turns two of them into a
  :class:`Window` of rates, error rate and latency quantiles. Parsing goes through
  ``prometheus_client.parser`` only.
* :class:`PrometheusSource` asks a Prometheus server (which scrapes the engines) through its
  HTTP query API; the PromQL it builds is documented on :meth:`PrometheusSource.latency_query`.
* :class:`RequestLogSource` is the seam for per-request samples from a traffic proxy (nginx,
  Envoy): no implementation here.

What the engines expose (measured on Triton 2.51 and vLLM 0.32, see docs in
``/work/shared/design``):

Triton counters carry ``{model, version}`` labels. ``nv_inference_request_duration_us``,
``queue`` and ``compute_*`` sum the durations of *successful* requests only (a failed request
adds nothing), so averages divide by the success count. With
``--metrics-config=summary_latencies=true`` the ``nv_inference_*_summary_us`` summaries expose
the quantiles :data:`TRITON_SUMMARY_QUANTILES` over a sliding window of about 60 s (they read
``Nan`` when that window is empty). There are no latency histograms in 2.51. Quirks that shape
the arithmetic below:

* a python-backend model that answers an *error response* is counted as a success
  (triton-inference-server/server#7713); only an exception raised from ``execute()`` counts
  as a failure (reason ``BACKEND``). Requests refused by validation (wrong input name, type or
  shape: HTTP 400) are counted nowhere. Error rates from Triton's metrics are therefore a
  lower bound: the data plane (:class:`RequestLogSource`) sees every HTTP status;
* an in-place reload (a changed config.pbtxt, or a load with a config override) resets
  ``/v2/models/<m>/versions/<v>/stats`` but *not* the Prometheus counters; an unload removes
  the series and a later load restarts them at 0, except ``nv_inference_request_failure``,
  whose series outlive the unload and go on counting after the next load. :func:`parse_triton`
  leaves out versions that only have failure series (unloaded ones), and :func:`window` takes
  the failure delta per series (Prometheus ``rate()`` style) even when the other counters
  restarted.

vLLM labels its series ``{engine, model_name}`` and has no versions: the key is
``(model_name, "")``; engines (data-parallel ranks) of one model are added up. Finished
requests are ``vllm:request_success_total{finished_reason}``: reasons ``abort`` and ``error``
count as failures here, the others (``stop``, ``length``, ``repetition``) as successes; queue
admissions rejected by a limit (``vllm:admission_rejections_total``) are failures too. Latency
histograms (seconds) are kept under short names: ``e2e``, ``ttft``, ``itl`` (new name
``vllm:inter_token_latency_seconds`` or the older ``vllm:time_per_output_token_seconds``),
``tpot``, ``queue``, ``prefill``, ``decode``, ``inference``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable
from urllib.parse import urlencode

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from fleet.adapters.base import AdapterError, Deadline, ProbeFailed, request

Kind = Literal["triton", "vllm"]
KINDS: tuple[str, ...] = ("triton", "vllm")
SeriesKey = tuple[str, str]  # (model, version); version "" for vLLM

#: Quantiles of Triton's ``nv_inference_*_summary_us`` summaries (2.51).
TRITON_SUMMARY_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99, 0.999)

#: vLLM ``finished_reason`` values counted as failures.
VLLM_FAILED_REASONS = frozenset({"abort", "error"})

#: vLLM histogram families (seconds) by the short name they are kept under. Where a short
#: name appears twice, the first family present wins (the newer name comes first).
VLLM_HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("vllm:e2e_request_latency_seconds", "e2e"),
    ("vllm:time_to_first_token_seconds", "ttft"),
    ("vllm:inter_token_latency_seconds", "itl"),
    ("vllm:time_per_output_token_seconds", "itl"),  # name before vLLM 0.11
    ("vllm:request_time_per_output_token_seconds", "tpot"),
    ("vllm:request_queue_time_seconds", "queue"),
    ("vllm:request_prefill_time_seconds", "prefill"),
    ("vllm:request_decode_time_seconds", "decode"),
    ("vllm:request_inference_time_seconds", "inference"),
)

#: PromQL metric (bucket series name pattern) per short latency name, for vLLM.
VLLM_PROMQL_HISTOGRAMS: dict[str, str] = {
    "e2e": "vllm:e2e_request_latency_seconds_bucket",
    "ttft": "vllm:time_to_first_token_seconds_bucket",
    "itl": "vllm:(inter_token_latency|time_per_output_token)_seconds_bucket",
    "queue": "vllm:request_queue_time_seconds_bucket",
}

#: Triton summary per short latency name, for PromQL.
TRITON_PROMQL_SUMMARIES: dict[str, str] = {
    "e2e": "nv_inference_request_summary_us",
    "queue": "nv_inference_queue_summary_us",
}


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """A cumulative Prometheus histogram: ``buckets`` are (upper bound ``le``, cumulative
    count) in ascending ``le``, the last one ``+Inf``; ``sum`` and ``count`` as exposed."""

    buckets: tuple[tuple[float, float], ...]
    sum: float = 0.0
    count: float = 0.0

    def minus(self, prev: Histogram | None) -> Histogram:
        """The observations made since ``prev`` (bucket-wise difference; ``self`` if None).

        Buckets missing from ``prev`` count as 0 there.
        """
        if prev is None:
            return self
        before = dict(prev.buckets)
        return Histogram(
            buckets=tuple((le, count - before.get(le, 0.0)) for le, count in self.buckets),
            sum=self.sum - prev.sum,
            count=self.count - prev.count,
        )

    def decreased_from(self, prev: Histogram) -> bool:
        """True when any bucket, the sum or the count is lower than in ``prev``."""
        if self.count < prev.count or self.sum < prev.sum:
            return True
        now = dict(self.buckets)
        return any(le in now and now[le] < count for le, count in prev.buckets)


@dataclass(frozen=True)
class Counters:
    """Cumulative figures of one (model, version) as one scrape saw them.

    ``success`` and ``failure`` count requests; ``request_us``, ``queue_us`` and ``compute_us``
    (input + infer + output on Triton; vLLM's inference time) sum durations in microseconds
    over the ``timed`` requests (Triton: the successes; vLLM: requests in the e2e histogram).
    ``prompt_tokens`` and ``generation_tokens`` are vLLM's token counters. ``failure_reasons``
    splits ``failure`` (Triton ``reason`` label; vLLM finished reason or
    ``rejected:<reason>``). ``histograms`` are vLLM's latency histograms by short name (see
    :data:`VLLM_HISTOGRAMS`); ``quantiles_us`` Triton's request-duration summary (quantile ->
    µs, over Triton's ~60 s sliding window, NaN dropped); ``gauges`` instantaneous values:
    ``pending`` (Triton), ``running``, ``waiting``, ``kv_cache_usage`` (vLLM, a fraction).
    """

    engine: str = ""
    success: float = 0.0
    failure: float = 0.0
    request_us: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    timed: float = 0.0
    failure_reasons: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    quantiles_us: dict[float, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)

    @property
    def requests(self) -> float:
        """Requests counted so far: successes plus failures."""
        return self.success + self.failure


#: The cumulative scalar fields of :class:`Counters` (a decrease in any means a restart).
CUMULATIVE_FIELDS: tuple[str, ...] = (
    "success",
    "failure",
    "request_us",
    "queue_us",
    "compute_us",
    "prompt_tokens",
    "generation_tokens",
    "timed",
)


@dataclass(frozen=True)
class Snapshot:
    """One scrape: when it was taken (``time.time()``) and the counters per (model, version)."""

    taken_at: float
    series: dict[SeriesKey, Counters]


@dataclass(frozen=True)
class Window:
    """What happened to one (model, version) between two scrapes ``seconds`` apart.

    ``requests`` and ``failures`` are deltas; ``rps`` their rate; ``error_rate`` the failing
    fraction (0.0 without requests); ``avg_ms`` the mean request duration (the
    ``request_us`` delta over the requests it sums: the ``timed`` delta, else successes).
    ``p50_ms``,
    ``p95_ms``, ``p99_ms``: for vLLM estimated from the e2e histogram's bucket deltas (like
    PromQL ``histogram_quantile``); for Triton the current summary quantile nearest to each
    (``quantile_source`` says which, ``quantiles_available`` lists those exposed; they cover
    Triton's own ~60 s window, not exactly this one). Latencies are None when nothing was
    measured in the window. ``ttft_*`` and ``itl_*`` (time to first token, inter-token
    latency) and ``tokens_per_s`` (generated tokens) are vLLM only. ``running`` and
    ``waiting`` are the current gauges (Triton's pending count is ``waiting``). ``reset``:
    the counters restarted (reload, restart, or no previous scrape), so the current values
    were taken as counted from zero.
    """

    seconds: float
    requests: float
    failures: float
    rps: float
    error_rate: float
    avg_ms: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    queue_ms: float | None = None
    tokens_per_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    reset: bool = False
    quantile_source: dict[str, float] = field(default_factory=dict)
    quantiles_available: tuple[float, ...] = ()


# --------------------------------------------------------------------------------------------
# Parsing (prometheus_client's parser only)
# --------------------------------------------------------------------------------------------


@dataclass
class _HistAcc:
    """Mutable accumulator behind one Histogram while parsing."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def freeze(self) -> Histogram:
        """The immutable Histogram, buckets in ascending ``le``."""
        return Histogram(buckets=tuple(sorted(self.buckets.items())), sum=self.sum,
                         count=self.count)


@dataclass
class _Acc:
    """Mutable accumulator behind one Counters while parsing."""

    success: float = 0.0
    failure: float = 0.0
    request_us: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    has_success: bool = False
    failure_reasons: dict[str, float] = field(default_factory=dict)
    quantiles_us: dict[float, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    hist: dict[str, _HistAcc] = field(default_factory=dict)  # by family name


def _counter_samples(family: Metric) -> Iterable[Sample]:
    """The value samples of a counter family (the parser names them ``<family>_total``;
    ``_created`` timestamps are skipped)."""
    for sample in family.samples:
        if sample.name in (family.name, f"{family.name}_total"):
            yield sample


def _finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


TRITON_COMPUTE = (
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def parse_triton(text: str) -> dict[SeriesKey, Counters]:
    """Parse a Triton ``/metrics`` page into Counters per (model, version).

    Versions without an ``nv_inference_request_success`` series are left out: they are not
    loaded (Triton keeps their failure series after an unload). Raises ValueError when the
    text is not Prometheus exposition format.
    """
    accs: dict[SeriesKey, _Acc] = {}

    def acc_for(labels: Mapping[str, str]) -> _Acc | None:
        if "model" not in labels or "version" not in labels:
            return None
        return accs.setdefault((labels["model"], labels["version"]), _Acc())

    scalar = {
        "nv_inference_request_duration_us": "request_us",
        "nv_inference_queue_duration_us": "queue_us",
        **{name: "compute_us" for name in TRITON_COMPUTE},
    }
    for family in text_string_to_metric_families(text):
        name = family.name
        if name == "nv_inference_request_success":
            for sample in _counter_samples(family):
                if acc := acc_for(sample.labels):
                    acc.success += sample.value
                    acc.has_success = True
        elif name == "nv_inference_request_failure":
            for sample in _counter_samples(family):
                if acc := acc_for(sample.labels):
                    reason = sample.labels.get("reason", "")
                    acc.failure += sample.value
                    acc.failure_reasons[reason] = acc.failure_reasons.get(reason, 0.0) + sample.value
        elif name in scalar:
            attr = scalar[name]
            for sample in _counter_samples(family):
                if acc := acc_for(sample.labels):
                    setattr(acc, attr, getattr(acc, attr) + sample.value)
        elif name == "nv_inference_pending_request_count":
            for sample in family.samples:
                if acc := acc_for(sample.labels):
                    acc.gauges["pending"] = float(sample.value)
        elif name == "nv_inference_request_summary_us":
            for sample in family.samples:
                if sample.name != name or "quantile" not in sample.labels:
                    continue
                labels = {k: v for k, v in sample.labels.items() if k != "quantile"}
                if (acc := acc_for(labels)) and _finite(sample.value):
                    acc.quantiles_us[float(sample.labels["quantile"])] = float(sample.value)
    return {
        key: Counters(
            engine="triton",
            success=acc.success,
            failure=acc.failure,
            request_us=acc.request_us,
            queue_us=acc.queue_us,
            compute_us=acc.compute_us,
            timed=acc.success,
            failure_reasons=acc.failure_reasons,
            quantiles_us=dict(sorted(acc.quantiles_us.items())),
            gauges=acc.gauges,
        )
        for key, acc in accs.items()
        if acc.has_success
    }


def parse_vllm(text: str) -> dict[SeriesKey, Counters]:
    """Parse a vLLM ``/metrics`` page into Counters per ``(model_name, "")``.

    Accepts the current and the older metric names (``vllm:inter_token_latency_seconds`` or
    ``vllm:time_per_output_token_seconds``; ``vllm:kv_cache_usage_perc`` or
    ``vllm:gpu_cache_usage_perc``). Series of several engines of one model are added up
    (``kv_cache_usage``: the highest). Raises ValueError when the text is not Prometheus
    exposition format.
    """
    accs: dict[SeriesKey, _Acc] = {}
    hist_names = {family: short for family, short in VLLM_HISTOGRAMS}

    def acc_for(labels: Mapping[str, str]) -> _Acc | None:
        if "model_name" not in labels:
            return None
        return accs.setdefault((labels["model_name"], ""), _Acc())

    def add_gauge(acc: _Acc, key: str, value: float, *, combine: str = "sum") -> None:
        if key in acc.gauges:
            old = acc.gauges[key]
            value = max(old, value) if combine == "max" else old + value
        acc.gauges[key] = value

    gauges = {
        "vllm:num_requests_running": ("running", "sum"),
        "vllm:num_requests_waiting": ("waiting", "sum"),
        "vllm:kv_cache_usage_perc": ("kv_cache_usage", "max"),
        "vllm:gpu_cache_usage_perc": ("kv_cache_usage_legacy", "max"),
    }
    for family in text_string_to_metric_families(text):
        name = family.name
        if name == "vllm:request_success":
            for sample in _counter_samples(family):
                if acc := acc_for(sample.labels):
                    reason = sample.labels.get("finished_reason", "")
                    if reason in VLLM_FAILED_REASONS:
                        acc.failure += sample.value
                        acc.failure_reasons[reason] = (
                            acc.failure_reasons.get(reason, 0.0) + sample.value
                        )
                    else:
                        acc.success += sample.value
                    acc.has_success = True
        elif name == "vllm:admission_rejections":
            for sample in _counter_samples(family):
                if acc := acc_for(sample.labels):
                    reason = f"rejected:{sample.labels.get('reason', '')}"
                    acc.failure += sample.value
                    acc.failure_reasons[reason] = acc.failure_reasons.get(reason, 0.0) + sample.value
        elif name in ("vllm:prompt_tokens", "vllm:generation_tokens"):
            attr = name.removeprefix("vllm:")
            for sample in _counter_samples(family):
                if acc := acc_for(sample.labels):
                    setattr(acc, attr, getattr(acc, attr) + sample.value)
        elif name in gauges:
            key, combine = gauges[name]
            for sample in family.samples:
                if acc := acc_for(sample.labels):
                    add_gauge(acc, key, float(sample.value), combine=combine)
        elif name in hist_names:
            for sample in family.samples:
                labels = {k: v for k, v in sample.labels.items() if k != "le"}
                if not (acc := acc_for(labels)):
                    continue
                hist = acc.hist.setdefault(name, _HistAcc())
                if sample.name == f"{name}_bucket":
                    le = float(sample.labels["le"])
                    hist.buckets[le] = hist.buckets.get(le, 0.0) + sample.value
                elif sample.name == f"{name}_sum":
                    hist.sum += sample.value
                elif sample.name == f"{name}_count":
                    hist.count += sample.value

    result: dict[SeriesKey, Counters] = {}
    for key, acc in accs.items():
        histograms: dict[str, Histogram] = {}
        for family, short in VLLM_HISTOGRAMS:
            if short not in histograms and family in acc.hist:
                histograms[short] = acc.hist[family].freeze()
        gauges_out = dict(acc.gauges)
        legacy = gauges_out.pop("kv_cache_usage_legacy", None)
        if legacy is not None and "kv_cache_usage" not in gauges_out:
            gauges_out["kv_cache_usage"] = legacy
        e2e, queue = histograms.get("e2e"), histograms.get("queue")
        if "inference" in histograms:
            compute_s = histograms["inference"].sum
        else:
            compute_s = sum(histograms[n].sum for n in ("prefill", "decode") if n in histograms)
        result[key] = Counters(
            engine="vllm",
            success=acc.success,
            failure=acc.failure,
            request_us=e2e.sum * 1e6 if e2e else 0.0,
            queue_us=queue.sum * 1e6 if queue else 0.0,
            compute_us=compute_s * 1e6,
            prompt_tokens=acc.prompt_tokens,
            generation_tokens=acc.generation_tokens,
            timed=e2e.count if e2e else 0.0,
            failure_reasons=acc.failure_reasons,
            histograms=histograms,
            gauges=gauges_out,
        )
    return result


PARSERS = {"triton": parse_triton, "vllm": parse_vllm}


# --------------------------------------------------------------------------------------------
# Scraping
# --------------------------------------------------------------------------------------------


def _get(url: str, timeout: float, what: str, client: httpx.Client | None = None) -> bytes:
    """GET ``url`` within a hard ``timeout``; AdapterError naming the URL on failure.

    Pass a shared ``client`` when scraping many servers at once: building one costs ~20 ms
    of CPU, which fifty scrapes in parallel would spend out of their own timeouts.
    """
    deadline = Deadline(timeout)
    try:
        if client is not None:
            status, body = request(client, "GET", url, deadline)
        else:
            with httpx.Client() as own:
                status, body = request(own, "GET", url, deadline)
    except ProbeFailed as exc:
        raise AdapterError(f"{what}: {exc}", permanent=False) from exc
    if status != 200:
        raise AdapterError(
            f"{what}: GET {url} returned {status}: {body[:200].decode(errors='replace')}",
            permanent=400 <= status < 500,
        )
    return body


def scrape(kind: Kind | str, metrics_url: str, timeout: float = 5.0) -> Snapshot:
    """Read a Triton or vLLM ``/metrics`` page (the full URL) into a Snapshot.

    The whole call ends within about ``timeout`` seconds. Raises AdapterError: transient
    (``permanent=False``) for connection errors, timeouts and 5xx, naming the URL; permanent
    for 4xx answers and for a body that is not Prometheus text. ValueError for an unknown
    ``kind``.
    """
    if kind not in PARSERS:
        raise ValueError(f"unknown metrics kind {kind!r}: expected one of {', '.join(KINDS)}")
    what = f"scraping {kind} metrics"
    body = _get(metrics_url, timeout, what)
    taken_at = time.time()
    try:
        series = PARSERS[kind](body.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise AdapterError(
            f"{what}: {metrics_url} did not answer Prometheus text: {exc}", permanent=True
        ) from exc
    return Snapshot(taken_at=taken_at, series=series)


# --------------------------------------------------------------------------------------------
# Rates and quantiles
# --------------------------------------------------------------------------------------------


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Estimate the ``q`` quantile from cumulative ``(le, count)`` buckets, as PromQL's
    ``histogram_quantile`` does: find the bucket holding rank ``q * total`` and interpolate
    linearly inside it (the lowest bucket starts at 0). A rank in the ``+Inf`` bucket gives
    the highest finite bound.

    Buckets may come in any order; counts are made monotonic. None without a ``+Inf`` bucket,
    with fewer than two buckets, or with no observations. ValueError for ``q`` outside [0, 1].
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    ordered = sorted((float(le), float(count)) for le, count in buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return None
    monotonic: list[tuple[float, float]] = []
    highest = 0.0
    for le, count in ordered:
        highest = max(highest, count)
        monotonic.append((le, highest))
    total = monotonic[-1][1]
    if total <= 0:
        return None
    rank = q * total
    index = next((i for i, (_, c) in enumerate(monotonic[:-1]) if c >= rank), len(monotonic) - 1)
    if index == len(monotonic) - 1:
        return monotonic[-2][0]
    upper, count = monotonic[index]
    if index == 0:
        if upper <= 0:
            return upper
        lower, below = 0.0, 0.0
    else:
        lower, below = monotonic[index - 1]
    in_bucket = count - below
    if in_bucket <= 0:
        return lower
    return lower + (upper - lower) * (rank - below) / in_bucket


def nearest_quantile(target: float, available: Iterable[float]) -> float | None:
    """The quantile in ``available`` closest to ``target`` (the higher one on a tie)."""
    choices = sorted(available)
    if not choices:
        return None
    return min(choices, key=lambda q: (round(abs(q - target), 9), -q))


def _decreased(prev: Counters, cur: Counters) -> bool:
    """True when any cumulative figure of ``cur`` is lower than in ``prev`` (a restart)."""
    if any(getattr(cur, name) < getattr(prev, name) for name in CUMULATIVE_FIELDS):
        return True
    if any(cur.failure_reasons.get(r, 0.0) < v for r, v in prev.failure_reasons.items()):
        return True
    return any(
        name in cur.histograms and cur.histograms[name].decreased_from(hist)
        for name, hist in prev.histograms.items()
    )


def _per_series_delta(prev: float | None, cur: float) -> float:
    """Prometheus-style delta of one counter: a drop means it restarted from zero."""
    if prev is None or cur < prev:
        return cur
    return cur - prev


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def window(prev: Counters | None, cur: Counters, seconds: float) -> Window:
    """Rates, error rate and latencies of one (model, version) between two scrapes.

    Counter-reset aware: when any cumulative figure decreased (a reload or restart), or with
    no ``prev``, ``cur`` is taken as counted from zero (delta = cur) and ``reset`` is True.
    Failures are the exception: their delta is taken per series (a drop restarts that series
    only), because Triton keeps its failure counters across an unload and load while the
    others restart. ``seconds`` is the time between the scrapes (rates are 0 when it is not
    positive).
    """
    reset = prev is None or _decreased(prev, cur)
    base = None if reset else prev

    def delta(name: str) -> float:
        now = getattr(cur, name)
        return now - getattr(base, name) if base is not None else now

    success = delta("success")
    if prev is None:
        failures = cur.failure
    else:
        reasons = set(cur.failure_reasons) | set(prev.failure_reasons)
        if reasons:
            failures = sum(
                _per_series_delta(prev.failure_reasons.get(r), cur.failure_reasons.get(r, 0.0))
                for r in reasons
            )
        else:
            failures = _per_series_delta(prev.failure, cur.failure)
    requests = success + failures
    rps = requests / seconds if seconds > 0 else 0.0
    error_rate = failures / requests if requests > 0 else 0.0
    timed = delta("timed")
    measured = timed if timed > 0 else success  # requests whose durations were summed
    request_us = delta("request_us")
    avg_ms = request_us / measured / 1000.0 if measured > 0 else None
    # The mean time the window's requests waited in the server's queue (same denominator).
    queue_ms = delta("queue_us") / measured / 1000.0 if measured > 0 else None

    hist_delta: dict[str, Histogram] = {
        name: hist.minus(None if base is None else base.histograms.get(name))
        for name, hist in cur.histograms.items()
    }

    def hist_q(name: str, q: float) -> float | None:
        hist = hist_delta.get(name)
        return _ms(histogram_quantile(q, hist.buckets)) if hist else None

    p50 = p95 = p99 = None
    source: dict[str, float] = {}
    available = tuple(sorted(cur.quantiles_us))
    if "e2e" in hist_delta:
        p50, p95, p99 = hist_q("e2e", 0.5), hist_q("e2e", 0.95), hist_q("e2e", 0.99)
    elif available and measured > 0:
        picked = []
        for label, target in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            q = nearest_quantile(target, available)
            assert q is not None
            source[label] = q
            picked.append(cur.quantiles_us[q] / 1000.0)
        p50, p95, p99 = picked

    generation = delta("generation_tokens")
    tokens_per_s = None
    if cur.engine == "vllm":
        tokens_per_s = generation / seconds if seconds > 0 else 0.0
    return Window(
        seconds=seconds,
        requests=requests,
        failures=failures,
        rps=rps,
        error_rate=error_rate,
        avg_ms=avg_ms,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        ttft_p50_ms=hist_q("ttft", 0.5),
        ttft_p99_ms=hist_q("ttft", 0.99),
        itl_p50_ms=hist_q("itl", 0.5),
        itl_p99_ms=hist_q("itl", 0.99),
        queue_ms=queue_ms,
        tokens_per_s=tokens_per_s,
        running=cur.gauges.get("running"),
        waiting=cur.gauges.get("waiting", cur.gauges.get("pending")),
        reset=reset,
        quantile_source=source,
        quantiles_available=available,
    )


def windows(prev: Snapshot | None, cur: Snapshot) -> dict[SeriesKey, Window]:
    """:func:`window` for every series of ``cur`` (a series new in ``cur`` counts as reset)."""
    seconds = cur.taken_at - prev.taken_at if prev is not None else 0.0
    before = prev.series if prev is not None else {}
    return {key: window(before.get(key), counters, seconds) for key, counters in cur.series.items()}


# --------------------------------------------------------------------------------------------
# A Prometheus server
# --------------------------------------------------------------------------------------------


def _label_value(value: str) -> str:
    """Quote a PromQL label value."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


class PrometheusSource:
    """Latencies and rates from a Prometheus server that scrapes the engines.

    ``base_url`` is the server's root (e.g. "http://127.0.0.1:9090"); every call ends within
    about ``timeout`` seconds and raises AdapterError on failure: transient for transport
    errors, timeouts and 5xx (``unavailable``/``timeout``), permanent for a query Prometheus
    rejects (``bad_data``, ``execution``).
    """

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        """Remember the server root and the per-call time budget."""
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """Evaluate an instant query (``GET /api/v1/query``): (labels, value) per series.

        A scalar result gives one entry with empty labels. Values may be NaN or infinite as
        Prometheus computes them. A range-vector (matrix) result is refused (AdapterError).
        """
        # Prometheus durations take whole numbers of a unit ("5000ms", not "5.0s").
        params = urlencode({"query": promql, "timeout": f"{max(int(self.timeout * 1000), 1)}ms"})
        url = f"{self.base_url}/api/v1/query?{params}"
        what = f"Prometheus query {promql!r} at {self.base_url}"
        deadline = Deadline(self.timeout)
        try:
            with httpx.Client() as client:
                status, body = request(client, "GET", url, deadline)
        except ProbeFailed as exc:
            raise AdapterError(f"{what}: {exc}", permanent=False) from exc
        try:
            payload = httpx.Response(status, content=body).json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            raise AdapterError(
                f"{what}: HTTP {status}, not a Prometheus API answer: "
                f"{body[:200].decode(errors='replace')}",
                permanent=400 <= status < 500,
            )
        if payload.get("status") != "success":
            kind = str(payload.get("errorType", "")) or f"HTTP {status}"
            permanent = kind in ("bad_data", "execution") or (400 <= status < 500)
            raise AdapterError(f"{what} failed: {kind}: {payload.get('error', '')}",
                               permanent=permanent)
        return self._results(payload.get("data"), what)

    @staticmethod
    def _results(data: object, what: str) -> list[tuple[dict[str, str], float]]:
        if not isinstance(data, dict):
            raise AdapterError(f"{what}: answer without data", permanent=True)
        result_type, result = data.get("resultType"), data.get("result")
        try:
            if result_type == "scalar":
                return [({}, float(result[1]))]  # type: ignore[index]
            if result_type == "vector":
                return [
                    ({str(k): str(v) for k, v in item["metric"].items()}, float(item["value"][1]))
                    for item in result  # type: ignore[union-attr]
                ]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise AdapterError(f"{what}: malformed {result_type} result", permanent=True) from exc
        raise AdapterError(
            f"{what}: expected an instant vector or a scalar, got {result_type!r}", permanent=True
        )

    @staticmethod
    def latency_query(
        model: str,
        version: str,
        quantile: float,
        window: str = "1m",
        *,
        kind: Kind | str | None = None,
        metric: str = "e2e",
    ) -> str:
        """The PromQL behind :meth:`latency`, in milliseconds.

        vLLM (``kind="vllm"``, or ``version == ""`` when ``kind`` is None)::

            histogram_quantile(Q, sum by (le) (rate(
                {__name__=~"vllm:e2e_request_latency_seconds_bucket", model_name="M"}[W]))) * 1000

        with ``metric`` one of ``e2e``, ``ttft``, ``itl`` (old and new names), ``queue``
        (see :data:`VLLM_PROMQL_HISTOGRAMS`): the quantile of the requests finished in the
        last ``W``, over every engine and scrape target.

        Triton (2.51 exposes no histograms) reads the summary quantile nearest to ``Q``
        (:data:`TRITON_SUMMARY_QUANTILES`), the worst value seen in the last ``W``::

            max(max_over_time(nv_inference_request_summary_us{model="M", version="V",
                quantile="0.99"}[W])) / 1000

        (``metric="queue"`` reads ``nv_inference_queue_summary_us``). Each summary value
        already covers Triton's own ~60 s sliding window.
        """
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {quantile}")
        engine = kind or ("vllm" if version == "" else "triton")
        if engine == "vllm":
            if metric not in VLLM_PROMQL_HISTOGRAMS:
                raise ValueError(f"unknown vLLM latency {metric!r}: "
                                 f"expected one of {', '.join(VLLM_PROMQL_HISTOGRAMS)}")
            selector = (f"{{__name__=~{_label_value(VLLM_PROMQL_HISTOGRAMS[metric])}, "
                        f"model_name={_label_value(model)}}}")
            return (f"histogram_quantile({quantile:g}, sum by (le) "
                    f"(rate({selector}[{window}]))) * 1000")
        if engine != "triton":
            raise ValueError(f"unknown kind {engine!r}: expected one of {', '.join(KINDS)}")
        if metric not in TRITON_PROMQL_SUMMARIES:
            raise ValueError(f"unknown Triton latency {metric!r}: "
                             f"expected one of {', '.join(TRITON_PROMQL_SUMMARIES)}")
        nearest = nearest_quantile(quantile, TRITON_SUMMARY_QUANTILES)
        selector = (f"{TRITON_PROMQL_SUMMARIES[metric]}{{model={_label_value(model)}, "
                    f"version={_label_value(version)}, quantile=\"{nearest:g}\"}}")
        return f"max(max_over_time({selector}[{window}])) / 1000"

    def latency(
        self,
        model: str,
        version: str,
        quantile: float,
        window: str = "1m",
        *,
        kind: Kind | str | None = None,
        metric: str = "e2e",
    ) -> float | None:
        """The ``quantile`` request latency of a model version over ``window``, in ms.

        ``kind`` defaults to vLLM when ``version`` is "" and Triton otherwise; the query is
        :meth:`latency_query`'s. None when Prometheus has no data for it (no traffic in the
        window gives NaN, an unknown model no series).
        """
        promql = self.latency_query(model, version, quantile, window, kind=kind, metric=metric)
        values = [value for _, value in self.query(promql) if _finite(value)]
        return max(values) if values else None

    @staticmethod
    def avg_latency_query(model: str, version: str, window: str = "1m",
                          *, kind: Kind | str | None = None) -> str:
        """The PromQL behind :meth:`avg_latency` (ms).

        Triton: ``sum(rate(nv_inference_request_duration_us{model, version}[W])) /
        sum(rate(nv_inference_request_success{model, version}[W])) / 1000`` (durations are
        summed over successes only). vLLM: ``sum(rate(vllm:e2e_request_latency_seconds_sum
        {model_name}[W])) / sum(rate(vllm:e2e_request_latency_seconds_count{...}[W])) * 1000``.
        """
        engine = kind or ("vllm" if version == "" else "triton")
        if engine == "vllm":
            sel = f"{{model_name={_label_value(model)}}}"
            return (f"sum(rate(vllm:e2e_request_latency_seconds_sum{sel}[{window}])) / "
                    f"sum(rate(vllm:e2e_request_latency_seconds_count{sel}[{window}])) * 1000")
        if engine != "triton":
            raise ValueError(f"unknown kind {engine!r}: expected one of {', '.join(KINDS)}")
        sel = f"{{model={_label_value(model)}, version={_label_value(version)}}}"
        return (f"sum(rate(nv_inference_request_duration_us{sel}[{window}])) / "
                f"sum(rate(nv_inference_request_success{sel}[{window}])) / 1000")

    def avg_latency(self, model: str, version: str, window: str = "1m",
                    *, kind: Kind | str | None = None) -> float | None:
        """Mean request latency of a model version over ``window`` in ms (None: no data)."""
        values = [
            value
            for _, value in self.query(self.avg_latency_query(model, version, window, kind=kind))
            if _finite(value)
        ]
        return max(values) if values else None


# --------------------------------------------------------------------------------------------
# Seam: per-request samples from the traffic data plane
# --------------------------------------------------------------------------------------------

#: One request seen by a traffic proxy: (variant, latency in ms, ok).
RequestSample = tuple[str, float, bool]


@runtime_checkable
class RequestLogSource(Protocol):
    """Per-request latencies from the data plane in front of the engines (not implemented).

    The engines' own metrics miss some failures (see the module docstring) and give Triton
    latencies only as pre-aggregated summaries; a traffic proxy sees every request with its
    HTTP status. An implementation would tail nginx's access log (``$upstream_response_time``
    and ``$status`` per request, the variant from the upstream or a header), or read Envoy /
    Istio access logs, and answer :meth:`samples`. A canary judge can then compare variants
    with exact percentiles and error rates.
    """

    def samples(self, since: float) -> list[RequestSample]:
        """Requests completed after ``since`` (a ``time.time()`` value), oldest first, as
        ``(variant, latency_ms, ok)``; ``variant`` names the serving target (e.g.
        "fraud-scorer:2" or "stable"/"canary"), ``ok`` is False for 5xx, timeouts and
        connection failures."""
        ...


def fetch_text(
    kind: Kind | str, metrics_url: str, timeout: float = 5.0, client: httpx.Client | None = None
) -> str:
    """The raw ``/metrics`` text (callers that keep it to diff against the next scrape)."""
    if kind not in PARSERS:
        raise ValueError(f"unknown metrics kind {kind!r}: expected one of {', '.join(KINDS)}")
    body = _get(metrics_url, timeout, f"scraping {kind} metrics", client)
    return body.decode("utf-8", errors="replace")


def parse(kind: Kind | str, text: str) -> dict[SeriesKey, Counters]:
    """Parse ``/metrics`` text of either engine; text that does not parse gives nothing."""
    try:
        return PARSERS[kind](text)
    except ValueError:
        return {}
