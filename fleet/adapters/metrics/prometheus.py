"""Latencies and rates from a Prometheus server that scrapes the engines, through its HTTP
query API; the PromQL it builds is documented on :meth:`PrometheusSource.latency_query`."""

from __future__ import annotations

from urllib.parse import urlencode

import httpx

from fleet.adapters.base import AdapterError, Deadline, ProbeFailed, http_client, request
from fleet.adapters.metrics.parsing import TRITON_SUMMARY_QUANTILES, is_finite
from fleet.adapters.metrics.rates import nearest_quantile
from fleet.adapters.metrics.values import KINDS, Kind

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


def escape_label_value(value: str) -> str:
    """``value`` escaped as inside a double-quoted PromQL string (so it cannot close it)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _label_value(value: str) -> str:
    """Quote a PromQL label value."""
    return f'"{escape_label_value(value)}"'


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
            with http_client() as client:
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
        values = [value for _, value in self.query(promql) if is_finite(value)]
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
            if is_finite(value)
        ]
        return max(values) if values else None
