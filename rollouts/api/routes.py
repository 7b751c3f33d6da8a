"""Traffic routes API: a deployment's route, keyed by the deployment's id.

``GET /routes/`` lists the routes the caller can see; ``GET /routes/{deployment}/`` reads one
(its client URL, state, policy, mirror and split); ``PUT`` sets the split (``PATCH`` changes
only what it names), ``POST /routes/`` gives a deployment its default route, and
``GET /routes/{deployment}/revisions/`` is its history; ``DELETE`` takes the route off the
router (so the versions it sent traffic to can be unloaded). Every write calls
:mod:`rollouts.traffic.routes`, as the console does.
"""

from __future__ import annotations

import re
from typing import Any

from django.http import Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.serializers import StrictFieldsMixin
from fleet.adapters.routers.base import POLICIES, WEIGHTED
from fleet.api.base import DEPLOYER_WRITES, TenantScopedViewSetMixin
from fleet.api.refs import IdOrNameField
from rollouts.models import Deployment, Route, RouteRevision
from rollouts.traffic import routes, specs

VERSION_KEY = re.compile(r"^[1-9][0-9]{0,9}$")
HEADER = r"^[A-Za-z][A-Za-z0-9-]{0,63}$"
MAX_PK = 2**63 - 1
WEIGHT_SCHEMA = {"type": "integer", "minimum": 0, "maximum": 100}


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


class RouteVariantSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="v<version>-<server>: the variant of every sample")
    version = serializers.IntegerField(allow_null=True)
    server = serializers.CharField()
    weight = serializers.IntegerField(help_text="Share of the requests, in percent")
    upstream = serializers.CharField(help_text="The server's base URL")
    model = serializers.CharField(help_text="Triton model a request is rewritten to (kserve-v2)")
    mirror = serializers.BooleanField(help_text="Receives the mirrored copies")


class RouteMirrorSerializer(serializers.Serializer):
    variant = serializers.CharField()
    version = serializers.IntegerField(allow_null=True)
    server = serializers.CharField()
    percent = serializers.IntegerField()


def _mirror_of(spec: dict[str, Any], meaning: dict[str, Any]) -> dict[str, Any] | None:
    mirror = spec.get("mirror")
    if not isinstance(mirror, dict):
        return None
    target = meaning.get(mirror["variant"]) or {}
    return {"variant": mirror["variant"], "version": target.get("version"),
            "server": target.get("server", ""), "percent": mirror["percent"]}


@extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"},
                      "example": {"1": 90, "2": 10}})
class VersionWeightsField(serializers.Field):
    """Share of the traffic per version number (its variants added up)."""

    def to_representation(self, value: Any) -> dict[str, int]:
        return {str(n): w for n, w in value.items()}


class RouteSerializer(serializers.ModelSerializer):
    """A deployment's route as in force (``state`` failed: the last change was refused and
    ``error`` says why; the route before it is still in force)."""

    id = serializers.IntegerField(source="pk", read_only=True,
                                  help_text="The route's id: its deployment's id")
    deployment = serializers.IntegerField(source="deployment_id", read_only=True)
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)
    tenant = serializers.CharField(source="deployment.tenant.slug", read_only=True)
    weights = VersionWeightsField(source="version_weights", read_only=True)
    variants = serializers.SerializerMethodField()
    mirror = serializers.SerializerMethodField()
    timeout_s = serializers.SerializerMethodField(
        help_text="The request deadline in force, in seconds (the deployment's "
                  "request_timeout_s when it was last applied); null: the router's own limit")

    class Meta:
        model = Route
        fields = [
            "id", "deployment", "deployment_name", "tenant", "name", "url", "protocol", "state",
            "error", "policy", "sticky_header", "mirror", "timeout_s", "weights", "variants", "revision",
            "applied_at", "created_at", "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(RouteVariantSerializer(many=True))
    def get_variants(self, route: Route) -> list[dict[str, Any]]:
        return route.split()

    @extend_schema_field(RouteMirrorSerializer(allow_null=True))
    def get_mirror(self, route: Route) -> dict[str, Any] | None:
        return _mirror_of(route.spec, route.variants)

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_timeout_s(self, route: Route) -> float | None:
        return route.spec.get("timeout_s") if route.spec else None


class RouteRevisionSerializer(serializers.ModelSerializer):
    """One change of a route, as asked and as the router answered."""

    policy = serializers.CharField(read_only=True)
    sticky_header = serializers.SerializerMethodField()
    mirror = serializers.SerializerMethodField()
    variants = serializers.SerializerMethodField()
    actor = serializers.CharField(source="actor_label", read_only=True)

    class Meta:
        model = RouteRevision
        fields = [
            "number", "result", "changed", "reloaded", "message", "url", "actor", "reason",
            "weights", "policy", "sticky_header", "mirror", "variants", "created_at",
        ]
        read_only_fields = fields

    def get_sticky_header(self, revision: RouteRevision) -> str:
        return str(revision.spec.get("sticky_header", ""))

    @extend_schema_field(RouteMirrorSerializer(allow_null=True))
    def get_mirror(self, revision: RouteRevision) -> dict[str, Any] | None:
        return _mirror_of(revision.spec, revision.variants)

    @extend_schema_field(RouteVariantSerializer(many=True))
    def get_variants(self, revision: RouteRevision) -> list[dict[str, Any]]:
        mirror = revision.mirror or {}
        rows = []
        for variant in revision.spec.get("variants", []):
            meaning = revision.variants.get(variant["name"]) or {}
            rows.append({
                "name": variant["name"], "weight": variant["weight"],
                "version": meaning.get("version"), "server": meaning.get("server", ""),
                "upstream": variant["upstream"], "model": variant.get("model", ""),
                "mirror": mirror.get("variant") == variant["name"],
            })
        return rows


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


@extend_schema_field({
    "type": "object",
    "minProperties": 1,
    "propertyNames": {"pattern": VERSION_KEY.pattern},
    "additionalProperties": {"oneOf": [
        WEIGHT_SCHEMA,
        {"type": "object", "minProperties": 1, "propertyNames": {"minLength": 1},
         "additionalProperties": WEIGHT_SCHEMA},
    ]},
    "description": (
        "Share of the traffic per version number, in percent, summing to 100: a number (split "
        "evenly over the servers the version is ready on) or an object of server name to "
        "number. Ready versions left out get 0."
    ),
    "example": {"1": 90, "2": 10},
})
class WeightsField(serializers.Field):
    """``{"1": 90, "2": 10}`` or ``{"1": {"triton-a": 45, "triton-b": 45}, "2": 10}``, read
    into the domain's form: version number (or (version number, server name)) to weight."""

    def to_internal_value(self, data: Any) -> dict[Any, int]:
        if not isinstance(data, dict) or not data:
            raise serializers.ValidationError(
                'must be an object of version number to weight, e.g. {"1": 90, "2": 10}'
            )
        weights: dict[Any, int] = {}
        for key, value in data.items():
            if not isinstance(key, str) or not VERSION_KEY.match(key):
                raise serializers.ValidationError(f"{key!r}: keys are version numbers, e.g. \"2\"")
            number = int(key)
            if isinstance(value, dict) and value:
                for server, weight in value.items():
                    if not isinstance(server, str) or not server:
                        raise serializers.ValidationError(f"v{number}: server names are not empty")
                    weights[(number, server)] = _weight(f"v{number} on {server}", weight)
            else:
                weights[number] = _weight(f"v{number}", value)
        return weights

    def to_representation(self, value: Any) -> Any:
        return value


def _weight(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise serializers.ValidationError(
            f"{where}: a weight is an integer from 0 to 100 (or, per server, an object of "
            f"server name to weight), got {value!r}"
        )
    return value


class MirrorTargetSerializer(StrictFieldsMixin, serializers.Serializer):
    version = serializers.IntegerField(min_value=1, max_value=MAX_PK,
                                       help_text="The version that receives the copies")
    percent = serializers.IntegerField(min_value=0, max_value=100,
                                       help_text="Share of the requests copied to it (0: none)")
    server = serializers.CharField(required=False, allow_blank=True, max_length=64,
                                   help_text="Its server; the first it is ready on when left out")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A PATCH makes nested fields optional too; a mirror is whole or not sent at all.
        missing = [name for name in ("version", "percent") if name not in attrs]
        if missing:
            raise serializers.ValidationError({name: [serializers.Field.default_error_messages[
                "required"]] for name in missing})
        return attrs


class RouteChangeSerializer(StrictFieldsMixin, serializers.Serializer):
    """A route change. With PATCH, what is left out stays as in force."""

    weights = WeightsField()
    policy = serializers.ChoiceField(choices=list(POLICIES), required=False,
                                     help_text="weighted (default), least-pending or sticky")
    sticky_header = serializers.RegexField(
        HEADER, required=False, allow_blank=True, max_length=64,
        help_text="The request header whose value keeps a client on its variant (sticky)",
        error_messages={"invalid": "must be a header name of letters, digits and hyphens "
                                   "starting with a letter (at most 64)"},
    )
    mirror = MirrorTargetSerializer(required=False, allow_null=True,
                                     help_text="Shadow traffic: null for none")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)

    def to_domain(self, current: Route | None) -> dict[str, Any]:
        """set_route's keyword arguments: what was sent, and for PATCH what is in force."""
        data = self.validated_data
        keep = self.partial and current is not None and bool(current.spec)
        if "weights" in data:
            weights = data["weights"]
        elif keep:
            weights = {(row["version"], row["server"]): row["weight"]
                       for row in current.split() if row["weight"] > 0}
        else:
            raise serializers.ValidationError({"weights": ["This field is required."]})
        policy = data.get("policy", current.policy if keep else WEIGHTED)
        header = data.get("sticky_header")
        if header is None:
            header = current.sticky_header if keep and policy == Route.Policy.STICKY else ""
        if "mirror" in data:
            mirror = data["mirror"]
            target = None if mirror is None else specs.MirrorTarget(
                version=mirror["version"], percent=mirror["percent"],
                server=mirror.get("server", ""))
        else:
            now = _mirror_of(current.spec, current.variants) if keep else None
            target = None if now is None else specs.MirrorTarget(
                version=now["version"], percent=now["percent"], server=now["server"])
        return {"weights": weights, "policy": policy, "sticky_header": header,
                "mirror": target, "reason": data.get("reason", "")}


class RouteCreateSerializer(StrictFieldsMixin, serializers.Serializer):
    """Give a deployment its default route: all traffic to the production alias's version
    when it is ready, else to the newest ready version."""

    deployment = IdOrNameField(queryset=Deployment.objects.none(),
                               help_text="Deployment id, or its name")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.fields["deployment"].queryset = Deployment.objects.visible_to(request.user)


# --------------------------------------------------------------------------------------------
# The viewset
# --------------------------------------------------------------------------------------------

CONFLICT = OpenApiResponse(
    description="The cluster has no traffic router, another change of the route is being "
                "applied, or the router refused the change (nginx's message on `route`; the "
                "route in force is unchanged and the failed revision is recorded)"
)


class RouteViewSet(
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Deployment routes, by deployment id: the client URL and the split of its traffic."""

    write_roles = DEPLOYER_WRITES
    queryset = Route.objects.select_related("deployment__tenant").order_by("deployment_id")
    serializer_class = RouteSerializer
    filterset_fields = {"state": ["exact"], "policy": ["exact"], "deployment__name": ["exact"]}
    ordering_fields = ["deployment", "applied_at", "updated_at"]
    lookup_value_regex = "[0-9]+"

    def _pk(self) -> int:
        pk = int(self.kwargs["pk"])
        if not 0 < pk <= MAX_PK:
            raise Http404("no such route")
        return pk

    def get_object(self) -> Route:
        route = get_object_or_404(self.get_queryset(), pk=self._pk())
        self.check_object_permissions(self.request, route)
        return route

    def _deployment(self) -> Deployment:
        return get_object_or_404(
            Deployment.objects.visible_to(self.request.user).select_related(
                "tenant", "model", "cluster"
            ),
            pk=self._pk(),
        )

    def _answer(self, pk: int, code: int = status.HTTP_200_OK) -> Response:
        return Response(RouteSerializer(self.get_queryset().get(pk=pk)).data, status=code)

    @extend_schema(request=RouteCreateSerializer,
                   responses={201: RouteSerializer, 200: RouteSerializer, 409: CONFLICT})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Give a deployment its default route (deployer role); 200 with the route it has
        when it has one."""
        body = RouteCreateSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        data = body.validated_data
        route, made = routes.ensure_route(request.user, data["deployment"], data.get("reason", ""))
        return self._answer(route.pk, status.HTTP_201_CREATED if made else status.HTTP_200_OK)

    @extend_schema(request=RouteChangeSerializer, responses={200: RouteSerializer, 409: CONFLICT})
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Set the deployment's split, policy and mirror (deployer role); a deployment with no
        route gets one. Asking for the route in force changes nothing."""
        deployment = self._deployment()
        body = RouteChangeSerializer(data=request.data, partial=kwargs.get("partial", False))
        body.is_valid(raise_exception=True)
        current = Route.objects.filter(pk=deployment.pk).first()
        route = routes.set_route(request.user, deployment, **body.to_domain(current))
        return self._answer(route.pk)

    @extend_schema(request=RouteChangeSerializer, responses={200: RouteSerializer, 409: CONFLICT})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Change what the body names; the rest stays as in force (deployer role)."""
        return self.update(request, *args, partial=True, **kwargs)

    @extend_schema(request=None, responses={204: None, 409: CONFLICT})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Take the route off the router (deployer role): its URL stops answering. The route
        stays, removed, with its history; a PUT routes again."""
        routes.remove_route(request.user, self._deployment())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=RouteRevisionSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=RouteRevisionSerializer,
            filter_backends=[])
    def revisions(self, request: Request, pk: str | None = None) -> Response:
        """The route's changes, newest first, each with who, why and the router's answer."""
        route = self.get_object()
        page = self.paginate_queryset(
            RouteRevision.objects.filter(route=route).order_by("-number")
        )
        serializer = RouteRevisionSerializer(page, many=True)
        return self.get_paginated_response(serializer.data)
