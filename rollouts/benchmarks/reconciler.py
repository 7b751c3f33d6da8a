"""The reconciler of benchmark jobs: carries a job out, one step at a time.

For each config the job compares it gets the version ready on the server through the load path
(admitted against the tenant's quota), starts a run of the load generator (:mod:`.runs`) that
sweeps the levels, follows it through Redis, records what it measured, and unloads what the job
loaded. The best config is the one with the most load within the SLO.

:func:`advance` does at most one step under a lease, like loads and rollouts, and never waits
for the load generator: a worker stays free while a sweep runs. A cancelled job (its stop flag
set by :func:`rollouts.benchmarks.requests.cancel`) is unloaded and ended by the next step.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
import uuid
from typing import Any

import httpx
import redis
from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from console.exceptions import DomainError
from fleet import audit
from rollouts import leases
from rollouts.benchmarks import runs
from rollouts.benchmarks.results import summarize_job
from rollouts.benchmarks.specs import config_label, full_config, level_name, spec_for
from rollouts.loads import reconciler as load_reconciler
from rollouts.loads import requests as loads
from rollouts.models import BenchmarkJob, ModelLoad

log = logging.getLogger(__name__)

State = BenchmarkJob.State

RUNNER_GRACE_S = 15.0  # a runner not heard from this long after its start has died


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
    runs.stop_run(job)


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
    pid = runs.launch_runner(spec, run_id)
    _update(job, run_id=run_id, runner_pid=pid, runner_started_at=timezone.now(),
            phase=f"sweeping {config_label(_current_override(job))}: starting the load generator")


def _running(job: BenchmarkJob) -> bool:
    runs.reap_runners()
    if not job.run_id:
        _start_runner(job)
        return False
    try:
        levels, current, done, alive = runs.read_run(job)
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
        log_path = runs.spec_path(job.run_id).with_suffix(".log")
        if log_path.exists():
            tail = log_path.read_text(errors="replace")[-1000:]
        return _config_failed(job, f"the load generator (pid {job.runner_pid}) stopped without "
                                   f"a result{': ' + tail if tail else ''}")
    now_at = f"level {len(levels) + 1}: {level_name(job.mode, current['value'])}" if current \
        else "warming up"
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
    runs.stop_run(job)
    if job.run_id:
        try:
            levels, _current, _done, _alive = runs.read_run(job)
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
