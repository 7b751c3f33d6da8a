"""Benchmarks API: measured capacity of a version on a fleet server, for people and for CI.

``GET /benchmarks/`` lists the jobs the caller can see; ``GET /benchmarks/{id}/`` reads one
with its progress, phase and results (every level measured, per config); ``POST
/benchmarks/`` asks for one (with an ``Idempotency-Key`` a retried request replays the
first); ``POST /benchmarks/{id}/cancel/`` stops it (the load stops within a second, the next
tick unloads and ends it); ``GET /benchmarks/{id}/results/`` answers the figures in a compact
shape for CI; ``POST /benchmarks/{id}/register-config/`` registers the best (or a chosen)
config of a config sweep as a new version; ``GET /benchmarks/compare/?a=&b=`` sets two jobs'
summaries side by side. Every write calls :mod:`rollouts.benchmarks.jobs`, as the console does.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.exceptions import DomainError
from console.filters import FilterSet, IntegerFilter, parse_integer
from console.schema import AutoSchema
from console.serializers import StrictFieldsMixin
from fleet.api.base import (
    DEPLOYER_WRITES,
    MAX_IDEMPOTENCY_KEY,
    TenantScopedViewSetMixin,
    idempotency_key,
)
from fleet.api.refs import IdOrNameField, IdOrNameFilter
from fleet.models import InferenceServer
from rollouts.api.rollouts import MAX_VERSION, named_at_the_top
from rollouts.api.serializers import ModelVersionSerializer
from rollouts.benchmarks import jobs, results, specs, sweep
from rollouts.models import BenchmarkJob, Deployment, Model

LIMITS = specs.LIMITS
Mode = BenchmarkJob.Mode
Protocol = BenchmarkJob.Protocol

# --------------------------------------------------------------------------------------------
# Schemas of the JSON inputs the domain checks (rollouts.benchmarks.jobs)
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


class _JSONInput(serializers.Field):
    """A JSON value handed to the domain as sent (its checks name the path at fault)."""

    kind: type | tuple[type, ...] = object
    kind_message = ""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, self.kind):
            raise serializers.ValidationError(self.kind_message)
        return data

    def to_representation(self, value: Any) -> Any:
        return value


def whole_numbers(value: Any) -> Any:
    """``value`` with every whole float made an int: 8.0 is the whole number 8 in JSON (and
    in the schema's integers), which the domain's integer checks take only as an int."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    return value


class LevelsField(_JSONInput):
    """Concurrencies (whole numbers) or request rates, checked against the mode."""

    kind = list
    kind_message = "a non-empty list of concurrencies or request rates"


@extend_schema_field(SLO_SCHEMA)
class SloField(_JSONInput):
    kind = dict
    kind_message = "an object: p99_ms, error_rate (a fraction), ttft_p99_ms, itl_p99_ms"


@extend_schema_field(REQUEST_SCHEMA)
class RequestBodyField(_JSONInput):
    kind = dict
    kind_message = "an object"

    def to_internal_value(self, data: Any) -> Any:
        data = super().to_internal_value(data)
        # Token counts are whole numbers; the inputs' data goes to the server as sent.
        return {k: whole_numbers(v) if k in ("prompt_tokens", "output_tokens") else v
                for k, v in data.items()}


@extend_schema_field(CONFIGS_SCHEMA)
class ConfigsField(_JSONInput):
    kind = list
    kind_message = "a list of config overrides"

    def to_internal_value(self, data: Any) -> Any:
        data = whole_numbers(super().to_internal_value(data))
        for i, item in enumerate(data):
            group = item.get("instance_group") if isinstance(item, dict) else None
            if isinstance(group, dict) and set(group) - {"count"}:
                raise serializers.ValidationError(
                    f"configs[{i}].instance_group: a count, or {{\"count\": n}}")
        return data


class BoundedFloatField(serializers.FloatField):
    """A number within bounds; ``above`` is an exclusive lower bound. JSON true and false
    are no numbers here."""

    def __init__(self, *, above: float | None = None, **kwargs: Any) -> None:
        self.above = above
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if self.above is not None and value <= self.above:
            raise serializers.ValidationError(f"Ensure this value is greater than {self.above:g}.")
        return value


class BoundedFloatFieldSchema(OpenApiSerializerFieldExtension):
    target_class = "rollouts.api.benchmarks.BoundedFloatField"

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        field = self.target
        schema: dict[str, Any] = {"type": "number"}
        if field.above is not None:
            schema["exclusiveMinimum"] = field.above
        if field.min_value is not None:
            schema["minimum"] = field.min_value
        if field.max_value is not None:
            schema["maximum"] = field.max_value
        return schema


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

LEVELS_HELP = ("Concurrency mode: whole numbers of requests in flight (1 to 512); rate mode: "
               "requests per second (above 0, up to 20000). At most 20, measured in ascending "
               "order (default 1, 2, 4, 8, 16 or 10, 50, 100, 200 req/s)")


class BenchmarkRequestSerializer(StrictFieldsMixin, serializers.Serializer):
    """A benchmark asked for: a version of a deployment's model, on one of its servers."""

    deployment = IdOrNameField(queryset=Deployment.objects.none(),
                               help_text="Deployment id, or its name")
    version = serializers.IntegerField(min_value=1, max_value=MAX_VERSION,
                                       help_text="The version number to measure")
    server = serializers.CharField(
        required=False, max_length=64, trim_whitespace=False,
        help_text="The deployment's server to measure on (needed when it has several)",
    )
    protocol = serializers.ChoiceField(
        choices=Protocol.choices, required=False,
        help_text="Default: triton_http on a Triton server, openai_completions on vLLM",
    )
    mode = serializers.ChoiceField(choices=Mode.choices, default=Mode.CONCURRENCY)
    levels = LevelsField(required=False, help_text=LEVELS_HELP)
    duration_s = BoundedFloatField(above=0, max_value=LIMITS["duration_s"], default=10,
                                   help_text="Measured seconds per level")
    warmup_s = BoundedFloatField(min_value=0, max_value=LIMITS["warmup_s"], default=2,
                                 help_text="Unmeasured seconds before each level")
    max_requests = serializers.IntegerField(
        min_value=0, max_value=LIMITS["max_requests"], default=0,
        help_text="End a level after this many requests (0: by duration only)",
    )
    refine_steps = serializers.IntegerField(
        min_value=0, max_value=LIMITS["refine_steps"], default=sweep.DEFAULT_REFINE_STEPS,
        help_text="Levels measured between the last passing and the first failing one",
    )
    error_limit = BoundedFloatField(
        above=0, max_value=1, default=sweep.DEFAULT_ERROR_LIMIT,
        help_text="Stop the sweep once a level's error rate passes this fraction",
    )
    slo = SloField(required=False)
    request = RequestBodyField(required=False)
    configs = ConfigsField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.fields["deployment"].queryset = Deployment.objects.visible_to(request.user)

    def to_domain(self) -> dict[str, Any]:
        """create_job's keyword arguments."""
        data = dict(self.validated_data)
        data.pop("deployment")
        for key in ("duration_s", "warmup_s", "error_limit"):
            value = data[key]
            data[key] = int(value) if float(value).is_integer() else value
        return data


@extend_schema_field({"type": "string", "const": Mode.CONCURRENCY,
                      "description": "concurrency (the default): closed loop"})
class _ConcurrencyMode(serializers.CharField):
    pass


@extend_schema_field({"type": "string", "const": Mode.RATE,
                      "description": "rate: open loop, Poisson arrivals"})
class _RateMode(serializers.CharField):
    pass


class _ConcurrencyBenchmark(BenchmarkRequestSerializer):
    """The schema of a request in concurrency mode (the default)."""

    mode = _ConcurrencyMode(required=False)
    levels = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=int(LIMITS["concurrency"])),
        min_length=1, max_length=LIMITS["levels"], required=False, help_text=LEVELS_HELP,
    )

    class Meta:
        ref_name = "ConcurrencyBenchmark"


class _RateBenchmark(BenchmarkRequestSerializer):
    """The schema of a request in rate mode."""

    mode = _RateMode()
    levels = serializers.ListField(
        child=BoundedFloatField(above=0, max_value=LIMITS["rate"]),
        min_length=1, max_length=LIMITS["levels"], required=False, help_text=LEVELS_HELP,
    )

    class Meta:
        ref_name = "RateBenchmark"


BENCHMARK_REQUEST = PolymorphicProxySerializer(
    component_name="Benchmark",
    serializers=[_ConcurrencyBenchmark, _RateBenchmark],
    resource_type_field_name=None,
)


class RegisterConfigSerializer(StrictFieldsMixin, serializers.Serializer):
    config = serializers.IntegerField(
        required=False, min_value=0, max_value=LIMITS["configs"] - 1,
        help_text="The index of the config in the job's configs (default: the best)",
    )


# --------------------------------------------------------------------------------------------
# Reading
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


class JobStateField(serializers.ChoiceField):
    """A job's state; the schema names its enum ``BenchmarkStateEnum`` (several models have
    a ``state``, and the enum hook would number a second unnamed set)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=BenchmarkJob.State.choices, read_only=True, **kwargs)


class JobStateFieldSchema(OpenApiSerializerFieldExtension):
    target_class = "rollouts.api.benchmarks.JobStateField"

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        component = ResolvedComponent(
            name="BenchmarkStateEnum", type=ResolvedComponent.SCHEMA, object="BenchmarkStateEnum",
            schema={"type": "string", "enum": list(BenchmarkJob.State.values),
                    "description": "queued → loading → running → unloading → (the next config) "
                                   "→ succeeded; failed; cancelled"},
        )
        auto_schema.registry.register_on_missing(component)
        return component.ref


class BenchmarkJobSerializer(serializers.ModelSerializer):
    """A benchmark job as it stands: what was asked, where it is, what it found."""

    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    deployment = serializers.IntegerField(source="deployment_id", read_only=True)
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)
    model = serializers.CharField(source="version.model.name", read_only=True)
    version = serializers.IntegerField(source="version.version", read_only=True,
                                       help_text="The version number measured")
    server = serializers.CharField(source="server.name", read_only=True)
    state = JobStateField()
    is_active = serializers.BooleanField(read_only=True)
    is_final = serializers.SerializerMethodField()
    levels = serializers.SerializerMethodField()
    slo = serializers.SerializerMethodField()
    configs = serializers.SerializerMethodField()
    summary = serializers.SerializerMethodField()
    progress = serializers.FloatField(read_only=True, help_text="0 to 1")

    class Meta:
        model = BenchmarkJob
        fields = [
            "id", "tenant", "deployment", "deployment_name", "model", "version", "server",
            "protocol", "mode", "levels", "duration_s", "warmup_s", "max_requests",
            "refine_steps", "error_limit", "slo", "configs", "state", "is_active", "is_final",
            "phase", "progress", "config_index", "summary", "error", "shares_production",
            "cancel_requested_by", "requested_by_label", "idempotency_key", "created_at",
            "updated_at", "started_at", "finished_at",
        ]
        read_only_fields = fields

    def get_is_final(self, obj: BenchmarkJob) -> bool:
        return obj.state in BenchmarkJob.FINAL

    @extend_schema_field({"type": "array", "items": {"type": "number"}})
    def get_levels(self, obj: BenchmarkJob) -> list[float]:
        return list(obj.levels or [])

    @extend_schema_field({**SLO_SCHEMA, "additionalProperties": True, "example": None})
    def get_slo(self, obj: BenchmarkJob) -> dict[str, Any]:
        return dict(obj.slo or {})

    @extend_schema_field({"type": "array", "items": {"type": "object"},
                          "description": "the config overrides compared"})
    def get_configs(self, obj: BenchmarkJob) -> list[dict[str, Any]]:
        return list(obj.configs or [])

    @extend_schema_field(JOB_SUMMARY_SCHEMA)
    def get_summary(self, obj: BenchmarkJob) -> dict[str, Any]:
        return dict(obj.summary or {})


class BenchmarkJobDetailSerializer(BenchmarkJobSerializer):
    """A job with what it asked each request to carry and every level it measured."""

    request = serializers.SerializerMethodField()
    results = serializers.SerializerMethodField()

    class Meta(BenchmarkJobSerializer.Meta):
        fields = [*BenchmarkJobSerializer.Meta.fields, "request", "results"]
        read_only_fields = fields

    @extend_schema_field({"type": "object"})
    def get_request(self, obj: BenchmarkJob) -> dict[str, Any]:
        return dict(obj.request or {})

    @extend_schema_field({"type": "array", "items": RESULT_SCHEMA,
                          "description": "One entry per config measured so far"})
    def get_results(self, obj: BenchmarkJob) -> list[dict[str, Any]]:
        return list(obj.results or [])


# The figures of a level CI reads; the rest stays on the detail answer.
LEVEL_KEYS = ("value", "requests", "ok", "errors", "error_rate", "throughput_rps", "offered_rps",
              "goodput_rps", "latency_ms", "ttft_ms", "itl_ms", "output_tokens_per_s",
              "refinement", "verdict", "server")


def compact_level(level: dict[str, Any]) -> dict[str, Any]:
    out = {key: level[key] for key in LEVEL_KEYS if key in level}
    out["within_slo"] = not level.get("verdict") and level.get("requests", 0) > 0
    return out


def compact_results(job: BenchmarkJob) -> dict[str, Any]:
    """What CI reads of a job: its state, summary and per config the levels' figures, by
    level (a curve), refinements in their place."""
    return {
        "id": job.pk, "state": job.state, "is_final": job.state in BenchmarkJob.FINAL,
        "progress": job.progress, "phase": job.phase, "error": job.error,
        "model": job.version.model.name, "version": job.version.version,
        "deployment": job.deployment.name, "server": job.server.name,
        "protocol": job.protocol, "mode": job.mode, "slo": job.slo,
        "shares_production": job.shares_production, "summary": job.summary or {},
        "configs": [{
            "index": i, "label": entry.get("label", ""), "config": entry.get("config") or {},
            "error": entry.get("error", ""), "summary": entry.get("summary"),
            "levels": [compact_level(level) for level in sorted(
                entry.get("levels") or [], key=lambda level: level.get("value", 0))],
        } for i, entry in enumerate(job.results or [])],
        "finished_at": job.finished_at,
    }


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


def _side(job: BenchmarkJob) -> dict[str, Any]:
    summary = job.summary or {}
    return {
        "id": job.pk, "state": job.state, "model": job.version.model.name,
        "version": job.version.version, "deployment": job.deployment.name,
        "server": job.server.name, "protocol": job.protocol, "mode": job.mode,
        "best_label": summary.get("best_label"), "best": summary.get("best"),
        "finished_at": job.finished_at,
    }


def change_pct(a: float | None, b: float | None) -> float | None:
    """b against a, in percent (None when either is missing or a is 0)."""
    if not a or b is None:
        return None
    return round((b - a) / a * 100.0, 2)


# --------------------------------------------------------------------------------------------
# The viewset
# --------------------------------------------------------------------------------------------


def _visible_deployments(request: Request | None) -> Any:
    return Deployment.objects.visible_to(request.user if request is not None else None)


def _visible_models(request: Request | None) -> Any:
    return Model.objects.visible_to(request.user if request is not None else None)


class BenchmarkFilterSet(FilterSet):
    """``deployment``, ``model`` and ``server``: id or name; ``version``: its number."""

    deployment = IdOrNameFilter(queryset=_visible_deployments, help_text="deployment id or name")
    model = IdOrNameFilter(field_name="version__model", queryset=_visible_models,
                           help_text="model id or name")
    server = IdOrNameFilter(queryset=InferenceServer.objects.all(), help_text="server id or name")
    version = IntegerFilter(field_name="version__version", help_text="version number")

    class Meta:
        model = BenchmarkJob
        fields = {"state": ["exact", "in"], "mode": ["exact"], "protocol": ["exact"]}

CONFLICT = OpenApiResponse(
    description="A benchmark is already queued or running on the server (on `server`), the "
                "Idempotency-Key was used for another request (on `idempotency_key`), the "
                "tenant's quota cannot hold the load (on `quota`), a config sweep's model is "
                "loaded on the server already (on `configs`), or the deployment is archived"
)
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", {"type": "string", "maxLength": MAX_IDEMPOTENCY_KEY},
    OpenApiParameter.HEADER, required=False,
    description="At most 200 characters: the same key with the same body replays the first "
                "request (200 with its job); with another body it is a 409",
)
JOB_ID = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}


def _job_param(name: str, text: str) -> OpenApiParameter:
    return OpenApiParameter(name, JOB_ID, OpenApiParameter.QUERY, required=True, description=text)


class BenchmarkSchema(AutoSchema):
    """A request for a benchmark is a body of one of two shapes (by mode), always sent."""

    def _get_request_body(self, direction: str = "request") -> dict[str, Any] | None:
        body = super()._get_request_body(direction)
        if body is not None and getattr(self.view, "action", None) == "create":
            body["required"] = True
        return body


class BenchmarkJobViewSet(
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Benchmark jobs: the most load a version carries within its SLO, per config."""

    write_roles = DEPLOYER_WRITES
    queryset = BenchmarkJob.objects.select_related(
        "tenant", "deployment", "version__model", "server",
    )
    serializer_class = BenchmarkJobSerializer
    filterset_class = BenchmarkFilterSet
    ordering_fields = ["created_at", "updated_at", "finished_at"]
    lookup_value_regex = "[0-9]+"
    schema = BenchmarkSchema()

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return BenchmarkJobSerializer if self.action == "list" else BenchmarkJobDetailSerializer

    def _answer(self, pk: int, code: int = status.HTTP_200_OK) -> Response:
        found = self.get_queryset().get(pk=pk)
        return Response(BenchmarkJobDetailSerializer(found).data, status=code)

    @extend_schema(
        request=BENCHMARK_REQUEST, parameters=[IDEMPOTENCY_KEY],
        responses={201: BenchmarkJobDetailSerializer, 200: BenchmarkJobDetailSerializer,
                   409: CONFLICT},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Ask for a benchmark of a version on one of the deployment's servers (deployer
        role): 201 with the job, queued; or 200 replaying an earlier request with the same
        Idempotency-Key. One job per server at a time."""
        body = BenchmarkRequestSerializer(data=request.data,
                                          context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        key = idempotency_key(request)
        try:
            found, made = jobs.create_job(
                request.user, body.validated_data["deployment"], idempotency_key=key,
                **body.to_domain(),
            )
        except DomainError as exc:
            raise named_at_the_top(exc) from None
        return self._answer(found.pk, status.HTTP_201_CREATED if made else status.HTTP_200_OK)

    @extend_schema(
        request=None,
        responses={202: BenchmarkJobDetailSerializer,
                   409: OpenApiResponse(description="The job has ended already (on `state`)")},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Stop a job (deployer role): its load stops within a second; the next tick unloads
        what it loaded and ends it as cancelled (202: poll it)."""
        found = jobs.cancel(request.user, self.get_object())
        return self._answer(found.pk, status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: RESULTS_RESPONSE})
    @action(detail=True, methods=["get"])
    def results(self, request: Request, pk: str | None = None) -> Response:
        """The job's figures for CI: state, summary, and per config the levels measured
        (throughput, latency percentiles, errors, the server's own view)."""
        return Response(compact_results(self.get_object()))

    @extend_schema(
        request=RegisterConfigSerializer,
        responses={201: ModelVersionSerializer,
                   409: OpenApiResponse(description="Not a finished config sweep (on `job`)")},
    )
    @action(detail=True, methods=["post"], url_path="register-config")
    def register_config(self, request: Request, pk: str | None = None) -> Response:
        """Register the best config of a finished config sweep (or ``config``, its index) as
        a new version of the model (deployer role): the same artifact, the measured Triton
        config, labels naming the job."""
        body = RegisterConfigSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        made = results.register_config(request.user, self.get_object(),
                                    body.validated_data.get("config"))
        return Response(ModelVersionSerializer(made, context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)

    def _job_named(self, request: Request, name: str) -> BenchmarkJob:
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            raise DomainError("give a benchmark job's id", field=name)
        try:
            pk = parse_integer(raw, 1)
        except DjangoValidationError as exc:
            raise DomainError(exc.messages[0], field=name) from None
        found = self.get_queryset().filter(pk=pk).first()
        if found is None:
            raise DomainError(f"no benchmark job with id {pk}", field=name)
        return found

    @extend_schema(
        parameters=[_job_param("a", "The first job's id (the reference)"),
                    _job_param("b", "The second job's id")],
        responses={200: COMPARE_RESPONSE}, filters=False,
    )
    @action(detail=False, methods=["get"], filter_backends=[], pagination_class=None)
    def compare(self, request: Request) -> Response:
        """Two jobs' summaries side by side, with the change of the most load carried within
        the SLO from ``a`` to ``b`` in percent. A job you cannot see is a 400 on its
        parameter."""
        a = self._job_named(request, "a")
        b = self._job_named(request, "b")
        rps = [((j.summary or {}).get("best") or {}).get("max_load_rps") for j in (a, b)]
        return Response({"a": _side(a), "b": _side(b),
                         "max_load_rps_change_pct": change_pct(*rps),
                         "same_mode": a.mode == b.mode})
