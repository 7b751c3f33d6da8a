"""The schemas of a rollout request's inputs that the domain checks (the analysis settings of
:mod:`rollouts.canary.analysis`, the steps of :mod:`rollouts.canary.specs`), for the API's
OpenAPI document: their keys, ranges and defaults come from the domain's own tables."""

from __future__ import annotations

from typing import Any

from rollouts.canary import analysis as canary_analysis
from rollouts.canary import metrics as canary_metrics
from rollouts.canary import policy as canary_policy
from rollouts.canary import specs


def _setting_schema(key: str) -> dict[str, Any]:
    low, high, kind = canary_analysis.ANALYSIS_LIMITS[key]
    schema: dict[str, Any] = {"type": "integer" if kind is int else "number",
                              "minimum": low, "maximum": high}
    if canary_analysis.ANALYSIS_DEFAULTS[key] is None:
        schema["type"] = [schema["type"], "null"]
    else:
        schema["default"] = canary_analysis.ANALYSIS_DEFAULTS[key]
    return schema


METRIC_GATE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["template"], "additionalProperties": False,
    "description": ("A metric gate: a metric template's value (PromQL on the platform's "
                    "Prometheus) must stay in [min, max]; beyond it in `failures` "
                    "measurements in a row (taken every `every_s`) fails the analysis"),
    "properties": {
        "template": {"type": "string", "description": "A metric template's name "
                     "(GET /api/v1/metric-templates/)"},
        "min": {"type": "number"}, "max": {"type": "number"},
        **{key: {"type": "integer", "minimum": low, "maximum": high}
           for key, (low, high) in canary_metrics.LIMITS.items()},
    },
}
ROLLBACK_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"], "required": ["webhook"], "additionalProperties": False,
    "description": ("The rollback webhook (rollout level only): while the rollout runs "
                    "(progressing, paused or baking) it is asked every `every_s` with a signed "
                    "POST (event rollout.rollback); a 2xx answer sends all traffic back to "
                    "the baseline"),
    "properties": {"webhook": {"type": "string", "description": "One of the tenant's webhooks"},
                   "every_s": {"type": "integer", "minimum": 1, "maximum": 3600,
                               "default": canary_analysis.ROLLBACK_EVERY_S}},
}
ANALYSIS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {**{key: _setting_schema(key) for key in canary_analysis.ANALYSIS_DEFAULTS},
                   "metrics": {"type": "array", "maxItems": canary_metrics.MAX_GATES,
                               "items": METRIC_GATE_SCHEMA},
                   "rollback": ROLLBACK_SCHEMA},
    "additionalProperties": False,
    "description": (
        "How analyses judge the candidate; settings left out take their defaults. "
        "max_p99_ms and max_error_rate (percent) default to the deployment's SLO; "
        "planned_samples must be at least min_samples. bake_s and rollback are settings of "
        "the whole rollout (refused on a step): bake_s keeps a canary baking at 100% that "
        "long, judged against itself and the SLO, before the promotion ends."
    ),
    "example": {"planned_samples": 2000, "latency_tolerance_pct": 3, "max_p95_ms": 40},
}
# A step's analysis: the same settings less those of the whole rollout.
STEP_ANALYSIS_SCHEMA: dict[str, Any] = {
    **ANALYSIS_SCHEMA,
    "properties": {k: v for k, v in ANALYSIS_SCHEMA["properties"].items()
                   if k not in canary_policy.ROLLOUT_ONLY},
}
STEP_SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "required": ["set_weight"], "additionalProperties": False,
     "properties": {"set_weight": {"type": "integer", "minimum": 0, "maximum": 100,
                                   "description": "Traffic to the candidate, in percent"}}},
    {"type": "object", "required": ["pause"], "additionalProperties": False,
     "properties": {"pause": {
         "type": "object", "additionalProperties": False,
         "description": "{} waits until a person resumes; {seconds} waits that long",
         "properties": {"seconds": {"type": "number", "minimum": 1,
                                    "maximum": specs.MAX_PAUSE_S}}}}},
    {"type": "object", "required": ["analysis"], "additionalProperties": False,
     "properties": {"analysis": {**STEP_ANALYSIS_SCHEMA, "description": (
         "Judge the canary at its weight until it passes; settings here override the "
         "rollout's analysis")}}},
    {"type": "object", "required": ["approval"], "additionalProperties": False,
     "properties": {"approval": {"type": "object", "additionalProperties": False,
                                 "description": "Wait for an approver who is not the requester"}}},
    {"type": "object", "required": ["benchmark"], "additionalProperties": False,
     "properties": {"benchmark": {
         "type": "object", "additionalProperties": False,
         "description": ("The candidate's max load within its SLO (its newest benchmark) may "
                         "fall below the baseline's by at most max_drop_pct"),
         "properties": {"max_drop_pct": {"type": "number", "minimum": 0, "maximum": 100,
                                         "default": 10},
                        "mode": {"type": "string", "enum": ["concurrency", "rate"]}}}}},
    {"type": "object", "required": ["cost"], "additionalProperties": False,
     "properties": {"cost": {
         "type": "object", "additionalProperties": False,
         "description": ("The candidate may cost at most max_increase_pct more per request "
                         "than the baseline (their benchmarks, else their live traffic); "
                         "without a reading of both the rollout pauses for a person"),
         "properties": {"max_increase_pct": {"type": "number", "minimum": 0, "maximum": 1000,
                                             "default": 10}}}}},
    {"type": "object", "required": ["confirm"], "additionalProperties": False,
     "properties": {"confirm": {
         "type": "object", "required": ["webhook"], "additionalProperties": False,
         "description": (
             "Hold until the tenant's webhook answers a signed POST (event rollout.confirm) "
             "with a 2xx, asking every every_s; no 2xx within timeout_s goes back to the "
             "baseline. First in the list: confirm-rollout; last: confirm-promotion"),
         "properties": {
             "webhook": {"type": "string", "description": "One of the tenant's active webhooks"},
             "timeout_s": {"type": "integer", "minimum": 1, "maximum": specs.MAX_PAUSE_S,
                           "default": specs.CONFIRM_TIMEOUT_S},
             "every_s": {"type": "integer", "minimum": 1, "maximum": 3600,
                         "default": specs.CONFIRM_EVERY_S}}}}},
    {"type": "object", "required": ["shadow"], "additionalProperties": False,
     "properties": {"shadow": {
         **STEP_ANALYSIS_SCHEMA,
         "properties": {**STEP_ANALYSIS_SCHEMA["properties"],
                        "percent": {"type": "integer", "minimum": 1, "maximum": 100,
                                    "default": specs.SHADOW_PERCENT}},
         "description": (
             "Before the candidate serves anyone: copies of percent of the requests go to it "
             "(its answers discarded), each judged against the same request's time on the "
             "baseline; a fail rolls back before any user reaches it. Only where the "
             "candidate's weight is still 0; the other keys are analysis settings")}}},
]
