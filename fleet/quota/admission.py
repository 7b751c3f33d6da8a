"""Quota: usage from placements, and admission before anything is loaded.

Every model load is admitted here before anything changes on a server: the version's units
(GPUs, or model instances on CPU nodes) and memory are checked against the tenant's quota
for the server's device class and against the free memory of the server's node.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from django.db import models, transaction
from django.db.models import Sum
from django.utils import timezone

from console.exceptions import QuotaExceeded
from fleet.models import GPU, Cohort, InferenceServer, Node, Placement, Quota, Tenant
from fleet.models.quotas import CPU_CLASS


@dataclass(frozen=True)
class QuotaUsage:
    quota: Quota
    units_used: int
    memory_used_mib: int
    #: Of what is used, what is borrowed from the tenant's cohort above its quota.
    units_borrowed: int = 0
    memory_borrowed_mib: int = 0
    #: What the cohort's quotas of the class have free together (None: no cohort).
    cohort_free_units: int | None = None
    cohort_free_memory_mib: int | None = None

    @property
    def cohort(self) -> Cohort | None:
        return self.quota.tenant.cohort

    @property
    def units_lent(self) -> int:
        """Of the quota left, what other members of the cohort borrow now."""
        if self.cohort_free_units is None:
            return 0
        return self.units_left - min(self.units_left, self.cohort_free_units)

    @property
    def memory_lent_mib(self) -> int:
        if self.cohort_free_memory_mib is None:
            return 0
        return self.memory_left_mib - min(self.memory_left_mib, self.cohort_free_memory_mib)

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
    """Usage of each quota, and for a cohort member what its cohort has free, with one
    aggregate query for what is held and, with cohorts, two more (their quotas, and what
    their members hold)."""
    if not quotas:
        return []
    rows = (
        Placement.objects.filter(
            state__in=Placement.HOLDING, tenant__in={q.tenant_id for q in quotas}
        )
        .values("tenant_id", "device_class")
        .annotate(units=Sum("units"), memory=Sum("memory_mib"),
                  borrowed_units=Sum("borrowed_units"), borrowed_memory=Sum("borrowed_memory_mib"))
    )
    held = {(r["tenant_id"], r["device_class"]):
            (r["units"], r["memory"], r["borrowed_units"], r["borrowed_memory"]) for r in rows}
    free = _cohort_free({q.tenant.cohort_id for q in quotas} - {None})
    return [
        QuotaUsage(q, *held.get((q.tenant_id, q.device_class), (0, 0, 0, 0)),
                   *free.get((q.tenant.cohort_id, q.device_class), (None, None)))
        for q in quotas
    ]


def _cohort_free(cohort_ids: set[int]) -> dict[tuple[int, str], tuple[int, int]]:
    """(cohort id, device class) -> units and memory its members' quotas have free together."""
    if not cohort_ids:
        return {}
    total: dict[tuple[int, str], list[int]] = {}
    for cohort_id, device_class, units, memory in Quota.objects.filter(
            tenant__cohort__in=cohort_ids).values_list(
            "tenant__cohort_id", "device_class", "units", "memory_mib"):
        pair = total.setdefault((cohort_id, device_class), [0, 0])
        pair[0] += units
        pair[1] += memory
    rows = (Placement.objects.filter(state__in=Placement.HOLDING, tenant__cohort__in=cohort_ids)
            .values("tenant__cohort_id", "device_class")
            .annotate(units=Sum("units"), memory=Sum("memory_mib")))
    for row in rows:
        pair = total.setdefault((row["tenant__cohort_id"], row["device_class"]), [0, 0])
        pair[0] -= row["units"] or 0
        pair[1] -= row["memory"] or 0
    return {key: (max(u, 0), max(m, 0)) for key, (u, m) in total.items()}


# --------------------------------------------------------------------------------------------
# Admission: one function that decides, and says why
# --------------------------------------------------------------------------------------------


TIMES = "\u00d7"


@dataclass(frozen=True)
class Amount:
    """One dimension (units or memory) of an admission: what is asked, and where it may
    come from."""

    asked: int
    quota: int
    used: int
    borrowing_limit: int
    #: The cohort's quotas of the class together, and what its members hold (None: no cohort).
    cohort_quota: int | None
    cohort_used: int | None

    @property
    def own_left(self) -> int:
        """What the tenant's own quota has left, lent out or not."""
        return max(self.quota - self.used, 0)

    @property
    def borrowed(self) -> int:
        """What the tenant holds above its own quota now."""
        return max(self.used - self.quota, 0)

    @property
    def cohort_free(self) -> int | None:
        if self.cohort_quota is None or self.cohort_used is None:
            return None
        return max(self.cohort_quota - self.cohort_used, 0)

    @property
    def free(self) -> int:
        """Of the tenant's own quota, what is free now (not held by it, nor lent out)."""
        cohort_free = self.cohort_free
        return self.own_left if cohort_free is None else min(self.own_left, cohort_free)

    @property
    def lent(self) -> int:
        """Of the tenant's own quota, what other cohort members are borrowing now."""
        return self.own_left - self.free

    @property
    def borrowable(self) -> int:
        """What may be borrowed from the cohort beyond :attr:`free`, now."""
        cohort_free = self.cohort_free
        if cohort_free is None:
            return 0
        room = max(self.borrowing_limit - self.borrowed, 0)
        return max(min(self.free + room, cohort_free) - self.free, 0)

    @property
    def fits(self) -> bool:
        return self.asked <= self.free + self.borrowable

    @property
    def borrow(self) -> int:
        """What an admission of :attr:`asked` borrows (0 when it fits in the quota)."""
        return max(self.used + self.asked - self.quota, 0) - self.borrowed


@dataclass(frozen=True)
class Reclaimable:
    """A borrower's placement a lender could have unloaded to get its quota back."""

    placement_id: int
    tenant: str
    units: int
    memory_mib: int
    priority: int

    def __str__(self) -> str:
        # Names no tenant, placement or model: a lender reads this (refusals, its load's
        # events, the audit log), and another tenant's placements are not its to see.
        return f"a placement borrowing {self.units} and {self.memory_mib} MiB"


@dataclass(frozen=True)
class ReclaimSummary:
    """How much :attr:`Decision.reclaimable` would give back, counted (what a lender may
    see of other tenants' placements: how many, how much, never whose)."""

    placements: int = 0
    units: int = 0
    memory_mib: int = 0

    def __str__(self) -> str:
        noun = "placement" if self.placements == 1 else "placements"
        return (f"{self.placements} {noun} of other tenants borrowing {self.units} and "
                f"{self.memory_mib} MiB")


@dataclass(frozen=True)
class Decision:
    """What :func:`assess` found: whether a tenant may hold ``units`` and ``memory_mib`` more
    of ``device_class`` now, and why, in one sentence (:attr:`explanation`)."""

    tenant: Tenant
    device_class: str
    quota: Quota | None
    cohort: str
    reclaim_policy: str
    units: Amount
    memory: Amount
    reclaimable: tuple[Reclaimable, ...] = ()

    @property
    def admitted(self) -> bool:
        return self.quota is not None and self.units.fits and self.memory.fits

    @property
    def reclaim(self) -> ReclaimSummary:
        """What :attr:`reclaimable` adds up to, naming no one."""
        return ReclaimSummary(len(self.reclaimable), sum(r.units for r in self.reclaimable),
                              sum(r.memory_mib for r in self.reclaimable))

    def _part(self, amount: Amount, unit: str) -> str:
        text = f"{amount.free}{unit} free in quota"
        if self.cohort:
            text += f", {amount.borrowable}{unit} borrowable from cohort {self.cohort}"
            if amount.lent:
                text += f" ({amount.lent}{unit} of the quota lent out)"
        return text

    @property
    def explanation(self) -> str:
        """"needs 2 x nvidia-a100-80gb (1 free in quota, 1 borrowable from cohort gpu-pool)
        and 163840 MiB (...): admitted, borrowing 1 and 81920 MiB" (with a multiplication
        sign)."""
        if self.quota is None:
            return f"needs {self.units.asked} {TIMES} {self.device_class}: no quota for that class"
        text = (f"needs {self.units.asked} {TIMES} {self.device_class} ({self._part(self.units, '')}) "
                f"and {self.memory.asked} MiB ({self._part(self.memory, ' MiB')})")
        if not self.admitted:
            return f"{text}: refused"
        if self.units.borrow or self.memory.borrow:
            return (f"{text}: admitted, borrowing {self.units.borrow} and "
                    f"{self.memory.borrow} MiB from cohort {self.cohort}")
        return f"{text}: admitted"

    def refusal(self, *, more: bool = False) -> str:
        """Why it is refused, with the numbers ("" when admitted)."""
        quota, slug, cls = self.quota, self.tenant.slug, self.device_class
        if quota is None:
            return (f"tenant {slug} has no quota for device class {cls}; "
                    "ask a platform admin for one")
        extra = " more" if more else ""
        for amount, label, unit in ((self.units, quota.unit_label, ""),
                                    (self.memory, quota.memory_label, " MiB")):
            if amount.fits:
                continue
            short = amount.asked - amount.free - amount.borrowable
            head = f"{label} quota of {slug} on {cls} exceeded: asks {amount.asked}{unit}{extra}, "
            if not self.cohort:
                return (f"{head}{amount.own_left}{unit} left of {amount.quota}{unit} "
                        f"(short by {short}{unit})")
            text = (f"{head}{amount.free}{unit} free in quota, {amount.borrowable}{unit} "
                    f"borrowable from cohort {self.cohort} (borrowing limit "
                    f"{amount.borrowing_limit}{unit}, {amount.borrowed}{unit} borrowed already; "
                    f"the cohort has {amount.cohort_free}{unit} free) (short by {short}{unit})")
            if amount.lent:
                text += (f"; {amount.lent}{unit} of its own quota is lent to other tenants of "
                         f"cohort {self.cohort}")
                if self.reclaimable:
                    action = ("unloading" if self.reclaim_policy == Cohort.Reclaim.UNLOAD
                              else "reclaimable")
                    text += f", {action}, lowest priority first: {self.reclaim}"
            return text
        return ""


def _held(tenant_ids: list[int], device_class: str) -> dict[int, tuple[int, int]]:
    rows = (Placement.objects.filter(tenant__in=tenant_ids, device_class=device_class,
                                     state__in=Placement.HOLDING)
            .values("tenant_id").annotate(units=Sum("units"), memory=Sum("memory_mib")))
    return {r["tenant_id"]: (r["units"] or 0, r["memory"] or 0) for r in rows}


def assess(tenant: Tenant, device_class: str, units: int, memory_mib: int) -> Decision:
    """Whether ``tenant`` may hold ``units`` and ``memory_mib`` more of ``device_class``
    now: in its own quota, else borrowed from its cohort within its borrowing limit, and why.
    When its own quota has room but is lent out, the borrowers' placements that would give
    it back are listed, lowest priority first. Reads only; :func:`admit` locks and acts."""
    quota = Quota.objects.filter(tenant=tenant, device_class=device_class).first()
    cohort = Cohort.objects.filter(pk=tenant.cohort_id).first() if tenant.cohort_id else None
    members = [tenant.pk]
    quotas = {tenant.pk: quota} if quota else {}
    if cohort is not None:
        members = list(Tenant.objects.filter(cohort=cohort).values_list("pk", flat=True))
        quotas = {q.tenant_id: q for q in Quota.objects.filter(tenant__in=members,
                                                                device_class=device_class)}
    held = _held(members, device_class)
    own_units, own_memory = held.get(tenant.pk, (0, 0))

    def amount(asked: int, field: str, limit_field: str, index: int) -> Amount:
        own = getattr(quota, field, 0) if quota else 0
        return Amount(
            asked=asked, quota=own, used=(own_units, own_memory)[index],
            borrowing_limit=getattr(quota, limit_field, 0) if quota else 0,
            cohort_quota=sum(getattr(q, field) for q in quotas.values()) if cohort else None,
            cohort_used=sum(h[index] for h in held.values()) if cohort else None,
        )

    decision = Decision(
        tenant=tenant, device_class=device_class, quota=quota,
        cohort=cohort.name if cohort else "", reclaim_policy=cohort.reclaim if cohort else "",
        units=amount(units, "units", "borrowing_limit_units", 0),
        memory=amount(memory_mib, "memory_mib", "borrowing_limit_memory_mib", 1),
    )
    if cohort is None or decision.admitted or quota is None:
        return decision
    if units > decision.units.own_left or memory_mib > decision.memory.own_left:
        return decision  # beyond its own quota: reclaiming would not be enough
    need_units = units - decision.units.free - decision.units.borrowable
    need_memory = memory_mib - decision.memory.free - decision.memory.borrowable
    found: list[Reclaimable] = []
    borrowers = (Placement.objects.filter(tenant__in=members, device_class=device_class,
                                          state__in=Placement.HOLDING)
                 .exclude(tenant=tenant)
                 .filter(models.Q(borrowed_units__gt=0) | models.Q(borrowed_memory_mib__gt=0))
                 .select_related("tenant").order_by("priority", "-created_at", "-pk"))
    for placement in borrowers:
        if need_units <= 0 and need_memory <= 0:
            break
        found.append(Reclaimable(placement.pk, placement.tenant.slug, placement.borrowed_units,
                                 placement.borrowed_memory_mib, placement.priority))
        need_units -= placement.borrowed_units
        need_memory -= placement.borrowed_memory_mib
    return dataclasses.replace(decision, reclaimable=tuple(found))


def mark_borrowed(tenant: Tenant, device_class: str) -> None:
    """Mark what ``tenant`` holds of ``device_class`` above its own quota as borrowed, on
    its placements of the lowest priority, newest first (the ones a lender reclaims first);
    the rest is held in its own quota. Idempotent; call after any change of what is held or
    of the quota."""
    quota = Quota.objects.filter(tenant=tenant, device_class=device_class).first()
    own_units = quota.units if quota else 0
    own_memory = quota.memory_mib if quota else 0
    holding = Placement.objects.filter(tenant=tenant, device_class=device_class,
                                       state__in=Placement.HOLDING).order_by(
        "-priority", "created_at", "pk")
    for placement in holding:
        in_quota_units = min(placement.units, own_units)
        in_quota_memory = min(placement.memory_mib, own_memory)
        own_units -= in_quota_units
        own_memory -= in_quota_memory
        borrowed = (placement.units - in_quota_units, placement.memory_mib - in_quota_memory)
        if borrowed != (placement.borrowed_units, placement.borrowed_memory_mib):
            Placement.objects.filter(pk=placement.pk).update(
                borrowed_units=borrowed[0], borrowed_memory_mib=borrowed[1])


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
    *,
    priority: int = 0,
) -> Placement:
    """Reserve quota and node capacity for one version on one server, or raise QuotaExceeded.

    The tenant's cohort and quota rows are locked for the check and the insert, so
    concurrent admissions are counted one after the other. Admitting a version that already
    holds a placement on the server returns that placement (idempotent).
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
        return _place(tenant, server, model_version_id, device_class, units, memory_mib, priority)


def _holding(server: InferenceServer, model_version_id: int) -> Placement | None:
    return Placement.objects.filter(
        server=server, model_version_id=model_version_id, state__in=Placement.HOLDING
    ).first()


def _place(tenant: Tenant, server: InferenceServer, model_version_id: int, device_class: str,
           units: int, memory_mib: int, priority: int = 0) -> Placement:
    placement = Placement.objects.create(
        tenant=tenant, server=server, model_version_id=model_version_id,
        device_class=device_class, units=units, memory_mib=memory_mib, priority=priority,
        state=Placement.State.LOADING,
    )
    mark_borrowed(tenant, device_class)
    placement.refresh_from_db()
    return placement


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
    with transaction.atomic():
        released = Placement.objects.filter(pk=placement.pk, state__in=Placement.HOLDING).update(
            state=Placement.State.RELEASED, released_at=timezone.now(),
            borrowed_units=0, borrowed_memory_mib=0,
        )
        if released:
            mark_borrowed(placement.tenant, placement.device_class)


def _refuse_beyond_quota(
    tenant: Tenant, device_class: str, units: int, memory_mib: int, *, more: bool = False
) -> Decision:
    """Lock the tenant's cohort and quota row for ``device_class`` (until the transaction
    ends) and raise QuotaExceeded unless ``units`` and ``memory_mib`` more fit beside what
    is held, in the quota or borrowed from the cohort (``more``: they are added to what the
    asker holds already, and the message says so)."""
    if tenant.cohort_id is not None:
        Cohort.objects.select_for_update().filter(pk=tenant.cohort_id).first()
    Quota.objects.select_for_update().filter(tenant=tenant, device_class=device_class).first()
    decision = assess(tenant, device_class, units, memory_mib)
    if not decision.admitted:
        raise QuotaExceeded(decision.refusal(more=more), field="quota",
                            reclaimable=decision.reclaimable,
                            reclaim_policy=decision.reclaim_policy)
    return decision


def admit_on_class(
    tenant: Tenant,
    server: InferenceServer,
    model_version_id: int,
    device_class: str,
    units: int,
    memory_mib: int,
    *,
    priority: int = 0,
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
        return _place(tenant, server, model_version_id, device_class, units, memory_mib, priority)


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
        mark_borrowed(current.tenant, current.device_class)
    placement.refresh_from_db()
    return placement
