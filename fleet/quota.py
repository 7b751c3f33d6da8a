"""Quota: usage from placements, and admission before anything is loaded.

Every model load is admitted here before anything changes on a server: the version's units
(GPUs, or model instances on CPU nodes) and memory are checked against the tenant's quota
for the server's device class and against the free memory of the server's node.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from fleet.errors import QuotaExceeded
from fleet.models import GPU, InferenceServer, Node, Placement, Quota, Tenant
from fleet.models.quotas import CPU_CLASS


@dataclass(frozen=True)
class QuotaUsage:
    quota: Quota
    units_used: int
    memory_used_mib: int

    @property
    def units_left(self) -> int:
        return max(self.quota.units - self.units_used, 0)

    @property
    def memory_left_mib(self) -> int:
        return max(self.quota.memory_mib - self.memory_used_mib, 0)

    @property
    def units_percent(self) -> int:
        return _percent(self.units_used, self.quota.units)

    @property
    def memory_percent(self) -> int:
        return _percent(self.memory_used_mib, self.quota.memory_mib)


def _percent(used: int, limit: int) -> int:
    if limit <= 0:
        return 100 if used else 0
    return min(round(100 * used / limit), 100)


def usage_for(quotas: list[Quota]) -> list[QuotaUsage]:
    """Usage of each quota, with one aggregate query for the lot."""
    if not quotas:
        return []
    rows = (
        Placement.objects.filter(
            state__in=Placement.HOLDING, tenant__in={q.tenant_id for q in quotas}
        )
        .values("tenant_id", "device_class")
        .annotate(units=Sum("units"), memory=Sum("memory_mib"))
    )
    held = {(r["tenant_id"], r["device_class"]): (r["units"], r["memory"]) for r in rows}
    return [
        QuotaUsage(q, *held.get((q.tenant_id, q.device_class), (0, 0)))
        for q in quotas
    ]


def device_class_of(server: InferenceServer) -> str:
    """The device class a server's placements count against: its node's GPU class, or cpu."""
    if server.node_id is not None:
        gpu = GPU.objects.filter(node_id=server.node_id, parent__isnull=True).first()
        if gpu is not None:
            return gpu.device_class
    return CPU_CLASS


def _node_capacity_mib(server: InferenceServer, device_class: str) -> int | None:
    """Memory the server's node offers for this class (None: no node recorded, not checked)."""
    if server.node_id is None:
        return None
    if device_class == CPU_CLASS:
        return server.node.memory_mib or None
    # A GPU partitioned into MIG slices offers its slices (their own class), not itself.
    partitioned = GPU.objects.filter(parent__isnull=False).values("parent_id")
    total = GPU.objects.filter(node_id=server.node_id, device_class=device_class).exclude(
        pk__in=partitioned
    ).aggregate(total=Sum("memory_mib"))["total"]
    return total or None


def admit(
    tenant: Tenant,
    server: InferenceServer,
    model_version_id: int,
    units: int,
    memory_mib: int,
) -> Placement:
    """Reserve quota and node capacity for one version on one server, or raise QuotaExceeded.

    The tenant's quota row is locked for the check and the insert, so concurrent admissions
    are counted one after the other. Admitting a version that already holds a placement on
    the server returns that placement (idempotent).
    """
    device_class = device_class_of(server)
    with transaction.atomic():
        existing = _holding(server, model_version_id)
        if existing is not None:
            return existing
        _refuse_beyond_quota(tenant, device_class, units, memory_mib)
        capacity = _node_capacity_mib(server, device_class)
        if capacity is not None:
            # Tenants share nodes: serialise admissions per node as well as per quota.
            Node.objects.select_for_update().filter(pk=server.node_id).first()
            used_on_node = Placement.objects.filter(
                server__node_id=server.node_id, device_class=device_class,
                state__in=Placement.HOLDING,
            ).aggregate(total=Sum("memory_mib"))["total"] or 0
            free = max(capacity - used_on_node, 0)
            if memory_mib > free:
                raise QuotaExceeded(
                    f"node {server.node.name} has too little free memory: asks {memory_mib} MiB, "
                    f"{free} MiB free of {capacity} MiB",
                    field="node",
                )
        return _place(tenant, server, model_version_id, device_class, units, memory_mib)


def _holding(server: InferenceServer, model_version_id: int) -> Placement | None:
    return Placement.objects.filter(
        server=server, model_version_id=model_version_id, state__in=Placement.HOLDING
    ).first()


def _place(tenant: Tenant, server: InferenceServer, model_version_id: int, device_class: str,
           units: int, memory_mib: int) -> Placement:
    return Placement.objects.create(
        tenant=tenant, server=server, model_version_id=model_version_id,
        device_class=device_class, units=units, memory_mib=memory_mib,
        state=Placement.State.LOADING,
    )


def activate(placement: Placement, config_hash: str) -> Placement:
    """The version is serving: keep holding quota, remember the config it runs with."""
    Placement.objects.filter(pk=placement.pk).update(
        state=Placement.State.ACTIVE, config_hash=config_hash
    )
    placement.refresh_from_db()
    return placement


def release(placement: Placement | None) -> None:
    """Give the quota back (idempotent)."""
    if placement is None:
        return
    Placement.objects.filter(pk=placement.pk, state__in=Placement.HOLDING).update(
        state=Placement.State.RELEASED, released_at=timezone.now()
    )


def _refuse_beyond_quota(
    tenant: Tenant, device_class: str, units: int, memory_mib: int, *, more: bool = False
) -> None:
    """Lock the tenant's quota row for ``device_class`` (until the transaction ends) and
    raise QuotaExceeded unless ``units`` and ``memory_mib`` more fit beside what is held
    (``more``: they are added to what the asker holds already, and the message says so)."""
    extra = " more" if more else ""
    quota = Quota.objects.select_for_update().filter(tenant=tenant, device_class=device_class).first()
    if quota is None:
        raise QuotaExceeded(
            f"tenant {tenant.slug} has no quota for device class {device_class}; "
            "ask a platform admin for one",
            field="quota",
        )
    usage = usage_for([quota])[0]
    if units > usage.units_left:
        raise QuotaExceeded(
            f"{quota.unit_label} quota of {tenant.slug} on {device_class} exceeded: "
            f"asks {units}{extra}, {usage.units_left} left of {quota.units} "
            f"(short by {units - usage.units_left})",
            field="quota",
        )
    if memory_mib > usage.memory_left_mib:
        raise QuotaExceeded(
            f"{quota.memory_label} quota of {tenant.slug} on {device_class} exceeded: "
            f"asks {memory_mib} MiB{extra}, {usage.memory_left_mib} MiB left of "
            f"{quota.memory_mib} MiB (short by {memory_mib - usage.memory_left_mib} MiB)",
            field="quota",
        )


def admit_on_class(
    tenant: Tenant,
    server: InferenceServer,
    model_version_id: int,
    device_class: str,
    units: int,
    memory_mib: int,
) -> Placement:
    """:func:`admit` for a server whose device class is not its node's: a server Switchyard
    runs on Kubernetes, whose pods the scheduler places on any node that offers the GPU
    resource its Deployment asks for (the class comes from that resource and the product it
    selects). No node is recorded for such a server, so only the quota is checked: the
    scheduler holds the pods back while no node has room. Idempotent as :func:`admit`."""
    with transaction.atomic():
        existing = _holding(server, model_version_id)
        if existing is not None:
            return existing
        _refuse_beyond_quota(tenant, device_class, units, memory_mib)
        return _place(tenant, server, model_version_id, device_class, units, memory_mib)


def resize(placement: Placement, units: int, memory_mib: int) -> Placement:
    """Make a held placement hold ``units`` and ``memory_mib`` (a server scaled to more or
    fewer replicas). Growing is admitted against the quota first, for the difference only,
    and refused with the numbers (QuotaExceeded, nothing changed); shrinking always fits."""
    with transaction.atomic():
        current = Placement.objects.select_for_update().get(pk=placement.pk)
        if current.state not in Placement.HOLDING:
            raise QuotaExceeded(f"placement {current.pk} is released: it cannot be resized",
                                field="quota")
        more_units = units - current.units
        more_memory = memory_mib - current.memory_mib
        if more_units > 0 or more_memory > 0:
            _refuse_beyond_quota(current.tenant, current.device_class, max(more_units, 0),
                                 max(more_memory, 0), more=True)
        Placement.objects.filter(pk=current.pk).update(units=units, memory_mib=memory_mib)
    placement.refresh_from_db()
    return placement
