"""Django admin for the registry. Versions are read-only here: the API and console change status;
so are model loads, which the reconciler drives."""

from django.contrib import admin

from fleet.admin import AuditedAdmin
from rollouts.models import (
    Alias,
    Deployment,
    MetricTemplate,
    Model,
    ModelLoad,
    ModelLoadEvent,
    ModelVersion,
)


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


class ModelLoadEventInline(admin.TabularInline):
    model = ModelLoadEvent
    fields = ["created_at", "state", "message"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(ModelLoad)
class ModelLoadAdmin(admin.ModelAdmin):
    """Read-only, history included: the reconciler (rollouts/loads/requests.py) moves a load through its
    states, holding quota and talking to the server; a state set here would do neither. Load
    and unload from the console or the API."""

    list_display = ["id", "version", "server", "deployment", "state", "attempts",
                    "requested_by_label", "created_at", "finished_at"]
    list_filter = ["state", "tenant", "server__cluster"]
    search_fields = ["version__model__name", "server__name", "deployment__name",
                     "requested_by_label", "error"]
    list_select_related = ["version__model__tenant", "server__cluster", "deployment__tenant"]
    date_hierarchy = "created_at"
    inlines = [ModelLoadEventInline]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(MetricTemplate)
class MetricTemplateAdmin(AuditedAdmin):
    """PromQL queries analyses may use as gates (rollouts/canary/metrics.py): platform admins
    write them, tenants name them with a range."""

    list_display = ["name", "unit", "updated_at"]
    search_fields = ["name", "query"]
