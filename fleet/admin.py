"""Django admin for platform admins: the fleet, tenants, memberships and quotas."""

from django.contrib import admin

from fleet.models import (
    GPU,
    APIToken,
    AuditEvent,
    Cluster,
    InferenceServer,
    Membership,
    Node,
    Placement,
    Quota,
    Tenant,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 1


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline, QuotaInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
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
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["tenant", "device_class", "units", "memory_mib", "updated_at"]
    list_filter = ["device_class"]


class NodeInline(admin.TabularInline):
    model = Node
    extra = 0


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "description", "last_synced_at"]
    inlines = [NodeInline]


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fk_name = "node"


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "hostname", "cpu_cores", "memory_mib"]
    list_filter = ["cluster"]
    inlines = [GPUInline]


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    list_display = ["uuid", "node", "index", "model", "device_class", "memory_mib", "mig_profile"]
    list_filter = ["device_class"]


@admin.register(InferenceServer)
class InferenceServerAdmin(admin.ModelAdmin):
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
