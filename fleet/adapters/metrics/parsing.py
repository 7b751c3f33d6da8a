"""How the engines' ``/metrics`` pages are read into Counters per (model, version):
:func:`parse_triton`, :func:`parse_vllm`, and :func:`parse` for either.

A scrape tick reads every server's page, so the reading is a single pass over the lines that
keeps only the samples of the families used here (:func:`samples`) and parses their labels;
every other line costs one dictionary lookup. It reads the text exposition format as
``prometheus_client.parser`` does for these pages (a test holds the two to the same answers
on the real servers' pages), about ten times faster.

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
  lower bound: the data plane (:class:`~fleet.adapters.metrics.values.RequestLogSource`) sees
  every HTTP status;
* an in-place reload (a changed config.pbtxt, or a load with a config override) resets
  ``/v2/models/<m>/versions/<v>/stats`` but *not* the Prometheus counters; an unload removes
  the series and a later load restarts them at 0, except ``nv_inference_request_failure``,
  whose series outlive the unload and go on counting after the next load. :func:`parse_triton`
  leaves out versions that only have failure series (unloaded ones), and
  :func:`~fleet.adapters.metrics.rates.window` takes the failure delta per series (Prometheus
  ``rate()`` style) even when the other counters restarted.

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
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

from fleet.adapters.metrics.values import Counters, Histogram, Kind, SeriesKey

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


_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), "\\" + m.group(1)), value)


def samples(text: str, names: Collection[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample of ``text`` (Prometheus text format)
    whose name is in ``names``; the rest are skipped unparsed. Raises ValueError on a line
    that cannot start a sample (an HTML page, say) and on a wanted sample without a value."""
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        if not (line[0].isalpha() or line[0] in "_:"):
            raise ValueError(f"not a sample, comment or empty line: {line[:120]!r}")
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            if name not in names:
                continue
            end = line.rfind("}")
            if end < brace:
                raise ValueError(f"unclosed labels: {line[:120]!r}")
            labels = {k: _unescape(v) for k, v in _LABEL.findall(line, brace + 1, end)}
            rest = line[end + 1:].split()
        else:
            name = line if space == -1 else line[:space]
            if name not in names:
                continue
            labels = {}
            rest = line[space:].split() if space != -1 else []
        if not rest:
            raise ValueError(f"a sample without a value: {line[:120]!r}")
        yield name, labels, float(rest[0])


def _counter(*names: str) -> set[str]:
    """The sample names of counter families (with and without ``_total``)."""
    return {n for name in names for n in (name, f"{name}_total")}


def is_finite(value: float) -> bool:
    """Neither NaN nor infinite (Triton's summaries read NaN over an empty window)."""
    return not (math.isnan(value) or math.isinf(value))


TRITON_COMPUTE = (
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


TRITON_SCALARS = {
    "nv_inference_request_duration_us": "request_us",
    "nv_inference_queue_duration_us": "queue_us",
    **{name: "compute_us" for name in TRITON_COMPUTE},
}
TRITON_SUMMARY = "nv_inference_request_summary_us"
#: The sample names parse_triton reads; every other line of the page is skipped.
TRITON_SAMPLES = frozenset(
    _counter("nv_inference_request_success", "nv_inference_request_failure", *TRITON_SCALARS)
    | {"nv_inference_pending_request_count", TRITON_SUMMARY}
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

    scalar = TRITON_SCALARS
    for name, labels, value in samples(text, TRITON_SAMPLES):
        family = name.removesuffix("_total")
        if family == "nv_inference_request_success":
            if acc := acc_for(labels):
                acc.success += value
                acc.has_success = True
        elif family == "nv_inference_request_failure":
            if acc := acc_for(labels):
                reason = labels.get("reason", "")
                acc.failure += value
                acc.failure_reasons[reason] = acc.failure_reasons.get(reason, 0.0) + value
        elif family in scalar:
            if acc := acc_for(labels):
                attr = scalar[family]
                setattr(acc, attr, getattr(acc, attr) + value)
        elif name == "nv_inference_pending_request_count":
            if acc := acc_for(labels):
                acc.gauges["pending"] = value
        elif name == TRITON_SUMMARY and "quantile" in labels:
            rest = {k: v for k, v in labels.items() if k != "quantile"}
            if (acc := acc_for(rest)) and is_finite(value):
                acc.quantiles_us[float(labels["quantile"])] = value
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


VLLM_GAUGES = {
    "vllm:num_requests_running": ("running", "sum"),
    "vllm:num_requests_waiting": ("waiting", "sum"),
    "vllm:kv_cache_usage_perc": ("kv_cache_usage", "max"),
    "vllm:gpu_cache_usage_perc": ("kv_cache_usage_legacy", "max"),
}
#: The sample names parse_vllm reads; every other line of the page is skipped.
VLLM_SAMPLES = frozenset(
    _counter("vllm:request_success", "vllm:admission_rejections", "vllm:prompt_tokens",
             "vllm:generation_tokens")
    | set(VLLM_GAUGES)
    | {f"{family}_{part}" for family, _ in VLLM_HISTOGRAMS for part in ("bucket", "sum", "count")}
)


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

    for name, labels, value in samples(text, VLLM_SAMPLES):
        family = name.removesuffix("_total")
        if family == "vllm:request_success":
            if acc := acc_for(labels):
                reason = labels.get("finished_reason", "")
                if reason in VLLM_FAILED_REASONS:
                    acc.failure += value
                    acc.failure_reasons[reason] = acc.failure_reasons.get(reason, 0.0) + value
                else:
                    acc.success += value
                acc.has_success = True
        elif family == "vllm:admission_rejections":
            if acc := acc_for(labels):
                reason = f"rejected:{labels.get('reason', '')}"
                acc.failure += value
                acc.failure_reasons[reason] = acc.failure_reasons.get(reason, 0.0) + value
        elif family in ("vllm:prompt_tokens", "vllm:generation_tokens"):
            if acc := acc_for(labels):
                attr = family.removeprefix("vllm:")
                setattr(acc, attr, getattr(acc, attr) + value)
        elif name in VLLM_GAUGES:
            if acc := acc_for(labels):
                key, combine = VLLM_GAUGES[name]
                add_gauge(acc, key, value, combine=combine)
        else:
            hist_name, _, part = name.rpartition("_")
            if hist_name not in hist_names:
                continue
            if not (acc := acc_for({k: v for k, v in labels.items() if k != "le"})):
                continue
            hist = acc.hist.setdefault(hist_name, _HistAcc())
            if part == "bucket":
                le = float(labels["le"])
                hist.buckets[le] = hist.buckets.get(le, 0.0) + value
            elif part == "sum":
                hist.sum += value
            elif part == "count":
                hist.count += value

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


def parse(kind: Kind | str, text: str) -> dict[SeriesKey, Counters]:
    """Parse ``/metrics`` text of either engine; text that does not parse gives nothing."""
    try:
        return PARSERS[kind](text)
    except ValueError:
        return {}
