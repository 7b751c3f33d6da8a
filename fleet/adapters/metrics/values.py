"""What the metrics adapters hand out: cumulative Counters (and Histograms) per (model,
version) as one scrape saw them, a Snapshot of them, the Window of rates and latencies between
two, and the seam for per-request samples from the data plane."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Kind = Literal["triton", "vllm"]
KINDS: tuple[str, ...] = ("triton", "vllm")


SeriesKey = tuple[str, str]  # (model, version); version "" for vLLM


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
    ``fleet.adapters.metrics.parsing.VLLM_HISTOGRAMS``); ``quantiles_us`` Triton's
    request-duration summary (quantile -> µs, over Triton's ~60 s sliding window, NaN
    dropped); ``gauges`` instantaneous values:
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


def dump_series(series: dict[SeriesKey, Counters]) -> str:
    """``series`` as compact JSON (:func:`load_series` reads it back): what a scraper keeps of a
    page to diff the next one against, a few hundred bytes where the page is tens of kB."""
    return json.dumps([
        [model, version, c.engine, [getattr(c, f) for f in CUMULATIVE_FIELDS], c.failure_reasons,
         {k: [h.buckets, h.sum, h.count] for k, h in c.histograms.items()},
         list(c.quantiles_us.items()), c.gauges]
        for (model, version), c in series.items()
    ], separators=(",", ":"))


def load_series(text: str | bytes) -> dict[SeriesKey, Counters]:
    """What :func:`dump_series` wrote."""
    out: dict[SeriesKey, Counters] = {}
    for model, version, engine, scalars, reasons, hists, quantiles, gauges in json.loads(text):
        values: dict[str, Any] = dict(zip(CUMULATIVE_FIELDS, scalars, strict=True))
        out[(model, version)] = Counters(
            engine=engine, failure_reasons=reasons, gauges=gauges,
            histograms={k: Histogram(tuple((le, n) for le, n in b), total, count)
                        for k, (b, total, count) in hists.items()},
            quantiles_us={q: v for q, v in quantiles}, **values)
    return out


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
    #: The request durations' distribution as (ms, share at or below), ascending: vLLM's e2e
    #: histogram buckets of the window (+Inf last), Triton's summary quantiles; empty when
    #: neither (``rates.share_over`` reads it).
    latency_cdf: tuple[tuple[float, float], ...] = ()


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
