"""Rollouts: canaries moved by evidence, A/B splits ended by a verdict.

:func:`create_rollout` checks and writes a row; :func:`advance` is the reconciler Celery calls
(beat every ``SWITCHYARD_ROLLOUT_INTERVAL_S``, and a task sent after each request, action and
step that lets the next one follow at once). It claims the row with a short lease, carries
out at most one step, records what it saw and did (a :class:`RolloutEvent`, with the
evidence) and returns. Every step is idempotent: a step repeated by another worker after one
died (its lease ran out) changes nothing twice. The weight of a step is put in force and the
step index moved on only while the lease is held, so a step is never done twice.

A canary's steps::

    {"set_weight": 25}              traffic to the candidate, in percent
    {"pause": {"seconds": 60}}      wait (the canary keeps its traffic and is watched)
    {"pause": {}}                   wait until a person resumes
    {"analysis": {...}}             judge the canary until it passes (overrides ``analysis``)
    {"approval": {}}                wait until an approver who is not the requester approves
    {"benchmark": {"max_drop_pct": 10}}
                                    the candidate's max load within its SLO (its newest
                                    benchmark) may fall below the baseline's by at most 10%;
                                    without a benchmark of both it pauses for a person

Every tick of a running canary first watches its health: a candidate load that is no longer
ready, a candidate server the health probes call unhealthy or unreachable, or the
candidate's requests failing upstream (no answer, 502/504) roll back at once. An analysis
judges the candidate against the baseline on the requests of both since the analysis began
(``rollouts.canary.analysis.judge``: Mann-Whitney U and Fisher's exact test with the false-alarm
probability spent over the looks), and holds the candidate to the SLO gates (the
deployment's p99 and error-rate ceilings, and any p50/p95 ceilings given). A failed look
beyond ``failure_limit`` rolls back in the same tick; an inconclusive end (the planned
sample reached without a verdict, or ``timeout_s`` passed) pauses for a person, whose
"resume" accepts it.

Rolling back puts 100% of the traffic on the baseline in the tick that found the failure;
should the router refuse the change for now, the rollout stays ``rolling_back`` and the next
tick tries again. The candidate's loads are then unloaded (the quota comes back).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import re
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from console import logs
from console.celery import send_soon
from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.audit import actor_label
from fleet.inventory.routers import has_router
from fleet.models import InferenceServer, Membership
from fleet.tenancy.scoping import require_role, token_of
from fleet.tenancy.tokens import person_id
from fleet.webhooks import events as webhook_events
from rollouts import leases
from rollouts.canary import analysis
from rollouts.loads import reconciler as load_reconciler
from rollouts.loads import requests as loads
from rollouts.models import (
    Deployment,
    ModelLoad,
    ModelVersion,
    Rollout,
    RolloutAnalysis,
    RolloutApproval,
    RolloutEvent,
    Route,
)
from rollouts.registry import versions as registry
from rollouts.traffic import routes, samples

log = logging.getLogger(__name__)
State = Rollout.State
Kind = RolloutEvent.Kind
Verdict = RolloutAnalysis.Verdict

DEFAULT_STEPS: list[dict[str, Any]] = [
    {"set_weight": 5}, {"analysis": {}},
    {"set_weight": 25}, {"analysis": {}},
    {"set_weight": 50}, {"analysis": {}},
]
# How analyses judge, unless the rollout (or the step) says otherwise. ``max_p99_ms`` and
# ``max_error_rate`` default to the deployment's SLO.
ANALYSIS_DEFAULTS: dict[str, Any] = {
    "planned_samples": 1000,
    "min_samples": 100,
    "latency_tolerance_pct": 5.0,
    "error_tolerance_pct": 1.0,
    "alpha": 0.05,
    "failure_limit": 0,
    "timeout_s": 900,
    "max_p50_ms": None,
    "max_p95_ms": None,
    "max_p99_ms": None,
    "max_error_rate": None,
}
# The range and type of each analysis setting: parse_analysis refuses outside them, and the
# API's schema states them.
ANALYSIS_LIMITS: dict[str, tuple[float, float, type]] = {
    "planned_samples": (10, 10_000_000, int),
    "min_samples": (10, 10_000_000, int),
    "latency_tolerance_pct": (0, 1000, float),
    "error_tolerance_pct": (0, 100, float),
    "alpha": (0.0001, 0.4999, float),
    "failure_limit": (0, 1000, int),
    "timeout_s": (1, 7 * 24 * 3600, int),
    "max_p50_ms": (0.001, 3_600_000, float),
    "max_p95_ms": (0.001, 3_600_000, float),
    "max_p99_ms": (0.001, 3_600_000, float),
    "max_error_rate": (0, 100, float),
}
MAX_STEPS = 100
ALIAS_NAME = re.compile(r"[A-Za-z0-9_-]{0,64}")
HEADER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,63}")
MAX_PAUSE_S = 7 * 24 * 3600
# The candidate's requests failing upstream (no answer, 502, 504) over this many seconds, at
# least UPSTREAM_MIN of them and at least UPSTREAM_SHARE of its requests: its server is down.
UPSTREAM_WINDOW_S = 3.0
UPSTREAM_MIN = 5
UPSTREAM_SHARE = 0.5
AB_MIN_SAMPLES = 20


# --------------------------------------------------------------------------------------------
# Checking requests
# --------------------------------------------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_analysis(raw: object, field: str = "analysis") -> dict[str, Any]:
    """The analysis settings given (an object of the keys of :data:`ANALYSIS_DEFAULTS`),
    checked; a DomainError naming ``field.key`` otherwise. Keys not given are left out."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DomainError("must be an object", field=field)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in ANALYSIS_LIMITS:
            known = ", ".join(sorted(ANALYSIS_LIMITS))
            raise DomainError(f"unknown setting {str(key)[:40]!r}; known: {known}", field=field)
        if value is None and ANALYSIS_DEFAULTS[key] is None:
            out[key] = None
            continue
        low, high, kind = ANALYSIS_LIMITS[key]
        if not _is_number(value) or (kind is int and value != int(value)) or not low <= value <= high:
            what = "an integer" if kind is int else "a number"
            raise DomainError(f"must be {what} from {low:g} to {high:g}, got {value!r}"[:200],
                              field=f"{field}.{key}")
        out[key] = kind(value)
    merged = {**ANALYSIS_DEFAULTS, **out}
    if merged["planned_samples"] < merged["min_samples"]:
        raise DomainError("must be at least min_samples", field=f"{field}.planned_samples")
    return out


def parse_steps(raw: object) -> list[dict[str, Any]]:
    """A canary's step list, checked (see the module's documentation for the forms)."""
    if raw is None:
        return [dict(s) for s in DEFAULT_STEPS]
    if not isinstance(raw, list) or not raw:
        raise DomainError("must be a non-empty list of steps", field="steps")
    if len(raw) > MAX_STEPS:
        raise DomainError(f"at most {MAX_STEPS} steps", field="steps")
    out: list[dict[str, Any]] = []
    for index, step in enumerate(raw):
        where = f"steps[{index}]"
        if not isinstance(step, dict) or len(step) != 1:
            raise DomainError("a step is an object with one of set_weight, pause, analysis, "
                              "approval", field=where)
        (kind, value), = step.items()
        if kind == "set_weight":
            if not _is_number(value) or value != int(value) or not 0 <= value <= 100:
                raise DomainError(f"set_weight is an integer from 0 to 100, got {value!r}"[:200],
                                  field=where)
            out.append({"set_weight": int(value)})
        elif kind == "pause":
            if not isinstance(value, dict) or set(value) - {"seconds"}:
                raise DomainError('pause is {} (until resumed) or {"seconds": N}', field=where)
            seconds = value.get("seconds")
            if seconds is not None and (not _is_number(seconds) or not 1 <= seconds <= MAX_PAUSE_S):
                raise DomainError(f"pause seconds run from 1 to {MAX_PAUSE_S}", field=where)
            out.append({"pause": {} if seconds is None else {"seconds": float(seconds)}})
        elif kind == "analysis":
            out.append({"analysis": parse_analysis({} if value is None else value, field=where)})
        elif kind == "approval":
            if value not in ({}, None):
                raise DomainError("approval takes no settings: {}", field=where)
            out.append({"approval": {}})
        elif kind == "benchmark":
            out.append({"benchmark": _parse_benchmark_step(value, where)})
        else:
            raise DomainError(f"unknown step {str(kind)[:40]!r}: set_weight, pause, analysis, "
                              "approval or benchmark", field=where)
    return out


def _parse_benchmark_step(value: object, where: str) -> dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, dict) or set(value) - {"max_drop_pct", "mode"}:
        raise DomainError('benchmark is {"max_drop_pct": N} (and optionally "mode": '
                          '"concurrency" or "rate")', field=where)
    drop = value.get("max_drop_pct", 10)
    if not _is_number(drop) or not 0 <= drop <= 100:
        raise DomainError(f"max_drop_pct is a percentage from 0 to 100, got {drop!r}"[:200], field=where)
    mode = value.get("mode")
    if mode not in (None, "concurrency", "rate"):
        raise DomainError("mode is concurrency or rate", field=where)
    return {"max_drop_pct": float(drop), **({"mode": mode} if mode else {})}


def _version(deployment: Deployment, number: object, field: str) -> ModelVersion:
    if not _is_number(number) or number != int(number):
        raise DomainError(f"a version number, got {number!r}"[:200], field=field)
    version = deployment.model.versions.filter(version=int(number)).first()
    if version is None:
        raise DomainError(f"{deployment.model.name} has no version {number}", field=field)
    return version


def _ready_numbers(deployment: Deployment) -> dict[int, list[str]]:
    ready: dict[int, list[str]] = {}
    for load in routes.ready_loads(deployment):
        ready.setdefault(load.version.version, []).append(load.server.name)
    return ready


def _default_baseline(deployment: Deployment, ready: dict[int, list[str]]) -> int:
    route = Route.objects.filter(pk=deployment.pk, state=Route.State.IN_FORCE).first()
    if route is not None and route.version_weights:
        heaviest = max(route.version_weights.items(), key=lambda item: (item[1], item[0]))
        if heaviest[1] > 0 and heaviest[0] in ready:
            return heaviest[0]
    return routes.default_version(deployment, routes.ready_loads(deployment))[0]


def _canary_servers(deployment: Deployment, candidate: ModelVersion, baseline: int,
                    ready: dict[int, list[str]], names: list[str] | None) -> list[str]:
    all_names = list(deployment.servers.order_by("name").values_list("name", flat=True))
    if names:
        unknown = sorted(set(names) - set(all_names))
        if unknown:
            raise DomainError(f"deployment {deployment.name} has no server named "
                              f"{', '.join(unknown)}", field="servers")
        chosen = sorted(set(names))
    else:
        chosen = all_names
    if candidate.runtime == ModelVersion.Runtime.VLLM and not candidate.adapter_of:
        # A vLLM server runs one base model: the candidate needs servers the baseline is not on.
        busy = set(ready.get(baseline, []))
        if names and busy & set(chosen):
            raise DomainError(f"a vLLM server runs one base version: {', '.join(sorted(busy & set(chosen)))} "
                              f"serves v{baseline}, the baseline", field="servers")
        chosen = [n for n in chosen if n not in busy]
        if not chosen:
            raise DomainError(f"a vLLM server runs one base version and every server of "
                              f"{deployment.name} serves v{baseline}: add a server for the canary",
                              field="servers")
    if not chosen:
        raise DomainError(f"deployment {deployment.name} has no servers", field="servers")
    return chosen


def _ab_variants(deployment: Deployment, raw: object) -> list[dict[str, int]]:
    if not isinstance(raw, list) or not 2 <= len(raw) <= 10:
        raise DomainError("an A/B split names 2 to 10 variants: [{version, weight}]",
                          field="variants")
    out: list[dict[str, int]] = []
    for index, item in enumerate(raw):
        where = f"variants[{index}]"
        if not isinstance(item, dict) or set(item) - {"version", "weight"} or "version" not in item:
            raise DomainError("a variant is {version, weight}", field=where)
        version = _version(deployment, item["version"], f"{where}.version")
        weight = item.get("weight")
        if not _is_number(weight) or weight != int(weight) or not 1 <= weight <= 99:
            raise DomainError(f"weight is an integer from 1 to 99, got {weight!r}"[:200],
                              field=f"{where}.weight")
        if any(v["version"] == version.version for v in out):
            raise DomainError(f"v{version.version} is named twice", field=where)
        out.append({"version": version.version, "weight": int(weight)})
    total = sum(v["weight"] for v in out)
    if total != 100:
        raise DomainError(f"the weights must sum to 100, got {total}", field="variants")
    return out


def _fingerprint(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


def create_rollout(
    actor: Any,
    deployment: Deployment,
    *,
    strategy: str = Rollout.Strategy.CANARY,
    version: object = None,
    baseline: object = None,
    steps: object = None,
    analysis_settings: object = None,
    variants: object = None,
    duration_s: object = None,
    sample_size: object = None,
    sticky_header: str = "",
    promote: bool | None = None,
    alias: str | None = None,
    unload_previous: bool = True,
    servers: list[str] | None = None,
    require_approval: bool = False,
    idempotency_key: str = "",
    reason: str = "",
) -> tuple[Rollout, bool]:
    """Ask for a rollout of the deployment (deployer role); returns (rollout, made now).

    Canary: ``version`` is the candidate's number; ``baseline`` defaults to the version that
    carries the most traffic (else the production alias, else the newest ready version), and
    must be ready. A/B: ``variants`` [{version, weight}] (the first is the reference) and
    ``duration_s`` and/or ``sample_size`` (requests a variant). A production deployment (or
    ``require_approval``) waits for an approver first. A second rollout while one is in
    flight on the deployment is a Conflict on ``deployment``; the same ``idempotency_key``
    replays the first request (a Conflict if it asked for something else).
    """
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    if deployment.archived_at is not None:
        raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
    if not has_router(deployment.cluster):
        raise Conflict(f"cluster {deployment.cluster.name} has no traffic router: rollouts "
                       "move traffic through one", field="deployment")
    if strategy not in Rollout.Strategy.values:
        raise DomainError(f"one of {', '.join(Rollout.Strategy.values)}", field="strategy")
    ready = _ready_numbers(deployment)
    if not ready:
        raise Conflict(f"no version of {deployment.model.name} is ready on deployment "
                       f"{deployment.name}: load the stable version first", field="deployment")
    settings_given = parse_analysis(analysis_settings)
    if sticky_header and (not isinstance(sticky_header, str) or not HEADER_NAME.fullmatch(sticky_header)):
        raise DomainError("a header name (a letter, then letters, digits and -, at most 64)",
                          field="sticky_header")
    fields: dict[str, Any] = {
        "strategy": strategy, "analysis": settings_given, "sticky_header": sticky_header or "",
        "unload_previous": bool(unload_previous),
        "requires_approval": bool(require_approval or deployment.production),
    }
    if strategy == Rollout.Strategy.CANARY:
        if version is None:
            raise DomainError("name the version to roll out", field="version")
        candidate = _version(deployment, version, "version")
        base_number = _default_baseline(deployment, ready) if baseline is None else int(
            _version(deployment, baseline, "baseline").version)
        if base_number not in ready:
            raise DomainError(f"v{base_number} is not ready on the deployment's servers: the "
                              "baseline carries the traffic back", field="baseline")
        if candidate.version == base_number:
            raise DomainError(f"v{candidate.version} is the baseline already", field="version")
        loads.check_loadable(deployment, candidate)
        chosen = _canary_servers(deployment, candidate, base_number, ready, servers)
        loads.check_runtime(candidate, list(deployment.servers.filter(name__in=chosen)))
        fields.update(
            baseline=deployment.model.versions.get(version=base_number), candidate=candidate,
            steps=parse_steps(steps), servers=chosen, promote=True,
            alias=(routes.PRODUCTION_ALIAS if deployment.production else "") if alias is None
            else _alias_name(alias),
        )
    else:
        parsed = _ab_variants(deployment, variants)
        for item in parsed:
            loads.check_loadable(deployment, deployment.model.versions.get(version=item["version"]))
        if duration_s is None and sample_size is None:
            raise DomainError("an A/B split ends after duration_s seconds or sample_size "
                              "requests a variant: give one", field="duration_s")
        if duration_s is not None and (not _is_number(duration_s)
                                       or not 1 <= duration_s <= 30 * 24 * 3600):
            raise DomainError(f"seconds from 1 to {30 * 24 * 3600}, got {duration_s!r}"[:200],
                              field="duration_s")
        if sample_size is not None and (not _is_number(sample_size) or sample_size != int(sample_size)
                                        or not AB_MIN_SAMPLES <= sample_size <= 10_000_000):
            raise DomainError(f"an integer from {AB_MIN_SAMPLES} to 10000000, got "
                              f"{sample_size!r}"[:200], field="sample_size")
        names = list(deployment.servers.order_by("name").values_list("name", flat=True))
        if servers:
            unknown = sorted(set(servers) - set(names))
            if unknown:
                raise DomainError(f"deployment {deployment.name} has no server named "
                                  f"{', '.join(unknown)}", field="servers")
            names = sorted(set(servers))
        fields.update(
            baseline=deployment.model.versions.get(version=parsed[0]["version"]),
            variants=parsed, servers=names, promote=bool(promote),
            duration_s=None if duration_s is None else int(duration_s),
            sample_size=None if sample_size is None else int(sample_size),
            alias=(routes.PRODUCTION_ALIAS if deployment.production else "") if alias is None
            else _alias_name(alias),
        )
    request_fields = {k: (v.pk if isinstance(v, ModelVersion) else v) for k, v in fields.items()}
    fingerprint = _fingerprint({"deployment": deployment.pk, **request_fields})
    try:
        return _create(actor, deployment, fields, idempotency_key, fingerprint, reason)
    except IntegrityError:
        # Two requests raced past the checks: the constraints decide, and say which.
        if idempotency_key:
            earlier = _replay(deployment, idempotency_key, fingerprint)
            if earlier is not None:
                return earlier, False
        _refuse_second(deployment)
        raise


def _alias_name(alias: object) -> str:
    if not isinstance(alias, str) or not ALIAS_NAME.fullmatch(alias):
        raise DomainError("an alias name (ASCII letters, digits, - and _, at most 64), or empty "
                          "for none", field="alias")
    return alias


def _replay(deployment: Deployment, key: str, fingerprint: str) -> Rollout | None:
    earlier = Rollout.objects.filter(tenant=deployment.tenant, idempotency_key=key).first()
    if earlier is None:
        return None
    leases.check_replay(earlier.request_fingerprint, fingerprint)
    return earlier


def _refuse_second(deployment: Deployment) -> None:
    active = Rollout.objects.filter(deployment=deployment, state__in=Rollout.ACTIVE).first()
    if active is not None:
        raise Conflict(
            f"rollout {active.pk} is {active.get_state_display().lower()} on deployment "
            f"{deployment.name}: one rollout at a time (abort it, or wait for it to end)",
            field="deployment",
        )


def _create(actor: Any, deployment: Deployment, fields: dict[str, Any], idempotency_key: str,
            fingerprint: str, reason: str) -> tuple[Rollout, bool]:
    token = token_of(actor)
    with transaction.atomic():
        # Requests for one deployment go one at a time: the check and the insert belong together.
        locked = Deployment.objects.select_for_update().only("archived_at").get(pk=deployment.pk)
        if locked.archived_at is not None:
            raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
        if idempotency_key:
            earlier = _replay(deployment, idempotency_key, fingerprint)
            if earlier is not None:
                return earlier, False
        _refuse_second(deployment)
        pending = fields["requires_approval"]
        rollout = Rollout.objects.create(
            tenant=deployment.tenant, deployment=deployment,
            state=State.PENDING_APPROVAL if pending else State.LOADING,
            waiting_for="an approver who is not the requester" if pending else "",
            idempotency_key=idempotency_key, request_fingerprint=fingerprint,
            requested_by=None if token else actor, requested_by_token=token,
            requested_by_label=actor_label(actor), reason=reason,
            next_tick_at=timezone.now(), request_id=logs.REQUEST_ID.get(), **fields,
        )
        what = (f"canary of v{rollout.candidate.version} against v{rollout.baseline.version}"
                if rollout.strategy == Rollout.Strategy.CANARY else
                "A/B split " + " / ".join(f"v{v['version']} {v['weight']}%" for v in rollout.variants))
        _event(rollout, Kind.REQUEST, f"{what} requested by {rollout.requested_by_label}"
               + (f": {reason}" if reason else ""), actor=rollout.requested_by_label,
               data={"steps": rollout.steps, "analysis": rollout.analysis})
        audit.record(actor, "requested_rollout", rollout, tenant=deployment.tenant,
                     after={"strategy": rollout.strategy, "versions": rollout.versions},
                     reason=reason)
        if pending:
            _event(rollout, Kind.APPROVAL, "waiting for an approver who is not the requester "
                   f"({'a production deployment' if deployment.production else 'asked for'})")
            _notify(rollout, "rollout.approval_needed", "")
        _enqueue_on_commit(rollout.pk)
    return rollout, True


def _enqueue_on_commit(rollout_id: int) -> None:
    send_soon("rollouts.tasks.advance_rollout", rollout_id)


ACTION_FROM: dict[str, list[str]] = {
    Rollout.Action.PAUSE: [State.PROGRESSING],
    Rollout.Action.RESUME: [State.PAUSED],
    Rollout.Action.PROMOTE: [State.PROGRESSING, State.PAUSED],
    Rollout.Action.ABORT: [State.PENDING_APPROVAL, State.LOADING, State.PROGRESSING,
                           State.PAUSED],
}


def request_action(actor: Any, rollout: Rollout, action: str, reason: str = "") -> Rollout:
    """Pause, resume, promote now or abort (deployer role): recorded on the row and carried
    out by the reconciler's next tick (sent at once). A Conflict on ``action`` when the
    rollout's state does not allow it."""
    require_role(actor, rollout.tenant, Membership.Role.DEPLOYER)
    if action not in ACTION_FROM:
        raise DomainError(f"one of {', '.join(ACTION_FROM)}", field="action")
    label = actor_label(actor)
    with transaction.atomic():
        locked = Rollout.objects.select_for_update().get(pk=rollout.pk)
        allowed = ACTION_FROM[action]
        if action == Rollout.Action.PROMOTE and locked.strategy == Rollout.Strategy.AB:
            raise Conflict("an A/B split ends in a verdict: abort it, or let it run its course",
                           field="action")
        if locked.state not in allowed:
            raise Conflict(f"rollout {locked.pk} is {locked.get_state_display().lower()}: "
                           f"{action} needs it {' or '.join(allowed)}", field="action")
        if locked.requested_action and locked.requested_action != action:
            raise Conflict(f"{locked.requested_action} was asked for by "
                           f"{locked.requested_action_by} and is being carried out",
                           field="action")
        Rollout.objects.filter(pk=locked.pk).update(
            requested_action=action, requested_action_by=label,
            requested_action_reason=reason, next_tick_at=timezone.now(), updated_at=timezone.now(),
        )
        _event(locked, Kind.ACTION, f"{action} asked for by {label}" + (f": {reason}" if reason else ""),
               actor=label)
        audit.record(actor, f"rollout_{action}", locked, tenant=locked.tenant, reason=reason,
                     before={"state": locked.state})
        _enqueue_on_commit(locked.pk)
    locked.refresh_from_db()
    return locked


def requester_person_id(rollout: Rollout) -> int | None:
    if rollout.requested_by_token_id is not None:
        return rollout.requested_by_token.created_by_id
    return rollout.requested_by_id


def approve(actor: Any, rollout: Rollout, reason: str = "") -> Rollout:
    """An approver lets a rollout start, or pass its approval step. People only (not API
    tokens), and never the person who asked for the rollout (directly or through a token)."""
    if token_of(actor) is not None:
        raise PermissionDenied("approvals are decided by people: log in to the console to decide")
    require_role(actor, rollout.tenant, Membership.Role.APPROVER)
    label = actor_label(actor)
    with transaction.atomic():
        locked = Rollout.objects.select_for_update().get(pk=rollout.pk)
        if locked.state != State.PENDING_APPROVAL:
            raise Conflict(f"rollout {locked.pk} is {locked.get_state_display().lower()}: "
                           "nothing waits for an approval", field="action")
        if person_id(actor) == requester_person_id(locked):
            raise PermissionDenied(
                "four-eyes rule: you requested this rollout, so someone else must approve it")
        at_step = locked.strategy == Rollout.Strategy.CANARY and locked.started_at is not None
        RolloutApproval.objects.create(
            rollout=locked, step_index=locked.step_index if at_step else None,
            attempt=locked.attempt, approved_by=actor, approved_by_label=label, reason=reason,
        )
        now = timezone.now()
        to = State.PROGRESSING if at_step else State.LOADING
        Rollout.objects.filter(pk=locked.pk).update(
            state=to, waiting_for="", next_tick_at=now, updated_at=now,
            step_index=locked.step_index + 1 if at_step else locked.step_index,
            step_started_at=now if at_step else locked.step_started_at,
        )
        where = f"step {locked.step_index + 1}" if at_step else "rollout"
        _event(locked, Kind.APPROVAL, f"{where} approved by {label}" + (f": {reason}" if reason else ""),
               state=to, actor=label)
        audit.record(actor, "approved_rollout", locked, tenant=locked.tenant, reason=reason,
                     before={"state": State.PENDING_APPROVAL}, after={"state": to})
        locked.state = to
        _notify(locked, "rollout.state_changed", State.PENDING_APPROVAL)
        _enqueue_on_commit(locked.pk)
    locked.refresh_from_db()
    return locked


def retry(actor: Any, rollout: Rollout, reason: str = "") -> Rollout:
    """Start a rolled back, failed or aborted rollout again from its first step (deployer
    role); it waits for an approval again where it needed one."""
    require_role(actor, rollout.tenant, Membership.Role.DEPLOYER)
    label = actor_label(actor)
    try:
        with transaction.atomic():
            Deployment.objects.select_for_update().only("pk").get(pk=rollout.deployment_id)
            locked = Rollout.objects.select_for_update().get(pk=rollout.pk)
            if locked.state not in Rollout.RETRYABLE:
                raise Conflict(f"rollout {locked.pk} is {locked.get_state_display().lower()}: "
                               "only a rolled back, failed or aborted rollout is retried",
                               field="action")
            _refuse_second(locked.deployment)
            if locked.candidate_id:
                loads.check_loadable(locked.deployment, locked.candidate)
            to = State.PENDING_APPROVAL if locked.requires_approval else State.LOADING
            now = timezone.now()
            Rollout.objects.filter(pk=locked.pk).update(
                state=to, attempt=locked.attempt + 1, step_index=0, step_started_at=None,
                # The loads of this attempt only: a load that failed before is asked again.
                load_ids=[], started_at=None, finished_at=None, failures=0, verdict={}, weights={},
                requested_action="", requested_action_by="", requested_action_reason="",
                waiting_for="an approver who is not the requester" if to == State.PENDING_APPROVAL
                else "", reason=reason, next_tick_at=now, updated_at=now, lease_owner="",
                lease_expires_at=None,
            )
            _event(locked, Kind.ACTION, f"retried by {label} (attempt {locked.attempt + 1})"
                   + (f": {reason}" if reason else ""), state=to, actor=label)
            audit.record(actor, "retried_rollout", locked, tenant=locked.tenant, reason=reason,
                         before={"state": locked.state}, after={"state": to})
            previous, locked.state = locked.state, to
            _notify(locked, "rollout.state_changed", previous)
            _enqueue_on_commit(locked.pk)
    except IntegrityError:
        _refuse_second(rollout.deployment)
        raise
    locked.refresh_from_db()
    return locked


# --------------------------------------------------------------------------------------------
# The reconciler: claiming, writing, recording
# --------------------------------------------------------------------------------------------


def _claim(rollout_id: int, force: bool) -> Rollout | None:
    def due(rollout: Rollout, now: Any) -> bool:
        return rollout.state in Rollout.ACTIVE and (
            force or not (rollout.next_tick_at and rollout.next_tick_at > now))

    return leases.claim(
        Rollout.objects.select_related("deployment__model", "deployment__cluster", "baseline",
                                       "candidate", "tenant"),
        rollout_id, lease_s=settings.SWITCHYARD_ROLLOUT_LEASE_S, due=due,
        on_take_over=lambda rollout, dead: _event(
            rollout, Kind.ERROR, f"took over from a worker whose lease ran out ({dead[:8]})"),
    )


def _update(rollout: Rollout, **fields: Any) -> None:
    """Write fields only while we still hold the lease."""
    leases.update(rollout, **fields)


def _event(rollout: Rollout, kind: str, message: str, *, state: str | None = None,
           data: dict[str, Any] | None = None, actor: str = "system") -> RolloutEvent:
    return RolloutEvent.objects.create(
        rollout=rollout, kind=kind, state=state or rollout.state,
        step_index=rollout.step_index if rollout.current_step is not None else None,
        message=message, data=data or {}, actor_label=actor,
    )


def payload(rollout: Rollout) -> dict[str, Any]:
    """What notifications say about a rollout."""
    deployment = rollout.deployment
    return {
        "id": rollout.pk,
        "tenant": rollout.tenant.slug,
        "deployment": deployment.name,
        "model": deployment.model.name,
        "strategy": rollout.strategy,
        "state": rollout.state,
        "baseline": rollout.baseline.version,
        "candidate": rollout.candidate.version if rollout.candidate_id else None,
        "weights": rollout.weights,
        "step": rollout.step_index,
        "steps": len(rollout.steps),
        "reason": rollout.reason,
        "waiting_for": rollout.waiting_for,
        "path": reverse("rollouts:rollout", args=[rollout.pk]),
    }


def _notify(rollout: Rollout, event: str, previous: str) -> None:
    body = {**payload(rollout), "previous_state": previous}
    webhook_events.emit(rollout.tenant, event, body, summary=_summary(rollout, event))


def _summary(rollout: Rollout, event: str) -> str:
    dep = rollout.deployment.name
    if event == "rollout.approval_needed":
        return f"Rollout {rollout.pk} of {dep} waits for an approval"
    if event == "rollout.rolled_back":
        return f"Rollout {rollout.pk} of {dep} rolled back to v{rollout.baseline.version}: {rollout.reason}"
    return f"Rollout {rollout.pk} of {dep} is {rollout.get_state_display().lower()}" + (
        f": {rollout.reason}" if rollout.reason and rollout.state in Rollout.FINAL else "")


def _move(rollout: Rollout, to: str, message: str, *, kind: str = Kind.STATE,
          data: dict[str, Any] | None = None, **fields: Any) -> None:
    previous = rollout.state
    with transaction.atomic():  # the state, its event and its notification, together
        _update(rollout, state=to, **fields)
        _event(rollout, kind, message, data=data)
        if to != previous:
            _notify(rollout, "rollout.state_changed", previous)
            if to == State.ROLLED_BACK:
                _notify(rollout, "rollout.rolled_back", previous)
            if to == State.PENDING_APPROVAL:
                _notify(rollout, "rollout.approval_needed", previous)


# --------------------------------------------------------------------------------------------
# Traffic
# --------------------------------------------------------------------------------------------


def _route(rollout: Rollout, weights: dict[int, int], why: str, *, sticky: bool = False) -> None:
    """Put ``weights`` (by version) in force on the deployment's route, by the system on the
    rollout's behalf; the route in force already is a no-op. Raises the route's errors."""
    policy = "sticky" if sticky and rollout.sticky_header else "weighted"
    routes.set_route_as_system(
        rollout.deployment, {n: w for n, w in weights.items()}, policy=policy,
        sticky_header=rollout.sticky_header if policy == "sticky" else "",
        reason=f"rollout {rollout.pk}: {why}",
    )


def _back_to_baseline(rollout: Rollout, why: str, ends_as: str, *,
                      data: dict[str, Any] | None = None) -> None:
    """All traffic to the baseline now; the rollout ends as ``ends_as`` (rolled_back or
    aborted), or stays rolling_back while the router does not take the change."""
    base = rollout.baseline.version
    try:
        if rollout.weights:  # the rollout moved traffic: all of it back (a route it never
            # touched, before its first step, stays as its owners set it)
            _route(rollout, {base: 100}, f"back to v{base}: {why}")
    except DomainError as exc:
        if isinstance(exc, Conflict):  # the router refused, or another change holds the route
            _move(rollout, State.ROLLING_BACK,
                  f"{why}; the router has not taken the way back to v{base} yet ({exc.message}): "
                  "trying again next tick", kind=Kind.ROLLBACK, data=data or {}, reason=why,
                  waiting_for=ends_as)
            return
        _move(rollout, State.FAILED,
              f"{why}; traffic cannot go back to v{base}: {exc.message}. A person must route "
              "the deployment by hand", kind=Kind.ERROR, data=data or {}, reason=why,
              finished_at=timezone.now(), waiting_for="")
        return
    _move(rollout, ends_as, f"{why}: all traffic back on v{base}", kind=Kind.ROLLBACK,
          data=data or {}, reason=why, weights={str(base): 100}, finished_at=timezone.now(),
          waiting_for="", requested_action="")
    if rollout.strategy == Rollout.Strategy.CANARY and rollout.candidate_id:
        _unload(rollout, rollout.candidate, "the rollout went back to the baseline",
                own_only=True)


def _unload(rollout: Rollout, version: ModelVersion, why: str, *, own_only: bool = False) -> None:
    """Take ``version`` off the rollout's servers (best effort: a refusal is recorded);
    with ``own_only``, only from the servers where the rollout itself loaded it."""
    names = list(rollout.servers)
    if own_only:
        names = sorted(set(ModelLoad.objects.filter(
            pk__in=rollout.load_ids, version=version).values_list("server__name", flat=True)))
        if not names:
            return
    try:
        taken = loads.unload_for(None, rollout.deployment, version, server_names=names or None,
                                 label=f"rollout {rollout.pk}")
    except DomainError as exc:
        _event(rollout, Kind.LOAD, f"v{version.version} stays loaded ({why}), the unload was "
               f"refused: {exc.message}")
        return
    if taken:
        _event(rollout, Kind.LOAD, f"unloading v{version.version} from "
               f"{', '.join(sorted({load.server.name for load in taken}))}: {why}",
               data={"loads": [load.pk for load in taken]})


# --------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------


def _needed(rollout: Rollout) -> list[ModelVersion]:
    if rollout.strategy == Rollout.Strategy.CANARY:
        return [rollout.candidate]
    numbers = [v["version"] for v in rollout.variants]
    found = {v.version: v for v in rollout.deployment.model.versions.filter(version__in=numbers)}
    return [found[n] for n in numbers]


def _loading(rollout: Rollout) -> bool:
    """Load what the rollout needs on its servers; on to the steps once it is all ready."""
    deployment = rollout.deployment
    servers = {s.name: s for s in deployment.servers.filter(name__in=rollout.servers)}
    started = rollout.started_at
    if started is None:
        _update(rollout, started_at=timezone.now())
        started = rollout.started_at
    waiting: list[str] = []
    load_ids = set(rollout.load_ids)
    for version in _needed(rollout):
        missing = []
        for name in rollout.servers:
            server = servers.get(name)
            if server is None:
                continue
            load = ModelLoad.objects.filter(server=server, version=version).order_by("-created_at").first()
            if load is not None and load.state == ModelLoad.State.READY:
                continue
            if load is not None and load.state in ModelLoad.IN_FLIGHT and not load.is_unload:
                waiting.append(f"v{version.version} on {name} ({load.get_state_display().lower()})")
                load_ids.add(load.pk)
                continue
            if load is not None and load.pk in load_ids and load.state == ModelLoad.State.FAILED:
                why = f"loading v{version.version} on {name} failed: {load.error}"
                _back_to_baseline(rollout, why, State.ROLLED_BACK,
                                  data={"load": load.pk, "error": load.error,
                                        "server_log": load.server_log[-2000:]})
                return False
            if load is not None and load.state == ModelLoad.State.UNLOADING:
                waiting.append(f"v{version.version} on {name} (an unload in flight)")
                load_ids.add(load.pk)  # followed like the rollout's own (run_to_end drives it)
                continue
            missing.append(name)
        if missing:
            try:
                made, _new = loads.load_for(deployment, version, missing, f"rollout {rollout.pk}")
            except DomainError as exc:
                # Over quota, or not loadable any more: the rollout cannot go on.
                _back_to_baseline(rollout, f"loading v{version.version} was refused: {exc.message}",
                                  State.ROLLED_BACK, data={"error": exc.message})
                return False
            load_ids.update(load.pk for load in made)
            _event(rollout, Kind.LOAD, f"loading v{version.version} on {', '.join(missing)}",
                   data={"loads": [load.pk for load in made]})
            waiting.extend(f"v{version.version} on {name}" for name in missing)
    if sorted(load_ids) != sorted(rollout.load_ids):
        _update(rollout, load_ids=sorted(load_ids))
    if waiting:
        text = "loads: " + ", ".join(waiting)
        if rollout.waiting_for != text[:200]:
            _update(rollout, waiting_for=text[:200])
        return False
    if not Route.objects.filter(pk=deployment.pk, state=Route.State.IN_FORCE).exists():
        _route(rollout, {rollout.baseline.version: 100}, "the route the rollout starts from")
    _move(rollout, State.PROGRESSING, "everything the rollout needs is ready on "
          f"{', '.join(rollout.servers)}", step_index=0, step_started_at=timezone.now(),
          waiting_for="")
    return True


def _candidate_samples(rollout: Rollout, seconds: float) -> tuple[dict[int, list[samples.Sample]], float]:
    """The route's samples of the last ``seconds``, by version; and the time they were read."""
    now = time.time()
    route = Route.objects.filter(pk=rollout.deployment_id).first()
    meaning = route.variants if route is not None else {}
    by_version: dict[int, list[samples.Sample]] = {}
    for variant, found in samples.window(rollout.deployment_id, seconds, now=now).items():
        number = (meaning.get(variant) or {}).get("version")
        if number is not None:
            by_version.setdefault(int(number), []).extend(found)
    return by_version, now


def _health_problem(rollout: Rollout) -> tuple[str, dict[str, Any]] | None:
    """Why the versions under test are unhealthy (with the evidence), or None."""
    watched = [v for v in _needed(rollout) if v.pk != rollout.baseline_id]
    servers = list(rollout.deployment.servers.filter(name__in=rollout.servers))
    for version in watched:
        for server in servers:
            load = ModelLoad.objects.filter(server=server, version=version).order_by("-created_at").first()
            if load is None or load.state != ModelLoad.State.READY:
                state = load.get_state_display().lower() if load else "not loaded"
                return (f"v{version.version} is no longer ready on {server.name} ({state})",
                        {"server": server.name, "load": load.pk if load else None,
                         "load_state": load.state if load else None,
                         "error": load.error if load else ""})
            if server.health in (InferenceServer.Health.UNHEALTHY, InferenceServer.Health.UNREACHABLE):
                return (f"{server.name}, serving v{version.version}, is {server.health}: "
                        f"{server.health_detail}",
                        {"server": server.name, "health": server.health,
                         "detail": server.health_detail})
    try:
        by_version, _ = _candidate_samples(rollout, UPSTREAM_WINDOW_S)
    except Exception as exc:  # redis down: the analysis says so; health is not judged on it
        log.warning("rollout %s: cannot read samples: %s", rollout.pk, exc)
        return None
    for version in watched:
        found = by_version.get(version.version, [])
        failed = [s for s in found if s.upstream_failed]
        if len(failed) >= UPSTREAM_MIN and len(failed) >= UPSTREAM_SHARE * len(found):
            return (f"v{version.version}'s server did not answer {len(failed)} of its "
                    f"{len(found)} requests in the last {UPSTREAM_WINDOW_S:g} s",
                    {"requests": len(found), "upstream_failures": len(failed),
                     "statuses": sorted({s.status for s in failed})})
    return None


def _watch(rollout: Rollout) -> bool:
    """Roll back when the versions under test are unhealthy; True when it did."""
    problem = _health_problem(rollout)
    if problem is None:
        return False
    why, evidence = problem
    _back_to_baseline(rollout, why, State.ROLLED_BACK, data={"health": evidence})
    return True


def _progressing(rollout: Rollout) -> bool:
    if _watch(rollout):
        return False
    if rollout.strategy == Rollout.Strategy.AB:
        return _ab_tick(rollout)
    step = rollout.current_step
    if step is None:
        _move(rollout, State.PROMOTING, "every step passed: promoting "
              f"v{rollout.candidate.version}", waiting_for="")
        return True
    (kind, value), = step.items()
    return STEP_KINDS[kind](rollout, value)


def _next_step(rollout: Rollout, message: str, data: dict[str, Any] | None = None, **fields: Any) -> None:
    with transaction.atomic():
        index = rollout.step_index
        _event(rollout, Kind.STEP, message, data=data)
        _update(rollout, step_index=index + 1, step_started_at=timezone.now(), waiting_for="",
                failures=0, **fields)


def _set_weight(rollout: Rollout, weight: int) -> bool:
    base, cand = rollout.baseline.version, rollout.candidate.version
    weights = {base: 100 - weight, cand: weight} if weight < 100 else {cand: 100}
    try:
        _route(rollout, weights, f"step {rollout.step_index + 1}: {weight}% to v{cand}")
    except DomainError as exc:
        if isinstance(exc, Conflict):  # refused or busy for now: try again next tick
            _event(rollout, Kind.ERROR, f"setting {weight}% to v{cand} did not take: "
                   f"{exc.message}; trying again next tick")
            return False
        raise
    _next_step(rollout, f"step {rollout.step_index + 1}: {weight}% of the traffic to v{cand}, "
               f"{100 - weight}% to v{base}",
               weights={str(base): 100 - weight, str(cand): weight})
    return True


def _pause(rollout: Rollout, value: dict[str, Any]) -> bool:
    seconds = value.get("seconds")
    started = rollout.step_started_at or timezone.now()
    if seconds is None:
        _move(rollout, State.PAUSED, f"step {rollout.step_index + 1}: paused until a person "
              "resumes", waiting_for=f"a person to resume (step {rollout.step_index + 1})")
        return False
    until = started + timedelta(seconds=seconds)
    if timezone.now() >= until:
        _next_step(rollout, f"step {rollout.step_index + 1}: paused {seconds:g} s")
        return True
    text = f"pause until {until.strftime('%H:%M:%S %Z')}"
    if rollout.waiting_for != text:
        _update(rollout, waiting_for=text)
    return False


def _approval_step(rollout: Rollout, _value: dict[str, Any]) -> bool:
    _move(rollout, State.PENDING_APPROVAL, f"step {rollout.step_index + 1}: waiting for an "
          "approver who is not the requester",
          waiting_for=f"an approver who is not the requester (step {rollout.step_index + 1})")
    return False


def analysis_config(rollout: Rollout, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings an analysis runs with: defaults, the rollout's, the step's; the SLO
    ceilings from the deployment where none were given."""
    config = {**ANALYSIS_DEFAULTS, **(rollout.analysis or {}), **(overrides or {})}
    if config["max_p99_ms"] is None:
        config["max_p99_ms"] = float(rollout.deployment.slo_p99_ms)
    if config["max_error_rate"] is None:
        config["max_error_rate"] = float(rollout.deployment.slo_error_rate)
    return config


def slo_gates(found: list[samples.Sample], config: dict[str, Any]) -> dict[str, Any]:
    """The candidate's p50/p95/p99 and error rate against their ceilings (those set)."""
    summary = samples.summarize(found, 1.0)
    gates = []
    for name, key, limit_key in (("p50", "p50_ms", "max_p50_ms"), ("p95", "p95_ms", "max_p95_ms"),
                                 ("p99", "p99_ms", "max_p99_ms"),
                                 ("error rate", "error_rate", "max_error_rate")):
        limit = config.get(limit_key)
        if limit is None:
            continue
        value = summary.get(key)
        gates.append({"name": name, "value": value, "limit": limit,
                      "ok": value is None or value <= limit})
    checked = len(found) >= config["min_samples"]
    return {"checked": checked, "samples": len(found), "gates": gates,
            "ok": not checked or all(g["ok"] for g in gates)}


def _analysis_step(rollout: Rollout, overrides: dict[str, Any]) -> bool:
    config = analysis_config(rollout, overrides)
    row, _ = RolloutAnalysis.objects.get_or_create(
        rollout=rollout, attempt=rollout.attempt, step_index=rollout.step_index,
        defaults={"window_start": time.time(), "weight": rollout.candidate_weight,
                  "config": config},
    )
    if row.verdict != Verdict.RUNNING:  # decided by a worker that died before moving on
        return _after_analysis(rollout, row)
    judge_config = analysis.JudgeConfig(
        planned_samples=config["planned_samples"], min_samples=config["min_samples"],
        latency_tolerance_pct=config["latency_tolerance_pct"],
        error_tolerance_pct=config["error_tolerance_pct"], alpha=config["alpha"],
    )
    try:
        by_version, now = _candidate_samples(rollout, max(time.time() - row.window_start, 0.001))
    except Exception as exc:
        _event(rollout, Kind.ERROR, f"cannot read the route's samples: {exc}")
        return False
    canary = by_version.get(rollout.candidate.version, [])
    baseline = by_version.get(rollout.baseline.version, [])
    gates = slo_gates(canary, config)
    if row.weight >= 100:
        # No baseline traffic to compare with: the SLO gates alone decide.
        judgement = analysis.Judgement(
            analysis.PASS if gates["checked"] else analysis.INCONCLUSIVE,
            ["the canary carries all traffic: judged by the SLO gates alone"
             + ("" if gates["checked"] else f" once it has {config['min_samples']} requests")],
            len(canary), 0, min(len(canary) / config["planned_samples"], 1.0), 0.0, 0.0)
    else:
        judgement = analysis.judge_samples(canary, baseline, judge_config, spent_before=row.spent)
    reasons = list(judgement.reasons)
    verdict = judgement.verdict
    if not gates["ok"]:
        verdict = analysis.FAIL
        reasons = [f"SLO: the canary's {g['name']} is {g['value']:.4g} against a ceiling of "
                   f"{g['limit']:g}" for g in gates["gates"] if not g["ok"]] + (
            reasons if judgement.verdict == analysis.FAIL else [])
    elapsed = now - row.window_start
    if verdict == analysis.INCONCLUSIVE and (judgement.information >= 1 or elapsed >= config["timeout_s"]):
        ended = verdict
        if judgement.information < 1:
            reasons.append(f"{elapsed:.0f} s passed without a verdict (timeout {config['timeout_s']} s)")
    else:
        ended = verdict if verdict != analysis.INCONCLUSIVE else Verdict.RUNNING
    fields: dict[str, Any] = {
        "looks": row.looks + 1, "spent": judgement.spent, "judgement": judgement.to_json(),
        "slo": gates, "reasons": reasons, "updated_at": timezone.now(),
    }
    if ended == analysis.FAIL:
        fields["failed_looks"] = row.failed_looks + 1
        if fields["failed_looks"] <= config["failure_limit"]:
            # Within the failures allowed: judge again on a fresh window.
            fields.update(window_start=time.time(), spent=0.0)
            RolloutAnalysis.objects.filter(pk=row.pk).update(**fields)
            _event(rollout, Kind.ANALYSIS, f"analysis failed a look ({fields['failed_looks']} of "
                   f"{config['failure_limit']} allowed): {'; '.join(reasons)}; judging again",
                   data={"analysis": row.pk, "judgement": fields["judgement"], "slo": gates})
            return False
    if ended != Verdict.RUNNING:
        fields.update(verdict=ended, finished_at=timezone.now())
    RolloutAnalysis.objects.filter(pk=row.pk).update(**fields)
    for key, value in fields.items():
        setattr(row, key, value)
    if ended == Verdict.RUNNING:
        return False
    return _after_analysis(rollout, row)


def _after_analysis(rollout: Rollout, row: RolloutAnalysis) -> bool:
    evidence = {"analysis": row.pk, "judgement": row.judgement, "slo": row.slo}
    text = "; ".join(row.reasons)
    if row.verdict == Verdict.PASS:
        _next_step(rollout, f"step {rollout.step_index + 1}: analysis passed at "
                   f"{row.weight}%: {text}", data=evidence)
        return True
    if row.verdict == Verdict.FAIL:
        _back_to_baseline(rollout, f"analysis failed at {row.weight}% to "
                          f"v{rollout.candidate.version}: {text}", State.ROLLED_BACK, data=evidence)
        return False
    _move(rollout, State.PAUSED, f"step {rollout.step_index + 1}: analysis inconclusive: {text}",
          kind=Kind.ANALYSIS, data=evidence,
          waiting_for="a person: the analysis was inconclusive (resume accepts it, abort goes back)")
    return False


def _benchmark_step(rollout: Rollout, value: dict[str, Any]) -> bool:
    """The benchmark gate: the candidate's measured capacity against the baseline's."""
    from rollouts.benchmarks import results as benchmark_results

    found = benchmark_results.gate(rollout.candidate, rollout.baseline, value.get("max_drop_pct", 10),
                                mode=value.get("mode"))
    step = f"step {rollout.step_index + 1}: benchmark gate"
    if found["passed"] is True:
        _next_step(rollout, f"{step} passed: {found['message']}", data={"benchmark": found})
        return True
    if found["passed"] is False:
        _back_to_baseline(rollout, f"{step} failed: {found['message']}", State.ROLLED_BACK,
                          data={"benchmark": found})
        return False
    _move(rollout, State.PAUSED, f"{step}: {found['message']}", data={"benchmark": found},
          waiting_for="a person: the benchmark gate has nothing to compare (run the "
                      "benchmarks, then resume to judge again; promote skips it)")
    return False


STEP_KINDS: dict[str, Callable[[Rollout, Any], bool]] = {
    "set_weight": _set_weight,
    "pause": _pause,
    "analysis": _analysis_step,
    "approval": _approval_step,
    "benchmark": _benchmark_step,
}


def _ab_tick(rollout: Rollout) -> bool:
    weights = {v["version"]: v["weight"] for v in rollout.variants}
    if not rollout.weights:
        try:
            _route(rollout, weights, "A/B split", sticky=True)
        except Conflict as exc:
            _event(rollout, Kind.ERROR, f"the split did not take: {exc.message}; trying again")
            return False
        with transaction.atomic():
            _update(rollout, weights={str(k): w for k, w in weights.items()},
                    step_started_at=timezone.now())
            _event(rollout, Kind.STEP, "split in force: " + ", ".join(
                f"v{k} {w}%" for k, w in weights.items())
                + (f", sticky by {rollout.sticky_header}" if rollout.sticky_header else ""))
        return False
    started = rollout.step_started_at or timezone.now()
    elapsed = (timezone.now() - started).total_seconds()
    try:
        by_version, _ = _candidate_samples(rollout, max(elapsed, 0.001))
    except Exception as exc:
        _event(rollout, Kind.ERROR, f"cannot read the route's samples: {exc}")
        return False
    counts = {n: len(by_version.get(n, [])) for n in weights}
    done_by_time = rollout.duration_s is not None and elapsed >= rollout.duration_s
    done_by_size = rollout.sample_size is not None and min(counts.values()) >= rollout.sample_size
    if not (done_by_time or done_by_size):
        text = "collecting: " + ", ".join(f"v{n} {c}" for n, c in counts.items()) + " requests"
        if rollout.waiting_for != text:
            _update(rollout, waiting_for=text[:200])
        return False
    result = ab_verdict(rollout, by_version)
    winner = result.get("winner")
    if rollout.promote and winner is not None and winner != rollout.baseline.version:
        with transaction.atomic():
            _update(rollout, verdict=result,
                    candidate=rollout.deployment.model.versions.get(version=winner))
            _move(rollout, State.PROMOTING, f"verdict: {result['summary']}; promoting v{winner}",
                  kind=Kind.ANALYSIS, data=result, waiting_for="")
        return True
    base = rollout.baseline.version
    try:
        _route(rollout, {base: 100}, f"A/B ended: back to v{base}")
    except Conflict as exc:
        _event(rollout, Kind.ERROR, f"going back to v{base} did not take: {exc.message}")
        return False
    _move(rollout, State.SUCCEEDED, f"verdict: {result['summary']}; all traffic back on v{base}",
          kind=Kind.ANALYSIS, data=result, verdict=result, weights={str(base): 100},
          reason=result["summary"], finished_at=timezone.now(), waiting_for="")
    return False


def ab_verdict(rollout: Rollout, by_version: dict[int, list[samples.Sample]]) -> dict[str, Any]:
    """Each variant against the reference: p50/p95 and error-rate differences with their
    intervals, whether the sample could see the effect the team set (``analysis``'s
    ``latency_tolerance_pct``), how many more requests it needs if not, and a summary."""
    config = analysis_config(rollout)
    reference = rollout.baseline.version
    ref = by_version.get(reference, [])
    rows = []
    for item in rollout.variants[1:]:
        number = item["version"]
        found = by_version.get(number, [])
        if len(found) < 2 or len(ref) < 2:
            rows.append({"version": number, "samples": len(found), "reference_samples": len(ref),
                         "enough": False, "difference": "unknown",
                         "note": "too few requests to compare"})
            continue
        diff = analysis.ab_difference(
            f"v{number}", [s.latency_ms for s in found], sum(s.is_error for s in found),
            f"v{reference}", [s.latency_ms for s in ref], sum(s.is_error for s in ref),
            effect_pct=max(config["latency_tolerance_pct"], 0.1), alpha=config["alpha"],
        )
        data = dataclasses.asdict(diff)
        p50, p95, err = diff.p50_diff_ms, diff.p95_diff_ms, diff.error_diff_pct
        slower = p50.low > 0 or p95.low > 0
        faster = p50.high < 0 or p95.high < 0
        more_errors, fewer_errors = err.low > 0, err.high < 0
        if (slower or more_errors) and not (faster or fewer_errors):
            difference = "worse"
        elif (faster or fewer_errors) and not (slower or more_errors):
            difference = "better"
        elif slower or faster or more_errors or fewer_errors:
            difference = "mixed"
        else:
            difference = "none"
        rows.append({"version": number, **_jsonable(data), "difference": difference})
    better = [r for r in rows if r["difference"] == "better"]
    if all(r["difference"] == "none" for r in rows):
        summary = "no difference between the variants"
        if not all(r.get("enough") for r in rows):
            summary += " (the sample was too small to rule out the effect set)"
    else:
        summary = "; ".join(f"v{r['version']} {r['difference']} than v{reference}"
                            if r["difference"] in ("worse", "better") else
                            f"v{r['version']}: {r['difference']}" for r in rows)
    winner = None
    if better:
        winner = min(better, key=lambda r: r["p50_diff_ms"]["estimate"])["version"]
    return {"reference": reference, "variants": rows, "summary": summary, "winner": winner,
            "samples": {str(n): len(v) for n, v in by_version.items()}}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return _jsonable(dict(value.__dict__))
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


def _paused(rollout: Rollout) -> bool:
    _watch(rollout)
    return False


def _promoting(rollout: Rollout) -> bool:
    cand = rollout.candidate.version
    try:
        _route(rollout, {cand: 100}, f"promoting v{cand}")
    except Conflict as exc:
        _event(rollout, Kind.ERROR, f"promotion did not take: {exc.message}; trying again")
        return False
    moved = ""
    if rollout.alias:
        # The production alias names approved versions only: a promotion of any other
        # version (on a deployment that is not production) leaves it where it is, and says so.
        try:
            registry.move_alias(None, rollout.deployment.model, rollout.alias, rollout.candidate,
                                f"promoted by rollout {rollout.pk}")
            moved = f"; the {rollout.alias} alias now names v{cand}"
        except DomainError as exc:
            moved = f"; the {rollout.alias} alias was left where it was: {exc.message}"
    _move(rollout, State.SUCCEEDED, f"v{cand} promoted: all traffic{moved}",
          weights={str(cand): 100}, finished_at=timezone.now(), waiting_for="",
          reason=rollout.reason if rollout.strategy == Rollout.Strategy.AB else f"v{cand} promoted")
    if rollout.unload_previous and rollout.baseline_id != rollout.candidate_id:
        _unload(rollout, rollout.baseline, f"v{cand} replaced it")
    return False


def _rolling_back(rollout: Rollout) -> bool:
    _back_to_baseline(rollout, rollout.reason or "rolling back", rollout.waiting_for
                      if rollout.waiting_for in (State.ROLLED_BACK, State.ABORTED) else
                      State.ROLLED_BACK)
    return False


def _pending(rollout: Rollout) -> bool:
    return False


STEPS: dict[str, Callable[[Rollout], bool]] = {
    State.PENDING_APPROVAL: _pending,
    State.LOADING: _loading,
    State.PROGRESSING: _progressing,
    State.PAUSED: _paused,
    State.PROMOTING: _promoting,
    State.ROLLING_BACK: _rolling_back,
}


def _carry_out(rollout: Rollout) -> bool:
    """The action a person asked for, under the lease; True when it was one."""
    action, who = rollout.requested_action, rollout.requested_action_by
    if not action:
        return False
    why = rollout.requested_action_reason
    said = f" ({why})" if why else ""
    if rollout.state not in ACTION_FROM.get(action, []):
        _update(rollout, requested_action="")
        _event(rollout, Kind.ACTION, f"{action} by {who} no longer applies: the rollout is "
               f"{rollout.get_state_display().lower()}")
        return True
    if action == Rollout.Action.ABORT:
        _update(rollout, requested_action="")
        _back_to_baseline(rollout, f"aborted by {who}{said}", State.ABORTED)
    elif action == Rollout.Action.PAUSE:
        _move(rollout, State.PAUSED, f"paused by {who}{said}", kind=Kind.ACTION,
              requested_action="", waiting_for=f"a person to resume (paused by {who})")
    elif action == Rollout.Action.PROMOTE:
        _move(rollout, State.PROMOTING, f"promotion asked for by {who}{said}: the remaining "
              "steps are skipped", kind=Kind.ACTION, requested_action="", waiting_for="")
    elif action == Rollout.Action.RESUME:
        step = rollout.current_step or {}
        row = RolloutAnalysis.objects.filter(rollout=rollout, attempt=rollout.attempt,
                                             step_index=rollout.step_index).first()
        accept = ("pause" in step and not step["pause"].get("seconds")) or (
            "analysis" in step and row is not None and row.verdict == Verdict.INCONCLUSIVE)
        with transaction.atomic():
            _move(rollout, State.PROGRESSING, f"resumed by {who}{said}"
                  + ("; the step is accepted" if accept else ""), kind=Kind.ACTION,
                  requested_action="", waiting_for="")
            if accept:
                _next_step(rollout, f"step {rollout.step_index + 1} accepted by {who}")
    return True


def advance(rollout_id: int, *, force: bool = False) -> tuple[str | None, bool]:
    """Do at most one step of a rollout. Returns (the state it left, whether the next step
    may follow at once); (None, False) when nothing was done (not due, or another worker
    holds it). ``force`` skips the wait for the next tick (actions, tests).

    An unexpected exception is a bug: traffic goes back to the baseline and the rollout
    fails with a readable reason, the traceback kept in its timeline. A database error is
    left to propagate: the lease runs out and the next tick repeats the step.
    """
    rollout = _claim(rollout_id, force)
    if rollout is None:
        return None, False
    with logs.acting_for(rollout.request_id, rollout=rollout.pk):
        return _advance(rollout)


def _heartbeat(rollout: Rollout) -> contextlib.AbstractContextManager[None]:
    """Keep the lease alive while a step runs (:func:`leases.heartbeat`): renewed every third
    of ``SWITCHYARD_ROLLOUT_LEASE_S``, for at most ``SWITCHYARD_ROUTE_APPLY_LEASE_S`` (the
    longest a route change may hold its route) plus a lease."""
    lease_s = settings.SWITCHYARD_ROLLOUT_LEASE_S
    return leases.heartbeat(rollout, lease_s=lease_s,
                            max_s=settings.SWITCHYARD_ROUTE_APPLY_LEASE_S + lease_s)


def _advance(rollout: Rollout) -> tuple[str | None, bool]:
    rollout_id = rollout.pk
    again = False
    try:
        try:
            with _heartbeat(rollout):
                if not _carry_out(rollout):
                    again = STEPS[rollout.state](rollout)
        except (leases.LostLease, DatabaseError):
            raise
        except Exception as exc:
            log.exception("rollout %s: unexpected error in %s", rollout_id, rollout.state)
            _event(rollout, Kind.ERROR, f"unexpected error while {rollout.state}",
                   data={"trace": traceback.format_exc()[-4000:]})
            _back_to_baseline(rollout, f"Switchyard failed unexpectedly while "
                              f"{rollout.get_state_display().lower()} ({type(exc).__name__}: "
                              f"{exc})", State.FAILED)
    except leases.LostLease:
        log.info("rollout %s: another worker took over", rollout_id)
        return None, False
    finally:
        leases.release(
            rollout,
            # The next step at once when it may follow (the task sends it); else half an
            # interval, so the next beat tick finds it due, whatever its jitter.
            next_tick_at=timezone.now() if again else timezone.now() + timedelta(
                seconds=settings.SWITCHYARD_ROLLOUT_INTERVAL_S / 2),
        )
    return rollout.state, again and rollout.state in Rollout.ACTIVE


def due_rollouts() -> list[int]:
    """Rollouts a tick should advance: active, not leased, due."""
    now = timezone.now()
    return list(
        Rollout.objects.filter(state__in=Rollout.ACTIVE)
        .exclude(state=State.PENDING_APPROVAL, requested_action="")
        .exclude(lease_expires_at__gt=now)
        .exclude(next_tick_at__gt=now)
        .values_list("pk", flat=True)
    )


def run_to_end(rollout_id: int, *, max_ticks: int = 600, tick_s: float = 0.25,
               until: Callable[[Rollout], bool] | None = None) -> Rollout:
    """Advance the rollout, and the loads it asked for, until it ends, waits for a person or
    ``until`` says so (for scripts, the bench and tests: no worker needed); a tick every
    ``tick_s``."""
    for _ in range(max_ticks):
        rollout = Rollout.objects.get(pk=rollout_id)
        if rollout.state in Rollout.FINAL or (until is not None and until(rollout)) or (
            rollout.state in (State.PAUSED, State.PENDING_APPROVAL) and not rollout.requested_action
        ):
            return rollout
        for load_id in rollout.load_ids:
            load_reconciler.advance(load_id)
        _state, again = advance(rollout_id, force=True)
        if not again:
            time.sleep(tick_s)
    return Rollout.objects.get(pk=rollout_id)
