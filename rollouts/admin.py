"""Django admin for the registry. Versions are read-only here: the API and console change status."""

from django.contrib import admin

from fleet.admin import AuditedAdmin
from rollouts.models import Alias, Deployment, Model, ModelVersion


class VersionInline(admin.TabularInline):
    model = ModelVersion
    extra = 0
    fields = ["version", "status", "runtime", "artifact_uri", "created_at"]
    readonly_fields = fields
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(Model)
class ModelAdmin(AuditedAdmin):
    list_display = ["name", "tenant", "created_at"]
    list_filter = ["tenant"]
    search_fields = ["name"]
    inlines = [VersionInline]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["model", "version", "status", "runtime", "created_at"]
    list_filter = ["status", "runtime", "model__tenant"]

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(Alias)
class AliasAdmin(AuditedAdmin):
    list_display = ["model", "name", "version", "updated_at"]


@admin.register(Deployment)
class DeploymentAdmin(AuditedAdmin):
    list_display = ["name", "tenant", "model", "cluster", "production", "slo_p99_ms", "slo_error_rate"]
    list_filter = ["tenant", "production"]
