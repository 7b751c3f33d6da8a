"""Model loads: admit against quota, fetch from S3, place, load, and the way back.

``request_load`` / ``request_unload`` write rows; ``advance(load_id)`` is the reconciler
that Celery (beat every few seconds, and a task enqueued after each step) calls. It claims
the row with a short lease, does at most one step, records what it did and returns. Every
step is idempotent, so a step repeated after a lost worker changes nothing twice.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet import audit, quota
from fleet.adapters.base import AdapterError
from fleet.audit import actor_label
from fleet.errors import Conflict, DomainError, QuotaExceeded
from fleet.models import InferenceServer, Membership
from fleet.runtimes import artifact_store_for, runtime_for
from fleet.tenancy import require_role, token_of
from rollouts.models import Deployment, ModelLoad, ModelLoadEvent, ModelVersion

log = logging.getLogger(__name__)
State = ModelLoad.State
Status = ModelVersion.Status
PROGRESS_EVERY_S = 0.5


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


def _servers(deployment: Deployment, names: list[str] | None) -> list[InferenceServer]:
    servers = list(deployment.servers.order_by("name"))
    if names:
        known = {s.name: s for s in servers}
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise DomainError(
                f"deployment {deployment.name} has no server named {', '.join(unknown)}",
                field="servers",
            )
        servers = [known[n] for n in sorted(set(names))]
    if not servers:
        raise DomainError(f"deployment {deployment.name} has no servers to load onto", field="servers")
    return servers


def check_runtime(version: ModelVersion, servers: list[InferenceServer]) -> None:
    wrong = [s.name for s in servers if s.runtime != version.runtime]
    if wrong:
        raise DomainError(
            f"v{version.version} is a {version.get_runtime_display()} version; "
            f"{', '.join(wrong)} run{'s' if len(wrong) == 1 else ''} another runtime",
            field="version",
        )


def check_loadable(deployment: Deployment, version: ModelVersion) -> None:
    if version.model_id != deployment.model_id:
        raise DomainError(
            f"version belongs to {version.model.name}, the deployment serves {deployment.model.name}",
            field="version",
        )
    if version.status in (Status.REJECTED, Status.ARCHIVED):
        raise DomainError(f"version {version.version} is {version.status}", field="version")
    if deployment.production and version.status != Status.APPROVED:
        raise DomainError(
            f"production deployments load approved versions only; version {version.version} "
            f"is {version.status}",
            field="version",
        )


def _event(load: ModelLoad, message: str, state: str | None = None) -> None:
    ModelLoadEvent.objects.create(load=load, state=state or load.state, message=message)


def _lock_and_find_busy(server: InferenceServer, version: ModelVersion) -> ModelLoad | None:
    """Lock the server row (requests per server go one at a time: the check and the write
    belong together) and return a load or unload of the same model in flight on it."""
    InferenceServer.objects.select_for_update().filter(pk=server.pk).first()
    return (
        ModelLoad.objects.filter(
            server=server, version__model=version.model, state__in=ModelLoad.IN_FLIGHT
        )
        .select_related("version")
        .first()
    )


def request_load(
    actor: Any,
    deployment: Deployment,
    version: ModelVersion,
    *,
    server_names: list[str] | None = None,
    idempotency_key: str = "",
) -> tuple[list[ModelLoad], bool]:
    """Ask for ``version`` on the deployment's servers; returns (loads, anything new).

    A version already ready on a server is not loaded again. Another load of the same model
    in flight on a server is a Conflict. The same idempotency key with the same request
    returns the loads it created the first time; with another request it is a Conflict.
    """
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    check_loadable(deployment, version)
    servers = _servers(deployment, server_names)
    check_runtime(version, servers)
    fingerprint = hashlib.sha256(
        f"load:{deployment.pk}:{version.pk}:{[s.pk for s in servers]}".encode()
    ).hexdigest()
    if idempotency_key:
        earlier = list(
            ModelLoad.objects.filter(tenant=deployment.tenant, idempotency_key=idempotency_key)
        )
        if earlier:
            if earlier[0].request_fingerprint != fingerprint:
                raise Conflict(
                    "this Idempotency-Key was used for a different request", field="idempotency_key"
                )
            return earlier, False
    token = token_of(actor)
    loads: list[ModelLoad] = []
    created: list[ModelLoad] = []
    with transaction.atomic():
        for server in servers:
            busy = _lock_and_find_busy(server, version)
            if busy is not None:
                raise Conflict(
                    f"{busy.get_state_display().lower()} of {version.model.name} "
                    f"v{busy.version.version} is in flight on {server.name} (load {busy.pk}): "
                    "wait for it to finish",
                    field="version",
                )
            ready = ModelLoad.objects.filter(server=server, version=version, state=State.READY).first()
            if ready is not None:
                loads.append(ready)
                continue
            load = ModelLoad.objects.create(
                tenant=deployment.tenant,
                deployment=deployment,
                server=server,
                version=version,
                idempotency_key=idempotency_key,
                request_fingerprint=fingerprint,
                requested_by=None if token else actor,
                requested_by_token=token,
                requested_by_label=actor_label(actor),
            )
            _event(load, f"load of v{version.version} onto {server.name} requested by {load.requested_by_label}")
            audit.record(actor, "requested_load", load, tenant=deployment.tenant,
                         after={"version": version.version, "server": server.name})
            loads.append(load)
            created.append(load)
        for load in created:
            _enqueue_on_commit(load.pk)
    return loads, bool(created)


def request_unload(
    actor: Any, deployment: Deployment, version: ModelVersion, *, server_names: list[str] | None = None
) -> list[ModelLoad]:
    """Take ``version`` off the deployment's servers (those where it is ready)."""
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    if version.model_id != deployment.model_id:
        raise DomainError("version belongs to another model", field="version")
    servers = _servers(deployment, server_names)
    label = actor_label(actor)
    moved: list[ModelLoad] = []
    with transaction.atomic():
        for server in servers:
            busy = _lock_and_find_busy(server, version)
            if busy is not None and not (busy.version_id == version.pk and busy.state == State.UNLOADING):
                raise Conflict(
                    f"v{busy.version.version} is {busy.state} on {server.name}: wait for it to finish",
                    field="version",
                )
            load = busy or ModelLoad.objects.filter(server=server, version=version, state=State.READY).first()
            if load is None:
                continue
            if load.state == State.READY:
                ModelLoad.objects.filter(pk=load.pk, state=State.READY).update(
                    state=State.UNLOADING, unload_requested_by_label=label,
                    phase_started_at=timezone.now(), attempts=0, error="",
                )
                load.refresh_from_db()
                _event(load, f"unload from {server.name} requested by {label}")
                audit.record(actor, "requested_unload", load, tenant=deployment.tenant,
                             after={"version": version.version, "server": server.name})
                _enqueue_on_commit(load.pk)
            moved.append(load)
    return moved


def _enqueue_on_commit(load_id: int) -> None:
    from rollouts.tasks import advance_load

    transaction.on_commit(lambda: advance_load.delay(load_id))


# --------------------------------------------------------------------------------------------
# The reconciler
# --------------------------------------------------------------------------------------------


class LostLease(Exception):
    """Another worker took the load over (our lease ran out): stop quietly."""


def _claim(load_id: int) -> ModelLoad | None:
    now = timezone.now()
    with transaction.atomic():
        load = (
            ModelLoad.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("version__model", "server__cluster", "server__node", "deployment", "tenant")
            .filter(pk=load_id)
            .first()
        )
        if load is None or load.state not in ModelLoad.IN_FLIGHT:
            return None
        if load.lease_owner and load.lease_expires_at and load.lease_expires_at > now:
            return None  # another worker holds it
        if load.next_attempt_at and load.next_attempt_at > now:
            return None  # backing off after a transient failure
        if load.lease_owner:
            _event(load, f"took over from a worker whose lease ran out ({load.lease_owner[:8]})")
        load.lease_owner = uuid.uuid4().hex
        load.lease_expires_at = now + timedelta(seconds=settings.SWITCHYARD_LOAD_LEASE_S)
        load.save(update_fields=["lease_owner", "lease_expires_at"])
    return load


def _update(load: ModelLoad, **fields: Any) -> None:
    """Write fields only while we still hold the lease."""
    fields.setdefault("updated_at", timezone.now())
    if not ModelLoad.objects.filter(pk=load.pk, lease_owner=load.lease_owner).update(**fields):
        raise LostLease
    for key, value in fields.items():
        setattr(load, key, value)


def _move(load: ModelLoad, to: str, message: str, **fields: Any) -> None:
    now = timezone.now()
    with transaction.atomic():  # the state and its event, together
        _update(load, state=to, phase_started_at=now, attempts=0, next_attempt_at=None, **fields)
        _event(load, message, to)


def _renew(load: ModelLoad, *, blocking_call: bool = False) -> None:
    """Extend the lease; before a blocking server call, by that call's whole timeout too."""
    seconds = settings.SWITCHYARD_LOAD_LEASE_S
    if blocking_call:
        seconds += settings.SWITCHYARD_LOAD_TIMEOUT_S
    _update(load, lease_expires_at=timezone.now() + timedelta(seconds=seconds))


def demand(version: ModelVersion, device_class: str) -> tuple[int, int]:
    """(units, memory MiB) a version asks for: GPUs, or model instances on CPU nodes."""
    if device_class == "cpu":
        groups = (version.triton_config or {}).get("instance_group") or [{}]
        instances = sum(int(g.get("count", 1)) for g in groups if isinstance(g, dict)) or 1
        return instances, version.estimated_gpu_memory_mib * instances
    return version.gpus, version.estimated_gpu_memory_mib


def _is_lora(version: ModelVersion) -> bool:
    return version.runtime == ModelVersion.Runtime.VLLM and bool(version.adapter_of)


def _admit(load: ModelLoad) -> None:
    units, memory = demand(load.version, quota.device_class_of(load.server))
    placement = quota.admit(load.tenant, load.server, load.version_id, units, memory)
    _move(load, State.ADMITTED,
          f"admitted: holds {placement.units} {'model instance' if placement.device_class == 'cpu' else 'GPU'}"
          f"{'s' if placement.units != 1 else ''} and {placement.memory_mib} MiB on {placement.device_class}",
          placement=placement)


def _fetch(load: ModelLoad, *, move: bool = True) -> Any:
    version = load.version
    if move and load.state != State.FETCHING:
        _move(load, State.FETCHING, f"fetching {version.artifact_uri}", bytes_total=version.size_bytes, bytes_done=0)
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S or done >= total:
            last[0] = now
            _update(load, bytes_done=done, bytes_total=total,
                    lease_expires_at=timezone.now() + timedelta(seconds=settings.SWITCHYARD_LOAD_LEASE_S))

    store = artifact_store_for(load.server.cluster)
    return store.fetch(version.artifact_uri, sha256=version.sha256, size=version.size_bytes, progress=progress)


def _fetch_step(load: ModelLoad) -> None:
    _fetch(load)
    _move(load, State.PLACING,
          f"fetched and verified {load.version.size_bytes} bytes (sha256 {load.version.sha256[:12]}…)",
          bytes_done=load.version.size_bytes)


def _place(load: ModelLoad) -> None:
    _renew(load)
    path = _fetch(load, move=False)  # from the cache: the digest was verified by the fetch step
    version = load.version
    runtime_for(load.server, lora=_is_lora(version)).place(version.model.name, version.version, path)
    _move(load, State.LOADING, f"placed into {load.server.model_repository or load.server.name}")


def _load(load: ModelLoad) -> None:
    version = load.version
    _renew(load, blocking_call=True)
    loaded = runtime_for(load.server, lora=_is_lora(version)).load(
        version.model.name, version.version, dict(version.triton_config or {}),
        settings.SWITCHYARD_LOAD_TIMEOUT_S,
    )
    if load.placement is not None:
        quota.activate(load.placement, loaded.config_hash)
    if version.runtime == ModelVersion.Runtime.VLLM and not _is_lora(version):
        # A new server process replaced the old one: nothing the old one served is loaded.
        for other in ModelLoad.objects.filter(server=load.server, state=State.READY).exclude(pk=load.pk):
            ModelLoad.objects.filter(pk=other.pk, state=State.READY).update(
                state=State.UNLOADED, finished_at=timezone.now(), updated_at=timezone.now(),
                unload_requested_by_label="system",
            )
            quota.release(other.placement)
            _event(other, f"replaced: v{version.version} now runs in a new server process",
                   State.UNLOADED)
    _move(load, State.READY, f"ready on {load.server.name} (config {loaded.config_hash[:12]})",
          config_hash=loaded.config_hash, ready_at=timezone.now())


def _unload(load: ModelLoad) -> None:
    version = load.version
    runtime = runtime_for(load.server, lora=_is_lora(version))
    _renew(load, blocking_call=True)
    runtime.unload(version.model.name, version.version, settings.SWITCHYARD_LOAD_TIMEOUT_S)
    runtime.remove(version.model.name, version.version)
    quota.release(load.placement)
    _move(load, State.UNLOADED, f"unloaded from {load.server.name}; quota released",
          finished_at=timezone.now())


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
        runtime = runtime_for(load.server, lora=_is_lora(version))
        if load.state == State.LOADING:
            runtime.unload(version.model.name, version.version, settings.SWITCHYARD_LOAD_TIMEOUT_S)
        runtime.remove(version.model.name, version.version)
    except AdapterError as exc:
        problems.append(f"cleanup on {load.server.name} failed: {exc.message}")
    return "; ".join(problems)


def _fail(load: ModelLoad, message: str, server_log: str = "") -> None:
    if load.state == State.UNLOADING:
        _move(load, State.FAILED,
              f"unload failed: {message}. The version may still be loaded; its quota stays held",
              error=message, server_log=server_log, finished_at=timezone.now())
        return
    leftover = _cleanup(load)
    quota.release(load.placement)
    text = message + (f" ({leftover})" if leftover else "")
    _move(load, State.FAILED, f"failed while {load.get_state_display().lower()}: {text}; quota released",
          error=text, server_log=server_log, finished_at=timezone.now())


def advance(load_id: int) -> str | None:
    """Do at most one step of a load. Returns the state it left, or None if nothing was done."""
    load = _claim(load_id)
    if load is None:
        return None
    try:
        STEPS[load.state](load)
    except LostLease:
        log.info("load %s: another worker took over", load_id)
        return None
    except QuotaExceeded as exc:
        _fail(load, exc.message)
    except Exception as exc:
        if not isinstance(exc, AdapterError):
            log.exception("load %s: unexpected error in %s", load_id, load.state)
            exc = AdapterError(f"{type(exc).__name__}: {exc}", permanent=False)
        attempts = load.attempts + 1
        if exc.permanent or attempts >= settings.SWITCHYARD_LOAD_MAX_ATTEMPTS:
            message, _, server_log = exc.message.partition("\nserver log")
            _fail(load, message, f"server log{server_log}" if server_log else "")
        else:
            delay = min(2**attempts, 30)
            _update(load, attempts=attempts, error=exc.message,
                    next_attempt_at=timezone.now() + timedelta(seconds=delay))
            _event(load, f"{exc.message}; retry {attempts}/{settings.SWITCHYARD_LOAD_MAX_ATTEMPTS - 1} in {delay} s")
    finally:
        ModelLoad.objects.filter(pk=load.pk, lease_owner=load.lease_owner).update(
            lease_owner="", lease_expires_at=None
        )
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
    """A server came back empty (restarted): its ready loads no longer hold; release them."""
    count = 0
    now = timezone.now()
    for load in ModelLoad.objects.filter(server=server, state__in=[State.READY, *ModelLoad.IN_FLIGHT]):
        settled = State.UNLOADED if load.state in (State.READY, State.UNLOADING) else State.FAILED
        fields = {"state": settled, "finished_at": now, "updated_at": now, "lease_owner": ""}
        if settled == State.FAILED:
            fields["error"] = f"interrupted: {why}"
        ModelLoad.objects.filter(pk=load.pk, state=load.state).update(**fields)
        quota.release(load.placement)
        _event(load, f"no longer loaded: {why}; quota released", settled)
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
