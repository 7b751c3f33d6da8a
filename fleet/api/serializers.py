"""Serializers for tenancy, tokens, quotas, inventory and the audit log."""

from __future__ import annotations

import copy
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.exceptions import Conflict, messages_by_field
from console.serializers import StrictFieldsMixin
from fleet.api.refs import IdOrNameField, NodeField, NotFound, lookup_node
from fleet.inventory import kube_connection
from fleet.models import (
    GPU,
    APIToken,
    AuditEvent,
    Cluster,
    ClusterSync,
    InferenceServer,
    Membership,
    Node,
    Quota,
    QuotaRequest,
    Tenant,
)
from fleet.quota import requests as quota_requests
from fleet.tenancy.scoping import is_platform_admin, role_in
from fleet.tenancy.visibility import reported_models_of


class ValidatedModelSerializer(StrictFieldsMixin, serializers.ModelSerializer):
    """Runs the model's ``full_clean()`` too, so model invariants answer 400 naming the field."""

    def get_validators(self) -> list[Any]:
        # Uniqueness is checked by full_clean() below, which can name the field at fault.
        return []

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        m2m = {f.name for f in self.Meta.model._meta.many_to_many}
        plain = {k: v for k, v in attrs.items() if k not in m2m}
        # A copy: the row as it was stays in ``self.instance`` until save (the audit log's
        # "before" is read from it).
        instance = copy.copy(self.instance) if self.instance is not None else self.Meta.model()
        for key, value in plain.items():
            setattr(instance, key, value)
        exclude = [f.name for f in instance._meta.fields if f.name not in plain and self.instance is None]
        try:
            instance.full_clean(exclude=exclude, validate_unique=True)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(messages_by_field(exc)) from None
        return attrs


@extend_schema_field({
    "type": "object",
    "additionalProperties": {"type": "string"},
    "propertyNames": {"minLength": 1},
    "description": "Names and values, all strings",
    "example": {"team": "risk"},
})
class LabelsField(serializers.JSONField):
    """Labels: an object of non-empty names and string values."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise serializers.ValidationError("must be an object of string keys and string values")
        if "" in value:
            raise serializers.ValidationError("label names cannot be empty")
        return value


class JSONObjectField(serializers.JSONField):
    """A JSON object (what is inside is checked by the model)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        return value


class JSONObjectFieldSchema(OpenApiSerializerFieldExtension):
    """Any object (subclasses that know what is inside bring their own schema)."""

    target_class = "fleet.api.serializers.JSONObjectField"

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        return {"type": "object"}


class AdminOnlyFieldsMixin:
    """Leaves ``admin_only_fields`` out of what it returns unless the caller is a platform
    admin. Clusters and servers are shared by every tenant: tenants read their names, kinds
    and health; how to reach a cluster's API (URL, credentials, the errors that name them) and
    a server's files are the platform's. Writes are unaffected (platform admins only anyway).
    """

    admin_only_fields: tuple[str, ...] = ()
    context: dict[str, Any]

    def shows_admin_fields(self) -> bool:
        request = self.context.get("request")
        return request is not None and is_platform_admin(request.user)

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)  # type: ignore[misc]
        if not self.shows_admin_fields():
            for name in self.admin_only_fields:
                data.pop(name, None)
        return data


class AdminOnlyFieldsSchema(OpenApiSerializerExtension):
    """In answers, the admin-only fields are optional and say who gets them."""

    target_class = "fleet.api.serializers.AdminOnlyFieldsMixin"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction != "response":
            return schema
        hidden = set(self.target.admin_only_fields)
        for name in hidden & set(schema.get("properties", {})):
            prop = schema["properties"][name]
            note = "Platform admins only: left out for tenant members and tokens."
            prop["description"] = f"{prop['description']} ({note})" if prop.get("description") else note
        required = [name for name in schema.get("required", []) if name not in hidden]
        if required:
            schema["required"] = required
        else:
            schema.pop("required", None)
        return schema


class TenantField(serializers.SlugRelatedField):
    """A tenant named by slug, limited to the tenants the caller can see."""

    default_error_messages = {
        "does_not_exist": "no tenant with slug '{value}'",
        "invalid": "give the tenant's slug (a string)",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("slug_field", "slug")
        super().__init__(**kwargs)

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return Tenant.objects.visible_to(self.context["request"].user)


class TenantSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField(help_text="Your role in this tenant")
    cohort = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True,
        help_text="The cohort whose members lend each other unused quota (null: none)")

    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "role", "cohort", "created_at"]

    @extend_schema_field(serializers.ChoiceField(choices=Membership.Role.choices))
    def get_role(self, tenant: Tenant) -> str | None:
        return role_in(self.context["request"].user, tenant)


class APITokenSerializer(StrictFieldsMixin, serializers.ModelSerializer):
    tenant = TenantField(required=False)
    state = serializers.ChoiceField(choices=["active", "expired", "revoked"], read_only=True)
    created_by = serializers.StringRelatedField(
        allow_null=True, help_text="The person who made the token (null once they are deleted)"
    )

    class Meta:
        model = APIToken
        fields = [
            "id", "tenant", "name", "role", "prefix", "state", "created_by", "created_at",
            "expires_at", "revoked_at", "last_used_at",
        ]
        read_only_fields = ["prefix", "created_by", "created_at", "revoked_at", "last_used_at"]

    def validate_expires_at(self, value: Any) -> Any:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("must be in the future")
        return value


class IssuedTokenSerializer(APITokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The secret, shown this once only")

    class Meta(APITokenSerializer.Meta):
        fields = [*APITokenSerializer.Meta.fields, "token"]


class QuotaSerializer(ValidatedModelSerializer):
    """A tenant's quota of one device class, what it holds now, and its cohort: what it may
    borrow above the quota (``borrowing_limit_*``, set by a platform admin), what it borrows
    now (``*_borrowed``) and what of its own quota other members borrow (``*_lent``)."""

    tenant = TenantField()
    units = serializers.IntegerField(min_value=0, max_value=quota_requests.MAX_UNITS)
    memory_mib = serializers.IntegerField(min_value=0, max_value=quota_requests.MAX_MEMORY_MIB)
    borrowing_limit_units = serializers.IntegerField(
        min_value=0, max_value=quota_requests.MAX_UNITS, required=False,
        help_text="Units the tenant may borrow from its cohort above its quota")
    borrowing_limit_memory_mib = serializers.IntegerField(
        min_value=0, max_value=quota_requests.MAX_MEMORY_MIB, required=False,
        help_text="Memory (MiB) the tenant may borrow from its cohort above its quota")
    cohort = serializers.SlugRelatedField(source="tenant.cohort", slug_field="name",
                                          read_only=True, allow_null=True)
    units_used = serializers.IntegerField(read_only=True, default=0)
    memory_used_mib = serializers.IntegerField(read_only=True, default=0)
    units_borrowed = serializers.IntegerField(read_only=True, default=0)
    memory_borrowed_mib = serializers.IntegerField(read_only=True, default=0)
    units_lent = serializers.IntegerField(read_only=True, default=0)
    memory_lent_mib = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Quota
        fields = [
            "id", "tenant", "device_class", "units", "memory_mib", "borrowing_limit_units",
            "borrowing_limit_memory_mib", "cohort", "units_used", "memory_used_mib",
            "units_borrowed", "memory_borrowed_mib", "units_lent", "memory_lent_mib",
            "updated_at",
        ]


class AdmissionQuerySerializer(StrictFieldsMixin, serializers.Serializer):
    """What to ask admission about: ``units`` and ``memory_mib`` more of the quota's class."""

    units = serializers.IntegerField(min_value=0, max_value=quota_requests.MAX_UNITS)
    memory_mib = serializers.IntegerField(min_value=0, max_value=quota_requests.MAX_MEMORY_MIB,
                                          required=False, default=0)


class AdmissionAmountSerializer(serializers.Serializer):
    asked = serializers.IntegerField()
    quota = serializers.IntegerField()
    used = serializers.IntegerField()
    free = serializers.IntegerField(help_text="Of the quota, free now (not held, not lent out)")
    lent = serializers.IntegerField(help_text="Of the quota, borrowed by other cohort members now")
    borrowed = serializers.IntegerField(help_text="Held above the quota now, borrowed")
    borrowing_limit = serializers.IntegerField()
    borrowable = serializers.IntegerField(help_text="May be borrowed from the cohort now")
    borrow = serializers.IntegerField(help_text="What this admission would borrow")
    cohort_free = serializers.IntegerField(allow_null=True)


class ReclaimSummarySerializer(serializers.Serializer):
    """What the borrowers' placements listed for reclaim give back, counted: how many, how
    much, never whose (a fleet.quota.admission.ReclaimSummary)."""

    placements = serializers.IntegerField()
    units = serializers.IntegerField(help_text="Units they borrow")
    memory_mib = serializers.IntegerField(help_text="Memory they borrow")


class ReclaimableSerializer(serializers.Serializer):
    placement_id = serializers.IntegerField()
    tenant = serializers.CharField()
    units = serializers.IntegerField(help_text="Units it borrows")
    memory_mib = serializers.IntegerField(help_text="Memory it borrows")
    priority = serializers.IntegerField()


class AdmissionSerializer(serializers.Serializer):
    """Admission's decision (a fleet.quota.admission.Decision), as a load of that size would get it now
    (nothing is reserved)."""

    admitted = serializers.BooleanField()
    explanation = serializers.CharField()
    # Decision.refusal() is a method; DRF calls a source that takes no required argument.
    refusal = serializers.CharField(help_text="Why it would be refused; empty when admitted")
    device_class = serializers.CharField()
    cohort = serializers.CharField(help_text="The tenant's cohort; empty: none")
    reclaim_policy = serializers.CharField()
    units = AdmissionAmountSerializer()
    memory = AdmissionAmountSerializer()
    reclaim = ReclaimSummarySerializer(
        help_text="What reclaiming the quota lent out would give back (how much, not whose)")
    reclaimable = ReclaimableSerializer(
        many=True, required=False,
        help_text="The borrowers' placements one by one; platform admins only (a tenant is "
                  "not told another tenant's placements)")

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = super().to_representation(instance)
        if not is_platform_admin(getattr(self.context.get("request"), "user", None)):
            data.pop("reclaimable", None)
        return data


class QuotaIncreaseSerializer(StrictFieldsMixin, serializers.ModelSerializer):
    """A request for more quota. Writable: ``tenant`` (optional for a token or a member of
    one tenant), ``device_class``, ``units`` and ``memory_mib`` (the totals wanted),
    ``reason`` and ``until`` (when the grant ends; none: it stays)."""

    tenant = TenantField(required=False, help_text="Tenant slug; optional for API tokens")
    units = serializers.IntegerField(min_value=0, max_value=quota_requests.MAX_UNITS)
    memory_mib = serializers.IntegerField(min_value=0, max_value=quota_requests.MAX_MEMORY_MIB)

    class Meta:
        model = QuotaRequest
        fields = [
            "id", "tenant", "device_class", "units", "memory_mib", "reason", "until", "state",
            "requested_by_label", "decided_by_label", "decision_reason", "granted_units",
            "granted_memory_mib", "previous_units", "previous_memory_mib", "created_at",
            "decided_at", "ended_at",
        ]
        read_only_fields = [
            "state", "requested_by_label", "decided_by_label", "decision_reason", "granted_units",
            "granted_memory_mib", "previous_units", "previous_memory_mib", "created_at",
            "decided_at", "ended_at",
        ]


class QuotaDecisionSerializer(StrictFieldsMixin, serializers.Serializer):
    """An approval (``units``/``memory_mib`` change what is granted; left out: as asked) or a
    refusal (``reason`` required)."""

    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    units = serializers.IntegerField(required=False, min_value=0, max_value=quota_requests.MAX_UNITS)
    memory_mib = serializers.IntegerField(required=False, min_value=0, max_value=quota_requests.MAX_MEMORY_MIB)


class ClusterSerializer(AdminOnlyFieldsMixin, ValidatedModelSerializer):
    """A cluster and, for a kubernetes one, how to reach its API and what it last said.

    ``kube_secret`` (the bearer token, or the kubeconfig text) is write-only and stored
    encrypted; it is never returned: ``kube_secret_hint`` says what is stored. On update,
    leaving it out or sending ``""`` keeps the stored one, ``null`` removes it. Or name the
    environment variable that holds it in ``kube_secret_env`` (read where Switchyard runs);
    the one given last wins, both at once is a 400.

    Tenant members read the name, kind, namespace, router and health (connection and sync
    state); how the API is reached, its credentials and the error texts (which name the API
    server) are for platform admins only.
    """

    admin_only_fields = (
        "api_url", "s3_endpoint_url", "kube_auth", "kube_context", "kube_ca_bundle",
        "kube_secret_env", "kube_secret_hint", "connection_detail", "sync_detail",
    )

    kube_secret = serializers.CharField(
        write_only=True, required=False, allow_blank=True, allow_null=True,
        max_length=kube_connection.MAX_SECRET, style={"input_type": "password"},
        help_text="Bearer token (token auth) or kubeconfig text (kubeconfig auth); write-only, "
                  "stored encrypted. Empty or left out on update: keep the stored one; null: "
                  "remove it",
    )
    kube_secret_hint = serializers.SerializerMethodField(
        help_text="What is stored of the secret: its length and last characters, or the "
                  "environment variable it is read from"
    )

    class Meta:
        model = Cluster
        fields = [
            "id", "name", "kind", "description", "api_url", "s3_endpoint_url", "s3_region",
            "kube_auth", "kube_context", "kube_ca_bundle", "kube_secret", "kube_secret_env",
            "kube_secret_hint", "kube_namespace", "kube_router", "kube_gateway",
            "kube_route_host", "connection_state", "connection_detail", "connection_checked_at",
            "kube_server_version", "sync_state", "sync_detail", "last_synced_at", "created_at",
        ]
        read_only_fields = [
            "connection_state", "connection_detail", "connection_checked_at",
            "kube_server_version", "sync_state", "sync_detail", "last_synced_at", "created_at",
        ]

    def get_kube_secret_hint(self, cluster: Cluster) -> str:
        return kube_connection.secret_hint(cluster)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        secret = attrs.pop("kube_secret", "")
        env = attrs.get("kube_secret_env")
        # The secret is applied to a stand-in first: the row changes only when all is valid.
        stand_in = Cluster(
            kube_secret_encrypted=getattr(self.instance, "kube_secret_encrypted", ""),
            kube_secret_env=getattr(self.instance, "kube_secret_env", ""),
        )
        kube_connection.change_secret(stand_in, secret=secret, secret_env=env)
        if stand_in.kube_secret_encrypted != getattr(self.instance, "kube_secret_encrypted", ""):
            attrs["kube_secret_encrypted"] = stand_in.kube_secret_encrypted
        if stand_in.kube_secret_env != getattr(self.instance, "kube_secret_env", ""):
            attrs["kube_secret_env"] = stand_in.kube_secret_env
        return super().validate(attrs)


class ClusterSyncSerializer(AdminOnlyFieldsMixin, serializers.ModelSerializer):
    """One sync of a kubernetes cluster's inventory: what it added, changed, saw go, and the
    errors it met (platform admins only: they can name the API server)."""

    admin_only_fields = ("errors",)

    class Meta:
        model = ClusterSync
        fields = [
            "id", "kind", "ok", "added", "changed", "gone", "errors", "resource_version",
            "started_at", "finished_at",
        ]


class ConnectionResultSerializer(serializers.Serializer):
    """What "test connection" found; a failed connection is a result (ok false), not an
    error."""

    ok = serializers.BooleanField()
    detail = serializers.CharField(
        help_text="connected: Kubernetes <version>, N nodes listed; or why not (401, RBAC, TLS, "
                  "unreachable, a missing environment variable)"
    )
    server_version = serializers.CharField(
        allow_blank=True, help_text="The API server's gitVersion; empty when not reached"
    )


class SyncQueuedSerializer(serializers.Serializer):
    queued = serializers.BooleanField()
    detail = serializers.CharField()


@extend_schema_field({
    "type": "array",
    "items": {"type": "string"},
    "description": "The Node's taints as key=value:Effect (key:Effect without a value)",
    "example": ["nvidia.com/gpu=present:NoSchedule", "node.kubernetes.io/not-ready:NoSchedule"],
})
class TaintsField(serializers.JSONField):
    """A synced node's taints (read-only)."""


@extend_schema_field({
    "type": "object",
    "additionalProperties": {"type": "string"},
    "description": "Resource quantities as the Kubernetes API gives them (strings)",
    "example": {"cpu": "96", "memory": "2113531904Ki", "nvidia.com/gpu": "6",
                "nvidia.com/mig-3g.40gb": "2"},
})
class QuantitiesField(serializers.JSONField):
    """A synced node's capacity or allocatable resources (read-only)."""


#: Node fields observed from the Kubernetes API (a synced node's), never typed in.
OBSERVED_NODE_FIELDS = [
    "synced", "ready", "ready_detail", "unschedulable", "taints", "zone", "capacity",
    "allocatable", "gone_at",
]


def synced_refusal(node: Node) -> Conflict:
    """The 409 for a hand-made change to what the Kubernetes API owns."""
    return Conflict(
        f"node {node.name} comes from the Kubernetes API of cluster {node.cluster.name} and is "
        "kept in step with its Node object: change it there (kubectl), not here"
    )


def refuse_kubernetes_cluster(cluster: Cluster | None, field: str) -> None:
    """Nodes and GPUs of a kubernetes cluster are the sync's to make: a 400 on ``field``."""
    if cluster is not None and cluster.is_kubernetes:
        raise serializers.ValidationError({field: [
            f"the nodes and GPUs of kubernetes cluster {cluster.name} come from its Kubernetes "
            "API (the sync adds them); they are not added by hand"
        ]})


class NodeSerializer(ValidatedModelSerializer):
    """A node. ``synced`` nodes (a kubernetes cluster's) are read-only: their observed fields
    (Ready, cordoned, taints, zone, capacity, allocatable, gone) come from the Node object."""

    cluster = IdOrNameField(queryset=Cluster.objects.all(), help_text="Cluster id or name")
    labels = LabelsField()
    taints = TaintsField(read_only=True)
    capacity = QuantitiesField(read_only=True)
    allocatable = QuantitiesField(read_only=True)

    class Meta:
        model = Node
        fields = ["id", "cluster", "name", "hostname", "cpu_cores", "memory_mib", "labels",
                  *OBSERVED_NODE_FIELDS, "created_at"]
        read_only_fields = [*OBSERVED_NODE_FIELDS, "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None and self.instance.synced:
            raise synced_refusal(self.instance)
        cluster = attrs.get("cluster")
        if cluster is not None and cluster.pk != getattr(self.instance, "cluster_id", None):
            refuse_kubernetes_cluster(cluster, "cluster")
        return super().validate(attrs)


def _resolve_node(attrs: dict[str, Any], cluster: Cluster | None) -> None:
    """A node given by plain name is looked up now that the cluster is known."""
    if isinstance(attrs.get("node"), str):
        try:
            attrs["node"] = lookup_node(attrs["node"], cluster)
        except NotFound as exc:
            raise serializers.ValidationError({"node": [str(exc)]}) from None


class GPUSerializer(ValidatedModelSerializer):
    """A GPU or MIG slice. Those of a synced node are read-only (``synced``)."""

    node = NodeField(help_text="Node id, cluster/node, or a node name only one cluster has")
    parent = IdOrNameField(
        name_field="uuid", queryset=GPU.objects.all(), required=False, allow_null=True,
        help_text="For a MIG slice: the physical GPU's id or uuid",
    )
    synced = serializers.BooleanField(
        source="node.synced", read_only=True,
        help_text="Observed from the Kubernetes API through its node (read-only then)",
    )

    class Meta:
        model = GPU
        fields = [
            "id", "node", "index", "uuid", "model", "device_class", "memory_mib", "parent",
            "mig_profile", "synced",
        ]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None and self.instance.node.synced:
            raise synced_refusal(self.instance.node)
        _resolve_node(attrs, None)
        node = attrs.get("node")
        if node is not None and node.pk != getattr(self.instance, "node_id", None):
            if node.synced:
                raise serializers.ValidationError({"node": [
                    f"node {node.name} comes from the Kubernetes API of cluster "
                    f"{node.cluster.name}: its GPUs are observed there, not added by hand"
                ]})
            refuse_kubernetes_cluster(node.cluster, "node")
        return super().validate(attrs)


class ReportedModelSerializer(serializers.Serializer):
    """One entry of a server's model index, as the server reports it."""

    name = serializers.CharField()
    version = serializers.CharField(allow_blank=True)
    state = serializers.CharField(help_text="e.g. READY, UNAVAILABLE, LOADING")
    reason = serializers.CharField(allow_blank=True)


class InferenceServerSerializer(AdminOnlyFieldsMixin, ValidatedModelSerializer):
    """An inference server. Tenant members read its name, runtime, URLs to call it and its
    health; its files (model repository, log) and its metrics URL, which counts every
    tenant's models, are for platform admins only."""

    admin_only_fields = ("metrics_url", "model_repository", "log_path")
    cluster = IdOrNameField(queryset=Cluster.objects.all(), help_text="Cluster id or name")
    node = NodeField(
        required=False, allow_null=True,
        help_text="Node id, or its name in the server's cluster (optional)",
    )
    reported_models = serializers.SerializerMethodField(
        help_text="What the server reports of your tenants' models (all of them for platform "
                  "admins)"
    )
    other_models = serializers.SerializerMethodField(
        help_text="How many models of other tenants the server reports (not named)"
    )

    class Meta:
        model = InferenceServer
        fields = [
            "id", "cluster", "node", "name", "runtime", "http_url", "grpc_url", "metrics_url",
            "model_repository", "log_path", "health", "health_detail", "server_version",
            "reported_models", "other_models", "probe_latency_ms", "consecutive_failures",
            "last_checked_at", "last_seen_at", "health_changed_at", "created_at",
        ]
        read_only_fields = [
            "health", "health_detail", "server_version", "probe_latency_ms",
            "consecutive_failures", "last_checked_at", "last_seen_at", "health_changed_at",
            "created_at",
        ]

    def _reported(self, server: InferenceServer) -> Any:
        # Views that list servers compute this for the whole page at once.
        shown = getattr(server, "shown_models", None)
        if shown is None:
            shown = server.shown_models = reported_models_of(self.context["request"].user, server)
        return shown

    @extend_schema_field(ReportedModelSerializer(many=True))
    def get_reported_models(self, server: InferenceServer) -> list[dict[str, Any]]:
        return self._reported(server).models

    def get_other_models(self, server: InferenceServer) -> int:
        return self._reported(server).others

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        cluster = attrs.get("cluster", getattr(self.instance, "cluster", None))
        _resolve_node(attrs, cluster)
        node = attrs.get("node", getattr(self.instance, "node", None))
        if node is not None and cluster is not None and node.cluster_id != cluster.pk:
            raise serializers.ValidationError({"node": "the node belongs to another cluster"})
        return super().validate(attrs)


class AuditEventSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id", "created_at", "tenant", "actor_label", "verb", "object_type", "object_id",
            "object_repr", "before", "after", "reason",
        ]
