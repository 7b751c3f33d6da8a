"""Benchmarks API: measured capacity of a version on a fleet server, for people and for CI.

``GET /benchmarks/`` lists the jobs the caller can see; ``GET /benchmarks/{id}/`` reads one
with its progress, phase and results (every level measured, per config); ``POST
/benchmarks/`` asks for one (with an ``Idempotency-Key`` a retried request replays the
first); ``POST /benchmarks/{id}/cancel/`` stops it (the load stops within a second, the next
tick unloads and ends it); ``GET /benchmarks/{id}/results/`` answers the figures in a compact
shape for CI; ``POST /benchmarks/{id}/register-config/`` registers the best (or a chosen)
config of a config sweep as a new version; ``GET /benchmarks/compare/?a=&b=`` sets two jobs'
summaries side by side. Every write calls :mod:`rollouts.benchmarks.requests`, as the console does.

The views and their filters; what they read and write is shaped in :mod:`.benchmark_serializers`,
documented with the schemas of :mod:`.benchmark_schemas`.
"""

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.exceptions import DomainError, FieldErrors
from console.filters import FilterSet, IntegerFilter, parse_integer
from console.schema import AutoSchema
from console.serializers import refused_and_valid
from fleet.api.base import (
    DEPLOYER_WRITES,
    MAX_IDEMPOTENCY_KEY,
    TenantScopedViewSetMixin,
    idempotency_key,
)
from fleet.api.refs import IdOrNameFilter
from fleet.models import InferenceServer
from rollouts.api.benchmark_schemas import COMPARE_RESPONSE, RESULTS_RESPONSE
from rollouts.api.benchmark_serializers import (
    BENCHMARK_REQUEST,
    BenchmarkJobDetailSerializer,
    BenchmarkJobSerializer,
    BenchmarkRequestSerializer,
    RegisterConfigSerializer,
    change_pct,
    compact_results,
    compare_side,
)
from rollouts.api.rollouts import named_at_the_top
from rollouts.api.serializers import ModelVersionSerializer
from rollouts.benchmarks import requests as job_requests
from rollouts.benchmarks import results
from rollouts.models import BenchmarkJob, Deployment, Model


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
        # A body refused on some fields has the others checked too: one 400 names them all.
        refused, valid = ({}, body.validated_data) if body.is_valid() else refused_and_valid(
            body, needed=("deployment",))
        key = idempotency_key(request)
        try:
            found, made = job_requests.create_job(
                request.user, valid["deployment"], idempotency_key=key,
                errors=FieldErrors(refused), **body.to_domain(valid),
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
        found = job_requests.cancel(request.user, self.get_object())
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
        return Response({"a": compare_side(a), "b": compare_side(b),
                         "max_load_rps_change_pct": change_pct(*rps),
                         "same_mode": a.mode == b.mode})
