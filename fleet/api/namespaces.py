"""Kubernetes namespaces granted to tenants: ``/api/v1/tenant-namespaces/``.

A tenant's servers on Kubernetes run only in the namespaces granted to it, and read Secrets
from those only (see ``fleet.tenancy.namespaces``). A tenant's members read its grants; platform
admins grant, change and revoke them (each change is in the audit log). Revoking a grant
stops new servers and rolls there; servers already running keep running until deleted.
"""

from __future__ import annotations

from rest_framework import serializers

from fleet.api.refs import IdOrNameField
from fleet.api.serializers import TenantField, ValidatedModelSerializer
from fleet.api.views import AuditedFleetViewSet
from fleet.models import Cluster, TenantNamespace


class TenantNamespaceSerializer(ValidatedModelSerializer):
    """A namespace a tenant's servers may run in, on one Kubernetes cluster or on all."""

    tenant = TenantField(help_text="The tenant's slug")
    cluster = IdOrNameField(
        queryset=Cluster.objects.filter(kind=Cluster.Kind.KUBERNETES), read_as_name=True,
        required=False, allow_null=True, default=None,
        help_text="The Kubernetes cluster's id or name (null: every Kubernetes cluster)",
    )
    namespace = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", max_length=63,
        help_text="A Kubernetes namespace name; never kube-*; one tenant's only",
        error_messages={"invalid": "a Kubernetes namespace name: lowercase letters, digits "
                                   "and dashes (at most 63)"},
    )

    class Meta:
        model = TenantNamespace
        fields = ["id", "tenant", "cluster", "namespace", "created_at"]
        read_only_fields = ["created_at"]


class TenantNamespaceViewSet(AuditedFleetViewSet):
    """Namespaces granted to tenants: members read their tenant's, platform admins write."""

    queryset = TenantNamespace.objects.select_related("tenant", "cluster")
    serializer_class = TenantNamespaceSerializer
    filterset_fields = ["tenant__slug", "namespace"]
    audit_tenant_field = "tenant"
