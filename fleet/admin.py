"""Django admin for platform admins: the fleet, tenants, memberships and quotas."""

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import models, transaction
from django.http import HttpRequest

from fleet import audit
from fleet.models import (
    GPU,
    APIToken,
    AuditEvent,
    Cluster,
    Cohort,
    DevicePrice,
    InferenceServer,
    Membership,
    Node,
    Placement,
    Quota,
    Tenant,
    TenantNamespace,
)
from fleet.quota import admission as quota


def _tenant_of(obj: models.Model) -> Tenant | None:
    tenant = getattr(obj, "tenant", None)
    return tenant if isinstance(tenant, Tenant) else obj if isinstance(obj, Tenant) else None


class AuditedAdmin(admin.ModelAdmin):
    """Changes made in the admin reach the audit log like every other change."""

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        fields = [f for f in form.changed_data if f in {x.name for x in obj._meta.concrete_fields}]
        before = {}
        if change and fields:
            before = audit.snapshot(type(obj).objects.get(pk=obj.pk), fields)
        super().save_model(request, obj, form, change)
        if fields or not change:
            audit.record(
                request.user, "updated" if change else "created", obj, tenant=_tenant_of(obj),
                before=before, after=audit.snapshot(obj, fields), reason="changed in the admin",
            )

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        why = "changed in the admin"
        for deleted in formset.deleted_forms:  # recorded first: after save() their pk is gone
            if deleted.instance.pk is not None:
                audit.record(request.user, "deleted", deleted.instance,
                             tenant=_tenant_of(deleted.instance), reason=why)
        formset.save()
        for obj in formset.new_objects:
            audit.record(request.user, "created", obj, tenant=_tenant_of(obj), reason=why)
        for obj, fields in formset.changed_objects:
            audit.record(request.user, "updated", obj, tenant=_tenant_of(obj),
                         after=audit.snapshot(obj, fields), reason=why)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        audit.record(request.user, "deleted", obj, tenant=_tenant_of(obj), reason="deleted in the admin")
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        """The admin's "delete selected" action: one event per row, in the same transaction
        as the delete, so a bulk delete leaves the same trail as deleting one by one."""
        with transaction.atomic():
            for obj in queryset:
                audit.record(request.user, "deleted", obj, tenant=_tenant_of(obj),
                             reason="deleted in the admin (several at once)")
            super().delete_queryset(request, queryset)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 1


class TenantNamespaceInline(admin.TabularInline):
    """Kubernetes namespaces the tenant's servers may run in (and read Secrets from); the
    first on a cluster is its default there."""

    model = TenantNamespace
    extra = 1
    fields = ["namespace", "cluster"]
    verbose_name = "Kubernetes namespace"

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "cluster":
            kwargs["queryset"] = Cluster.objects.filter(kind=Cluster.Kind.KUBERNETES)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(DevicePrice)
class DevicePriceAdmin(AuditedAdmin):
    list_display = ["device_class", "per_unit_hour", "currency", "updated_at"]
    search_fields = ["device_class"]


@admin.register(Tenant)
class TenantAdmin(AuditedAdmin):
    list_display = ["slug", "name", "cohort", "created_at"]
    list_filter = ["cohort"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline, QuotaInline, TenantNamespaceInline]

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        # The slug qualifies the tenant's model names on shared servers: renaming it would
        # leave what is loaded there under names nothing routes to.
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "slug"] if obj is not None and obj.pk else fields


@admin.register(TenantNamespace)
class TenantNamespaceAdmin(AuditedAdmin):
    """Every namespace granted, by tenant: a namespace is one tenant's on a cluster."""

    list_display = ["namespace", "tenant", "cluster", "created_at"]
    list_filter = ["tenant", "cluster"]
    search_fields = ["namespace", "tenant__slug"]
    autocomplete_fields = ["tenant"]


@admin.register(Cohort)
class CohortAdmin(AuditedAdmin):
    """Tenants that lend each other unused quota; members join on the tenant's page, and
    each quota says how much its tenant may borrow."""

    list_display = ["name", "reclaim", "description", "created_at"]
    search_fields = ["name"]


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role", "tenant"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(APIToken)
class APITokenAdmin(admin.ModelAdmin):
    """Read-mostly: tokens are made in the console or the API, where the secret is shown once."""

    list_display = ["name", "tenant", "role", "prefix", "state", "created_at", "last_used_at"]
    list_filter = ["tenant", "role"]
    readonly_fields = ["prefix", "digest", "created_by", "created_at", "last_used_at"]

    def has_add_permission(self, request: object) -> bool:
        return False


@admin.register(Quota)
class QuotaAdmin(AuditedAdmin):
    list_display = ["tenant", "device_class", "units", "memory_mib", "borrowing_limit_units",
                    "borrowing_limit_memory_mib", "updated_at"]
    list_filter = ["device_class"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        quota.mark_borrowed(obj.tenant, obj.device_class)


class NodeInline(admin.TabularInline):
    model = Node
    extra = 0


class ClusterAdminForm(forms.ModelForm):
    """The model's checks of fields this form does not show (Kubernetes access) are shown
    above the form, naming the field, instead of failing the page."""

    def _update_errors(self, errors: ValidationError) -> None:
        if hasattr(errors, "error_dict"):
            moved: dict[str, list[ValidationError]] = {}
            for name, messages in errors.error_dict.items():
                if name in self.fields or name == NON_FIELD_ERRORS:
                    moved.setdefault(name, []).extend(messages)
                    continue
                moved.setdefault(NON_FIELD_ERRORS, []).extend(
                    ValidationError(f"{name}: {m} (set it on the console's cluster page)")
                    for error in messages for m in error.messages
                )
            errors = ValidationError(moved)
        super()._update_errors(errors)


@admin.register(Cluster)
class ClusterAdmin(AuditedAdmin):
    """Kubernetes access (the secret above all) is set on the console's cluster page, whose
    form stores the secret encrypted and checks the whole: here it is read-only."""

    form = ClusterAdminForm
    list_display = ["name", "kind", "description", "last_synced_at"]
    inlines = [NodeInline]
    readonly_fields = [
        "kube_auth", "kube_context", "kube_ca_bundle", "kube_secret_env", "kube_router",
        "kube_gateway", "kube_route_host", "kube_namespace", "connection_state",
        "connection_detail", "connection_checked_at", "kube_server_version", "sync_state",
        "sync_detail", "last_synced_at",
    ]


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fk_name = "node"


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = ["name", "cluster", "hostname", "cpu_cores", "memory_mib"]
    list_filter = ["cluster"]
    inlines = [GPUInline]


@admin.register(GPU)
class GPUAdmin(AuditedAdmin):
    list_display = ["uuid", "node", "index", "model", "device_class", "memory_mib", "mig_profile"]
    list_filter = ["device_class"]


@admin.register(InferenceServer)
class InferenceServerAdmin(AuditedAdmin):
    list_display = ["name", "cluster", "runtime", "http_url", "health", "last_seen_at"]
    list_filter = ["runtime", "health", "cluster"]
    readonly_fields = [
        "health", "health_detail", "server_version", "reported_models", "probe_latency_ms",
        "consecutive_failures", "last_checked_at", "last_seen_at", "health_changed_at",
    ]


@admin.register(Placement)
class PlacementAdmin(admin.ModelAdmin):
    list_display = ["model_version", "server", "tenant", "device_class", "units", "memory_mib", "state"]
    list_filter = ["state", "device_class"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Append-only: visible, never editable."""

    list_display = ["created_at", "tenant", "actor_label", "verb", "object_type", "object_repr"]
    list_filter = ["verb", "object_type", "tenant"]
    search_fields = ["actor_label", "object_repr", "reason"]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False
