"""The server-workload reconciler: it advances a ServerWorkload one step at a time.

Celery calls :func:`advance` (a task enqueued after each request and each step, and beat's
tick for whatever is due, :func:`due_workloads`); it claims the row with a short lease, does
at most one step (one to five API calls) and returns. Every step is idempotent (an apply of
the same manifest changes nothing), so a step repeated after a lost worker does no harm. The
states and what each step does are in ``rollouts.workloads.requests``'s docstring; the requests that
start a change are there too.

An autoscaled workload has its HorizontalPodAutoscaler applied with its Deployment (and
deleted first when it goes), and is judged ready against the replicas its HPA set on the
Deployment, within the HPA's range. Once ready it is still read every
``SWITCHYARD_KUBE_SYNC_INTERVAL_S`` (:func:`_observe`): the HPA changes the replica count
on its own, and the row (``observed``, ``replicas``), the pages and the replica
recommendation follow it. Those reads never change the state.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Q
from django.utils import timezone

from console.exceptions import DomainError
from fleet import audit
from fleet.adapters import kube_workloads as kw
from fleet.adapters.kubernetes import KubeAccess, KubeError
from fleet.inventory.kube_connection import access_for
from fleet.models import Placement
from fleet.quota import admission as quota
from rollouts import leases
from rollouts.models import ModelLoad, ServerWorkload
from rollouts.workloads.checks import range_words
from rollouts.workloads.specs import autoscaler_manifest, demand, server_spec

log = logging.getLogger(__name__)
State = ServerWorkload.State

POLL_S = 3  # how soon a progressing workload's Deployment is read again
MAX_BACKOFF_S = 30
MAX_ROLLBACK_ATTEMPTS = 20  # a roll-back that cannot be applied this many times in a row

def _heartbeat(workload: ServerWorkload) -> contextlib.AbstractContextManager[None]:
    """Keep the lease alive while a step runs (:func:`leases.heartbeat`): renewed every third
    of ``SWITCHYARD_WORKLOAD_LEASE_S``, for at most a step's API calls plus a lease. A step
    makes at most five API calls, each bounded by the client's timeout (an autoscaled
    creation that fails: three applies, then what was applied is deleted)."""
    lease_s = settings.SWITCHYARD_WORKLOAD_LEASE_S
    return leases.heartbeat(workload, lease_s=lease_s,
                            max_s=6 * settings.SWITCHYARD_KUBE_TIMEOUT_S + lease_s)


def _watched_while_ready(workload: ServerWorkload) -> bool:
    """A ready autoscaled workload is read on (its HPA changes its replicas)."""
    return workload.state == State.READY and workload.autoscaled


def _range(workload: ServerWorkload) -> tuple[int, int] | None:
    return (workload.min_replicas, workload.max_replicas) if workload.autoscaled else None


def _counts(workload: ServerWorkload, judged: kw.Readiness) -> dict[str, Any]:
    """What a read says of the row: the status counts, and for an autoscaled workload the
    replicas its HPA set (``replicas`` mirrors the Deployment then)."""
    fields: dict[str, Any] = {"observed": judged.observed}
    if workload.autoscaled:
        fields["replicas"] = judged.observed["desired"]
    return fields


def _due(workload: ServerWorkload, now: Any) -> bool:
    """In flight (or ready and watched), and not backing off or waiting to look again."""
    return (workload.state in ServerWorkload.IN_FLIGHT or _watched_while_ready(workload)) and not (
        workload.next_attempt_at and workload.next_attempt_at > now)


def _claim(workload_id: int) -> ServerWorkload | None:
    workload = leases.claim(
        ServerWorkload.objects.select_related("version__model", "previous_version", "cluster",
                                              "deployment", "tenant", "placement", "server"),
        workload_id, lease_s=settings.SWITCHYARD_WORKLOAD_LEASE_S, due=_due,
    )
    if workload is not None:
        workload.claimed_state = workload.state
    return workload


def _update(workload: ServerWorkload, **fields: Any) -> None:
    """Write fields while we hold the lease and the state is the one we act on: a request
    that moved the row on (a deletion) stops the step as a lost lease does."""
    leases.update(workload, {"state": workload.claimed_state}, **fields)
    workload.claimed_state = workload.state


def _move(workload: ServerWorkload, to: str, detail: str, **fields: Any) -> None:
    _update(workload, state=to, detail=detail, phase_started_at=timezone.now(), attempts=0,
            next_attempt_at=None, forbidden_since=None, **fields)


def _access(workload: ServerWorkload) -> KubeAccess:
    try:
        return access_for(workload.cluster)
    except DomainError as exc:  # a secret that cannot be read: as permanent as a 401
        raise KubeError(f"cannot reach cluster {workload.cluster.name}: {exc.message}",
                        kind="config") from exc


def _start(workload: ServerWorkload) -> None:
    _move(workload, State.APPLYING, "applying the Deployment and the Service")


def _apply(workload: ServerWorkload) -> None:
    access = _access(workload)
    spec = server_spec(workload)
    desired = kw.deployment_manifest(spec)
    creating = not workload.previous_spec
    if not creating and not workload.autoscaled and kw.differs_only_in_replicas(
        desired, workload.previous_spec
    ):
        kw.scale(access, workload.namespace, workload.name, workload.replicas)
        generation = workload.generation
        what = f"scaled to {workload.replicas} replicas"
    else:
        try:
            applied = kw.apply(access, desired)
        except KubeError as exc:
            if creating and exc.permanent and not _may_be_passing(workload, exc):
                # Server-side apply is all or nothing: the refused Deployment was not made.
                _fail_creation(workload, f"the Deployment was refused: {exc.message}",
                               created=False)
                return
            raise
        if creating:
            try:
                kw.apply(access, kw.service_manifest(spec))
            except KubeError as exc:
                if not exc.permanent or _may_be_passing(workload, exc):
                    raise  # the next attempt applies both again
                _fail_creation(workload, f"the Service was refused: {exc.message}",
                               autoscaler=False)  # applied after the Service
                return
        if workload.autoscaled:
            # After the Deployment it scales; on every change (its range, the p99 SLO).
            try:
                kw.apply(access, autoscaler_manifest(workload))
            except KubeError as exc:
                if not (creating and exc.permanent) or _may_be_passing(workload, exc):
                    raise  # a change that cannot apply it rolls back
                # Refused, so not made (server-side apply is all or nothing): the Deployment
                # and the Service go; there is no HPA to delete (nor, without RBAC for
                # HPAs, the right to).
                _fail_creation(workload, "the HorizontalPodAutoscaler was refused: "
                                         f"{exc.message}", autoscaler=False)
                return
        generation = int((applied.get("metadata") or {}).get("generation") or 0)
        applied_what = ["the Deployment", *(["the Service"] if creating else []),
                        *(["the HPA"] if workload.autoscaled else [])]
        what = "applied " + (", ".join(applied_what[:-1]) + " and " if len(applied_what) > 1
                             else "") + applied_what[-1]
        if workload.autoscaled:
            what += f" ({workload.min_replicas}-{workload.max_replicas} replicas)"
    _move(workload, State.PROGRESSING, f"{what}; waiting for the pods", applied_spec=desired,
          generation=generation, error="")


def _watch(workload: ServerWorkload) -> None:
    found = kw.read(_access(workload), workload.namespace, workload.name)
    judged = kw.readiness(found, _range(workload))
    generation = judged.observed["generation"]
    if judged.is_ready:
        _ready(workload, judged, generation)
        return
    if judged.has_failed:
        _give_up(workload, judged.detail, observed=judged.observed)
        return
    if workload.deadline_at and timezone.now() >= workload.deadline_at:
        _give_up(workload, f"not ready within {settings.SWITCHYARD_KUBE_ROLLOUT_DEADLINE_S:g} s: "
                           f"{judged.detail}", observed=judged.observed)
        return
    _update(workload, generation=generation, detail=judged.detail, error="", attempts=0,
            forbidden_since=None, next_attempt_at=timezone.now() + timedelta(seconds=POLL_S),
            **_counts(workload, judged))


def _ready(workload: ServerWorkload, judged: kw.Readiness, generation: int) -> None:
    with transaction.atomic():  # the state and the quota it holds, together
        previous = workload.previous_version
        _move(workload, State.READY, judged.detail, generation=generation,
              ready_at=timezone.now(), previous_version=None, deadline_at=None, error="",
              **_counts(workload, judged))
        # An autoscaled workload holds its HPA's maximum: the HPA may scale to it any time.
        units, memory = demand(workload.version, workload.quota_replicas)
        placement = workload.placement
        if previous is not None and previous.pk != workload.version_id:
            # The old version's pods are gone: so is its quota.
            for old in Placement.objects.filter(server_id=workload.server_id,
                                                model_version=previous,
                                                state__in=Placement.HOLDING):
                quota.release(old)
        if placement is not None and placement.state in Placement.HOLDING:
            if (units, memory) != (placement.units, placement.memory_mib):
                quota.resize(placement, units, memory)  # fewer replicas: give back the rest
            spec_hash = hashlib.sha256(
                json.dumps(workload.applied_spec, sort_keys=True).encode()).hexdigest()
            quota.activate(placement, spec_hash)
        if workload.server_id is not None:
            _record_served(workload)


def _observe(workload: ServerWorkload) -> None:
    """A ready autoscaled workload: read what its HPA made of the Deployment (the replicas it
    set, how many are available) into ``observed`` and ``replicas``, then again after
    ``SWITCHYARD_KUBE_SYNC_INTERVAL_S``. The state stays ready whatever the read says (the HPA
    adding pods is not a change of Switchyard's to wait for or roll back); a read that fails
    is said on the row and tried at the next interval."""
    again = timezone.now() + timedelta(seconds=settings.SWITCHYARD_KUBE_SYNC_INTERVAL_S)
    try:
        found = kw.read(_access(workload), workload.namespace, workload.name)
        judged = kw.readiness(found, _range(workload))
    except Exception as exc:  # never given up on, never rolled back: said, and read again
        if isinstance(exc, KubeError):
            reason = exc.message
        else:
            log.exception("workload %s: unexpected error reading it", workload.pk)
            reason = f"Switchyard failed unexpectedly ({type(exc).__name__}: {exc})"
        _update(workload, error=reason, next_attempt_at=again,
                detail=f"autoscaled by its HPA; the Deployment could not be read: {reason}")
        return
    _update(workload, detail=f"autoscaled by its HPA: {judged.detail}", error="",
            forbidden_since=None, next_attempt_at=again, **_counts(workload, judged))


def _record_served(workload: ServerWorkload) -> None:
    """The server runs ``workload.version`` now: a ready ModelLoad says so (holding the
    workload's placement), as it does for a version loaded onto any server, so routes,
    rollouts, benchmarks, live latency and the pages treat it alike; the versions it no
    longer runs end unloaded. Call it in the transaction that makes the workload ready."""
    now = timezone.now()
    label = workload.requested_by_label or "workload"
    ModelLoad.objects.filter(server_id=workload.server_id, state=ModelLoad.State.READY).exclude(
        version_id=workload.version_id
    ).update(state=ModelLoad.State.UNLOADED, finished_at=now, updated_at=now,
             unload_requested_by_label=f"workload {workload.namespace}/{workload.name} rolled")
    if ModelLoad.objects.filter(server_id=workload.server_id, version_id=workload.version_id,
                                state=ModelLoad.State.READY).exists():
        return
    ModelLoad.objects.create(
        tenant=workload.tenant, deployment=workload.deployment, server_id=workload.server_id,
        version=workload.version, state=ModelLoad.State.READY, placement=workload.placement,
        requested_by=workload.requested_by, requested_by_token=workload.requested_by_token,
        requested_by_label=label, ready_at=now, phase_started_at=now,
    )


def _record_stopped(workload: ServerWorkload) -> None:
    """The workload's server is gone: what it served ends unloaded."""
    now = timezone.now()
    ModelLoad.objects.filter(server_id=workload.server_id, state=ModelLoad.State.READY).update(
        state=ModelLoad.State.UNLOADED, finished_at=now, updated_at=now,
        unload_requested_by_label=f"workload {workload.namespace}/{workload.name} deleted")


def _give_up(workload: ServerWorkload, reason: str, **fields: Any) -> None:
    """The change cannot be completed: roll back a change, end a creation."""
    if workload.state == State.ROLLING_BACK:
        # Never failed either: the Deployment may run the new spec or the old one, so both
        # versions' quota stays held while the roll-back is tried again (or the workload
        # is deleted); a failed workload holds no quota.
        if not workload.detail.startswith("the roll-back could not be applied"):
            audit.record(None, "workload_rollback_stuck", workload, tenant=workload.tenant, reason=reason)
        _update(workload, attempts=workload.attempts + 1,
                detail=f"the roll-back could not be applied: {reason}; the Deployment may still run "
                       f"the new spec, so both versions' quota stays held until it is rolled back or "
                       f"deleted (tried again every {MAX_BACKOFF_S} s)",
                next_attempt_at=timezone.now() + timedelta(seconds=MAX_BACKOFF_S), **fields)
        return
    if workload.state == State.DELETING:
        # Never failed: what is still on the cluster holds its GPUs, so the workload keeps
        # its quota, says why, and deletes again until it is gone.
        _update(workload, attempts=workload.attempts + 1, error=reason,
                detail=f"could not delete: {reason}; its quota stays held until it is gone "
                       f"(tried again every {MAX_BACKOFF_S} s)",
                next_attempt_at=timezone.now() + timedelta(seconds=MAX_BACKOFF_S), **fields)
        return
    if workload.previous_spec:
        _move(workload, State.ROLLING_BACK, f"rolling back: {reason}", error=reason, **fields)
        return
    # A creation (pending, applying, or waiting for pods that never came up): what it
    # applied is removed and its quota released.
    _fail_creation(workload, reason, **fields)


def _fail_creation(workload: ServerWorkload, reason: str, *, created: bool | None = None,
                   autoscaler: bool | None = None, **fields: Any) -> None:
    """A creation that failed before its pods ran: remove what may have been applied (not
    the Deployment when ``created`` is False, not the HPA when ``autoscaler`` is), then
    release the quota and end ``failed`` with nothing applied (``applied_spec`` empty: it can
    be created again). When removing fails, the workload is not failed but ``deleting``: it
    keeps its quota (what was applied may run) and removes it again until it is gone."""
    left = ""
    if created is not False:
        try:
            access = _access(workload)
            if workload.autoscaled and autoscaler is not False:
                kw.delete_autoscaler(access, workload.namespace, workload.name)
            kw.delete_deployment(access, workload.namespace, workload.name)
            kw.delete_service(access, workload.namespace, workload.name)
        except KubeError as exc:
            left = exc.message
    with transaction.atomic():
        if left:
            _move(workload, State.DELETING,
                  f"{reason}. What was applied could not be removed yet ({left}): removing it "
                  "again; its quota stays held until it is gone", error=reason,
                  deadline_at=None, **fields)
        else:
            _move(workload, State.FAILED, f"{reason}. Nothing is left on the cluster; quota "
                                          "released", error=reason, deadline_at=None,
                  applied_spec={}, **fields)
            quota.release(workload.placement)
        audit.record(None, "workload_failed", workload, tenant=workload.tenant, reason=reason)


def _roll_back(workload: ServerWorkload) -> None:
    access = _access(workload)
    kw.apply(access, workload.previous_spec)
    fields: dict[str, Any] = {"applied_spec": workload.previous_spec, "previous_version": None,
                              "deadline_at": None}
    if workload.autoscaled:
        # The range the previous Deployment was applied with (its annotation), and its HPA.
        low, high = kw.replica_range_of(workload.previous_spec) or _range(workload)
        kw.apply(access, autoscaler_manifest(workload, (low, high)))
        fields.update(min_replicas=low, max_replicas=high)
        restored_words = range_words(low, high)
    else:
        fields["replicas"] = kw.replicas_of(workload.previous_spec)
        restored_words = f"{fields['replicas']} replicas"
    with transaction.atomic():
        previous = workload.previous_version
        failed_version = workload.version
        if previous is not None and previous.pk != workload.version_id:
            old = Placement.objects.filter(server_id=workload.server_id, model_version=previous,
                                           state__in=Placement.HOLDING).first()
            quota.release(workload.placement)
            fields.update(version=previous, gpus_per_replica=previous.gpus, placement=old)
            what = f"v{failed_version.version} rolled back to v{previous.version}"
        else:
            what = f"scale rolled back to {restored_words}"
        _move(workload, State.FAILED, f"{what}: {workload.error}", **fields)
        placement = workload.placement
        if placement is not None and placement.state in Placement.HOLDING:
            units, memory = demand(workload.version, workload.quota_replicas)
            if (units, memory) != (placement.units, placement.memory_mib):
                quota.resize(placement, units, memory)
        audit.record(None, "workload_rolled_back", workload, tenant=workload.tenant,
                     reason=workload.error)


def _delete(workload: ServerWorkload) -> None:
    access = _access(workload)
    if _may_have_autoscaler(workload):
        # First, so it does not scale what is being taken away.
        kw.delete_autoscaler(access, workload.namespace, workload.name)
    kw.delete_deployment(access, workload.namespace, workload.name)
    kw.delete_service(access, workload.namespace, workload.name)
    with transaction.atomic():
        _move(workload, State.DELETED, "deleted from the cluster; quota released",
              deadline_at=None, previous_version=None)
        held = Placement.objects.filter(server_id=workload.server_id, state__in=Placement.HOLDING,
                                        model_version_id__in=_version_ids(workload))
        for placement in held:
            quota.release(placement)
        if workload.server_id is not None:
            _record_stopped(workload)
        if workload.server is not None:
            # The server row stays as the history its placements point to, out of the
            # deployment; a new workload of the same name takes it over.
            workload.deployment.servers.remove(workload.server)


def _may_have_autoscaler(workload: ServerWorkload) -> bool:
    """Whether an autoscaled workload's HPA may be on the cluster: not when its creation
    failed with nothing left there (nothing applied in force, its quota released)."""
    if not workload.autoscaled:
        return False
    placement = workload.placement
    holds = placement is not None and placement.state in Placement.HOLDING
    return bool(workload.applied_spec) or holds


def _version_ids(workload: ServerWorkload) -> set[int]:
    ids = {workload.version_id}
    if workload.previous_version_id:
        ids.add(workload.previous_version_id)
    if workload.placement is not None:
        ids.add(workload.placement.model_version_id)
    return ids


STEPS: dict[str, Callable[[ServerWorkload], None]] = {
    State.PENDING: _start,
    State.APPLYING: _apply,
    State.PROGRESSING: _watch,
    State.ROLLING_BACK: _roll_back,
    State.DELETING: _delete,
    State.READY: _observe,  # autoscaled ones only (see _claim)
}


def _retry(workload: ServerWorkload, exc: KubeError) -> None:
    """A transient failure: try again, backing off, until the change's deadline (a roll-back
    or a deletion keeps trying; a roll-back backs off to MAX_BACKOFF_S after
    MAX_ROLLBACK_ATTEMPTS, holding both versions' quota)."""
    attempts = workload.attempts + 1
    now = timezone.now()
    past_deadline = workload.deadline_at is not None and now >= workload.deadline_at
    changing = workload.state in (State.PENDING, State.APPLYING, State.PROGRESSING)
    if (changing and past_deadline) or (
        workload.state == State.ROLLING_BACK and attempts >= MAX_ROLLBACK_ATTEMPTS
    ):
        _give_up(workload, f"gave up after {attempts} attempts: {exc.message}")
        return
    delay = min(2**attempts, MAX_BACKOFF_S)
    _update(workload, attempts=attempts, error=exc.message,
            detail=f"{exc.message}; trying again in {delay} s",
            next_attempt_at=now + timedelta(seconds=delay))


def _refused_for(workload: ServerWorkload) -> float:
    """Seconds the API server has refused this workload's calls in a row (0: not now)."""
    since = workload.forbidden_since
    return (timezone.now() - since).total_seconds() if since else 0.0


def _may_be_passing(workload: ServerWorkload, exc: KubeError) -> bool:
    """Whether ``exc`` is a refusal (403) that may still be an API server starting up:
    :func:`_refused` tries it again."""
    return (exc.kind == "forbidden"
            and _refused_for(workload) < settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S)


def _refused(workload: ServerWorkload, exc: KubeError) -> None:
    """A 403. An API server that has just started answers 403 to every call for a moment
    (0.02-0.13 s, while its ``/readyz`` is not ready yet), with a Status no different from a
    real RBAC denial. So a refusal is said on the row, the workload stays where it is and the
    step is tried again, backing off; only once its calls have been refused for
    ``SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S`` in a row (a success in between starts over) is
    the refusal final (:func:`_give_up`)."""
    now = timezone.now()
    window = settings.SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S
    refused_s = _refused_for(workload)
    if not _may_be_passing(workload, exc):
        _give_up(workload, f"{exc.message} (refused for {refused_s:.0f} s in a row)"
                 if window else exc.message)
        return
    attempts = workload.attempts + 1
    delay = max(1, min(2**attempts, MAX_BACKOFF_S, math.ceil(window - refused_s)))
    _update(workload, attempts=attempts, error=exc.message,
            forbidden_since=workload.forbidden_since or now,
            detail=f"{exc.message}; an API server that has just started refuses everything "
                   f"for a moment: trying again in {delay} s (the refusal is final once it "
                   f"has lasted {window:g} s)",
            next_attempt_at=now + timedelta(seconds=delay))


def advance(workload_id: int) -> str | None:
    """Do at most one step of a workload; the state it left, or None when nothing was done.

    A transient API failure is retried (see :func:`_retry`), a refusal (403) too for a
    while (:func:`_refused`); a permanent one, or an unexpected error (a bug: it is logged
    with its traceback), ends the change as :func:`_give_up` says. A database error propagates: the lease runs out and the next
    tick repeats the step.
    """
    workload = _claim(workload_id)
    if workload is None:
        return None
    try:
        try:
            with _heartbeat(workload):
                STEPS[workload.state](workload)
        except (leases.LostLease, DatabaseError):
            raise
        except KubeError as exc:
            if exc.kind == "forbidden":
                _refused(workload, exc)
            elif exc.permanent:
                _give_up(workload, exc.message)
            else:
                _retry(workload, exc)
        except DomainError as exc:  # a version whose labels no longer make a spec
            _give_up(workload, exc.message)
        except Exception as exc:
            log.exception("workload %s: unexpected error in %s", workload_id, workload.state)
            _give_up(workload, f"Switchyard failed unexpectedly ({type(exc).__name__}: {exc})")
    except leases.LostLease:
        log.debug("workload %s: moved on elsewhere", workload_id)
        return None
    finally:
        leases.release(workload)
    return workload.state


def due_workloads() -> list[int]:
    """Workloads a tick should advance: in flight (or ready and autoscaled, to be read
    again), not leased, not waiting for their time."""
    now = timezone.now()
    return list(
        ServerWorkload.objects.filter(
            Q(state__in=ServerWorkload.IN_FLIGHT)
            | Q(state=State.READY, min_replicas__isnull=False, max_replicas__isnull=False)
        )
        .exclude(lease_expires_at__gt=now)
        .exclude(next_attempt_at__gt=now)
        .values_list("pk", flat=True)
    )


def run_to_end(workload_id: int, max_steps: int = 20) -> ServerWorkload:
    """Advance until the workload leaves the states in flight (scripts and tests)."""
    for _ in range(max_steps):
        workload = ServerWorkload.objects.get(pk=workload_id)
        if workload.state not in ServerWorkload.IN_FLIGHT:
            return workload
        if advance(workload_id) is None:
            time.sleep(0.2)
    return ServerWorkload.objects.get(pk=workload_id)
