"""Benchmark jobs: ask for one, and the reconciler that carries it out.

A job measures one version on one fleet server of a deployment (never an arbitrary URL):
for each config it compares (the version's own when ``configs`` is empty) it gets the
version ready there through the load path (admitted against the tenant's quota), starts a
runner process (:mod:`.runner`) that sweeps the levels, follows it through Redis, records
what it measured, and unloads what the job loaded. The best config is the one with the most
load within the SLO.

:func:`advance` does at most one step under a lease, like loads and rollouts, and never
waits for the load generator: a worker stays free while a sweep runs. One job per server at
a time (a partial unique constraint). Cancelling sets the runner's stop flag in Redis at once
(the load stops within a second) and the next tick unloads and ends the job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import traceback
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis
from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from console.celery import send_now
from console.exceptions import Conflict, DomainError, QuotaExceeded
from fleet import audit
from fleet.audit import actor_label
from fleet.models import InferenceServer, Membership
from fleet.quota import admission as quota
from fleet.tenancy.scoping import require_role, token_of
from rollouts import leases
from rollouts.benchmarks import sweep
from rollouts.benchmarks.results import summarize_job
from rollouts.benchmarks.specs import (
    LIMITS,
    at_least_zero,
    config_label,
    full_config,
    key_prefix,
    parse_configs,
    parse_levels,
    parse_request,
    positive_number,
    protocol_for,
    slo_for,
    spec_for,
)
from rollouts.loads import demand
from rollouts.loads import reconciler as load_reconciler
from rollouts.loads import requests as loads
from rollouts.models import BenchmarkJob, Deployment, ModelLoad, ModelVersion

log = logging.getLogger(__name__)

State = BenchmarkJob.State
Protocol = BenchmarkJob.Protocol

RUNNER_FILES_KEPT_S = 7 * 24 * 3600  # runner logs are kept a week
RUNNER_GRACE_S = 15.0  # a runner not heard from this long after its start has died
TICK_S = 1.0


def _server(deployment: Deployment, name: object) -> InferenceServer:
    servers = list(deployment.servers.all())
    if name in (None, ""):
        if len(servers) == 1:
            return servers[0]
        raise DomainError("name the server to benchmark on (the deployment has "
                          f"{len(servers)})", field="server")
    found = next((s for s in servers if s.name == name), None)
    if found is None:
        raise DomainError(f"deployment {deployment.name} has no server named {name!r}"[:200],
                          field="server")
    return found


def _check_quota(deployment: Deployment, version: ModelVersion, server: InferenceServer,
                 configs: list[dict[str, Any]]) -> None:
    """Refuse up front what the loads would be refused: the largest config must fit."""
    if ModelLoad.objects.filter(server=server, version=version, state=ModelLoad.State.READY).exists() \
            and not configs:
        return
    device_class = quota.device_class_of(server)
    for override in configs or [None]:
        units, memory = demand.demand_of(version, device_class, full_config(version, override))
        decision = quota.assess(deployment.tenant, device_class, units, memory)
        if not decision.admitted:
            raise QuotaExceeded(f"config {config_label(override)} of v{version.version}: "
                                f"{decision.refusal()}", field="quota")


def _shares_production(server: InferenceServer) -> bool:
    return ModelLoad.objects.filter(
        server=server, state=ModelLoad.State.READY, deployment__production=True
    ).exists()


def create_job(
    actor: Any,
    deployment: Deployment,
    *,
    version: object,
    server: object = None,
    protocol: object = None,
    mode: object = BenchmarkJob.Mode.CONCURRENCY,
    levels: object = None,
    duration_s: object = 10,
    warmup_s: object = 2,
    max_requests: object = 0,
    refine_steps: object = sweep.DEFAULT_REFINE_STEPS,
    error_limit: object = sweep.DEFAULT_ERROR_LIMIT,
    slo: object = None,
    request: object = None,
    configs: object = None,
    idempotency_key: str = "",
) -> tuple[BenchmarkJob, bool]:
    """Ask for a benchmark (deployer role); returns (job, made now). A job already running
    on the server is a Conflict; the same ``idempotency_key`` replays the first request."""
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    if deployment.archived_at is not None:
        raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
    number = version
    if isinstance(number, bool) or not isinstance(number, int):
        raise DomainError("a version number", field="version")
    found = deployment.model.versions.filter(version=number).first()
    if found is None:
        raise DomainError(f"{deployment.model.name} has no version {number}", field="version")
    target = _server(deployment, server)
    if mode not in BenchmarkJob.Mode.values:
        raise DomainError(f"one of {', '.join(BenchmarkJob.Mode.values)}", field="mode")
    chosen_protocol = protocol_for(found, target, protocol)
    parsed_configs = parse_configs(configs, found)
    fields: dict[str, Any] = {
        "version": found, "server": target, "protocol": chosen_protocol, "mode": mode,
        "levels": parse_levels(levels if levels is not None else
                               ([1, 2, 4, 8, 16] if mode == BenchmarkJob.Mode.CONCURRENCY
                                else [10, 50, 100, 200]), mode),
        "duration_s": positive_number(duration_s, "duration_s", LIMITS["duration_s"]),
        "warmup_s": at_least_zero(warmup_s, "warmup_s", LIMITS["warmup_s"]),
        "max_requests": int(at_least_zero(max_requests, "max_requests", LIMITS["max_requests"],
                                           integer=True)),
        "refine_steps": int(at_least_zero(refine_steps, "refine_steps", LIMITS["refine_steps"],
                                           integer=True)),
        "error_limit": positive_number(error_limit, "error_limit", 1.0),
        "slo": slo_for(deployment, slo),
        "request": parse_request(request, chosen_protocol),
        "configs": parsed_configs,
    }
    if parsed_configs and ModelLoad.objects.filter(
            server=target, version__model=found.model, state__in=[ModelLoad.State.READY, *ModelLoad.IN_FLIGHT],
    ).exists():
        raise Conflict(f"a config sweep loads {found.model.name} on {target.name} once per config: "
                       f"unload it there first, or choose a server where it is not loaded",
                       field="configs")
    if not parsed_configs:
        loads.check_loadable(deployment, found)
    loads.check_runtime(found, [target])
    _check_quota(deployment, found, target, parsed_configs)
    fingerprint = hashlib.sha256(json.dumps(
        {k: (v.pk if hasattr(v, "pk") else v) for k, v in fields.items()}, sort_keys=True,
        default=str).encode()).hexdigest()
    token = token_of(actor)
    try:
        with transaction.atomic():
            if idempotency_key:
                earlier = BenchmarkJob.objects.filter(
                    tenant=deployment.tenant, idempotency_key=idempotency_key).first()
                if earlier is not None:
                    leases.check_replay(earlier.request_fingerprint, fingerprint)
                    return earlier, False
            _refuse_busy(target)
            job = BenchmarkJob.objects.create(
                tenant=deployment.tenant, deployment=deployment, **fields,
                shares_production=_shares_production(target),
                phase="queued", idempotency_key=idempotency_key, request_fingerprint=fingerprint,
                requested_by=None if token else actor, requested_by_token=token,
                requested_by_label=actor_label(actor),
            )
            audit.record(actor, "requested_benchmark", job, tenant=deployment.tenant,
                         after={"version": found.version, "server": target.name,
                                "levels": fields["levels"], "configs": len(parsed_configs)})
            transaction.on_commit(lambda: _enqueue(job.pk))
    except IntegrityError:
        _refuse_busy(target)
        raise
    return job, True


def _refuse_busy(server: InferenceServer) -> None:
    busy = BenchmarkJob.objects.filter(server=server, state__in=BenchmarkJob.ACTIVE).first()
    if busy is not None:
        raise Conflict(f"benchmark {busy.pk} is {busy.state} on {server.name}: one job per "
                       "server at a time", field="server")


def _enqueue(job_id: int) -> None:
    try:
        send_now("rollouts.tasks.advance_benchmark", job_id)
    except Exception:
        log.warning("benchmark %s: could not enqueue; the next tick takes it", job_id)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def _key(job: BenchmarkJob, name: str) -> str:
    return f"{key_prefix()}{job.run_id}:{name}"


def cancel(actor: Any, job: BenchmarkJob) -> BenchmarkJob:
    """Stop a job: the runner's stop flag is set at once, the reconciler does the rest."""
    require_role(actor, job.tenant, Membership.Role.DEPLOYER)
    label = actor_label(actor)
    with transaction.atomic():
        locked = BenchmarkJob.objects.select_for_update().get(pk=job.pk)
        if locked.state in BenchmarkJob.FINAL:
            raise Conflict(f"benchmark {job.pk} is {locked.state} already", field="state")
        if not locked.cancel_requested_by:
            BenchmarkJob.objects.filter(pk=job.pk).update(cancel_requested_by=label, updated_at=timezone.now())
            audit.record(actor, "cancelled_benchmark", locked, tenant=job.tenant)
        run_id = locked.run_id
    if run_id:
        locked.run_id = run_id
        try:
            _redis().set(_key(locked, "cancel"), label, ex=3600)
        except redis.RedisError:
            log.warning("benchmark %s: Redis unreachable for the stop flag; the runner is "
                        "stopped at the next tick", job.pk)
    transaction.on_commit(lambda: _enqueue(job.pk))
    job.refresh_from_db()
    return job


# --------------------------------------------------------------------------------------------
# The reconciler
# --------------------------------------------------------------------------------------------


def _claim(job_id: int) -> BenchmarkJob | None:
    return leases.claim(
        BenchmarkJob.objects.select_related("version__model", "server__cluster", "deployment",
                                            "tenant"),
        job_id, lease_s=settings.SWITCHYARD_BENCHMARK_LEASE_S,
        due=lambda job, now: job.state in BenchmarkJob.ACTIVE,
    )


def _update(job: BenchmarkJob, **fields: Any) -> None:
    leases.update(job, **fields)


def _heartbeat(job: BenchmarkJob) -> contextlib.AbstractContextManager[None]:
    """Keep the lease alive while a step runs (:func:`leases.heartbeat`): renewed every third
    of ``SWITCHYARD_BENCHMARK_LEASE_S``, for at most ``SWITCHYARD_LOAD_TIMEOUT_S`` (the
    longest call to a server) plus a lease."""
    lease_s = settings.SWITCHYARD_BENCHMARK_LEASE_S
    return leases.heartbeat(job, lease_s=lease_s,
                            max_s=settings.SWITCHYARD_LOAD_TIMEOUT_S + lease_s)


def _finish(job: BenchmarkJob, state: str, phase: str, **fields: Any) -> None:
    _update(job, state=state, phase=phase[:300], finished_at=timezone.now(),
            progress=1.0 if state == State.SUCCEEDED else job.progress, **fields)
    audit.record(None, f"benchmark_{state}", job, tenant=job.tenant,
                 after={"phase": phase[:300], "summary": job.summary})
    _cleanup_run(job)


def _cleanup_run(job: BenchmarkJob) -> None:
    """Stop a runner that may still be going, and drop its spec file."""
    if job.run_id:
        with contextlib.suppress(redis.RedisError):
            _redis().set(_key(job, "cancel"), "1", ex=3600)
        _spec_path(job.run_id).unlink(missing_ok=True)
    _kill_runner(job)


def _kill_runner(job: BenchmarkJob) -> None:
    if not job.runner_pid:
        return
    try:
        proc = psutil.Process(job.runner_pid)
        if "rollouts.benchmarks.runner" in " ".join(proc.cmdline()):
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except psutil.TimeoutExpired:
                proc.kill()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass


def _spec_path(run_id: str) -> Path:
    folder = Path(settings.DATA_DIR) / "benchmarks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{run_id}.json"


def prune_runner_files(max_age_s: float = RUNNER_FILES_KEPT_S) -> int:
    """Remove runner logs (and specs left by a worker that died) older than ``max_age_s``,
    except those of jobs still active; returns how many went."""
    import time

    folder = Path(settings.DATA_DIR) / "benchmarks"
    if not folder.is_dir():
        return 0
    active = set(BenchmarkJob.objects.filter(state__in=BenchmarkJob.ACTIVE)
                 .exclude(run_id="").values_list("run_id", flat=True))
    cutoff = time.time() - max_age_s
    removed = 0
    for path in folder.iterdir():
        if path.suffix in (".json", ".log") and path.stem not in active and \
                path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _current_override(job: BenchmarkJob) -> dict[str, Any] | None:
    return job.configs[job.config_index] if job.configs else None


def _entry(job: BenchmarkJob) -> dict[str, Any]:
    """The result entry of the config being measured (made on first use)."""
    results = list(job.results)
    while len(results) <= job.config_index:
        override = job.configs[len(results)] if job.configs else None
        results.append({"config": override or {}, "label": config_label(override), "levels": [],
                        "summary": None, "error": "", "load_id": None})
    job.results = results
    return results[job.config_index]


def _total_configs(job: BenchmarkJob) -> int:
    return max(len(job.configs), 1)


def _progress(job: BenchmarkJob, levels_done: int, current: dict[str, Any] | None) -> float:
    planned = len(job.levels) + job.refine_steps
    within = 0.0
    if current:
        elapsed = timezone.now().timestamp() - float(current.get("started_at", 0))
        span = float(current.get("warmup_s", 0)) + float(current.get("duration_s", 1))
        within = min(max(elapsed / span, 0.0), 0.99)
    config_part = min((levels_done + within) / max(planned, levels_done + 1), 0.99)
    return round((job.config_index + config_part) / _total_configs(job), 4)


def _queued(job: BenchmarkJob) -> bool:
    _update(job, state=State.LOADING, started_at=job.started_at or timezone.now(),
            phase=f"getting v{job.version.version} ready on {job.server.name}")
    return True


def _loading(job: BenchmarkJob) -> bool:
    entry = _entry(job)
    override = _current_override(job)
    if job.load_id is None:
        ready = None if job.configs else ModelLoad.objects.filter(
            server=job.server, version=job.version, state=ModelLoad.State.READY).first()
        if ready is not None:
            entry["load_id"] = ready.pk
            _update(job, load_id=ready.pk, loaded_by_job=False, results=job.results,
                    state=State.RUNNING, phase=f"v{job.version.version} is ready: starting the sweep")
            return True
        try:
            made, _ = loads.load_for(
                job.deployment, job.version, [job.server.name], label=f"benchmark {job.pk}",
                config_override=full_config(job.version, override) if override else None,
            )
        except DomainError as exc:
            return _config_failed(job, f"could not load {config_label(override)}: {exc}")
        entry["load_id"] = made[0].pk
        _update(job, load_id=made[0].pk, loaded_by_job=True, results=job.results,
                phase=f"loading v{job.version.version} ({config_label(override)}) on {job.server.name}")
        return False
    load = ModelLoad.objects.get(pk=job.load_id)
    if load.state == ModelLoad.State.READY:
        _update(job, state=State.RUNNING, phase=f"loaded ({config_label(override)}): starting the sweep")
        return True
    if load.state in (ModelLoad.State.FAILED, ModelLoad.State.UNLOADED, ModelLoad.State.LOST):
        return _config_failed(job, f"the load of {config_label(override)} ended {load.state}: "
                                   f"{load.error or 'no reason recorded'}", unload=False)
    _update(job, phase=f"loading {config_label(override)}: {load.get_state_display().lower()}")
    return False


def _config_failed(job: BenchmarkJob, why: str, *, unload: bool = True) -> bool:
    """One config could not be measured: recorded; the next config goes on (a job of one
    config fails)."""
    entry = _entry(job)
    entry["error"] = why[:2000]
    _update(job, results=job.results)
    if not job.configs:
        if unload and job.loaded_by_job:
            _release(job)
        _finish(job, State.FAILED, why, error=why, summary=summarize_job(job))
        return False
    return _next_config(job, unload=unload)


def _release(job: BenchmarkJob) -> None:
    """Unload what the job loaded (a failed job leaves nothing behind)."""
    try:
        loads.unload_for(None, job.deployment, job.version, server_names=[job.server.name],
                         label=f"benchmark {job.pk}")
    except DomainError as exc:
        log.warning("benchmark %s: unload refused: %s", job.pk, exc)


def _start_runner(job: BenchmarkJob) -> None:
    run_id = uuid.uuid4().hex
    try:
        spec = spec_for(job, run_id)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        _config_failed(job, f"server {job.server.name} did not answer for "
                            f"{job.version.model.name}'s inputs ({job.server.http_url}): {exc}")
        return
    path = _spec_path(run_id)
    path.write_text(json.dumps(spec))
    log_path = path.with_suffix(".log")
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollouts.benchmarks.runner", str(path)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=str(Path(settings.BASE_DIR)), env={**os.environ},
        )
    _RUNNERS[proc.pid] = proc
    _update(job, run_id=run_id, runner_pid=proc.pid, runner_started_at=timezone.now(),
            phase=f"sweeping {config_label(_current_override(job))}: starting the load generator")


_RUNNERS: dict[int, subprocess.Popen[bytes]] = {}


def _reap() -> None:
    for pid, proc in list(_RUNNERS.items()):
        if proc.poll() is not None:
            _RUNNERS.pop(pid, None)


def _read_run(job: BenchmarkJob) -> tuple[list[dict[str, Any]], dict[str, Any] | None,
                                         dict[str, Any] | None, bool]:
    client = _redis()
    pipe = client.pipeline()
    pipe.lrange(_key(job, "levels"), 0, -1)
    pipe.get(_key(job, "current"))
    pipe.get(_key(job, "done"))
    pipe.exists(_key(job, "alive"))
    levels_raw, current, done, alive = pipe.execute()
    return ([json.loads(x) for x in levels_raw], json.loads(current) if current else None,
            json.loads(done) if done else None, bool(alive))


def _running(job: BenchmarkJob) -> bool:
    _reap()
    if not job.run_id:
        _start_runner(job)
        return False
    try:
        levels, current, done, alive = _read_run(job)
    except redis.RedisError as exc:
        _update(job, phase=f"Redis unreachable, following the sweep again soon: {exc}"[:300])
        return False
    entry = _entry(job)
    entry["levels"] = levels
    label = config_label(_current_override(job))
    if done is not None:
        if done.get("error"):
            return _config_failed(job, f"the load generator failed: {done['error']}")
        entry["summary"] = done["summary"]
        if done["summary"].get("error"):
            entry["error"] = done["summary"]["error"]
        if job.cancel_requested_by:
            _update(job, results=job.results)
            return _next_config(job, last=True)
        if entry["error"] and not job.configs:
            _update(job, results=job.results)
            if job.loaded_by_job:
                _release(job)
            _finish(job, State.FAILED, entry["error"], error=entry["error"], summary=summarize_job(job))
            return False
        _update(job, results=job.results)
        return _next_config(job)
    started = job.runner_started_at or timezone.now()
    if not alive and (timezone.now() - started).total_seconds() > RUNNER_GRACE_S:
        tail = ""
        log_path = _spec_path(job.run_id).with_suffix(".log")
        if log_path.exists():
            tail = log_path.read_text(errors="replace")[-1000:]
        return _config_failed(job, f"the load generator (pid {job.runner_pid}) stopped without "
                                   f"a result{': ' + tail if tail else ''}")
    now_at = f"level {len(levels) + 1}: {'concurrency' if job.mode == 'concurrency' else 'rate'} " \
             f"{current['value']:g}" if current else "warming up"
    _update(job, results=job.results, progress=max(job.progress, _progress(job, len(levels), current)),
            phase=f"sweeping {label}: {now_at}")
    return False


def _next_config(job: BenchmarkJob, *, unload: bool = True, last: bool = False) -> bool:
    """The config is done: unload what the job loaded, then the next config or the end."""
    if unload and job.loaded_by_job and job.load_id is not None:
        load = ModelLoad.objects.filter(pk=job.load_id).first()
        if load is not None and load.state in (ModelLoad.State.READY, *ModelLoad.IN_FLIGHT):
            _release(job)
            _update(job, state=State.UNLOADING, phase=f"unloading {config_label(_current_override(job))}")
            return False
    return _after_config(job, last=last)


def _after_config(job: BenchmarkJob, *, last: bool = False) -> bool:
    if job.cancel_requested_by:
        _finish(job, State.CANCELLED, f"cancelled by {job.cancel_requested_by}",
                summary=summarize_job(job))
        return False
    if not last and job.config_index + 1 < _total_configs(job):
        _update(job, config_index=job.config_index + 1, load_id=None, loaded_by_job=False,
                run_id="", runner_pid=None, runner_started_at=None, state=State.LOADING,
                progress=round((job.config_index + 1) / _total_configs(job), 4),
                phase=f"next: {config_label(job.configs[job.config_index + 1])}")
        return True
    summary = summarize_job(job)
    if summary.get("best_config") is None:
        errors = "; ".join(e["error"] for e in job.results if e.get("error")) or \
            "no config carried any load within the SLO"
        _finish(job, State.FAILED if all(e.get("error") for e in job.results) else State.SUCCEEDED,
                errors[:300], summary=summary, error=errors if all(e.get("error") for e in job.results) else "")
        return False
    _finish(job, State.SUCCEEDED, f"done: {_best_phrase(job, summary)}", summary=summary)
    return False


def _unloading(job: BenchmarkJob) -> bool:
    load = ModelLoad.objects.filter(pk=job.load_id).first()
    if load is not None and load.state in ModelLoad.IN_FLIGHT:
        _update(job, phase=f"unloading {config_label(_current_override(job))}: "
                           f"{load.get_state_display().lower()}")
        return False
    return _after_config(job)


def _best_phrase(job: BenchmarkJob, summary: dict[str, Any]) -> str:
    best = summary.get("best")
    if not best or best.get("max_load") is None:
        return "nothing met the SLO"
    unit = "concurrency" if job.mode == "concurrency" else "req/s offered"
    return (f"max load within SLO {best['max_load']:g} ({unit}), {best['max_load_rps']:.0f} req/s"
            + (f" with {summary['best_label']}" if job.configs else ""))


def _cancelling(job: BenchmarkJob) -> bool:
    """A cancel: stop the runner (its flag is set), then unload what the job loaded."""
    _cleanup_run(job)
    if job.run_id:
        try:
            levels, _current, _done, _alive = _read_run(job)
            _entry(job)["levels"] = levels
        except redis.RedisError:
            pass
    _update(job, results=job.results)
    return _next_config(job, last=True)


STEPS = {
    State.QUEUED: _queued,
    State.LOADING: _loading,
    State.RUNNING: _running,
    State.UNLOADING: _unloading,
}


def advance(job_id: int) -> tuple[str | None, bool]:
    """At most one step of a job; returns (its state, whether the next may follow at once).
    An unexpected error fails the job readably (the traceback kept) and unloads what it
    loaded."""
    job = _claim(job_id)
    if job is None:
        return None, False
    again = False
    try:
        try:
            with _heartbeat(job):
                if job.cancel_requested_by and job.state != State.UNLOADING:
                    again = _cancelling(job)
                else:
                    again = STEPS[job.state](job)
        except (leases.LostLease, DatabaseError):
            raise
        except Exception as exc:
            log.exception("benchmark %s: unexpected error in %s", job_id, job.state)
            why = f"Switchyard failed unexpectedly while {job.state} ({type(exc).__name__}: {exc})"
            _entry(job)["error"] = why + "\n" + traceback.format_exc()[-3000:]
            _update(job, results=job.results)
            _finish(job, State.FAILED, why, error=why)
            if job.loaded_by_job and job.load_id:
                _release(job)
    except leases.LostLease:
        return None, False
    finally:
        leases.release(job)
    return job.state, again and job.state in BenchmarkJob.ACTIVE


def due_jobs() -> list[int]:
    now = timezone.now()
    return list(BenchmarkJob.objects.filter(state__in=BenchmarkJob.ACTIVE)
                .exclude(lease_expires_at__gt=now).values_list("pk", flat=True))


def run_to_end(job_id: int, *, max_ticks: int = 2000, tick_s: float = 0.2) -> BenchmarkJob:
    """Advance the job and the loads it asked for until it ends (scripts, the bench and
    tests: no worker needed)."""
    import time

    for _ in range(max_ticks):
        job = BenchmarkJob.objects.get(pk=job_id)
        if job.state in BenchmarkJob.FINAL:
            return job
        if job.load_id:
            load_reconciler.advance(job.load_id)
        _state, again = advance(job_id)
        if not again:
            time.sleep(tick_s)
    return BenchmarkJob.objects.get(pk=job_id)
