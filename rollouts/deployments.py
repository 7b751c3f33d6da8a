"""Creating, changing and deleting deployments, role-checked and audited."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from fleet import audit, quota
from fleet.errors import Conflict
from fleet.models import Membership, Placement
from fleet.tenancy import require_role
from rollouts.models import Deployment, ModelLoad

FIELDS = ["name", "model", "cluster", "production", "slo_p99_ms", "slo_error_rate", "priority",
          "description"]


def _reprioritise(deployment: Deployment) -> None:
    """The placements of the deployment's loads take its new priority; borrowed marks follow
    it (fleet.quota.mark_borrowed keeps them on the lowest priority)."""
    held = Placement.objects.filter(loads__deployment=deployment, state__in=Placement.HOLDING)
    classes = set(held.values_list("device_class", flat=True))
    held.update(priority=deployment.priority)
    for device_class in classes:
        quota.mark_borrowed(deployment.tenant, device_class)


def save_deployment(
    actor: Any, deployment: Deployment, servers: list[Any] | None = None, reason: str = ""
) -> Deployment:
    """Create or update. Servers, when given, must belong to the deployment's cluster."""
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    creating = deployment.pk is None
    if not creating and Deployment.objects.filter(pk=deployment.pk, archived_at__isnull=False).exists():
        raise Conflict(f"deployment {deployment.name} is archived and cannot change")
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
            if not creating and before.get("priority") != deployment.priority:
                _reprioritise(deployment)
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


def blockers(deployment: Deployment) -> list[str]:
    """What must be unloaded (or finish) before the deployment can go, e.g. "v3 ready on
    triton-1". A load whose placement still holds quota counts: the server may hold the model."""
    busy = (
        deployment.loads.filter(
            Q(state__in=[ModelLoad.State.READY, *ModelLoad.IN_FLIGHT])
            | Q(placement__state__in=Placement.HOLDING)
        )
        .select_related("version", "server")
        .order_by("version__version", "server__name")
    )
    return [f"v{load.version.version} {load.state} on {load.server.name}" for load in busy]


def delete_deployment(actor: Any, deployment: Deployment, reason: str = "") -> str:
    """Take a deployment out of use; returns what became of it: "archived" or "deleted".

    Refused (Conflict) while anything is loaded or in flight on it. A deployment that has had
    loads is archived: kept, read-only and hidden from lists, as the history its loads point
    to. One that never had a load is deleted. Either way the audit log keeps its settings.
    """
    require_role(actor, deployment.tenant, Membership.Role.ADMIN)
    with transaction.atomic():
        # Load requests lock the deployment row too, so none slips in between check and archive.
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if locked.archived_at is not None:
            return "archived"
        busy = blockers(locked)
        if busy:
            raise Conflict(f"unload it first: {', '.join(busy)}")
        before = audit.snapshot(locked, FIELDS)
        before["servers"] = sorted(s.name for s in locked.servers.all())
        if locked.loads.exists():
            summary = loads_summary(locked)
            locked.archived_at = timezone.now()
            locked.save(update_fields=["archived_at", "updated_at"])
            locked.servers.clear()
            audit.record(
                actor, "archived", locked, tenant=locked.tenant, before=before,
                after={"archived_at": locked.archived_at.isoformat(), "loads": summary},
                reason=reason,
            )
            outcome = "archived"
        else:
            audit.record(actor, "deleted", locked, tenant=locked.tenant, before=before, reason=reason)
            locked.delete()
            outcome = "deleted"
    deployment.archived_at = locked.archived_at
    return outcome


def loads_summary(deployment: Deployment) -> dict[str, int]:
    """How many loads the deployment had, by final state."""
    counts = deployment.loads.values("state").annotate(n=Count("pk")).order_by("state")
    return {row["state"]: row["n"] for row in counts}
