"""Which Kubernetes namespaces a tenant's servers may run in: those a platform admin granted.

A tenant's servers (``rollouts.workloads.requests``) run only in namespaces granted to it
(``TenantNamespace``), and the Secrets its versions name are read from that namespace only, so
the grant is the fence around both. A request that names no namespace gets the first one
granted for the cluster.
"""

from __future__ import annotations

from django.db.models import Q

from console.exceptions import DomainError
from fleet.models import Cluster, Tenant, TenantNamespace


def granted(tenant: Tenant, cluster: Cluster) -> list[str]:
    """The namespaces ``tenant`` may use on ``cluster``, the first granted first."""
    rows = TenantNamespace.objects.filter(
        Q(cluster=cluster) | Q(cluster__isnull=True), tenant=tenant,
    ).order_by("id").values_list("namespace", flat=True)
    return list(dict.fromkeys(rows))


def resolve(tenant: Tenant, cluster: Cluster, namespace: str) -> str:
    """``namespace``, or the first one granted when it is empty; refused on ``namespace``
    when it is not granted to ``tenant`` on ``cluster``."""
    allowed = granted(tenant, cluster)
    if not namespace:
        if not allowed:
            raise DomainError(
                f"tenant {tenant.slug} has no Kubernetes namespace on cluster {cluster.name}: "
                "a platform admin grants namespaces (admin: Tenants; API: "
                "/api/v1/tenant-namespaces/)", field="namespace",
            )
        return allowed[0]
    if namespace not in allowed:
        shown = ", ".join(allowed) if allowed else "none"
        raise DomainError(
            f"namespace {namespace} is not granted to tenant {tenant.slug} on cluster "
            f"{cluster.name}; granted: {shown}", field="namespace",
        )
    return namespace
