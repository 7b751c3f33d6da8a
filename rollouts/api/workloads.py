"""Server workloads API: Triton and vLLM servers Switchyard runs on Kubernetes clusters.

``GET /workloads/`` lists the workloads the caller can see (``?deployment=``, ``?state=``);
``GET /workloads/{id}/`` reads one; ``POST /workloads/`` asks for one (deployer role; quota
admitted first; with an ``Idempotency-Key`` a retried request replays the first);
``POST /workloads/{id}/scale/`` and ``roll/`` start a change the reconciler carries out
(202); ``DELETE /workloads/{id}/`` starts taking it away (202). Every write calls
:mod:`rollouts.workloads.requests`, as the console does.

A workload created with ``min_replicas`` and ``max_replicas`` is autoscaled: an HPA owns its
replica count, its quota is held for ``max_replicas``, and ``scale/`` takes a new range
(``{"min_replicas": a, "max_replicas": b}``) instead of ``replicas``. Autoscaled or not is
decided at creation.
"""

from __future__ import annotations

from typing import Any

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

from console.filters import FilterSet
from console.schema import AutoSchema
from console.serializers import StrictFieldsMixin
from fleet.adapters import kube_workloads as kw
from fleet.api.base import DEPLOYER_WRITES, TenantScopedViewSetMixin, idempotency_key
from fleet.api.refs import IdOrNameField, IdOrNameFilter
from rollouts.models import Deployment, ModelVersion, ServerWorkload
from rollouts.workloads import checks
from rollouts.workloads import requests as workloads

MAX_VERSION = 2**31 - 1  # what a version number column holds
State = ServerWorkload.State

# The patterns the domain checks (rollouts.workloads.requests), stated for the schema as well.
NAME = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
NAMESPACE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
GPU_RESOURCE = r"^nvidia\.com/(gpu|mig-[1-7]g\.[0-9]{1,3}gb)$"
CLAIM = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*)?$"
REPOSITORY = r"^(s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\s\x00-\x1f]*)?|/[^\s\x00-\x1f]*)?$"
IMAGE = r"^[^\s\x00-\x1f]{1,300}$"
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"


@extend_schema_field({
    "type": "object",
    "description": (
        "Node labels the pods must run on (the pod's nodeSelector). nvidia.com/gpu.product is "
        "required: with the GPU resource it names the device class whose quota is used"
    ),
    "properties": {kw.PRODUCT_LABEL: {"type": "string", "minLength": 1, "maxLength": 63,
                                      "pattern": LABEL_VALUE}},
    "required": [kw.PRODUCT_LABEL],
    "propertyNames": {"pattern": LABEL_KEY, "maxLength": 317},
    "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
    "maxProperties": 20,
    "example": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
})
class NodeSelectorField(serializers.JSONField):
    """The node selector as sent; the domain checks its names and values."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be an object of label names and values")
        return value


@extend_schema_field({"type": "string", "enum": list(State.values),
                      "description": " → ".join(State.values[:4]) + "; a change goes back "
                      "through applying; rolling_back → failed; deleting → deleted"})
class WorkloadStateField(serializers.CharField):
    """The workload's state (its own enum: other objects have states of the same name)."""


class WorkloadSerializer(serializers.ModelSerializer):
    """A server workload as it stands: what runs, where, and what the cluster says of it."""

    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    deployment = serializers.IntegerField(source="deployment_id", read_only=True)
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    model = serializers.CharField(source="version.model.name", read_only=True)
    version = serializers.IntegerField(source="version.version", read_only=True,
                                       help_text="The version the server runs")
    previous_version = serializers.SerializerMethodField(
        help_text="During a roll: the version it is rolling from",
    )
    state = WorkloadStateField(read_only=True)
    in_flight = serializers.SerializerMethodField(
        help_text="True while the reconciler still has work to do (poll until false)",
    )
    server = serializers.SerializerMethodField(help_text="The managed server's name")
    http_url = serializers.SerializerMethodField(
        help_text="Where the server answers inside the cluster: http://<name>.<namespace>.svc:8000",
    )
    units = serializers.IntegerField(read_only=True,
                                     help_text="GPUs (or MIG slices) it runs on: replicas x "
                                               "gpus_per_replica")
    device_class = serializers.SerializerMethodField(help_text="The quota's device class")
    memory_mib = serializers.SerializerMethodField(
        help_text="GPU memory its quota holds (autoscaled: for max_replicas)")
    ready_replicas = serializers.SerializerMethodField()
    available_replicas = serializers.SerializerMethodField()
    updated_replicas = serializers.SerializerMethodField()
    replicas = serializers.IntegerField(
        read_only=True, help_text="Servers (pods) it runs; autoscaled: what its HPA set on the "
                                  "Deployment, as last read")
    autoscaled = serializers.BooleanField(
        read_only=True, help_text="An HPA owns the replica count, between min_replicas and "
                                  "max_replicas (chosen at creation)")
    min_replicas = serializers.IntegerField(
        read_only=True, allow_null=True,
        help_text="Autoscaled: the fewest replicas its HPA keeps (null: not autoscaled)")
    max_replicas = serializers.IntegerField(
        read_only=True, allow_null=True,
        help_text="Autoscaled: the most replicas its HPA may run; the quota is held for these "
                  "(null: not autoscaled)")

    class Meta:
        model = ServerWorkload
        fields = [
            "id", "tenant", "deployment", "deployment_name", "cluster", "namespace", "name",
            "runtime", "image", "model", "version", "previous_version", "state", "in_flight",
            "detail", "error", "replicas", "autoscaled", "min_replicas", "max_replicas",
            "ready_replicas", "available_replicas", "updated_replicas", "gpu_resource", "gpus_per_replica", "units", "device_class",
            "memory_mib", "node_selector", "model_repository", "volume_claim", "server",
            "http_url", "generation", "observed", "applied_spec", "deadline_at", "attempts",
            "next_attempt_at", "requested_by_label", "created_at", "updated_at", "ready_at",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": ["integer", "null"]})
    def get_previous_version(self, obj: ServerWorkload) -> int | None:
        return obj.previous_version.version if obj.previous_version_id else None

    def get_in_flight(self, obj: ServerWorkload) -> bool:
        return obj.state in ServerWorkload.IN_FLIGHT

    @extend_schema_field({"type": ["string", "null"]})
    def get_server(self, obj: ServerWorkload) -> str | None:
        return obj.server.name if obj.server_id else None

    @extend_schema_field({"type": ["string", "null"], "format": "uri"})
    def get_http_url(self, obj: ServerWorkload) -> str | None:
        return obj.server.http_url if obj.server_id else None

    @extend_schema_field({"type": ["string", "null"]})
    def get_device_class(self, obj: ServerWorkload) -> str | None:
        return obj.placement.device_class if obj.placement_id else None

    @extend_schema_field({"type": ["integer", "null"]})
    def get_memory_mib(self, obj: ServerWorkload) -> int | None:
        return obj.placement.memory_mib if obj.placement_id else None

    def _count(self, obj: ServerWorkload, key: str) -> int | None:
        value = (obj.observed or {}).get(key)
        return value if isinstance(value, int) else None

    @extend_schema_field({"type": ["integer", "null"],
                          "description": "Pods ready, as last read (null: not read yet)"})
    def get_ready_replicas(self, obj: ServerWorkload) -> int | None:
        return self._count(obj, "ready")

    @extend_schema_field({"type": ["integer", "null"],
                          "description": "Pods available, as last read (null: not read yet)"})
    def get_available_replicas(self, obj: ServerWorkload) -> int | None:
        return self._count(obj, "available")

    @extend_schema_field({"type": ["integer", "null"],
                          "description": "Pods running the current spec, as last read"})
    def get_updated_replicas(self, obj: ServerWorkload) -> int | None:
        return self._count(obj, "updated")


class WorkloadRequestSerializer(StrictFieldsMixin, serializers.Serializer):
    """A server asked for: a version of a deployment's model, on Kubernetes."""

    deployment = IdOrNameField(queryset=Deployment.objects.none(),
                               help_text="Deployment id, or its name (on a kubernetes cluster)")
    version = serializers.IntegerField(min_value=1, max_value=MAX_VERSION,
                                       help_text="The version the server runs (vLLM: its base "
                                                 "model; Triton: the model it loads at start)")
    name = serializers.RegexField(
        NAME, max_length=63,
        help_text="The Deployment, Service and server name: a DNS label starting with a letter",
        error_messages={"invalid": "a Kubernetes Service name: lowercase letters, digits and "
                                   "dashes, starting with a letter (at most 63)"},
    )
    namespace = serializers.RegexField(
        NAMESPACE, max_length=63, required=False, allow_blank=True, default="",
        help_text="A namespace granted to the tenant on the cluster (default: the first "
                  "granted); another is a 400 on namespace",
        error_messages={"invalid": "a Kubernetes namespace name: lowercase letters, digits and "
                                   "dashes (at most 63)"},
    )
    replicas = serializers.IntegerField(
        min_value=1, max_value=checks.MAX_REPLICAS, required=False,
        help_text="Servers (pods) to run (default 1); leave it out for an autoscaled server",
    )
    min_replicas = serializers.IntegerField(
        min_value=1, max_value=checks.MAX_REPLICAS, required=False,
        help_text="With max_replicas: an autoscaled server, whose HorizontalPodAutoscaler keeps "
                  "at least this many replicas. Chosen at creation, for good",
    )
    max_replicas = serializers.IntegerField(
        min_value=1, max_value=checks.MAX_REPLICAS, required=False,
        help_text="With min_replicas: the most replicas the HPA may run (at least "
                  "min_replicas). The quota is admitted for this many up front",
    )
    gpu_resource = serializers.RegexField(
        GPU_RESOURCE, max_length=100, default=kw.GPU_RESOURCE,
        help_text="What each pod asks for, as many as the version's gpus: nvidia.com/gpu, or "
                  "a MIG slice such as nvidia.com/mig-3g.40gb",
        error_messages={"invalid": "nvidia.com/gpu, or a MIG slice such as "
                                   "nvidia.com/mig-3g.40gb"},
    )
    node_selector = NodeSelectorField()
    model_repository = serializers.RegexField(
        REPOSITORY, max_length=500, required=False, allow_blank=True, default="",
        help_text="Triton's model repository: s3://bucket/prefix, or the path volume_claim is "
                  "mounted at (vLLM: where a volume of weights is mounted)",
        error_messages={"invalid": "s3://bucket/prefix, or an absolute path"},
    )
    volume_claim = serializers.RegexField(
        CLAIM, max_length=253, required=False, allow_blank=True, default="",
        help_text="A PersistentVolumeClaim mounted read-only at model_repository",
        error_messages={"invalid": "a PersistentVolumeClaim name"},
    )
    image = serializers.RegexField(
        IMAGE, max_length=300, required=False,
        help_text="The container image (default: the site's Triton or vLLM image)",
        error_messages={"invalid": "a container image reference (no spaces)"},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.fields["deployment"].queryset = Deployment.objects.visible_to(request.user)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        deployment = attrs["deployment"]
        found = ModelVersion.objects.filter(model=deployment.model,
                                            version=attrs["version"]).first()
        if found is None:
            raise serializers.ValidationError(
                {"version": f"{deployment.model.name} has no version {attrs['version']}"})
        attrs["model_version"] = found
        return attrs

    def to_domain(self) -> dict[str, Any]:
        """create_workload's keyword arguments."""
        data = dict(self.validated_data)
        for key in ("deployment", "version", "model_version"):
            data.pop(key)
        return data


class _FixedWorkload(WorkloadRequestSerializer):
    """The schema of a server of a fixed replica count (``replicas``, default 1)."""

    min_replicas = None
    max_replicas = None

    class Meta:
        ref_name = "FixedWorkload"


class _AutoscaledWorkload(WorkloadRequestSerializer):
    """The schema of an autoscaled server: an HPA keeps it between ``min_replicas`` and
    ``max_replicas`` (min_replicas <= max_replicas, else a 400 on max_replicas); the quota is
    admitted for ``max_replicas``. Chosen at creation, for good."""

    replicas = None
    min_replicas = serializers.IntegerField(
        min_value=1, max_value=checks.MAX_REPLICAS,
        help_text="The fewest replicas the HorizontalPodAutoscaler keeps",
    )
    max_replicas = serializers.IntegerField(
        min_value=1, max_value=checks.MAX_REPLICAS,
        help_text="The most replicas the HPA may run (at least min_replicas); the quota is "
                  "admitted for this many up front",
    )

    class Meta:
        ref_name = "AutoscaledWorkload"


WORKLOAD_REQUEST = PolymorphicProxySerializer(
    component_name="WorkloadRequest",
    serializers=[_FixedWorkload, _AutoscaledWorkload],
    resource_type_field_name=None,
)


class ScaleSerializer(StrictFieldsMixin, serializers.Serializer):
    """``replicas`` for a workload of a fixed count; ``min_replicas`` and ``max_replicas``
    for an autoscaled one (the domain refuses the other form, saying why)."""

    replicas = serializers.IntegerField(
        min_value=0, max_value=checks.MAX_REPLICAS, required=False,
        help_text="Servers (pods) to run; 0 keeps the Deployment with no pods. Not for an "
                  "autoscaled workload: its HPA owns the count",
    )
    min_replicas = serializers.IntegerField(
        min_value=1, max_value=checks.MAX_REPLICAS, required=False,
        help_text="Autoscaled: the fewest replicas its HPA keeps (with max_replicas)",
    )
    max_replicas = serializers.IntegerField(
        min_value=1, max_value=checks.MAX_REPLICAS, required=False,
        help_text="Autoscaled: the most replicas its HPA may run (with min_replicas); a "
                  "higher maximum is admitted against the quota first",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        ranged = "min_replicas" in attrs or "max_replicas" in attrs
        if "replicas" in attrs and ranged:
            raise serializers.ValidationError({"replicas": [
                "give replicas (a fixed count), or min_replicas and max_replicas (an "
                "autoscaled workload), not both"]})
        if "replicas" not in attrs and not ranged:
            raise serializers.ValidationError({"replicas": [
                "give replicas, or min_replicas and max_replicas for an autoscaled workload"]})
        return attrs


class _FixedScale(StrictFieldsMixin, serializers.Serializer):
    """The schema of a scale of a workload of a fixed count."""

    replicas = serializers.IntegerField(
        min_value=0, max_value=checks.MAX_REPLICAS,
        help_text="Servers (pods) to run; 0 keeps the Deployment with no pods",
    )

    class Meta:
        ref_name = "FixedScale"


class _RangeScale(StrictFieldsMixin, serializers.Serializer):
    """The schema of a new range for an autoscaled workload's HPA (min_replicas <=
    max_replicas, else a 400 on max_replicas)."""

    min_replicas = serializers.IntegerField(
        min_value=1, max_value=checks.MAX_REPLICAS,
        help_text="The fewest replicas the HPA keeps",
    )
    max_replicas = serializers.IntegerField(
        min_value=1, max_value=checks.MAX_REPLICAS,
        help_text="The most replicas the HPA may run (at least min_replicas); a higher maximum "
                  "is admitted against the quota first",
    )

    class Meta:
        ref_name = "RangeScale"


SCALE_REQUEST = PolymorphicProxySerializer(
    component_name="Scale",
    serializers=[_FixedScale, _RangeScale],
    resource_type_field_name=None,
)


class RollSerializer(StrictFieldsMixin, serializers.Serializer):
    version = serializers.IntegerField(min_value=1, max_value=MAX_VERSION,
                                       help_text="The base-model version to roll to")


def _visible_deployments(request: Request | None) -> Any:
    return Deployment.objects.visible_to(request.user if request is not None else None)


class WorkloadFilterSet(FilterSet):
    """``deployment`` is the deployment's id or its name, as in request bodies."""

    deployment = IdOrNameFilter(queryset=_visible_deployments, help_text="deployment id or name")

    class Meta:
        model = ServerWorkload
        fields = {
            "deployment__name": ["exact"],
            "state": ["exact", "in"],
            "runtime": ["exact"],
            "namespace": ["exact"],
        }


CREATE_CONFLICT = OpenApiResponse(
    description="The quota is short (on `quota`, or on `max_replicas` for an autoscaled "
                "server, with the numbers), the deployment is not on a "
                "kubernetes cluster or is archived (on `deployment`), the name is taken (on "
                "`name`), another server's pods would carry the same labels (on `namespace`), "
                "or the Idempotency-Key was used for another request (on `idempotency_key`)"
)
CHANGE_CONFLICT = OpenApiResponse(
    description="The workload is in flight (on `state`: wait for it), nothing of it runs (on "
                "`state`), the quota is short (on `replicas`, `max_replicas` or `version`, "
                "with the numbers), or a Triton server was asked to roll (on `version`)"
)
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
    description="At most 200 characters: the same key with the same body replays the first "
                "request (200 with its workload); with another body it is a 409",
)


class WorkloadSchema(AutoSchema):
    """A creation and a scale are bodies of one of two shapes (a fixed count, or an HPA's
    range), always sent."""

    def _get_request_body(self, direction: str = "request") -> dict[str, Any] | None:
        body = super()._get_request_body(direction)
        if body is not None and getattr(self.view, "action", None) in ("create", "scale"):
            body["required"] = True
        return body


class WorkloadViewSet(
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Triton and vLLM servers Switchyard runs as Deployments on Kubernetes clusters."""

    write_roles = DEPLOYER_WRITES
    queryset = ServerWorkload.objects.select_related(
        "tenant", "deployment", "cluster", "version__model", "previous_version", "server",
        "placement",
    )
    serializer_class = WorkloadSerializer
    filterset_class = WorkloadFilterSet
    ordering_fields = ["created_at", "updated_at", "name"]
    lookup_value_regex = "[0-9]+"
    schema = WorkloadSchema()

    def _answer(self, pk: int, code: int = status.HTTP_200_OK) -> Response:
        return Response(WorkloadSerializer(self.get_queryset().get(pk=pk)).data, status=code)

    @extend_schema(
        request=WORKLOAD_REQUEST, parameters=[IDEMPOTENCY_KEY],
        responses={201: WorkloadSerializer, 200: WorkloadSerializer, 409: CREATE_CONFLICT},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Run a version of a deployment's model on its Kubernetes cluster (deployer role):
        201 with the workload to poll (pending, then applying, progressing, ready), or 200
        replaying an earlier request with the same Idempotency-Key. The quota (the version's
        gpus x replicas, and its GPU memory x replicas; autoscaled, with min_replicas and
        max_replicas: x max_replicas) is admitted first."""
        body = WorkloadRequestSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        found, made = workloads.create_workload(
            body.validated_data["deployment"], body.validated_data["model_version"],
            request.user, idempotency_key=idempotency_key(request), **body.to_domain(),
        )
        return self._answer(found.pk, status.HTTP_201_CREATED if made else status.HTTP_200_OK)

    @extend_schema(request=SCALE_REQUEST,
                   responses={202: WorkloadSerializer, 200: WorkloadSerializer,
                              409: CHANGE_CONFLICT})
    @action(detail=True, methods=["post"])
    def scale(self, request: Request, pk: str | None = None) -> Response:
        """Run another number of servers, or for an autoscaled workload let its HPA scale
        within another range (deployer role): 202 while the change is carried out; 200 when
        it already runs that many (that range). More replicas (a higher maximum) are
        admitted against the quota first. ``replicas`` on an autoscaled workload, or a range
        on one of a fixed count, is a 400: the mode is chosen at creation."""
        workload = self.get_object()
        body = ScaleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if "replicas" in data:
            found, changed = workloads.scale(workload, data["replicas"], request.user)
        else:
            found, changed = workloads.set_replica_range(
                workload, data.get("min_replicas"), data.get("max_replicas"), request.user)
        return self._answer(found.pk, status.HTTP_202_ACCEPTED if changed else status.HTTP_200_OK)

    @extend_schema(request=RollSerializer,
                   responses={202: WorkloadSerializer, 200: WorkloadSerializer,
                              409: CHANGE_CONFLICT})
    @action(detail=True, methods=["post"])
    def roll(self, request: Request, pk: str | None = None) -> Response:
        """Roll a vLLM server to another base-model version (deployer role): its Deployment
        is updated in place and the pods replaced one by one; when they do not come up, the
        previous spec is applied again and the workload ends failed with the reason. 202
        while it rolls; 200 when it runs that version already."""
        workload = self.get_object()
        body = RollSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        model = workload.deployment.model
        version = ModelVersion.objects.filter(model=model,
                                              version=body.validated_data["version"]).first()
        if version is None:
            raise serializers.ValidationError(
                {"version": [f"{model.name} has no version {body.validated_data['version']}"]})
        found, changed = workloads.roll_version(workload, version, request.user)
        return self._answer(found.pk, status.HTTP_202_ACCEPTED if changed else status.HTTP_200_OK)

    @extend_schema(request=None,
                   responses={202: WorkloadSerializer, 200: WorkloadSerializer,
                              409: OpenApiResponse(description="The deployment's route sends "
                                                   "the server traffic (on `version`)")})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Take the server off the cluster and release its quota (deployer role): 202 while
        the Deployment and Service are deleted; 200 when it is being deleted already."""
        found, started = workloads.delete_workload(self.get_object(), request.user)
        return self._answer(found.pk, status.HTTP_202_ACCEPTED if started else status.HTTP_200_OK)
