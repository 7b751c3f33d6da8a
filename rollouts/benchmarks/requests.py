"""Asking for a benchmark job, and cancelling one.

A job measures one version on one fleet server of a deployment (never an arbitrary URL), for
each config it compares (the version's own when ``configs`` is empty). :func:`create_job`
checks everything it can up front (the version, the server, the levels and SLO, whether the
loads would fit the tenant's quota), one job per server at a time (a partial unique
constraint), and replays a request with the same ``Idempotency-Key``; :func:`cancel` sets the
runner's stop flag in Redis at once (the load stops within a second), and the next tick of the
reconciler (:mod:`.reconciler`) unloads and ends the job.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from django.db import transaction
from django.utils import timezone

from console.celery import send_now
from console.exceptions import Conflict, DomainError, FieldErrors, QuotaExceeded
from fleet import audit
from fleet.audit import actor_label
from fleet.models import InferenceServer, Membership
from fleet.quota import admission as quota
from fleet.tenancy.scoping import require_role, token_of
from rollouts import idempotency
from rollouts.benchmarks import runs, sweep
from rollouts.benchmarks.specs import (
    LIMITS,
    at_least_zero,
    config_label,
    full_config,
    parse_configs,
    parse_levels,
    parse_request,
    positive_number,
    protocol_for,
    slo_for,
)
from rollouts.loads import demand
from rollouts.loads import requests as loads
from rollouts.models import BenchmarkJob, Deployment, ModelLoad, ModelVersion

log = logging.getLogger(__name__)


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
    version: object = None,
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
    errors: FieldErrors | None = None,
) -> tuple[BenchmarkJob, bool]:
    """Ask for a benchmark (deployer role); returns (job, made now). A job already running
    on the server is a Conflict; the same ``idempotency_key`` replays the first request.
    Every field refused is named in one answer, with those in ``errors`` (found before)."""
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    if deployment.archived_at is not None:
        raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
    # Every field the request got wrong is named in one answer; checks that need the version,
    # the server or the protocol run once those passed.
    errors = FieldErrors() if errors is None else errors
    found, target, chosen_protocol = None, None, None
    parsed_configs: list[dict[str, Any]] = []
    fields: dict[str, Any] = {"mode": mode}
    with errors.gather():
        if isinstance(version, bool) or not isinstance(version, int):
            raise DomainError("a version number", field="version")
        found = deployment.model.versions.filter(version=version).first()
        if found is None:
            raise DomainError(f"{deployment.model.name} has no version {version}", field="version")
    with errors.gather():
        target = _server(deployment, server)
    with errors.gather():
        if mode not in BenchmarkJob.Mode.values:
            raise DomainError(f"one of {', '.join(BenchmarkJob.Mode.values)}", field="mode")
        fields["levels"] = parse_levels(levels if levels is not None else
                                        ([1, 2, 4, 8, 16] if mode == BenchmarkJob.Mode.CONCURRENCY
                                         else [10, 50, 100, 200]), mode)
    for name, check in [
        ("duration_s", lambda: positive_number(duration_s, "duration_s", LIMITS["duration_s"])),
        ("warmup_s", lambda: at_least_zero(warmup_s, "warmup_s", LIMITS["warmup_s"])),
        ("max_requests", lambda: int(at_least_zero(max_requests, "max_requests",
                                                   LIMITS["max_requests"], integer=True))),
        ("refine_steps", lambda: int(at_least_zero(refine_steps, "refine_steps",
                                                   LIMITS["refine_steps"], integer=True))),
        ("error_limit", lambda: positive_number(error_limit, "error_limit", 1.0)),
        ("slo", lambda: slo_for(deployment, slo)),
    ]:
        with errors.gather():
            fields[name] = check()
    if found is not None:
        with errors.gather():
            parsed_configs = parse_configs(configs, found)
        if target is not None:
            with errors.gather():
                chosen_protocol = protocol_for(found, target, protocol)
                fields["request"] = parse_request(request, chosen_protocol)
    errors.raise_any()
    assert found is not None and target is not None  # else an error was raised
    fields = {"version": found, "server": target, "protocol": chosen_protocol, "mode": mode,
              "levels": fields["levels"], "duration_s": fields["duration_s"],
              "warmup_s": fields["warmup_s"], "max_requests": fields["max_requests"],
              "refine_steps": fields["refine_steps"], "error_limit": fields["error_limit"],
              "slo": fields["slo"], "request": fields["request"], "configs": parsed_configs}
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
    fingerprint = idempotency.fingerprint(**fields)
    token = token_of(actor)

    def replay() -> BenchmarkJob | None:
        earlier = BenchmarkJob.objects.filter(
            tenant=deployment.tenant, idempotency_key=idempotency_key).first()
        if earlier is not None:
            idempotency.check_replay(earlier.request_fingerprint, fingerprint)
        return earlier

    def create() -> tuple[BenchmarkJob, bool]:
        with transaction.atomic():
            earlier = replay() if idempotency_key else None
            if earlier is not None:
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
        return job, True

    return idempotency.create_once(create, key=idempotency_key, replay=replay,
                                   refuse=lambda: _refuse_busy(target))


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
            runs.redis_client().set(runs.run_key(locked, "cancel"), label, ex=3600)
        except redis.RedisError:
            log.warning("benchmark %s: Redis unreachable for the stop flag; the runner is "
                        "stopped at the next tick", job.pk)
    transaction.on_commit(lambda: _enqueue(job.pk))
    job.refresh_from_db()
    return job
