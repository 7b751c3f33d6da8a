"""Serializers for tenancy, tokens, quotas, inventory and the audit log."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

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


class ValidatedModelSerializer(serializers.ModelSerializer):
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


class TenantField(serializers.SlugRelatedField):
    """A tenant named by slug, limited to the tenants the caller can see."""

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


class APITokenSerializer(serializers.ModelSerializer):
    tenant = TenantField(required=False)
    state = serializers.CharField(read_only=True)
    created_by = serializers.StringRelatedField()

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
        fields = ["id", "name", "kind", "description", "api_url", "created_at", "last_synced_at"]
        read_only_fields = ["last_synced_at"]


class NodeSerializer(ValidatedModelSerializer):
    class Meta:
        model = Node
        fields = ["id", "cluster", "name", "hostname", "cpu_cores", "memory_mib", "labels"]


class GPUSerializer(ValidatedModelSerializer):
    class Meta:
        model = GPU
        fields = [
            "id", "node", "index", "uuid", "model", "device_class", "memory_mib", "parent",
            "mig_profile",
        ]


class InferenceServerSerializer(ValidatedModelSerializer):
    class Meta:
        model = InferenceServer
        fields = [
            "id", "cluster", "node", "name", "runtime", "http_url", "grpc_url", "metrics_url",
            "model_repository", "health", "health_detail", "server_version", "reported_models",
            "probe_latency_ms", "last_checked_at", "last_seen_at", "health_changed_at",
        ]
        read_only_fields = [
            "health", "health_detail", "server_version", "reported_models", "probe_latency_ms",
            "last_checked_at", "last_seen_at", "health_changed_at",
        ]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        node = attrs.get("node", getattr(self.instance, "node", None))
        cluster = attrs.get("cluster", getattr(self.instance, "cluster", None))
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
