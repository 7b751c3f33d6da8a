"""Quota requests: a tenant admin asks for more of a device class, a platform admin approves
(as asked or changed) or refuses; a grant with an end date returns the quota to what it was
when it ends. Every step is audited and sent to the tenant's webhooks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.audit import actor_label
from fleet.models import GPU, Membership, Node, Quota, QuotaRequest, Tenant
from fleet.models.quotas import CPU_CLASS
from fleet.quota.admission import mark_borrowed
from fleet.tenancy.scoping import require_platform_admin, require_role
from fleet.webhooks import events as webhook_events

State = QuotaRequest.State
MAX_UNITS = 100_000
MAX_MEMORY_MIB = 1 << 40  # a tebibyte of mebibytes: beyond any fleet


def known_device_classes() -> list[str]:
    """The device classes a quota may name: cpu, those of the fleet's GPUs, those quoted."""
    found = {CPU_CLASS, *GPU.objects.values_list("device_class", flat=True),
             *Quota.objects.values_list("device_class", flat=True)}
    return sorted(c for c in found if c)


def ask(actor: Any, tenant: Tenant, device_class: str, units: int, memory_mib: int, reason: str,
        until: datetime | None = None) -> QuotaRequest:
    """A tenant admin asks for ``units`` and ``memory_mib`` of ``device_class`` in all."""
    require_role(actor, tenant, Membership.Role.ADMIN)
    known = known_device_classes()
    if device_class not in known:
        raise DomainError(f"unknown device class {device_class!r}; known: {', '.join(known)}",
                          field="device_class")
    _check_amounts(units, memory_mib)
    _check_fleet_has(device_class, units, memory_mib)
    if not reason.strip():
        raise DomainError("say why the tenant needs it", field="reason")
    if until is not None and until <= timezone.now():
        raise DomainError("must be in the future", field="until")
    current = Quota.objects.filter(tenant=tenant, device_class=device_class).first()
    if current is not None and units <= current.units and memory_mib <= current.memory_mib:
        raise Conflict(
            f"asks for no more than the quota allows now ({current.units} {current.unit_label}, "
            f"{current.memory_mib} MiB): ask for the totals wanted", field="units")
    with transaction.atomic():
        request = QuotaRequest.objects.create(
            tenant=tenant, device_class=device_class, units=units, memory_mib=memory_mib,
            reason=reason.strip(), until=until, requested_by_label=actor_label(actor))
        audit.record(actor, "requested", request, tenant=tenant, reason=request.reason,
                     after={"device_class": device_class, "units": units, "memory_mib": memory_mib,
                            "until": until.isoformat() if until else None})
        _notify(request, f"{request.requested_by_label} asks for {units} x {device_class}")
    return request


def approve(actor: Any, request: QuotaRequest, reason: str = "", *, units: int | None = None,
            memory_mib: int | None = None) -> QuotaRequest:
    """A platform admin grants the request, as asked or with other totals."""
    require_platform_admin(actor)
    units = request.units if units is None else units
    memory_mib = request.memory_mib if memory_mib is None else memory_mib
    _check_amounts(units, memory_mib)
    with transaction.atomic():
        locked = _pending(request)
        quota = Quota.objects.select_for_update().filter(
            tenant=locked.tenant, device_class=locked.device_class).first()
        before = {"units": quota.units, "memory_mib": quota.memory_mib} if quota else {}
        if quota is None:
            quota = Quota(tenant=locked.tenant, device_class=locked.device_class)
        quota.units, quota.memory_mib = units, memory_mib
        quota.save()
        mark_borrowed(locked.tenant, locked.device_class)
        changed = (units, memory_mib) != (locked.units, locked.memory_mib)
        locked.state, locked.decided_at = State.APPROVED, timezone.now()
        locked.decided_by_label, locked.decision_reason = actor_label(actor), reason.strip()
        locked.granted_units, locked.granted_memory_mib = units, memory_mib
        locked.previous_units = before.get("units")
        locked.previous_memory_mib = before.get("memory_mib")
        locked.save()
        audit.record(actor, "approved", locked, tenant=locked.tenant, reason=locked.decision_reason,
                     after={"units": units, "memory_mib": memory_mib, "changed": changed})
        audit.record(actor, "updated", quota, tenant=locked.tenant, before=before,
                     after={"units": units, "memory_mib": memory_mib},
                     reason=f"quota request {locked.pk} approved")
        _notify(locked, f"granted {units} x {locked.device_class}" + (" (changed)" if changed else ""))
    return locked


def refuse(actor: Any, request: QuotaRequest, reason: str) -> QuotaRequest:
    """A platform admin refuses the request, saying why."""
    require_platform_admin(actor)
    if not reason.strip():
        raise DomainError("say why it is refused", field="reason")
    with transaction.atomic():
        locked = _pending(request)
        locked.state, locked.decided_at = State.REFUSED, timezone.now()
        locked.decided_by_label, locked.decision_reason = actor_label(actor), reason.strip()
        locked.save()
        audit.record(actor, "refused", locked, tenant=locked.tenant, reason=locked.decision_reason)
        _notify(locked, f"refused: {locked.decision_reason}")
    return locked


def end_due(now: datetime | None = None) -> int:
    """Return every grant whose end date passed to the quota before it (beat, every minute).
    What is loaded keeps running; new loads are admitted against the quota as it is now."""
    now = now or timezone.now()
    ended = 0
    for pk in QuotaRequest.objects.filter(state=State.APPROVED, until__lte=now).values_list("pk", flat=True):
        with transaction.atomic():
            grant = QuotaRequest.objects.select_for_update().filter(pk=pk, state=State.APPROVED).first()
            if grant is None:
                continue
            quota = Quota.objects.select_for_update().filter(
                tenant=grant.tenant, device_class=grant.device_class).first()
            if quota is not None:
                before = {"units": quota.units, "memory_mib": quota.memory_mib}
                if grant.previous_units is None:
                    quota.delete()
                    after: dict[str, Any] = {}
                else:
                    quota.units, quota.memory_mib = grant.previous_units, grant.previous_memory_mib or 0
                    quota.save()
                    after = {"units": quota.units, "memory_mib": quota.memory_mib}
                audit.record(None, "updated" if after else "deleted", quota, tenant=grant.tenant,
                             before=before, after=after, reason=f"quota request {grant.pk} ended")
                mark_borrowed(grant.tenant, grant.device_class)
            grant.state, grant.ended_at = State.ENDED, now
            grant.save(update_fields=["state", "ended_at"])
            _notify(grant, f"the grant of {grant.granted_units} x {grant.device_class} ended")
            ended += 1
    return ended


def _check_amounts(units: int, memory_mib: int) -> None:
    for field, value, most in (("units", units, MAX_UNITS), ("memory_mib", memory_mib, MAX_MEMORY_MIB)):
        if not 0 <= value <= most:
            raise DomainError(f"must be between 0 and {most}, got {value}", field=field)


def fleet_capacity(device_class: str) -> tuple[int | None, int | None]:
    """What the fleet has of ``device_class`` in all: (units, memory in MiB), None where it
    is not known. A GPU class counts the GPUs of nodes still there and their memory; cpu
    counts no units (model instances) and the memory of those nodes."""
    nodes = Node.objects.filter(gone_at__isnull=True)
    if device_class == CPU_CLASS:
        memory = nodes.aggregate(total=Sum("memory_mib"))["total"] or 0
        return None, memory or None
    gpus = GPU.objects.filter(device_class=device_class, node__in=nodes).aggregate(
        count=Count("id"), memory=Sum("memory_mib"))
    if not gpus["count"]:
        return None, None  # a class quoted ahead of its hardware: nothing to measure against
    return gpus["count"], gpus["memory"] or 0


def _size(mib: int) -> str:
    for unit, size in (("PiB", 1 << 30), ("TiB", 1 << 20), ("GiB", 1 << 10)):
        if mib >= size:
            return f"{mib / size:.1f} {unit}".replace(".0 ", " ")
    return f"{mib} MiB"


def _check_fleet_has(device_class: str, units: int, memory_mib: int) -> None:
    """A request for more than the whole fleet has is refused, saying how much exists."""
    has_units, has_memory = fleet_capacity(device_class)
    if has_units is not None and units > has_units:
        raise DomainError(f"the fleet has {has_units} {device_class} GPU{'s' if has_units != 1 else ''} "
                          f"in all: ask for at most {has_units}", field="units")
    if has_memory is not None and memory_mib > has_memory:
        what = "host memory of its nodes" if device_class == CPU_CLASS else f"{device_class} GPU memory"
        raise DomainError(f"the fleet has {has_memory} MiB ({_size(has_memory)}) of {what} "
                          f"in all: ask for at most {has_memory}", field="memory_mib")


def _pending(request: QuotaRequest) -> QuotaRequest:
    locked = QuotaRequest.objects.select_for_update().select_related("tenant").get(pk=request.pk)
    if locked.state != State.PENDING:
        raise Conflict(f"quota request {locked.pk} is {locked.state}: it was decided already")
    return locked


def _notify(request: QuotaRequest, summary: str) -> None:
    webhook_events.emit(request.tenant, "quota.request_changed", {
        "id": request.pk, "tenant": request.tenant.slug, "device_class": request.device_class,
        "state": request.state, "units": request.units, "memory_mib": request.memory_mib,
        "granted_units": request.granted_units, "granted_memory_mib": request.granted_memory_mib,
        "until": request.until.isoformat() if request.until else None,
    }, summary=summary)
