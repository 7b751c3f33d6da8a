"""Creating, changing and deleting deployments, role-checked and audited.

A deployment's ``production`` flag is itself approval-gated: only an approver (or higher) of
its tenant changes it, either way, and it is turned on only while nothing of a version that
is not approved is on the deployment or on its way there (:func:`unapproved_on`). With the
load check (production deployments load approved versions only), no order of calls leaves an
unapproved version on a production deployment.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.models import Membership, Placement
from fleet.quota import admission as quota
from fleet.tenancy.scoping import require_role
from rollouts.models import (
    BenchmarkJob,
    Deployment,
    ModelLoad,
    ModelVersion,
    Rollout,
    ServerWorkload,
)
from rollouts.traffic import routes

FIELDS = ["name", "model", "cluster", "production", "guard_servers", "slo_p99_ms", "slo_error_rate",
          "slo_window_days", "request_timeout_s", "priority", "auto_converge", "description"]


def _reprioritise(deployment: Deployment) -> None:
    """The placements of the deployment's loads take its new priority; borrowed marks follow
    it (fleet.quota.admission.mark_borrowed keeps them on the lowest priority)."""
    held = Placement.objects.filter(loads__deployment=deployment, state__in=Placement.HOLDING)
    classes = set(held.values_list("device_class", flat=True))
    held.update(priority=deployment.priority)
    for device_class in classes:
        quota.mark_borrowed(deployment.tenant, device_class)


def save_deployment(
    actor: Any, deployment: Deployment, servers: list[Any] | None = None, reason: str = ""
) -> Deployment:
    """Create or update. Servers, when given, must belong to the deployment's cluster.

    Changing ``production`` (on update) needs the approver role (PermissionDenied), and
    turning it on is a Conflict on ``production`` while :func:`unapproved_on` finds anything.
    A new deployment may start as production: nothing is on it yet.
    """
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    creating = deployment.pk is None
    if not creating and Deployment.objects.filter(pk=deployment.pk, archived_at__isnull=False).exists():
        raise Conflict(f"deployment {deployment.name} is archived and cannot change")
    before = {} if creating else audit.snapshot(Deployment.objects.get(pk=deployment.pk), FIELDS)
    if not creating:
        _guard_production(actor, deployment, before["production"])
    if servers is not None:
        strangers = [s.name for s in servers if s.cluster_id != deployment.cluster_id]
        if strangers:
            raise Conflict(
                f"servers {', '.join(strangers)} are not in cluster {deployment.cluster}",
                field="servers",
            )
    deployment.full_clean()
    problem = routes.deadline_problem(deployment)
    if problem:
        raise DomainError(problem, field="request_timeout_s")
    if not creating and before.get("request_timeout_s") != deployment.request_timeout_s:
        # The route takes the new deadline first: a router that refuses it leaves the
        # deployment as it was (RouteFailed), so the two never disagree.
        routes.reapply(actor, deployment, reason or "the deployment's request deadline changed")
    try:
        with transaction.atomic():
            if not creating:
                # Load and rollout requests lock this row too: checked again under the lock,
                # nothing new slips in between the check and the flag.
                locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
                before = audit.snapshot(locked, FIELDS)
                _guard_production(actor, deployment, before["production"])
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


def _guard_production(actor: Any, deployment: Deployment, was_production: bool) -> None:
    """Refuse a change of the production flag: by less than an approver (403), or turning it
    on while a version that is not approved is on the deployment (409 on ``production``)."""
    if bool(was_production) == bool(deployment.production):
        return
    try:
        require_role(actor, deployment.tenant, Membership.Role.APPROVER)
    except PermissionDenied as exc:
        raise PermissionDenied(
            f"an approver must change whether deployment {deployment.name} is production: {exc}"
        ) from None
    if not deployment.production:
        return
    found = unapproved_on(deployment)
    if found:
        raise Conflict(
            f"deployment {deployment.name} cannot be marked production while versions that are "
            f"not approved are on it or on their way: {'; '.join(found)}. Unload them, let "
            "them finish (or abort them), or have the versions approved first",
            field="production",
        )


def unapproved_on(deployment: Deployment) -> list[str]:
    """What of a version that is not approved is on the deployment or on its way there, in
    words: loads in flight or ready (or whose placement still holds the server), rollouts not
    in a final state, Kubernetes workloads and benchmark jobs not finished. Empty: the
    deployment may be marked production."""
    approved = ModelVersion.Status.APPROVED
    found: list[str] = []
    held = (
        deployment.loads.filter(
            Q(state__in=[ModelLoad.State.READY, *ModelLoad.IN_FLIGHT])
            | Q(placement__state__in=Placement.HOLDING)
        )
        .exclude(version__status=approved)
        .select_related("version", "server")
        .order_by("pk")
    )
    found += [f"v{load.version.version} ({load.version.get_status_display().lower()}): "
              f"load {load.pk} {load.get_state_display().lower()} on {load.server.name}"
              for load in held]
    statuses = {n: ModelVersion.Status(status).label.lower()
                for n, status in deployment.model.versions.values_list("version", "status")}
    for rollout in deployment.rollouts.exclude(state__in=Rollout.FINAL).select_related(
            "baseline", "candidate").order_by("pk"):
        named = [f"v{n} ({statuses.get(n, 'unknown')})" for n in rollout.versions
                 if statuses.get(n) != approved.label.lower()]
        if named:
            found.append(f"rollout {rollout.pk} ({rollout.get_state_display().lower()}) of "
                         f"{', '.join(named)}")
    for workload in deployment.workloads.filter(state__in=ServerWorkload.ACTIVE).exclude(
            version__status=approved).select_related("version").order_by("pk"):
        found.append(f"v{workload.version.version} "
                     f"({workload.version.get_status_display().lower()}): workload "
                     f"{workload.name} {workload.get_state_display().lower()}")
    for job in deployment.benchmark_jobs.filter(state__in=BenchmarkJob.ACTIVE).exclude(
            version__status=approved).select_related("version").order_by("pk"):
        found.append(f"v{job.version.version} ({job.version.get_status_display().lower()}): "
                     f"benchmark job {job.pk} "
                     f"{job.get_state_display().lower()}")
    return found


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
