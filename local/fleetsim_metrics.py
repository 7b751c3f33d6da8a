"""The ``/metrics`` pages of the fleet simulator's servers (:mod:`local.fleetsim`): the text a
real Triton 2.51 (``--metrics-config=summary_latencies=true``) or vLLM 0.32 answers, with
counters that move at a configured request rate and latency.

Every served model version is a :class:`Series`: quantities that grow at a constant rate per
second since the last change of its :class:`Traffic`, so a page costs the same whenever it is
read and two reads ``dt`` apart differ by exactly ``rate * dt`` (before rounding). Latencies
are log-normal: ``latency_ms`` is the median, ``spread`` the sigma of its logarithm; histogram
buckets hold the count times the distribution's CDF at each bound, Triton's summary quantiles
are the distribution's quantiles, sums are the count times the mean. Counts are whole numbers
and never go down, as the real servers' do.

What the pages carry: the families Switchyard reads (see ``fleet/adapters/metrics/parsing.py``)
with the names, types and labels of the real servers, plus the neighbours a real page has next
to them (Triton's ``nv_inference_count``, the queue and compute summaries, the CPU and
pinned-memory gauges;
vLLM's ``_created`` gauges, token counters and admission rejections). The other ``vllm:``
families of a real vLLM page (caches, preemptions, token-count histograms, sleep state) are
there too, at zero, so a page weighs what a real one does; the server-wide ones (Python
process, HTTP handler, LoRA and cache config) are left out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from statistics import NormalDist

TRITON_VERSION = "2.51.0"
VLLM_VERSION = "0.32.0"
_STD = NormalDist()
#: The quantiles of Triton 2.51's ``nv_inference_*_summary_us`` summaries.
TRITON_SUMMARY_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)

#: Bucket bounds (seconds) of vLLM 0.32's latency histograms, as its page prints them.
_E2E_LE = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_TTFT_LE = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
            7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_LE = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
           10.0, 20.0, 40.0, 80.0)

#: vLLM histograms: family, help text, bucket bounds.
VLLM_HISTOGRAMS: tuple[tuple[str, str, tuple[float, ...]], ...] = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     _TTFT_LE),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     _ITL_LE),
    ("vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request.", _ITL_LE),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
     _E2E_LE),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     _E2E_LE),
    ("vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request.", _E2E_LE),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
     _E2E_LE),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
     _E2E_LE),
)

#: Triton's counters of durations, the share of a request's time each stands for.
TRITON_DURATIONS: tuple[tuple[str, str, float], ...] = (
    ("request", "inference request duration", 1.0),
    ("queue", "inference queuing duration", 0.05),
    ("compute_input", "compute input duration", 0.01),
    ("compute_infer", "compute inference duration", 0.85),
    ("compute_output", "inference compute output duration", 0.05),
)
TRITON_FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@dataclass(frozen=True)
class Traffic:
    """What one served model version sees: requests a second, the share that fail, and
    latency (median, ms; ``spread`` is the sigma of its logarithm). vLLM only: time to first
    token (median, ms), tokens in and out per request, and how many requests run at once
    before more wait (``max_num_seqs``)."""

    rps: float = 10.0
    error_rate: float = 0.0
    latency_ms: float = 20.0
    spread: float = 0.3
    ttft_ms: float = 50.0
    prompt_tokens: int = 16
    output_tokens: int = 64
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        if self.rps < 0 or not 0 <= self.error_rate <= 1:
            raise ValueError("rps must be >= 0 and error_rate within [0, 1]")
        if self.latency_ms <= 0 or self.ttft_ms <= 0 or self.spread < 0:
            raise ValueError("latency_ms and ttft_ms must be > 0, spread >= 0")
        if self.output_tokens < 2 or self.prompt_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("output_tokens must be >= 2, prompt_tokens and max_num_seqs >= 1")

    def with_changes(self, changes: dict[str, object]) -> Traffic:
        """A copy with ``changes`` (field name to value) applied; ValueError naming an unknown
        field or a value out of range."""
        known = set(self.__dataclass_fields__)
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown traffic fields: {', '.join(unknown)}")
        typed = {k: type(getattr(self, k))(v) for k, v in changes.items()}  # type: ignore[call-arg]
        return replace(self, **typed)


def _cdf(bound: float, median: float, spread: float) -> float:
    """P(X <= bound) for a log-normal X with ``median`` and log-sigma ``spread``."""
    if spread == 0:
        return 1.0 if bound >= median else 0.0
    return _STD.cdf(math.log(bound / median) / spread)


def quantile(q: float, median: float, spread: float) -> float:
    """The ``q`` quantile of a log-normal with ``median`` and log-sigma ``spread``."""
    return median * math.exp(spread * _STD.inv_cdf(q)) if spread else median


def mean(median: float, spread: float) -> float:
    """The mean of a log-normal with ``median`` and log-sigma ``spread``."""
    return median * math.exp(spread * spread / 2)


@dataclass
class Series:
    """One served model version's quantities: each ``value(now) = base + rate * (now - t0)``.

    :meth:`retune` folds what has accumulated into ``base`` and takes the new traffic's rates
    from there, so nothing already counted ever goes down.
    """

    kind: str
    model: str
    version: str
    traffic: Traffic
    created: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.monotonic)
    base: dict[str, float] = field(default_factory=dict)
    rate: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rate = rates(self.kind, self.traffic)
        self.base = dict.fromkeys(self.rate, 0.0)

    @cached_property
    def still(self) -> str:
        """What of this version's page never moves (vLLM: see :func:`vllm_still`)."""
        return vllm_still(self.model, self.created) if self.kind == "vllm" else ""

    def values(self, now: float | None = None) -> dict[str, float]:
        """Every quantity at ``now`` (``time.monotonic()``)."""
        dt = (time.monotonic() if now is None else now) - self.t0
        return {k: self.base[k] + r * dt for k, r in self.rate.items()}

    def retune(self, traffic: Traffic, now: float | None = None) -> None:
        """Go on at ``traffic``'s rates from ``now``."""
        now = time.monotonic() if now is None else now
        self.base = self.values(now)
        self.t0 = now
        self.traffic = traffic
        self.rate = rates(self.kind, traffic)


def _vllm_medians(t: Traffic) -> dict[str, float]:
    """Median seconds of each vLLM histogram for traffic ``t``."""
    e2e = t.latency_ms / 1000
    ttft = min(t.ttft_ms / 1000, e2e * 0.9)
    queue = ttft * 0.02
    decode = e2e - ttft
    itl = decode / (t.output_tokens - 1)
    return {
        "vllm:time_to_first_token_seconds": ttft,
        "vllm:inter_token_latency_seconds": itl,
        "vllm:request_time_per_output_token_seconds": itl,
        "vllm:e2e_request_latency_seconds": e2e,
        "vllm:request_queue_time_seconds": queue,
        "vllm:request_inference_time_seconds": e2e - queue,
        "vllm:request_prefill_time_seconds": ttft - queue,
        "vllm:request_decode_time_seconds": decode,
    }


def rates(kind: str, t: Traffic) -> dict[str, float]:
    """What grows per second for one model version of a ``kind`` server under traffic ``t``."""
    ok = t.rps * (1 - t.error_rate)
    out = {"success": ok, "failure": t.rps * t.error_rate}
    if kind == "triton":
        request_us = mean(t.latency_ms * 1000, t.spread)
        for key, _, share in TRITON_DURATIONS:
            out[f"{key}_us"] = ok * request_us * share
        return out
    out["prompt_tokens"] = ok * t.prompt_tokens
    out["generation_tokens"] = ok * t.output_tokens
    for family, median in _vllm_medians(t).items():
        per_request = t.output_tokens - 1 if family == "vllm:inter_token_latency_seconds" else 1
        count = ok * per_request
        out[f"{family}:count"] = count
        out[f"{family}:sum"] = count * mean(median, t.spread)
        for le in next(b for f, _, b in VLLM_HISTOGRAMS if f == family):
            out[f"{family}:{le!r}"] = count * _cdf(le, median, t.spread)
    return out


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in pairs)


def _head(lines: list[str], name: str, kind: str, text: str) -> None:
    lines.append(f"# HELP {name} {text}")
    lines.append(f"# TYPE {name} {kind}")


def _whole(value: float) -> int:
    return math.floor(value + 1e-9)


def triton_page(series: list[Series], now: float | None = None) -> str:
    """The ``/metrics`` text of a Triton server serving ``series`` (integers, as Triton
    prints; summary quantiles read ``Nan`` while no request flows, as over an empty window)."""
    now = time.monotonic() if now is None else now
    vals = [(s, _labels((("model", s.model), ("version", s.version))), s.values(now))
            for s in series]
    lines: list[str] = []
    _head(lines, "nv_inference_request_success", "counter",
          "Number of successful inference requests, all batch sizes")
    lines += [f"nv_inference_request_success{{{lb}}} {_whole(v['success'])}" for _, lb, v in vals]
    _head(lines, "nv_inference_request_failure", "counter",
          "Number of failed inference requests, all batch sizes")
    for s, _, v in vals:
        for reason in TRITON_FAILURE_REASONS:
            n = _whole(v["failure"]) if reason == "BACKEND" else 0
            labels = _labels((("model", s.model), ("reason", reason), ("version", s.version)))
            lines.append(f"nv_inference_request_failure{{{labels}}} {n}")
    for name, text in (
        ("nv_inference_count",
         "Number of inferences performed (does not include cached requests)"),
        ("nv_inference_exec_count",
         "Number of model executions performed (does not include cached requests)"),
    ):
        _head(lines, name, "counter", text)
        lines += [f"{name}{{{lb}}} {_whole(v['success'])}" for _, lb, v in vals]
    for key, what, _ in TRITON_DURATIONS:
        name = f"nv_inference_{key}_duration_us"
        cached = "does not include" if key.startswith("compute") else "includes"
        _head(lines, name, "counter", f"Cumulative {what} in microseconds ({cached} cached "
              "requests)")
        lines += [f"{name}{{{lb}}} {_whole(v[f'{key}_us'])}" for _, lb, v in vals]
    _head(lines, "nv_inference_pending_request_count", "gauge",
          "Instantaneous number of pending requests awaiting execution per-model.")
    for s, lb, _ in vals:
        pending = round(s.traffic.rps * s.traffic.latency_ms / 1000 * 0.05)
        lines.append(f"nv_inference_pending_request_count{{{lb}}} {pending}")
    _head(lines, "nv_pinned_memory_pool_total_bytes", "gauge",
          "Pinned memory pool total memory size, in bytes")
    lines.append("nv_pinned_memory_pool_total_bytes 268435456")
    _head(lines, "nv_pinned_memory_pool_used_bytes", "gauge",
          "Pinned memory pool used memory size, in bytes")
    lines.append("nv_pinned_memory_pool_used_bytes 0")
    _head(lines, "nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
    lines.append("nv_cpu_utilization 0.25")
    _head(lines, "nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
    lines.append("nv_cpu_memory_total_bytes 25276514304")
    _head(lines, "nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
    lines.append("nv_cpu_memory_used_bytes 1234178048")
    for key, what, share in TRITON_DURATIONS:
        name = f"nv_inference_{key.replace('_duration', '')}_summary_us"
        head = "Summary of" if key in ("request", "queue") else "Cumulative"
        _head(lines, name, "summary", f"{head} {what} in microseconds")
        for s, lb, v in vals:
            lines.append(f"{name}_count{{{lb}}} {_whole(v['success'])}")
            lines.append(f"{name}_sum{{{lb}}} {_whole(v[f'{key}_us'])}")
            for q in TRITON_SUMMARY_QUANTILES:
                value = (str(round(share * quantile(q, s.traffic.latency_ms * 1000,
                                                     s.traffic.spread)))
                         if s.traffic.rps * (1 - s.traffic.error_rate) > 0 else "Nan")
                lines.append(f'{name}{{{lb},quantile="{q}"}} {value}')
    return "\n".join(lines) + "\n"


def _f(value: float) -> str:
    return repr(float(value))


def vllm_page(series: list[Series], now: float | None = None) -> str:
    """The ``/metrics`` text of a vLLM server serving ``series`` (one engine, ``"0"``)."""
    now = time.monotonic() if now is None else now
    rows = [(s, s.values(now), (("engine", "0"), ("model_name", s.model))) for s in series]
    lines: list[str] = []

    def gauge(name: str, text: str, values: list[tuple[str, float]]) -> None:
        _head(lines, name, "gauge", text)
        lines.extend(f"{name}{{{lb}}} {_f(v)}" for lb, v in values)

    def counter(name: str, text: str, values: list[tuple[str, float, float]]) -> None:
        _head(lines, f"{name}_total", "counter", text)
        lines.extend(f"{name}_total{{{lb}}} {_f(_whole(v))}" for lb, v, _ in values)
        gauge(f"{name}_created", text, [(lb, c) for lb, _, c in values])

    running, waiting = [], []
    for s, _, base in rows:
        in_flight = s.traffic.rps * s.traffic.latency_ms / 1000
        running.append((_labels(base), float(min(round(in_flight), s.traffic.max_num_seqs))))
        waiting.append((_labels(base), float(max(0, round(in_flight) - s.traffic.max_num_seqs))))
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
          running)
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
          [(lb, min(1.0, n / s.traffic.max_num_seqs))
           for (lb, n), (s, _, _) in zip(running, rows, strict=True)])
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
            [(_labels(b), v["prompt_tokens"], s.created) for s, v, b in rows])
    counter("vllm:generation_tokens", "Number of generation tokens processed.",
            [(_labels(b), v["generation_tokens"], s.created) for s, v, b in rows])
    outcomes = []
    for s, v, (engine, model) in rows:
        for reason in ("stop", "length", "abort", "error", "repetition"):
            n = v["success"] if reason == "stop" else v["failure"] if reason == "error" else 0.0
            outcomes.append((_labels((engine, ("finished_reason", reason), model)), n, s.created))
    counter("vllm:request_success", "Count of successfully processed requests.", outcomes)
    counter("vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            [(_labels((("model_name", s.model), ("reason", r))), 0.0, s.created)
             for s, _, _ in rows for r in ("max_num_queued_reqs", "max_num_queued_tokens")])
    for family, text, bounds in VLLM_HISTOGRAMS:
        _head(lines, family, "histogram", text)
        for _, v, (engine, model) in rows:
            count = _whole(v[f"{family}:count"])
            for le in bounds:
                n = min(count, _whole(v[f"{family}:{le!r}"]))
                lines.append(f'{family}_bucket{{{engine[0]}="0",le="{le}",'
                             f'model_name="{model[1]}"}} {_f(n)}')
            lines.append(f'{family}_bucket{{{engine[0]}="0",le="+Inf",'
                         f'model_name="{model[1]}"}} {_f(count)}')
            lines.append(f"{family}_count{{{_labels((engine, model))}}} {_f(count)}")
            lines.append(f"{family}_sum{{{_labels((engine, model))}}} {_f(v[f'{family}:sum'])}")
        gauge(f"{family}_created", text, [(_labels(b), s.created) for s, _, b in rows])
    return "\n".join(lines) + "\n" + "".join(s.still for s in series)


_COUNT_LE = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
#: The ``vllm:`` families the simulator does not move, with their help text: counters,
#: counters split by one more label, gauges split by one more label, histograms.
_STILL_COUNTERS = (
    ("estimated_flops_per_gpu", "Estimated number of floating point operations per GPU (for "
     "Model Flops Utilization calculations)."),
    ("estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU (for "
     "Model Flops Utilization calculations)."),
    ("estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU "
     "(for Model Flops Utilization calculations)."),
    ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("external_prefix_cache_queries", "External prefix cache queries from KV connector "
     "cross-instance cache sharing, in terms of number of queried tokens."),
    ("external_prefix_cache_hits", "External prefix cache hits from KV connector "
     "cross-instance cache sharing, in terms of number of cached tokens."),
    ("mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."),
    ("mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
    ("num_preemptions", "Cumulative number of preemption from the engine."),
    ("prompt_tokens_cached", "Number of cached prompt tokens (local + external)."),
)
_STILL_SPLIT_COUNTERS = (
    ("prompt_tokens_by_source", "Number of prompt tokens by source.", "source",
     ("local_compute", "local_cache_hit", "external_kv_transfer")),
    ("prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the cache tier that "
     "supplied them.", "source", ("device", "host", "p2p", "disk", "external_unspecified")),
)
_STILL_SPLIT_GAUGES = (
    ("num_requests_waiting_by_reason", "Number of waiting requests by reason.", "reason",
     ("capacity", "deferred"), ()),
    ("engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping.",
     "sleep_state", ("awake", "weights_offloaded", "discard_all"), ("awake",)),
)
_STILL_HISTOGRAMS = (
    ("request_prompt_tokens", "Number of prefill tokens processed.", _COUNT_LE),
    ("request_generation_tokens", "Number of generation tokens processed.", _COUNT_LE),
    ("iteration_tokens_total", "Histogram of number of tokens per engine_step.",
     (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
      16384.0)),
    ("request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens.", _COUNT_LE),
    ("request_params_n", "Histogram of the n request parameter.", _COUNT_LE[:5]),
    ("request_params_max_tokens", "Histogram of the max_tokens request parameter.", _COUNT_LE),
    ("request_num_preemptions", "Histogram of the number of times a request was preempted.",
     (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)),
    ("request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during "
     "prefill (excluding cached tokens).", _COUNT_LE),
)


def vllm_still(model: str, created: float) -> str:
    """The families of a real vLLM page that the simulator keeps at zero, for one model."""
    base = _labels((("engine", "0"), ("model_name", model)))
    lines: list[str] = []
    for name, text in _STILL_COUNTERS:
        _head(lines, f"vllm:{name}_total", "counter", text)
        lines.append(f"vllm:{name}_total{{{base}}} 0.0")
        _head(lines, f"vllm:{name}_created", "gauge", text)
        lines.append(f"vllm:{name}_created{{{base}}} {_f(created)}")
    for name, text, label, values in _STILL_SPLIT_COUNTERS:
        _head(lines, f"vllm:{name}_total", "counter", text)
        lines += [f'vllm:{name}_total{{{base},{label}="{v}"}} 0.0' for v in values]
        _head(lines, f"vllm:{name}_created", "gauge", text)
        lines += [f'vllm:{name}_created{{{base},{label}="{v}"}} {_f(created)}' for v in values]
    for name, text, label, values, ones in _STILL_SPLIT_GAUGES:
        _head(lines, f"vllm:{name}", "gauge", text)
        lines += [f'vllm:{name}{{{base},{label}="{v}"}} {_f(v in ones)}' for v in values]
    for name, text, bounds in _STILL_HISTOGRAMS:
        _head(lines, f"vllm:{name}", "histogram", text)
        lines += [f'vllm:{name}_bucket{{engine="0",le="{le}",model_name="{model}"}} 0.0'
                  for le in (*bounds, "+Inf")]
        lines += [f"vllm:{name}_count{{{base}}} 0.0", f"vllm:{name}_sum{{{base}}} 0.0"]
        _head(lines, f"vllm:{name}_created", "gauge", text)
        lines.append(f"vllm:{name}_created{{{base}}} {_f(created)}")
    return "\n".join(lines) + "\n"


PAGES = {"triton": triton_page, "vllm": vllm_page}
