"""Serializers for tenancy, tokens, quotas and the audit log, and the pieces every fleet
serializer shares (validation through the model, labels, JSON objects, fields for platform
admins only, tenants by slug). The inventory's are in ``fleet.api.inventory_serializers``."""

from __future__ import annotations

import copy
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.exceptions import messages_by_field
from console.serializers import StrictFieldsMixin
from fleet.models import (
    APIToken,
    AuditEvent,
    DevicePrice,
    Membership,
    Quota,
    QuotaRequest,
    Tenant,
)
from fleet.quota import requests as quota_requests
from fleet.tenancy.scoping import is_platform_admin, role_in


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
        fields = ["id", "slug", "name", "role", "cohort", "guard_production_servers", "created_at"]
        read_only_fields = ["guard_production_servers"]

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


class AuditEventSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id", "created_at", "tenant", "actor_label", "verb", "object_type", "object_id",
            "object_repr", "before", "after", "reason",
        ]


class DevicePriceSerializer(ValidatedModelSerializer):
    """What an hour of one unit of a device class costs (a GPU, or a model instance on CPU
    nodes): set by platform admins, read by every member; versions' costs use it."""

    # A number in and out (a decimal column: four places kept).
    per_unit_hour = serializers.FloatField(
        min_value=0, max_value=99_999_999, help_text="Price of one unit for one hour, in currency")

    class Meta:
        model = DevicePrice
        fields = ["id", "device_class", "per_unit_hour", "currency", "updated_at"]
        read_only_fields = ["updated_at"]

    def validate_per_unit_hour(self, value: float) -> Decimal:
        # A float such as 0.9 has no exact binary form: the column keeps four places.
        return Decimal(str(value)).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)
