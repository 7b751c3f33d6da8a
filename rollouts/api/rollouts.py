"""Rollouts API: canaries and A/B splits of a deployment, and the actions of people on them.

``GET /rollouts/`` lists the rollouts the caller can see; ``GET /rollouts/{id}/`` reads one
with its steps, analyses, approvals and timeline; ``POST /rollouts/`` asks for one (with an
``Idempotency-Key`` a retried request replays the first); ``POST /rollouts/{id}/pause/``,
``resume/``, ``promote/`` and ``abort/`` record an action the reconciler carries out at its
next tick (202); ``approve/`` and ``retry/`` take effect at once (200). Every write calls
:mod:`rollouts.canary.requests`, as the console does; the serializers here only shape a body
(types, required fields), and the domain's checks (:mod:`rollouts.canary.specs`) refuse what it
may not ask for, naming the field.
"""

from __future__ import annotations

import re
from typing import Any

from django.db.models import Prefetch
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.exceptions import DomainError, FieldErrors
from console.filters import FilterSet
from console.serializers import JSONInput, StrictFieldsMixin, refused_and_valid
from fleet.api.base import DEPLOYER_WRITES, TenantScopedViewSetMixin, idempotency_key
from fleet.api.refs import IdOrNameField, IdOrNameFilter
from rollouts.api.rollout_schemas import (
    ANALYSIS_SCHEMA,
    METRIC_GATE_SCHEMA,
    ROLLBACK_SCHEMA,
    STEP_SCHEMAS,
)
from rollouts.api.routes import VersionWeightsField
from rollouts.api.serializers import DecisionSerializer
from rollouts.canary import analysis as canary_analysis
from rollouts.canary import requests as rollout
from rollouts.canary import specs
from rollouts.models import (
    Deployment,
    Rollout,
    RolloutAnalysis,
    RolloutApproval,
    RolloutEvent,
    Route,
)
from rollouts.registry import costs

MAX_VERSION = 2**31 - 1  # what a version number column holds
EVENTS_SHOWN = 200  # a rollout's detail carries the newest events of its timeline, oldest first
TOP_FIELD = re.compile(r"[A-Za-z_]+")




@extend_schema_field({
    "type": "array", "minItems": 1, "maxItems": specs.MAX_STEPS,
    "items": {"oneOf": STEP_SCHEMAS},
    "description": (
        "Canary: the steps, in order (default: 5%, analysis, 25%, analysis, 50%, analysis). "
        "Each is one of {\"set_weight\": N}, {\"pause\": {}}, {\"pause\": {\"seconds\": N}}, "
        "{\"analysis\": {...}}, {\"approval\": {}}, {\"benchmark\": {...}}, "
        "{\"shadow\": {\"percent\": N, ...}}, {\"confirm\": {\"webhook\": NAME}}."
    ),
    "example": [{"set_weight": 10}, {"analysis": {}}, {"set_weight": 50},
                {"pause": {"seconds": 300}}],
})
class StepsField(JSONInput):
    kind = list
    kind_message = "must be a non-empty list of steps"


@extend_schema_field(ANALYSIS_SCHEMA)
class AnalysisField(JSONInput):
    kind = dict
    kind_message = "must be an object of analysis settings"


# The fields below are checked by the domain (rollouts.canary.specs), which names them in its
# refusal; their schemas state its limits.


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": specs.MAX_DURATION_S})
class DurationField(serializers.IntegerField):
    """Seconds an A/B split runs (``specs.duration_s`` checks them)."""


@extend_schema_field({"type": "integer", "minimum": specs.AB_MIN_SAMPLES,
                      "maximum": specs.MAX_SAMPLE_SIZE})
class SampleSizeField(serializers.IntegerField):
    """Requests a variant of an A/B split collects (``specs.sample_size`` checks them)."""


def _name_schema(pattern: re.Pattern[str]) -> dict[str, Any]:
    return {"oneOf": [{"type": "string", "maxLength": 64, "pattern": f"^{pattern.pattern}$"},
                      {"type": "string", "maxLength": 0}]}


@extend_schema_field(_name_schema(specs.HEADER_NAME))
class StickyHeaderField(serializers.CharField):
    """A request header's name, or empty (``specs.sticky_header`` checks it)."""


@extend_schema_field(_name_schema(specs.ALIAS_NAME))
class AliasNameField(serializers.CharField):
    """An alias's name, or empty for none (``specs.alias_name`` checks it)."""


@extend_schema_field({"type": "integer", "minimum": specs.MIN_WEIGHT, "maximum": specs.MAX_WEIGHT})
class WeightField(serializers.IntegerField):
    """A variant's share of the traffic (``specs.ab_variants`` checks it)."""


class VariantSerializer(StrictFieldsMixin, serializers.Serializer):
    version = serializers.IntegerField(min_value=1, max_value=MAX_VERSION,
                                       help_text="Version number")
    weight = WeightField(help_text="Share of the traffic, in percent")


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


class RolloutRequestSerializer(StrictFieldsMixin, serializers.Serializer):
    """A rollout asked for. Canary: ``version`` (and optionally ``baseline``, ``steps``,
    ``analysis``). A/B: ``variants`` and ``duration_s`` and/or ``sample_size``."""

    deployment = IdOrNameField(queryset=Deployment.objects.none(),
                               help_text="Deployment id, or its name")
    strategy = serializers.ChoiceField(choices=Rollout.Strategy.choices,
                                       default=Rollout.Strategy.CANARY)
    version = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_VERSION,
        help_text="Canary: the candidate's version number",
    )
    baseline = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_VERSION,
        help_text="Canary: the stable version (default: the one carrying the most traffic, "
                  "else the production alias's, else the newest ready one)",
    )
    steps = StepsField(required=False)
    analysis = AnalysisField(required=False)
    variants = serializers.ListField(
        child=VariantSerializer(), required=False, min_length=specs.MIN_VARIANTS,
        max_length=specs.MAX_VARIANTS,
        help_text="A/B: 2 to 10 versions whose weights sum to 100; the first is the reference",
    )
    duration_s = DurationField(required=False, help_text="A/B: end after this many seconds")
    sample_size = SampleSizeField(
        required=False, help_text="A/B: end once every variant has this many requests",
    )
    sticky_header = StickyHeaderField(
        required=False, allow_blank=True,
        help_text="A/B: the request header whose value keeps a client on its variant",
    )
    promote = serializers.BooleanField(
        required=False, help_text="A/B: promote a clear winner at the end (canary: always)",
    )
    alias = AliasNameField(
        required=False, allow_blank=True,
        help_text="The alias promotion moves to the candidate (default: production for a "
                  "production deployment, else none; empty for none)",
    )
    unload_previous = serializers.BooleanField(
        default=True, help_text="Unload the baseline once the candidate is promoted",
    )
    dry_run = serializers.BooleanField(
        default=False,
        help_text="Canary: each set_weight copies that share of the requests to the candidate "
                  "(its answers discarded) and each analysis judges the copies against the "
                  "baseline's answers; no traffic moves, nothing is promoted",
    )
    servers = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, max_length=100,
        help_text="Servers the versions load on (default: all the deployment's)",
    )
    require_approval = serializers.BooleanField(
        default=False,
        help_text="Wait for an approver first (always so on a production deployment)",
    )
    reason = serializers.CharField(required=False, allow_blank=True, default="",
                                   max_length=2000)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.fields["deployment"].queryset = Deployment.objects.visible_to(request.user)

    def to_domain(self, valid: dict[str, Any] | None = None) -> dict[str, Any]:
        """create_rollout's keyword arguments (from ``valid``, the fields that passed, when
        the body was refused on others)."""
        data = dict(self.validated_data if valid is None else valid)
        data.pop("deployment")
        data["analysis_settings"] = data.pop("analysis", None)
        if "variants" in data:
            data["variants"] = [dict(v) for v in data["variants"]]
        return data


def named_at_the_top(exc: DomainError) -> DomainError:
    """The domain names the path at fault (``steps[2]``, ``analysis.alpha``); the API keys
    errors by the body's field and puts the path in front of the message, as the parser does."""
    def top(field: str | None, message: str) -> tuple[str | None, str]:
        match = TOP_FIELD.match(field or "")
        if field is None or match is None or match.group() == field:
            return field, message
        return match.group(), f"{field}: {message}"

    if all(top(name, "")[0] == name for name in exc.by_field()):
        return exc
    return exc.renamed(top)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


class StepSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="The step's place, from 0")
    step = serializers.DictField(help_text="The step as asked for, e.g. {\"set_weight\": 25}")
    current = serializers.BooleanField(help_text="The step being carried out")
    done = serializers.BooleanField()


class RolloutAnalysisSerializer(serializers.ModelSerializer):
    class Meta:
        model = RolloutAnalysis
        fields = [
            "id", "step_index", "attempt", "weight", "verdict", "reasons", "looks", "spent",
            "failed_looks", "inconclusive_ends", "judgement", "slo", "config", "window_start", "created_at",
            "updated_at", "finished_at",
        ]
        read_only_fields = fields


class RolloutApprovalSerializer(serializers.ModelSerializer):
    class Meta:
        model = RolloutApproval
        fields = ["step_index", "attempt", "approved_by_label", "reason", "created_at"]
        read_only_fields = fields


class RolloutEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label", read_only=True)

    class Meta:
        model = RolloutEvent
        fields = ["id", "created_at", "kind", "state", "step_index", "message", "data", "actor"]
        read_only_fields = fields


class RolloutSerializer(serializers.ModelSerializer):
    """A rollout as it stands: what was asked, where it is, and what it waits for."""

    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    deployment = serializers.IntegerField(source="deployment_id", read_only=True)
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)
    model = serializers.CharField(source="deployment.model.name", read_only=True)
    baseline = serializers.IntegerField(source="baseline.version", read_only=True,
                                        help_text="The stable version's number")
    candidate = serializers.SerializerMethodField(help_text="Canary: the candidate's number")
    is_active = serializers.BooleanField(read_only=True)
    is_final = serializers.SerializerMethodField()
    steps = serializers.SerializerMethodField()
    weights = VersionWeightsField(read_only=True)
    analysis = serializers.SerializerMethodField()
    route_url = serializers.SerializerMethodField(
        help_text="The URL of the deployment's route; null while none is in force",
    )
    # Declared for the schema: read-only model fields lose allow_blank, and "" (no action
    # asked for) is the usual value.
    requested_action = serializers.ChoiceField(
        choices=Rollout.Action.choices, allow_blank=True, read_only=True,
        help_text="The action asked for and not carried out yet; empty: none")

    class Meta:
        model = Rollout
        fields = [
            "id", "tenant", "deployment", "deployment_name", "model", "strategy", "state",
            "is_active", "is_final", "baseline", "candidate", "variants", "steps", "step_index",
            "step_started_at", "weights", "analysis", "servers", "sticky_header", "duration_s",
            "sample_size", "promote", "alias", "unload_previous", "dry_run", "requires_approval",
            "requested_action", "requested_action_by", "waiting_for", "reason", "verdict",
            "attempt", "requested_by_label", "idempotency_key", "request_id", "route_url",
            "created_at", "updated_at", "started_at", "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": ["integer", "null"]})
    def get_candidate(self, obj: Rollout) -> int | None:
        return obj.candidate.version if obj.candidate_id else None

    def get_is_final(self, obj: Rollout) -> bool:
        return obj.state in Rollout.FINAL

    @extend_schema_field(StepSerializer(many=True))
    def get_steps(self, obj: Rollout) -> list[dict[str, Any]]:
        current = obj.state in Rollout.ACTIVE and obj.started_at is not None
        return [{"index": i, "step": step, "current": current and i == obj.step_index,
                 "done": i < obj.step_index} for i, step in enumerate(obj.steps)]

    @extend_schema_field({
        "type": "object", "description": "The settings analyses run with (defaults, the "
        "rollout's and the deployment's SLO for the ceilings left out)",
        "properties": {**{key: {"type": ["number", "null"]}
                          for key in canary_analysis.ANALYSIS_DEFAULTS},
                       "metrics": {"type": "array", "items": METRIC_GATE_SCHEMA},
                       "rollback": ROLLBACK_SCHEMA,
                       "streamed": {"type": "boolean", "description": "An LLM route: "
                                    "streamed answers are judged on ttft and tpot (time per output token; generation, "
                                    "the time after the first token, where the router counts no tokens) too"}},
    })
    def get_analysis(self, obj: Rollout) -> dict[str, Any]:
        return canary_analysis.analysis_config(obj)

    @extend_schema_field({"type": ["string", "null"], "format": "uri"})
    def get_route_url(self, obj: Rollout) -> str | None:
        route = getattr(obj.deployment, "route", None)
        if route is None or not route.url or route.state == Route.State.REMOVED:
            return None
        return route.url


class RolloutDetailSerializer(RolloutSerializer):
    """A rollout with its analyses, approvals and timeline (the newest events)."""

    analyses = RolloutAnalysisSerializer(many=True, read_only=True)
    approvals = RolloutApprovalSerializer(many=True, read_only=True)
    events = serializers.SerializerMethodField(
        help_text=f"The timeline, oldest first: the newest {EVENTS_SHOWN} events",
    )
    events_total = serializers.SerializerMethodField()

    class Meta(RolloutSerializer.Meta):
        fields = [*RolloutSerializer.Meta.fields, "analyses", "approvals", "events",
                  "events_total"]
        read_only_fields = fields

    @extend_schema_field(RolloutEventSerializer(many=True))
    def get_events(self, obj: Rollout) -> list[dict[str, Any]]:
        newest = RolloutEvent.objects.filter(rollout=obj).order_by("-created_at", "-id")
        return RolloutEventSerializer(reversed(newest[:EVENTS_SHOWN]), many=True).data

    def get_events_total(self, obj: Rollout) -> int:
        return RolloutEvent.objects.filter(rollout=obj).count()


# --------------------------------------------------------------------------------------------
# The viewset
# --------------------------------------------------------------------------------------------


def _visible_deployments(request: Request | None) -> Any:
    return Deployment.objects.visible_to(request.user if request is not None else None)


class RolloutFilterSet(FilterSet):
    """``deployment`` is the deployment's id or its name, as in request bodies."""

    deployment = IdOrNameFilter(queryset=_visible_deployments, help_text="deployment id or name")

    class Meta:
        model = Rollout
        fields = {
            "deployment__name": ["exact"],
            "state": ["exact", "in"],
            "strategy": ["exact"],
        }


CONFLICT = OpenApiResponse(
    description="Another rollout is in flight on the deployment (on `deployment`), the "
                "Idempotency-Key was used for another request (on `idempotency_key`), or no "
                "version is ready on the deployment"
)
ACTION_CONFLICT = OpenApiResponse(
    description="The rollout's state does not allow the action, or another action is being "
                "carried out (on `action`)"
)
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
    description="At most 200 characters: the same key with the same body replays the first "
                "request (200 with its rollout); with another body it is a 409",
)


class RolloutViewSet(
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Rollouts: a canary moved by evidence, or an A/B split ended by a verdict."""

    write_roles = DEPLOYER_WRITES
    queryset = Rollout.objects.select_related(
        "tenant", "deployment__model", "deployment__route", "baseline", "candidate",
    )
    serializer_class = RolloutSerializer
    filterset_class = RolloutFilterSet
    ordering_fields = ["created_at", "updated_at", "finished_at"]
    lookup_value_regex = "[0-9]+"

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return RolloutSerializer if self.action == "list" else RolloutDetailSerializer

    def get_queryset(self) -> Any:
        queryset = super().get_queryset()
        if self.action != "list":
            queryset = queryset.prefetch_related(
                Prefetch("analyses", queryset=RolloutAnalysis.objects.order_by("created_at", "id")),
                Prefetch("approvals", queryset=RolloutApproval.objects.order_by("created_at", "id")),
            )
        return queryset

    def _answer(self, pk: int, code: int = status.HTTP_200_OK) -> Response:
        found = self.get_queryset().get(pk=pk)
        return Response(RolloutDetailSerializer(found).data, status=code)

    @extend_schema(
        request=RolloutRequestSerializer, parameters=[IDEMPOTENCY_KEY],
        responses={201: RolloutDetailSerializer, 200: RolloutDetailSerializer, 409: CONFLICT},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Ask for a rollout of a deployment (deployer role): 201, or 200 replaying an
        earlier request with the same Idempotency-Key. A production deployment's rollout (or
        one with ``require_approval``) waits in pending_approval for an approver."""
        body = RolloutRequestSerializer(data=request.data, context=self.get_serializer_context())
        # A body refused on some fields has the others checked too: one 400 names them all.
        refused, valid = ({}, body.validated_data) if body.is_valid() else refused_and_valid(
            body, needed=("deployment",))
        key = idempotency_key(request)
        try:
            found, made = rollout.create_rollout(
                request.user, valid["deployment"], idempotency_key=key,
                errors=FieldErrors(refused), **body.to_domain(valid),
            )
        except DomainError as exc:
            raise named_at_the_top(exc) from None
        return self._answer(found.pk, status.HTTP_201_CREATED if made else status.HTTP_200_OK)

    def _request(self, request: Request, what: str) -> Response:
        body = DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        found = rollout.request_action(request.user, self.get_object(), what,
                                       body.validated_data["reason"])
        return self._answer(found.pk, status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: OpenApiResponse(description=(
        "source (benchmark or live), change_pct (+18: the candidate costs 18% more per "
        "request), message, and the candidate's and the baseline's readings")),
        400: OpenApiResponse(description="an A/B split has no candidate and baseline")})
    @action(detail=True, methods=["get"])
    def cost(self, request: Request, pk: str | None = None) -> Response:
        """What the candidate costs per request against the baseline, before it is promoted
        ("v3 costs 18% more per request than v1")."""
        rollout = self.get_object()
        if rollout.strategy != Rollout.Strategy.CANARY or rollout.candidate is None:
            raise DomainError("an A/B split has no candidate and baseline to compare",
                              field="strategy")
        return Response(costs.compare(rollout.candidate, rollout.baseline))

    @extend_schema(request=DecisionSerializer,
                   responses={202: RolloutDetailSerializer, 409: ACTION_CONFLICT})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        """Pause a progressing canary (deployer role); carried out at the next tick."""
        return self._request(request, Rollout.Action.PAUSE)

    @extend_schema(request=DecisionSerializer,
                   responses={202: RolloutDetailSerializer, 409: ACTION_CONFLICT})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        """Resume a paused rollout (deployer role); a pause until resumed, or an
        inconclusive analysis, is accepted and the next step follows."""
        return self._request(request, Rollout.Action.RESUME)

    @extend_schema(request=DecisionSerializer,
                   responses={202: RolloutDetailSerializer, 409: ACTION_CONFLICT})
    @action(detail=True, methods=["post"])
    def promote(self, request: Request, pk: str | None = None) -> Response:
        """Promote a canary now, skipping its remaining steps (deployer role)."""
        return self._request(request, Rollout.Action.PROMOTE)

    @extend_schema(request=DecisionSerializer,
                   responses={202: RolloutDetailSerializer, 409: ACTION_CONFLICT})
    @action(detail=True, methods=["post"])
    def abort(self, request: Request, pk: str | None = None) -> Response:
        """Send all traffic back to the baseline and end the rollout as aborted (deployer
        role)."""
        return self._request(request, Rollout.Action.ABORT)

    @extend_schema(request=DecisionSerializer,
                   responses={200: RolloutDetailSerializer, 409: ACTION_CONFLICT})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        """Let a rollout pending approval start, or pass its approval step (approver role; a
        person, never a token, and not the one who asked for the rollout)."""
        body = DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        found = rollout.approve(request.user, self.get_object(), body.validated_data["reason"])
        return self._answer(found.pk)

    @extend_schema(request=DecisionSerializer,
                   responses={200: RolloutDetailSerializer, 409: ACTION_CONFLICT})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        """Start a rolled back, failed or aborted rollout again from its first step
        (deployer role); it waits for an approval again where it needed one."""
        body = DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        found = rollout.retry(request.user, self.get_object(), body.validated_data["reason"])
        return self._answer(found.pk)
