"""The load reconciler: admit against quota, fetch from S3, place, load, and the way back.

``advance(load_id)`` is what Celery (beat every few seconds, and a task enqueued after each
step) calls. It claims the row with a short lease (``rollouts.leases``), does at most one step,
records what it did and returns. Every step is idempotent, so a step repeated after a lost
worker changes nothing twice. The rows it advances are written by ``rollouts.loads.requests``,
which it also asks, as the system, to unload the borrowers of a cohort's quota.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from console import logs
from console.exceptions import DomainError, QuotaExceeded
from fleet import audit
from fleet.adapters.base import READY, AdapterError, ServerRuntime
from fleet.inventory import health
from fleet.inventory.runtimes import artifact_store_for, runtime_for
from fleet.models import Cohort, InferenceServer, Placement
from fleet.quota import admission as quota
from rollouts import leases
from rollouts.loads import drain
from rollouts.loads.demand import config_of, demand_of, is_lora, served_config
from rollouts.loads.reloads import is_reload
from rollouts.loads.requests import record_event, unload_for
from rollouts.models import ModelLoad, ModelVersion

log = logging.getLogger(__name__)
State = ModelLoad.State

PROGRESS_EVERY_S = 0.5
#: Seconds between two admissions of a load waiting for quota its cohort gives back.
RECLAIM_RETRY_S = 2.0
#: Seconds between two looks at a drain in progress.
DRAIN_POLL_S = 0.25


def _due(load: ModelLoad, now: Any) -> bool:
    """In flight, and not backing off after a transient failure."""
    return load.state in ModelLoad.IN_FLIGHT and not (load.next_attempt_at and load.next_attempt_at > now)


def _claim(load_id: int) -> ModelLoad | None:
    return leases.claim(
        ModelLoad.objects.select_related("version__model", "server__cluster", "server__node",
                                         "deployment", "tenant"),
        load_id, lease_s=settings.SWITCHYARD_LOAD_LEASE_S, due=_due,
        on_take_over=lambda load, dead: record_event(load, f"took over from a worker whose lease ran out ({dead[:8]})"),
    )


def _update(load: ModelLoad, **fields: Any) -> None:
    """Write fields only while we still hold the lease."""
    leases.update(load, **fields)


def _move(load: ModelLoad, to: str, message: str, **fields: Any) -> None:
    now = timezone.now()
    with transaction.atomic():  # the state and its event, together
        _update(load, state=to, phase_started_at=now, attempts=0, next_attempt_at=None,
                said=message, **fields)
        record_event(load, message, to)


def _heartbeat(load: ModelLoad) -> contextlib.AbstractContextManager[None]:
    """Keep the lease short and alive while a step runs (:func:`leases.heartbeat`): renewed
    every third of ``SWITCHYARD_LOAD_LEASE_S``, for at most ``SWITCHYARD_LOAD_TIMEOUT_S``
    plus a lease (longer than any server call may take: the worker is stuck)."""
    lease_s = settings.SWITCHYARD_LOAD_LEASE_S
    return leases.heartbeat(load, lease_s=lease_s, max_s=settings.SWITCHYARD_LOAD_TIMEOUT_S + lease_s)


def _admit(load: ModelLoad) -> None:
    units, memory = demand_of(load.version, quota.device_class_of(load.server), config_of(load))
    try:
        placement = quota.admit(load.tenant, load.server, load.version_id, units, memory,
                                priority=load.deployment.priority)
    except QuotaExceeded as exc:
        if exc.reclaim_policy == Cohort.Reclaim.UNLOAD and exc.reclaimable:
            _reclaim(load, exc)
            return
        raise
    _move(load, State.ADMITTED,
          f"admitted: holds {placement.units} {'model instance' if placement.device_class == 'cpu' else 'GPU'}"
          f"{'s' if placement.units != 1 else ''} and {placement.memory_mib} MiB on {placement.device_class}",
          placement=placement)


def _reclaim(load: ModelLoad, refused: QuotaExceeded) -> None:
    """The tenant's own quota is lent to others in its cohort, whose policy is to unload
    borrowers: ask for the listed borrowers' versions to be unloaded, and wait (the load
    stays pending and is admitted again in a moment), at most SWITCHYARD_RECLAIM_WAIT_S;
    then it fails with the refusal. A borrower whose version still takes route traffic is
    kept, and said so."""
    waited = (timezone.now() - load.created_at).total_seconds()
    if waited > settings.SWITCHYARD_RECLAIM_WAIT_S:
        _fail(load, f"{refused.message}; the borrowed quota was not given back within "
                    f"{settings.SWITCHYARD_RECLAIM_WAIT_S:.0f} s")
        return
    asked, kept = [], []
    # Neither side learns the other's name: the borrower reads that a lender of its cohort
    # took its quota back, the lender what of other tenants' placements goes or stays.
    label = f"reclaimed for a lender of cohort {load.tenant.cohort}"
    for item in refused.reclaimable:
        held = (ModelLoad.objects.filter(placement_id=item.placement_id)
                .select_related("deployment", "version", "server").order_by("-pk").first())
        if held is None or held.state != State.READY:
            continue  # already on its way out
        try:
            unload_for(None, held.deployment, held.version, server_names=[held.server.name],
                       label=label)
            asked.append(str(item))
        except DomainError:  # its message names the borrower's deployment
            kept.append(f"{item} (kept for now: it cannot be unloaded yet, as while it serves route traffic)")
    note = "; ".join([*(f"unloading {a}" for a in asked), *kept]) or "unloads under way"
    _update(load, error=refused.message,
            next_attempt_at=timezone.now() + timedelta(seconds=RECLAIM_RETRY_S))
    record_event(load, f"waiting for quota lent to the cohort to come back: {note}")


def _fetch(load: ModelLoad, *, move: bool = True) -> Any:
    version = load.version
    if move and load.state != State.FETCHING:
        _move(load, State.FETCHING, f"fetching {version.artifact_uri}", bytes_total=version.size_bytes, bytes_done=0)
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S or done >= total:
            last[0] = now
            # Progress is proof of life: it renews the lease even past the heartbeat's limit.
            _update(load, bytes_done=done, bytes_total=total,
                    lease_expires_at=leases.until(settings.SWITCHYARD_LOAD_LEASE_S))

    store = artifact_store_for(load.server.cluster)
    return store.fetch(version.artifact_uri, sha256=version.sha256, size=version.size_bytes, progress=progress)


def _fetch_step(load: ModelLoad) -> None:
    _fetch(load)
    _move(load, State.PLACING,
          f"fetched and verified {load.version.size_bytes} bytes (sha256 {load.version.sha256[:12]}…)",
          bytes_done=load.version.size_bytes)


def _place(load: ModelLoad) -> None:
    path = _fetch(load, move=False)  # from the cache: the digest was verified by the fetch step
    version = load.version
    runtime_for(load.server, lora=is_lora(version)).place(
        version.name_on(load.server), version.version, path, folder=version.model.name
    )
    _move(load, State.LOADING, f"placed into {load.server.name}'s model repository")


def _load(load: ModelLoad) -> None:
    version = load.version
    runtime = runtime_for(load.server, lora=is_lora(version))
    if getattr(load, "taken_over", False):
        # The worker that died may have got the version loaded: ask the server first. The
        # load below then sends nothing when it runs as asked (and waits for a load the dead
        # worker sent that is still going on), so only the config is read back.
        state = runtime.status(version.name_on(load.server), version.version, settings.SWITCHYARD_PROBE_TIMEOUT_S)
        record_event(load, f"{load.server.name} reports v{version.version} {state or 'not loaded'}"
               + (": checking its config" if state == READY else ": loading it"))
    loaded = runtime.load(
        version.name_on(load.server), version.version, served_config(load),
        settings.SWITCHYARD_LOAD_TIMEOUT_S,
    )
    if load.placement is not None:
        quota.activate(load.placement, loaded.config_hash)
        if is_reload(load):
            _hold_as_served(load, loaded.config)
    if version.runtime == ModelVersion.Runtime.VLLM and not is_lora(version):
        # A new server process replaced the old one: nothing the old one served is loaded.
        for other in ModelLoad.objects.filter(server=load.server, state=State.READY).exclude(pk=load.pk):
            ModelLoad.objects.filter(pk=other.pk, state=State.READY).update(
                state=State.UNLOADED, finished_at=timezone.now(), updated_at=timezone.now(),
                unload_requested_by_label="system",
            )
            quota.release(other.placement)
            record_event(other, f"replaced: v{version.version} now runs in a new server process",
                   State.UNLOADED)
    else:
        _refresh_kept(load, runtime)
    _report_served(load)
    _move(load, State.READY, f"ready on {load.server.name} (config {loaded.config_hash[:12]})",
          config_hash=loaded.config_hash, ready_at=timezone.now())


def _hold_as_served(load: ModelLoad, config: dict[str, Any]) -> None:
    """A reloaded version's placement holds what it runs with now (its instance count may
    have changed with the config)."""
    placement = load.placement
    units, memory = demand_of(load.version, placement.device_class, config)
    if (units, memory) != (placement.units, placement.memory_mib):
        Placement.objects.filter(pk=placement.pk, state__in=Placement.HOLDING).update(
            units=units, memory_mib=memory)
        record_event(load, f"holds {units} {'model instance' if placement.device_class == 'cpu' else 'GPU'}"
                           f"{'s' if units != 1 else ''} and {memory} MiB now (was "
                           f"{placement.units} and {placement.memory_mib} MiB)")


def _refresh_kept(load: ModelLoad, runtime: ServerRuntime) -> None:
    """Re-read what the model's other ready versions on the server run with now.

    Triton keeps one config per model: loading a version with another config scales or
    reloads the versions kept beside it with that config. Their recorded hash, and the quota
    they hold when their instance count changed, follow what the server runs.
    """
    version = load.version
    kept = ModelLoad.objects.filter(
        server=load.server, version__model=version.model, state=State.READY
    ).exclude(pk=load.pk).select_related("version__model", "placement", "tenant", "server")
    for other in kept:
        try:
            served = runtime.served(version.name_on(load.server), other.version.version,
                                    settings.SWITCHYARD_PROBE_TIMEOUT_S)
        except AdapterError as exc:  # the drift reconciler looks at it with the next probe
            log.warning("load %s: cannot read the config of v%s: %s", load.pk, other.version.version, exc)
            continue
        refresh_served_config(
            other, served.config_hash, served.config,
            f"v{version.version} was loaded beside it (the server keeps one config per model)",
        )


def refresh_served_config(
    load: ModelLoad, config_hash: str, config: dict[str, Any], why: str, *, verb: str = "config_changed"
) -> bool:
    """Record that a ready load runs with another config now: its hash and, when the instance
    count changed with it, the quota its placement holds; an event and an audit entry say
    why. Returns False when the hash is the one recorded (or the load is no longer ready)."""
    if config_hash == load.config_hash:
        return False
    placement = load.placement
    before = {"config_hash": load.config_hash}
    after = {"config_hash": config_hash}
    holds: dict[str, int] = {}
    if placement is not None and placement.state in Placement.HOLDING:
        units, memory = demand_of(load.version, placement.device_class, config)
        if (units, memory) != (placement.units, placement.memory_mib):
            before.update(units=placement.units, memory_mib=placement.memory_mib)
            holds = {"units": units, "memory_mib": memory}
            after.update(holds)
    with transaction.atomic():
        if not ModelLoad.objects.filter(pk=load.pk, state=State.READY).update(
            config_hash=config_hash, updated_at=timezone.now()
        ):
            return False
        if placement is not None:
            Placement.objects.filter(pk=placement.pk, state__in=Placement.HOLDING).update(
                config_hash=config_hash, **holds
            )
        text = f"config now {config_hash[:12]} (was {(load.config_hash or 'none')[:12]}): {why}"
        if holds:
            unit = "model instance" if placement.device_class == "cpu" else "GPU"
            text += (f"; holds {holds['units']} {unit}{'s' if holds['units'] != 1 else ''} and "
                     f"{holds['memory_mib']} MiB (was {placement.units} and {placement.memory_mib} MiB)")
        record_event(load, text, State.READY)
        audit.record(None, verb, load, tenant=load.tenant, before=before, after=after, reason=why)
    load.config_hash = config_hash
    return True


def mark_lost(load: ModelLoad, why: str) -> bool:
    """A ready load whose version the server no longer serves: ``lost``, its quota released,
    an event and an audit entry (by the system) saying why. False when it was not ready."""
    now = timezone.now()
    with transaction.atomic():
        if not ModelLoad.objects.filter(pk=load.pk, state=State.READY).update(
            state=State.LOST, finished_at=now, updated_at=now, unload_requested_by_label="system",
            error=f"gone from the server: {why}",
        ):
            return False
        quota.release(load.placement)
        record_event(load, f"gone from the server: {why}; quota released", State.LOST)
        audit.record(None, "lost", load, tenant=load.tenant,
                     before={"state": State.READY}, after={"state": State.LOST}, reason=why)
    load.state = State.LOST
    return True


def _report_served(load: ModelLoad) -> None:
    """Ask the server what it serves now and record it, before the load's final state is
    written: a page that sees the load done then sees the server's own report agree, not the
    report of the last health check (up to an interval old)."""
    health.check_server(load.server_id)


def _unload(load: ModelLoad) -> None:
    if load.drained_at is None and not _drained(load):
        return
    version = load.version
    runtime = runtime_for(load.server, lora=is_lora(version))
    runtime.unload(version.name_on(load.server), version.version, settings.SWITCHYARD_LOAD_TIMEOUT_S)
    runtime.remove(version.name_on(load.server), version.version)
    quota.release(load.placement)
    _report_served(load)
    _move(load, State.UNLOADED, f"unloaded from {load.server.name}; quota released",
          finished_at=timezone.now())


def _drained(load: ModelLoad) -> bool:
    """Drain before unload (:mod:`rollouts.loads.drain`): False, to be asked again shortly,
    while the router still has requests in flight to the version; its progress is recorded
    once per change of what it says."""
    state = drain.drain(load)
    last = load.events.order_by("-pk").values_list("message", flat=True).first()
    if state.message and state.message != last:
        record_event(load, state.message)
    if not state.done:
        _update(load, next_attempt_at=timezone.now() + timedelta(seconds=DRAIN_POLL_S))
        return False
    _update(load, drained_at=timezone.now(), next_attempt_at=None)
    return True


STEPS: dict[str, Callable[[ModelLoad], None]] = {
    State.PENDING: _admit,
    State.ADMITTED: _fetch_step,
    State.FETCHING: _fetch_step,
    State.PLACING: _place,
    State.LOADING: _load,
    State.UNLOADING: _unload,
}


def _cleanup(load: ModelLoad) -> str:
    """Undo whatever a failed load did on the server; return what could not be undone."""
    if load.state not in (State.PLACING, State.LOADING):
        return ""
    version = load.version
    problems = []
    try:
        runtime = runtime_for(load.server, lora=is_lora(version))
        if load.state == State.LOADING:
            runtime.unload(version.name_on(load.server), version.version, settings.SWITCHYARD_LOAD_TIMEOUT_S)
        runtime.remove(version.name_on(load.server), version.version)
    except AdapterError as exc:
        problems.append(f"cleanup on {load.server.name} failed: {exc.message}")
    except Exception as exc:  # the quota is released all the same
        log.exception("load %s: cleanup failed", load.pk)
        problems.append(f"cleanup on {load.server.name} failed: {type(exc).__name__}: {exc}")
    return "; ".join(problems)


def _fail(load: ModelLoad, message: str, server_log: str = "", error_trace: str = "") -> None:
    if load.state == State.UNLOADING:
        _move(load, State.FAILED,
              f"unload failed: {message}. The version may still be loaded; its quota stays held",
              error=message, server_log=server_log, error_trace=error_trace,
              finished_at=timezone.now())
        return
    if is_reload(load) and _still_serving(load):
        # A reload that failed leaves the version as it ran: ready, with its config and quota.
        _move(load, State.READY, f"reload failed: {message}; v{load.version.version} still runs "
                                 f"on {load.server.name} with its previous config",
              error=message, server_log=server_log, error_trace=error_trace)
        return
    leftover = _cleanup(load)
    quota.release(load.placement)
    if load.state == State.LOADING:
        _report_served(load)
    text = message + (f" ({leftover})" if leftover else "")
    _move(load, State.FAILED, f"failed while {load.get_state_display().lower()}: {text}; quota released",
          error=text, server_log=server_log, error_trace=error_trace, finished_at=timezone.now())


def _still_serving(load: ModelLoad) -> bool:
    """Whether the server says the version is ready (False when it cannot say)."""
    version = load.version
    try:
        runtime = runtime_for(load.server, lora=is_lora(version))
        state = runtime.status(version.name_on(load.server), version.version,
                               settings.SWITCHYARD_PROBE_TIMEOUT_S)
    except AdapterError:
        return False
    return state == READY


def _retry_or_fail(load: ModelLoad, exc: AdapterError) -> None:
    """A server's answer: retry a transient one (backing off), fail on a permanent one or
    when the retries are spent."""
    attempts = load.attempts + 1
    if exc.permanent or attempts >= settings.SWITCHYARD_LOAD_MAX_ATTEMPTS:
        message, _, server_log = exc.message.partition("\nserver log")
        _fail(load, message, f"server log{server_log}" if server_log else "")
        return
    delay = min(2**attempts, 30)
    _update(load, attempts=attempts, error=exc.message,
            next_attempt_at=timezone.now() + timedelta(seconds=delay))
    record_event(load, f"{exc.message}; retry {attempts}/{settings.SWITCHYARD_LOAD_MAX_ATTEMPTS - 1} in {delay} s")


def advance(load_id: int) -> str | None:
    """Do at most one step of a load. Returns the state it left, or None if nothing was done.

    What a server answered (an AdapterError) is retried or fails the load as it says. An
    unexpected exception is a bug, not the server being busy: the load fails at once, with
    a readable error and the traceback kept for operators. A database error is left to
    propagate: the lease runs out and the next tick repeats the step.
    """
    load = _claim(load_id)
    if load is None:
        return None
    with logs.acting_for(load.request_id, load=load.pk, server=load.server.name):
        return _advance(load)


def _advance(load: ModelLoad) -> str | None:
    load_id = load.pk
    try:
        try:
            with _heartbeat(load):
                STEPS[load.state](load)
        except (leases.LostLease, DatabaseError):
            raise
        except QuotaExceeded as exc:
            _fail(load, exc.message)
        except AdapterError as exc:
            _retry_or_fail(load, exc)
        except Exception as exc:
            log.exception("load %s: unexpected error in %s", load_id, load.state)
            _fail(
                load,
                f"Switchyard failed unexpectedly while {load.get_state_display().lower()} "
                f"({type(exc).__name__}: {exc}); this is not the server's answer and retrying "
                "cannot help. Platform admins find the details on this load's page",
                error_trace=traceback.format_exc(),
            )
    except leases.LostLease:
        log.debug("load %s: another worker took over", load_id)
        return None
    finally:
        leases.release(load)
    return load.state


def due_loads() -> list[int]:
    """Loads a tick should advance: in flight, not leased, not backing off."""
    now = timezone.now()
    return list(
        ModelLoad.objects.filter(state__in=ModelLoad.IN_FLIGHT)
        .exclude(lease_expires_at__gt=now)
        .exclude(next_attempt_at__gt=now)
        .values_list("pk", flat=True)
    )


def forget_server_state(server: InferenceServer, why: str) -> int:
    """A server known to have come back empty (the demo restarts its local servers): its
    ready loads are lost, an unload in flight is done, other loads in flight failed; every
    placement is released. Returns how many loads changed."""
    count = 0
    now = timezone.now()
    for load in ModelLoad.objects.filter(server=server, state__in=[State.READY, *ModelLoad.IN_FLIGHT]).select_related(
        "tenant", "placement"
    ):
        if load.state == State.READY:
            count += mark_lost(load, why)
            continue
        settled = State.UNLOADED if load.state == State.UNLOADING else State.FAILED
        fields = {"state": settled, "finished_at": now, "updated_at": now, "lease_owner": ""}
        if settled == State.FAILED:
            fields["error"] = f"interrupted: {why}"
        if ModelLoad.objects.filter(pk=load.pk, state=load.state).update(**fields):
            quota.release(load.placement)
            record_event(load, f"no longer loaded: {why}; quota released", settled)
            count += 1
    return count


def run_to_end(load_id: int, max_steps: int = 20) -> ModelLoad:
    """Advance until the load settles (for scripts, the bench and tests)."""
    for _ in range(max_steps):
        load = ModelLoad.objects.get(pk=load_id)
        if load.state not in ModelLoad.IN_FLIGHT:
            return load
        if advance(load_id) is None:
            time.sleep(0.2)
    return ModelLoad.objects.get(pk=load_id)
