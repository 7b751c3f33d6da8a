"""The OpenAPI shapes of the benchmarks API, as JSON schemas.

The JSON inputs the domain checks (:mod:`rollouts.benchmarks.specs`: the SLO, what each request
carries, the config overrides a sweep compares), and the figures a job answers (a level, a
sweep's and a job's summary, the compact results CI reads, two jobs compared). The serializers
(:mod:`.benchmark_serializers`) and the views (:mod:`.benchmarks`) document themselves with them.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse

from rollouts.benchmarks.specs import LIMITS
from rollouts.models import BenchmarkJob

# --------------------------------------------------------------------------------------------
# The JSON inputs the domain checks (rollouts.benchmarks.specs)
# --------------------------------------------------------------------------------------------

NULLABLE_MS = {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 3_600_000}
SLO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "p99_ms": {**NULLABLE_MS, "description": "p99 ceiling (default: the deployment's)"},
        "error_rate": {"type": ["number", "null"], "minimum": 0, "maximum": 1,
                       "description": "error-rate ceiling, a fraction (default: the "
                                      "deployment's slo_error_rate / 100)"},
        "ttft_p99_ms": {**NULLABLE_MS, "description": "LLM: time-to-first-token p99 ceiling"},
        "itl_p99_ms": {**NULLABLE_MS, "description": "LLM: inter-token latency p99 ceiling"},
    },
    "description": "The SLO a level must meet to count as carried; settings left out take "
                   "the deployment's SLO",
    "example": {"p99_ms": 40, "error_rate": 0.01},
}
TOKENS_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["mean"],
    "properties": {"mean": {"type": "integer", "minimum": 1},
                   "spread": {"type": "integer", "minimum": 0,
                              "description": "uniform in mean ± spread; below mean"}},
}
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["name", "shape", "datatype", "data"],
    "properties": {"name": {"type": "string"}, "shape": {"type": "array"},
                   "datatype": {"type": "string"}, "data": {"type": "array"}},
}
REQUEST_SCHEMA: dict[str, Any] = {
    "description": (
        "What each request carries. Triton: {\"inputs\": [KServe v2 JSON inputs]} (default: "
        "made from the model's metadata). LLM: {\"prompt_tokens\": {\"mean\", \"spread\"}, "
        "\"output_tokens\": {\"mean\", \"spread\"}} (default: 32 ± 8 prompt words, 32 "
        "output tokens)."
    ),
    "oneOf": [
        {"type": "object", "additionalProperties": False, "maxProperties": 0},
        {"type": "object", "additionalProperties": False, "required": ["inputs"],
         "properties": {"inputs": {"type": "array", "minItems": 1, "items": INPUT_SCHEMA}}},
        {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
            "prompt_tokens": {**TOKENS_SCHEMA, "properties": {
                **TOKENS_SCHEMA["properties"],
                "mean": {"type": "integer", "minimum": 1, "maximum": LIMITS["prompt_tokens"]}}},
            "output_tokens": {**TOKENS_SCHEMA, "properties": {
                **TOKENS_SCHEMA["properties"],
                "mean": {"type": "integer", "minimum": 1, "maximum": LIMITS["output_tokens"]}}},
        }},
    ],
}
BATCHING_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "max_queue_delay_microseconds": {
            "type": "integer", "minimum": 0, "maximum": LIMITS["max_queue_delay_microseconds"]},
        "preferred_batch_size": {"type": "array", "items": {
            "type": "integer", "minimum": 1, "maximum": LIMITS["max_batch_size"]}},
    },
}
INSTANCES = {"type": "integer", "minimum": 1, "maximum": LIMITS["instance_count"]}
CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "instance_group": {"oneOf": [
            INSTANCES,
            {"type": "object", "required": ["count"], "properties": {"count": INSTANCES},
             "additionalProperties": False},
        ], "description": "model instances: a count, or {\"count\": n}"},
        "max_batch_size": {"type": "integer", "minimum": 1, "maximum": LIMITS["max_batch_size"]},
        "dynamic_batching": BATCHING_SCHEMA,
    },
    # Dynamic batching needs a batch size, from this override or the version's own config.
    "dependentRequired": {"dynamic_batching": ["max_batch_size"]},
}
CONFIGS_SCHEMA: dict[str, Any] = {
    "type": "array", "maxItems": LIMITS["configs"], "items": CONFIG_SCHEMA,
    "description": (
        "Triton versions: config overrides to compare, each loaded on the server in turn "
        "(empty: the version's own config). Each sets instance_group (a count), "
        "dynamic_batching (max_queue_delay_microseconds, preferred_batch_size) and/or "
        "max_batch_size over the version's config."
    ),
    "example": [{"instance_group": 1}, {"instance_group": 2},
                {"instance_group": 2, "max_batch_size": 8,
                 "dynamic_batching": {"max_queue_delay_microseconds": 100}}],
}


# --------------------------------------------------------------------------------------------
# The figures a job answers
# --------------------------------------------------------------------------------------------

LATENCY_SCHEMA: dict[str, Any] = {
    "type": "object", "description": "milliseconds",
    "properties": {k: {"type": ["number", "null"]} for k in
                   ("p50", "p90", "p95", "p99", "mean", "max")},
}
SERVER_VIEW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "The server's own account of the level's window (its metrics' deltas): available, "
        "requests, failures; Triton: request_ms, queue_ms, compute_ms (means); vLLM: "
        "ttft_ms, itl_ms, e2e_ms, queue_ms ({count, mean, p50, p99}), generation_tokens. "
        "available is false (with error) when the server reported nothing"
    ),
    "properties": {"available": {"type": "boolean"}, "error": {"type": "string"},
                   "requests": {"type": "integer"}, "failures": {"type": "integer"},
                   "request_ms": {"type": ["number", "null"]},
                   "queue_ms": {}, "compute_ms": {"type": ["number", "null"]}},
}
LEVEL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One level measured (engine result, with the server's view)",
    "properties": {
        "mode": {"type": "string"}, "value": {"type": "number"},
        "requests": {"type": "integer"}, "ok": {"type": "integer"},
        "errors": {"type": "object", "additionalProperties": {"type": "integer"},
                   "description": "errors by kind"},
        "error_rate": {"type": "number", "description": "a fraction"},
        "first_error": {"type": ["string", "null"]},
        "window_s": {"type": "number"}, "throughput_rps": {"type": "number"},
        "offered_rps": {"type": ["number", "null"]},
        "goodput_rps": {"type": ["number", "null"]},
        "latency_ms": LATENCY_SCHEMA, "ttft_ms": LATENCY_SCHEMA, "itl_ms": LATENCY_SCHEMA,
        "output_tokens": {"type": "integer"}, "output_tokens_per_s": {"type": "number"},
        "cancelled": {"type": "boolean"},
        "refinement": {"type": "boolean",
                       "description": "a level put between the last passing and first failing"},
        "verdict": {"type": "array", "items": {"type": "string"},
                    "description": "why the level fails the SLO (empty: within it)"},
        "server": SERVER_VIEW_SCHEMA,
    },
}
SWEEP_SUMMARY_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "description": "What a config's sweep found",
    "properties": {
        "mode": {"type": "string"},
        "max_load": {"type": ["number", "null"],
                     "description": "the highest level within the SLO (null: none)"},
        "max_load_rps": {"type": ["number", "null"], "description": "its throughput"},
        "max_load_p99_ms": {"type": ["number", "null"]},
        "first_failing": {"type": ["number", "null"]},
        "first_failing_why": {"type": "array", "items": {"type": "string"}},
        "peak_rps": {"type": "number"}, "goodput_rps": {"type": ["number", "null"]},
        "stopped_early": {"type": "string"}, "levels_run": {"type": "integer"},
        "client_overhead_ms": {"type": ["number", "null"],
                               "description": "median round trip of the health endpoint"},
    },
}
RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "config": {"type": "object", "description": "the override measured ({}: the version's)"},
        "label": {"type": "string"}, "levels": {"type": "array", "items": LEVEL_SCHEMA},
        "summary": SWEEP_SUMMARY_SCHEMA, "error": {"type": "string"},
        "load_id": {"type": ["integer", "null"]},
    },
}
JOB_SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The job's outcome: the best config (most load within the SLO) and each "
                   "config's figures; {} until the job ends",
    "properties": {
        "best_config": {"type": ["integer", "null"]}, "best_label": {"type": ["string", "null"]},
        "best": SWEEP_SUMMARY_SCHEMA,
        "configs": {"type": "array", "items": {"type": "object", "properties": {
            "label": {"type": "string"}, "max_load": {"type": ["number", "null"]},
            "max_load_rps": {"type": ["number", "null"]}, "error": {"type": "string"}}}},
    },
}

# The figures of a level CI reads; the rest stays on the detail answer.
LEVEL_KEYS = ("value", "requests", "ok", "errors", "error_rate", "throughput_rps", "offered_rps",
              "goodput_rps", "latency_ms", "ttft_ms", "itl_ms", "output_tokens_per_s",
              "refinement", "verdict", "server")


RESULTS_RESPONSE = OpenApiResponse(
    response={
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "state": {"type": "string",
                                                 "enum": list(BenchmarkJob.State.values)},
            "is_final": {"type": "boolean"}, "progress": {"type": "number"},
            "phase": {"type": "string"}, "error": {"type": "string"},
            "model": {"type": "string"}, "version": {"type": "integer"},
            "deployment": {"type": "string"}, "server": {"type": "string"},
            "protocol": {"type": "string"}, "mode": {"type": "string"},
            "slo": {"type": "object"}, "shares_production": {"type": "boolean"},
            "summary": JOB_SUMMARY_SCHEMA,
            "configs": {"type": "array", "items": {"type": "object", "properties": {
                "index": {"type": "integer"}, "label": {"type": "string"},
                "config": {"type": "object"}, "error": {"type": "string"},
                "summary": SWEEP_SUMMARY_SCHEMA,
                "levels": {"type": "array", "items": {**LEVEL_SCHEMA, "properties": {
                    **{k: v for k, v in LEVEL_SCHEMA["properties"].items() if k in LEVEL_KEYS},
                    "within_slo": {"type": "boolean"}}}},
            }}},
            "finished_at": {"type": ["string", "null"], "format": "date-time"},
        },
    },
    description="The job's figures, compact, for CI",
)

SIDE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"}, "state": {"type": "string"}, "model": {"type": "string"},
        "version": {"type": "integer"}, "deployment": {"type": "string"},
        "server": {"type": "string"}, "protocol": {"type": "string"}, "mode": {"type": "string"},
        "best_label": {"type": ["string", "null"]}, "best": SWEEP_SUMMARY_SCHEMA,
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
    },
}
COMPARE_RESPONSE = OpenApiResponse(
    response={
        "type": "object",
        "properties": {
            "a": SIDE_SCHEMA, "b": SIDE_SCHEMA,
            "max_load_rps_change_pct": {
                "type": ["number", "null"],
                "description": "b's max load within the SLO against a's, in percent "
                               "(null when either has none)"},
            "same_mode": {"type": "boolean"},
        },
    },
    description="Both jobs' summaries side by side",
)
