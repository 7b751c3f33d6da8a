"""Serializers for tenancy, tokens, quotas, inventory and the audit log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.utils import html

from fleet.api.refs import IdOrNameField, NodeField, NotFound, lookup_node
from fleet.models import (
    GPU,
    APIToken,
    AuditEvent,
    Cluster,
    InferenceServer,
    Membership,
    Node,
    Quota,
    Tenant,
)
from fleet.tenancy import role_in
from fleet.visibility import reported_models_of

# Sent by the browsable API's HTML forms along with the fields.
FORM_KEYS = frozenset({"csrfmiddlewaretoken"})


class StrictFieldsMixin:
    """Refuses request keys the serializer does not write, naming each one, so nothing sent
    is silently dropped: an unknown key and a read-only one are both a 400 on that key.

    In a form-encoded body, DRF reads an optional field sent empty (``tenant=``) as left out;
    it is refused here instead, unless the field takes empty text or null (a form's way of
    saying null). JSON bodies need no such rule: ``""`` is a value there, checked as any other.
    """

    fields: dict[str, serializers.Field]

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            refused = {
                str(key): ["read-only; leave it out" if key in self.fields else "unknown field"]
                for key in data
                if key not in FORM_KEYS
                and (key not in self.fields or self.fields[key].read_only)
            }
            if html.is_html_input(data):
                refused.update({
                    key: ["blank: give a value, or leave the field out"]
                    for key in data
                    if key not in refused and key in self.fields and _blank_in_form(data, key, self.fields[key])
                })
            if refused:
                raise serializers.ValidationError(refused)
        return super().to_internal_value(data)  # type: ignore[misc]


def _blank_in_form(data: Any, key: str, field: serializers.Field) -> bool:
    """Whether a form sends ``key`` empty where DRF would take that as leaving it out."""
    return (
        data.get(key) == ""
        and not field.required
        and not field.allow_null
        and not getattr(field, "allow_blank", False)
    )


class ValidatedModelSerializer(StrictFieldsMixin, serializers.ModelSerializer):
    """Runs the model's ``full_clean()`` too, so model invariants answer 400 naming the field."""

    def get_validators(self) -> list[Any]:
        # Uniqueness is checked by full_clean() below, which can name the field at fault.
        return []

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        m2m = {f.name for f in self.Meta.model._meta.many_to_many}
        plain = {k: v for k, v in attrs.items() if k not in m2m}
        instance = self.instance or self.Meta.model()
        for key, value in plain.items():
            setattr(instance, key, value)
        exclude = [f.name for f in instance._meta.fields if f.name not in plain and self.instance is None]
        try:
            instance.full_clean(exclude=exclude, validate_unique=True)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(_name_fields(exc)) from None
        return attrs


def _name_fields(exc: DjangoValidationError) -> dict[str, list[str]]:
    """Model errors keyed by field; a unique-together clash is put on its last field (the one
    the caller chose, e.g. ``name`` in (tenant, name)) instead of ``__all__``."""
    named: dict[str, list[str]] = {}
    for field, errors in exc.error_dict.items():
        for error in errors:
            key = field
            unique = error.code in ("unique", "unique_together")
            check = (error.params or {}).get("unique_check") if unique else None
            if field == NON_FIELD_ERRORS and check:
                key = check[-1]
            named.setdefault(key, []).extend(error.messages)
    return named


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

    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "role", "created_at"]

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
    tenant = TenantField()
    units_used = serializers.IntegerField(read_only=True, default=0)
    memory_used_mib = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Quota
        fields = [
            "id", "tenant", "device_class", "units", "memory_mib", "units_used",
            "memory_used_mib", "updated_at",
        ]


class ClusterSerializer(ValidatedModelSerializer):
    class Meta:
        model = Cluster
        fields = [
            "id", "name", "kind", "description", "api_url", "s3_endpoint_url", "s3_region",
            "created_at", "last_synced_at",
        ]
        read_only_fields = ["created_at", "last_synced_at"]


class NodeSerializer(ValidatedModelSerializer):
    cluster = IdOrNameField(queryset=Cluster.objects.all(), help_text="Cluster id or name")
    labels = LabelsField()

    class Meta:
        model = Node
        fields = ["id", "cluster", "name", "hostname", "cpu_cores", "memory_mib", "labels",
                  "created_at"]
        read_only_fields = ["created_at"]


def _resolve_node(attrs: dict[str, Any], cluster: Cluster | None) -> None:
    """A node given by plain name is looked up now that the cluster is known."""
    if isinstance(attrs.get("node"), str):
        try:
            attrs["node"] = lookup_node(attrs["node"], cluster)
        except NotFound as exc:
            raise serializers.ValidationError({"node": [str(exc)]}) from None


class GPUSerializer(ValidatedModelSerializer):
    node = NodeField(help_text="Node id, cluster/node, or a node name only one cluster has")
    parent = IdOrNameField(
        name_field="uuid", queryset=GPU.objects.all(), required=False, allow_null=True,
        help_text="For a MIG slice: the physical GPU's id or uuid",
    )

    class Meta:
        model = GPU
        fields = [
            "id", "node", "index", "uuid", "model", "device_class", "memory_mib", "parent",
            "mig_profile",
        ]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        _resolve_node(attrs, None)
        return super().validate(attrs)


class ReportedModelSerializer(serializers.Serializer):
    """One entry of a server's model index, as the server reports it."""

    name = serializers.CharField()
    version = serializers.CharField(allow_blank=True)
    state = serializers.CharField(help_text="e.g. READY, UNAVAILABLE, LOADING")
    reason = serializers.CharField(allow_blank=True)


class InferenceServerSerializer(ValidatedModelSerializer):
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
