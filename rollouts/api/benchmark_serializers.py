"""The serializers of the benchmarks API: a benchmark asked for, a job as it stands.

Writing: :class:`BenchmarkRequestSerializer` shapes a request for
:func:`rollouts.benchmarks.requests.create_job` (JSON inputs are handed to the domain as sent, whose
checks name the path at fault; the schema shows the two shapes, by mode), and
:class:`RegisterConfigSerializer` the config to register. Reading: a job in the list, a job in
full, CI's compact figures (:func:`compact_results`) and one side of two jobs compared.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from console.serializers import BoundedFloatField, JSONInput, StrictFieldsMixin
from fleet.api.refs import IdOrNameField
from rollouts.api.benchmark_schemas import (
    CONFIGS_SCHEMA,
    JOB_SUMMARY_SCHEMA,
    LEVEL_KEYS,
    REQUEST_SCHEMA,
    RESULT_SCHEMA,
    SLO_SCHEMA,
)
from rollouts.api.rollouts import MAX_VERSION
from rollouts.benchmarks import sweep
from rollouts.benchmarks.specs import LIMITS
from rollouts.models import BenchmarkJob, Deployment

Mode = BenchmarkJob.Mode
Protocol = BenchmarkJob.Protocol


# --------------------------------------------------------------------------------------------
# JSON inputs
# --------------------------------------------------------------------------------------------


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


class LevelsField(JSONInput):
    """Concurrencies (whole numbers) or request rates, checked against the mode."""

    kind = list
    kind_message = "a non-empty list of concurrencies or request rates"


@extend_schema_field(SLO_SCHEMA)
class SloField(JSONInput):
    kind = dict
    kind_message = "an object: p99_ms, error_rate (a fraction), ttft_p99_ms, itl_p99_ms"


@extend_schema_field(REQUEST_SCHEMA)
class RequestBodyField(JSONInput):
    kind = dict
    kind_message = "an object"

    def to_internal_value(self, data: Any) -> Any:
        data = super().to_internal_value(data)
        # Token counts are whole numbers; the inputs' data goes to the server as sent.
        return {k: whole_numbers(v) if k in ("prompt_tokens", "output_tokens") else v
                for k, v in data.items()}


@extend_schema_field(CONFIGS_SCHEMA)
class ConfigsField(JSONInput):
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

    def to_domain(self, valid: dict[str, Any] | None = None) -> dict[str, Any]:
        """create_job's keyword arguments (from ``valid``, the fields that passed, when the
        body was refused on others)."""
        data = dict(self.validated_data if valid is None else valid)
        data.pop("deployment")
        for key in ("duration_s", "warmup_s", "error_limit"):
            if key in data:
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


class JobStateField(serializers.ChoiceField):
    """A job's state; the schema names its enum ``BenchmarkStateEnum`` (several models have
    a ``state``, and the enum hook would number a second unnamed set)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=BenchmarkJob.State.choices, read_only=True, **kwargs)


class JobStateFieldSchema(OpenApiSerializerFieldExtension):
    target_class = "rollouts.api.benchmark_serializers.JobStateField"

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


def compare_side(job: BenchmarkJob) -> dict[str, Any]:
    """One job's side of two compared: what it measured and its best config."""
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
