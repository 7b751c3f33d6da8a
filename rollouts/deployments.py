"""Creating, changing and deleting deployments, role-checked and audited."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from fleet import audit
from fleet.errors import Conflict
from fleet.models import Membership
from fleet.tenancy import require_role
from rollouts.models import Deployment

FIELDS = ["name", "model", "cluster", "production", "slo_p99_ms", "slo_error_rate", "description"]


def save_deployment(
    actor: Any, deployment: Deployment, servers: list[Any] | None = None, reason: str = ""
) -> Deployment:
    """Create or update. Servers, when given, must belong to the deployment's cluster."""
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    creating = deployment.pk is None
    before = {} if creating else audit.snapshot(Deployment.objects.get(pk=deployment.pk), FIELDS)
    if servers is not None:
        strangers = [s.name for s in servers if s.cluster_id != deployment.cluster_id]
        if strangers:
            raise Conflict(
                f"servers {', '.join(strangers)} are not in cluster {deployment.cluster}",
                field="servers",
            )
    deployment.full_clean()
    try:
        with transaction.atomic():
            deployment.save()
            if servers is not None:
                deployment.servers.set(servers)
            after = audit.snapshot(deployment, FIELDS)
            if servers is not None:
                after["servers"] = sorted(s.name for s in servers)
            changed = {k: v for k, v in after.items() if before.get(k) != v}
            if creating or changed:
                audit.record(
                    actor,
                    "created" if creating else "updated",
                    deployment,
                    tenant=deployment.tenant,
                    before={k: before[k] for k in changed if k in before},
                    after=changed,
                    reason=reason,
                )
    except IntegrityError:
        raise Conflict(
            f"a deployment named {deployment.name!r} already exists in this tenant", field="name"
        ) from None
    return deployment


def delete_deployment(actor: Any, deployment: Deployment, reason: str = "") -> None:
    require_role(actor, deployment.tenant, Membership.Role.ADMIN)
    with transaction.atomic():
        audit.record(
            actor, "deleted", deployment, tenant=deployment.tenant,
            before=audit.snapshot(deployment, FIELDS), reason=reason,
        )
        deployment.delete()
