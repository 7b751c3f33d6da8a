"""Registry and deployment API. Every write goes through a domain function."""

from __future__ import annotations

import math
import time
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Count, OuterRef, Prefetch, QuerySet, Subquery
from django.db.models import Model as DjangoModel
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.exceptions import DomainError
from console.filters import FilterSet, parse_integer
from console.pagination import NewestFirstCursorPagination
from fleet.api.base import (
    DEPLOYER_WRITES,
    TenantScopedViewSetMixin,
    idempotency_key,
    resolve_tenant,
)
from fleet.api.refs import IdOrNameFilter
from fleet.models import Cluster, InferenceServer, Membership
from rollouts.api import serializers as s
from rollouts.api.consistency import ConsistencySerializer, ConvergeSerializer
from rollouts.api.filters import DeploymentFilter
from rollouts.deployments import consistency
from rollouts.deployments import lifecycle as deployments
from rollouts.loads import requests as loads
from rollouts.models import Alias, Deployment, Model, ModelLoad, ModelVersion, SloAlert
from rollouts.registry import approvals, costs
from rollouts.registry import versions as registry
from rollouts.traffic import latency

# The latency window, in seconds: from a minute to the 30 days of history kept.
MIN_WINDOW_S = 60
MAX_WINDOW_S = 30 * 86400
DEFAULT_WINDOW_S = 900


def _own_fields(model: type[DjangoModel]) -> list[str]:
    """Every column of ``model``, for an ``only()`` that narrows its related rows alone."""
    return [f.name for f in model._meta.concrete_fields]


class ReadsLean:
    """Lists and single reads load of each related row only what the serializer shows
    (``read_only``: the ``only()`` paths, the viewset's own columns all kept); writes and
    other actions get the full rows. A list of 50 loads or deployments then builds no
    server with its reported models, no version with its Triton config, no cluster with its
    credentials: each such row is columns to decode and a model instance to fill."""

    read_only: tuple[str, ...] = ()
    action: str | None

    def get_queryset(self) -> QuerySet:
        queryset = super().get_queryset()  # type: ignore[misc]
        if self.action not in ("list", "retrieve"):
            return queryset
        return queryset.only(*_own_fields(queryset.model), *self.read_only)


def _visible_models(request: Request | None) -> Any:
    return Model.objects.visible_to(request.user if request is not None else None)


def _visible_deployments(request: Request | None) -> Any:
    return Deployment.objects.visible_to(request.user if request is not None else None)


class ModelRefFilterSet(FilterSet):
    """``model`` is the model's id or its name, as in request bodies."""

    model = IdOrNameFilter(queryset=_visible_models, help_text="model id or name")


class VersionFilterSet(ModelRefFilterSet):
    class Meta:
        model = ModelVersion
        fields = {
            "model__name": ["exact"],
            "model__tenant__slug": ["exact"],
            "status": ["exact"],
            "runtime": ["exact"],
            "version": ["exact", "gte", "lte"],
        }


class AliasFilterSet(ModelRefFilterSet):
    class Meta:
        model = Alias
        fields = ["name"]


class LoadFilterSet(FilterSet):
    """``deployment`` is the deployment's id or its name, as in request bodies."""

    deployment = IdOrNameFilter(queryset=_visible_deployments, help_text="deployment id or name")

    class Meta:
        model = ModelLoad
        fields = {
            "deployment__name": ["exact"],
            "server__name": ["exact"],
            "state": ["exact", "in"],
            "version__version": ["exact"],
        }


class DeploymentRefFilter(DeploymentFilter):
    model = IdOrNameFilter(queryset=_visible_models, help_text="model id or name")
    cluster = IdOrNameFilter(queryset=Cluster.objects.all(), help_text="cluster id or name")


class ModelViewSet(
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Models in the registry. Creating is idempotent: the same name answers 200 with the
    existing model."""

    write_roles = DEPLOYER_WRITES
    # The latest version is a subquery per row (an index lookup on (model, version)), not a
    # GROUP BY over every version: a page reads 50 models, and the page's count query, which
    # leaves the subquery out, counts models alone.
    queryset = Model.objects.select_related("tenant").prefetch_related(
        Prefetch("aliases", queryset=Alias.objects.select_related("version").only(
            "model", "name", "version__version"), to_attr=s.prefetched("aliases"))
    ).annotate(latest_version=Subquery(
        ModelVersion.objects.filter(model=OuterRef("pk")).order_by("-version").values("version")[:1]
    )).order_by("tenant__slug", "name")
    serializer_class = s.ModelSerializer
    filterset_fields = {"tenant__slug": ["exact"], "name": ["exact", "icontains"]}

    @extend_schema(responses={201: s.ModelSerializer, 200: s.ModelSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        tenant = resolve_tenant(data, request.user)
        model, created = registry.create_model(
            request.user, tenant, data["name"], data.get("description", "")
        )
        body = self.get_serializer(self.get_queryset().get(pk=model.pk)).data
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def perform_update(self, serializer: s.ModelSerializer) -> None:
        data = serializer.validated_data
        registry.update_model(
            self.request.user, serializer.instance, data.get("name"), data.get("description")
        )


class ModelVersionViewSet(
    ReadsLean,
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Immutable model versions. Registering the same (model, version, sha256) again answers
    200 with the existing row; the same version with another sha256 is a 409."""

    write_roles = DEPLOYER_WRITES
    queryset = ModelVersion.objects.select_related(
        "model__tenant", "registered_by", "registered_by_token"
    )
    read_only = ("model__name", "model__tenant__slug", "registered_by__username",
                 "registered_by_token__name")
    serializer_class = s.ModelVersionSerializer
    filterset_class = VersionFilterSet
    ordering_fields = ["version", "created_at"]

    @extend_schema(responses={201: s.ModelVersionSerializer, 200: s.ModelVersionSerializer,
                              409: OpenApiResponse(description="same version, other sha256")})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        model = data.pop("model")
        ask = data.pop("request_approval", False)
        version, created = registry.register_version(request.user, model, data, request_approval=ask)
        body = self.get_serializer(version).data
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def _decide(self, request: Request, fn: Any) -> Response:
        decision = s.DecisionSerializer(data=request.data)
        decision.is_valid(raise_exception=True)
        version = fn(request.user, self.get_object(), decision.validated_data["reason"])
        return Response(self.get_serializer(self.get_queryset().get(pk=version.pk)).data)

    @extend_schema(request=s.DecisionSerializer, responses=s.ModelVersionSerializer)
    @action(detail=True, methods=["post"], url_path="request-approval")
    def request_approval(self, request: Request, pk: str | None = None) -> Response:
        """Move a registered version to pending_approval (deployer role)."""
        return self._decide(request, approvals.request_approval)

    @extend_schema(request=s.DecisionSerializer, responses=s.ModelVersionSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        """Approve (approver role, a person, not the one who asked: four-eyes)."""
        return self._decide(request, approvals.approve)

    @extend_schema(request=s.DecisionSerializer, responses=s.ModelVersionSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        """Reject with a reason (approver role, a person)."""
        return self._decide(request, approvals.reject)

    @extend_schema(request=s.DecisionSerializer, responses=s.ModelVersionSerializer)
    @action(detail=True, methods=["post"])
    def archive(self, request: Request, pk: str | None = None) -> Response:
        """Archive an approved, rejected or never-requested version (approver role)."""
        return self._decide(request, approvals.archive)

    @extend_schema(responses={200: OpenApiResponse(description=(
        "benchmark and live readings (unit-seconds per 1,000 requests, price per 1,000 in the "
        "device class's currency, the numbers read), the version it would replace "
        "(replaces) and the comparison with it (compared.change_pct: +18 is 18% more per "
        "request)"))})
    @action(detail=True, methods=["get"])
    def cost(self, request: Request, pk: str | None = None) -> Response:
        """What the version costs per 1,000 requests: GPU-seconds (model-instance-seconds on
        CPU nodes) from its benchmark's most load within the SLO and from live traffic, and
        money where its device class has a price; and how it compares with the version it
        would replace (the model's production alias)."""
        return Response(costs.of_version(self.get_object()))


class AliasViewSet(TenantScopedViewSetMixin, viewsets.ModelViewSet):
    """Aliases such as production or staging. POST sets (creates or moves) an alias. The
    production alias names approved versions only: any other is a 400 on ``version``."""

    write_roles = DEPLOYER_WRITES
    queryset = Alias.objects.select_related("model__tenant", "version")
    serializer_class = s.AliasSerializer
    filterset_class = AliasFilterSet

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        existed = Alias.objects.filter(model=data["model"], name=data["name"]).exists()
        alias = registry.set_alias(
            request.user, data["model"], data["name"], data["model_version"], data["reason"]
        )
        code = status.HTTP_200_OK if existed else status.HTTP_201_CREATED
        return Response(self.get_serializer(alias).data, status=code)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        alias = self.get_object()
        serializer = self.get_serializer(alias, data=request.data, partial=kwargs.get("partial"))
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        name = data.get("name", alias.name)
        if name != alias.name:
            raise DomainError("an alias cannot be renamed; create the new name", field="name")
        alias = registry.set_alias(
            request.user, alias.model, name, data["model_version"], data.get("reason", "")
        )
        return Response(self.get_serializer(alias).data)

    def perform_destroy(self, instance: Alias) -> None:
        registry.delete_alias(self.request.user, instance)


class DeploymentViewSet(ReadsLean, TenantScopedViewSetMixin, viewsets.ModelViewSet):
    """Deployments: a model on a cluster, with its SLO. ``model`` and ``cluster`` are ids or
    names, in bodies and filters alike (a deployment reads its cluster back by name)."""

    write_roles = {**DEPLOYER_WRITES, "destroy": Membership.Role.ADMIN,
                   "converge": Membership.Role.DEPLOYER}
    queryset = Deployment.objects.select_related(
        "tenant", "model", "cluster", "route", "slo"
    ).prefetch_related("servers").annotate(alerts_firing=Subquery(
        SloAlert.objects.filter(deployment=OuterRef("pk"), state=SloAlert.State.FIRING)
        .values("deployment").annotate(n=Count("pk")).values("n")[:1]
    ))
    read_only = ("tenant__slug", "model__name", "cluster__name", "route__url", "route__state",
                 *(f"slo__{f}" for f in ("state", "since", "reason", "budget_left", "burn_5m", "burn_30m",
                                         "burn_1h", "burn_6h", "detail", "evaluated_at")))
    serializer_class = s.DeploymentSerializer
    filterset_class = DeploymentRefFilter

    def get_queryset(self) -> QuerySet:
        queryset = super().get_queryset()
        if self.action in ("list", "retrieve"):
            # Only the servers' names are shown.
            queryset = queryset.prefetch_related(None).prefetch_related(
                Prefetch("servers", queryset=InferenceServer.objects.only("name"),
                         to_attr=s.prefetched("servers")))
        return queryset

    @extend_schema(
        parameters=[OpenApiParameter(
            "since", {"type": "number", "minimum": 0},
            description="epoch seconds of the newest point the caller has: only the points "
                        "from then on come back (they replace the caller's from ``since`` in "
                        "the answer on), versions with nothing new are left out",
        ), OpenApiParameter(
            "window",
            {"type": "integer", "minimum": MIN_WINDOW_S, "maximum": MAX_WINDOW_S,
             "default": DEFAULT_WINDOW_S},
            description="seconds back (60 to 2592000, 30 days; default 900)",
        )],
        responses={200: OpenApiResponse(description="p50/p95/p99, rate and error rate per version")},
    )
    @action(detail=True, methods=["get"])
    def latency(self, request: Request, pk: str | None = None) -> Response:
        """Live latency per version: full resolution for 15 minutes, minute rollups beyond."""
        raw = request.query_params.get("window", str(DEFAULT_WINDOW_S))
        try:
            window = parse_integer(raw, MIN_WINDOW_S, MAX_WINDOW_S)
        except DjangoValidationError as exc:
            message = (f"must be a number of seconds, got {raw!r}" if exc.code == "invalid"
                       else "must be between 60 and 2592000 seconds (30 days)")
            raise DomainError(message, field="window") from None
        return Response(latency.series(self.get_object(), window, _since(request)))

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        # A page of deployments is judged in two queries, not two a deployment.
        if kwargs.get("many") and args:
            rows = list(args[0])
            kwargs.setdefault("context", self.get_serializer_context())
            kwargs["context"]["consistency_states"] = consistency.states_of(rows)
            args = (rows, *args[1:])
        return super().get_serializer(*args, **kwargs)

    @extend_schema(responses={200: ConsistencySerializer})
    @action(detail=True, methods=["get"])
    def consistency(self, request: Request, pk: str | None = None) -> Response:
        """Per server, each version of the model it serves, with its config hash and state,
        and whether the servers disagree (a version missing from one, a version run with
        several configs)."""
        return Response(ConsistencySerializer(consistency.view(self.get_object())).data)

    @extend_schema(
        request=s.DecisionSerializer,
        responses={202: ConvergeSerializer,
                   409: OpenApiResponse(description="nothing to converge (the servers agree), "
                                                    "or a rollout, benchmark or load is changing "
                                                    "what the deployment serves")},
    )
    @action(detail=True, methods=["post"])
    def converge(self, request: Request, pk: str | None = None) -> Response:
        """Make the servers agree (deployer role): each version missing from a server is
        loaded there, and a version run with several configs gets its own config sent again
        where it is ready. Nothing is unloaded. One audited action; poll consistency/ (or the
        loads) until it reads consistent."""
        body = s.DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        done = consistency.converge(request.user, self.get_object(),
                                    reason=body.validated_data["reason"])
        return Response(ConvergeSerializer(done).data, status=status.HTTP_202_ACCEPTED)

    def perform_create(self, serializer: s.DeploymentSerializer) -> None:
        data = dict(serializer.validated_data)
        servers = data.pop("servers", None)
        reason = data.pop("reason", "")
        deployment = Deployment(**data)
        if servers is None:
            servers = list(deployment.cluster.servers.all())
        serializer.instance = deployments.save_deployment(self.request.user, deployment, servers,
                                                          reason)

    def perform_update(self, serializer: s.DeploymentSerializer) -> None:
        """A change of ``production`` needs the approver role, and turning it on is refused
        (409) while a version that is not approved is on the deployment."""
        data = dict(serializer.validated_data)
        servers = data.pop("servers", None)
        reason = data.pop("reason", "")
        deployment = serializer.instance
        for key, value in data.items():
            setattr(deployment, key, value)
        serializer.instance = deployments.save_deployment(self.request.user, deployment, servers,
                                                          reason)

    def perform_destroy(self, instance: Deployment) -> None:
        deployments.delete_deployment(self.request.user, instance)


def _since(request: Request) -> float | None:
    """The ``since`` of a latency poll: epoch seconds, not in the future."""
    raw = request.query_params.get("since")
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise DomainError(f"must be epoch seconds, got {raw[:40]!r}", field="since") from None
    if not math.isfinite(value) or not 0 <= value <= time.time() + 60:
        raise DomainError("must be epoch seconds, not in the future", field="since")
    return value


class ModelLoadViewSet(
    ReadsLean,
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Model loads and unloads onto a deployment's servers.

    POST starts a load (or, with ``"action": "unload"``, an unload) of one version on each
    of the deployment's servers and answers 202 with the loads to poll; a version already
    ready is not loaded again. Send an ``Idempotency-Key`` header to make retries safe: the
    same key answers 200 with the loads it started. Another load of the same model in flight
    on a server is a 409.
    """

    write_roles = DEPLOYER_WRITES
    queryset = ModelLoad.objects.select_related(
        "deployment", "server", "version__model"
    ).prefetch_related(Prefetch("events", to_attr=s.prefetched("events")))
    read_only = ("deployment__name", "server__name", "version__version", "version__model__name")
    serializer_class = s.ModelLoadSerializer
    filterset_class = LoadFilterSet
    pagination_class = NewestFirstCursorPagination

    @extend_schema(
        request=s.LoadRequestSerializer,
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False)],
        responses={202: s.ModelLoadSerializer(many=True), 200: s.ModelLoadSerializer(many=True),
                   409: OpenApiResponse(description="another load of the model is in flight")},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = s.LoadRequestSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        data = body.validated_data
        key = idempotency_key(request)
        if data["action"] == "unload":
            rows = loads.request_unload(
                request.user, data["deployment"], data["model_version"],
                server_names=data.get("servers"),
            )
            code = status.HTTP_202_ACCEPTED if rows else status.HTTP_200_OK
        else:
            rows, created = loads.request_load(
                request.user, data["deployment"], data["model_version"],
                server_names=data.get("servers"), idempotency_key=key,
            )
            code = status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK
        fresh = self.get_queryset().filter(pk__in=[r.pk for r in rows])
        return Response(self.get_serializer(fresh, many=True).data, status=code)
