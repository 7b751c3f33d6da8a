"""Rollouts as people and the API ask for them: a canary moved by evidence, or an A/B split
ended by a verdict.

:func:`create_rollout` checks a request (with :mod:`rollouts.canary.specs`) and writes the row;
:func:`request_action` records a pause, resume, promotion or abort for the reconciler
(:mod:`rollouts.canary.reconciler`) to carry out at its next tick; :func:`approve` lets a
rollout start or pass its approval step, and :func:`retry` starts an ended one again. Each
sends the reconciler's task by name once its transaction commits, so the next step follows at
once.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from console import logs
from console.celery import send_soon
from console.exceptions import Conflict, DomainError, FieldErrors
from fleet import audit
from fleet.audit import actor_label
from fleet.inventory.routers import has_router
from fleet.models import Membership, Webhook
from fleet.tenancy.scoping import require_role, token_of
from fleet.tenancy.tokens import person_id
from rollouts import idempotency
from rollouts.canary import analysis, specs
from rollouts.canary.specs import ACTION_FROM
from rollouts.canary.timeline import notify, record_event
from rollouts.loads import requests as loads
from rollouts.models import (
    Deployment,
    ModelVersion,
    Rollout,
    RolloutApproval,
    RolloutEvent,
    Route,
)
from rollouts.traffic import routes

State = Rollout.State
Kind = RolloutEvent.Kind


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
    dry_run: bool = False,
    servers: list[str] | None = None,
    require_approval: bool = False,
    idempotency_key: str = "",
    reason: str = "",
    errors: FieldErrors | None = None,
) -> tuple[Rollout, bool]:
    """Ask for a rollout of the deployment (deployer role); returns (rollout, made now).

    Canary: ``version`` is the candidate's number; ``baseline`` defaults to the version that
    carries the most traffic (else the production alias, else the newest ready version), and
    must be ready. A/B: ``variants`` [{version, weight}] (the first is the reference) and
    ``duration_s`` and/or ``sample_size`` (requests a variant). A canary's ``dry_run`` makes
    every weight copies of that share of the requests, judged against the baseline's answers,
    and ends without moving traffic or promoting. A production deployment (or
    ``require_approval``) waits for an approver first. A second rollout while one is in
    flight on the deployment is a Conflict on ``deployment``; the same ``idempotency_key``
    replays the first request (a Conflict if it asked for something else). Every field
    refused is named in one answer; ``errors`` carries refusals found before (an API body's
    shape), so that answer names those too.
    """
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    # Every field the request got wrong is named in one answer (errors.gather keeps a field's
    # refusal and goes on); a conflict with the deployment's state is answered at once.
    errors = FieldErrors() if errors is None else errors
    header, seconds, size, alias_given = "", None, None, None
    # What the request says on its own, whatever the deployment's state (as the API's body
    # was checked before anything else).
    with errors.gather():
        header = specs.sticky_header(sticky_header)
    with errors.gather():
        seconds = specs.duration_s(duration_s)
    with errors.gather():
        size = specs.sample_size(sample_size)
    with errors.gather():
        alias_given = None if alias is None else specs.alias_name(alias)
    if deployment.archived_at is not None:
        raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
    if not has_router(deployment.cluster):
        raise Conflict(f"cluster {deployment.cluster.name} has no traffic router: rollouts "
                       "move traffic through one", field="deployment")
    with errors.gather():
        if strategy not in Rollout.Strategy.values:
            raise DomainError(f"one of {', '.join(Rollout.Strategy.values)}", field="strategy")
    with errors.gather():
        if dry_run and strategy == Rollout.Strategy.AB:
            raise DomainError("a dry run is a canary's: an A/B split's verdict needs real "
                              "traffic on each variant", field="dry_run")
    ready = _ready_numbers(deployment)
    if not ready:
        raise Conflict(f"no version of {deployment.model.name} is ready on deployment "
                       f"{deployment.name}: load the stable version first", field="deployment")
    settings_given: dict[str, Any] = {}
    webhooks = set(Webhook.objects.filter(tenant=deployment.tenant, active=True)
                   .values_list("name", flat=True))
    with errors.gather():
        settings_given = analysis.parse_analysis(analysis_settings)
        if settings_given.get("rollback"):
            specs.check_webhook(settings_given["rollback"]["webhook"], webhooks,
                                "analysis.rollback.webhook")
        if settings_given.get("bake_s") and strategy == Rollout.Strategy.AB:
            raise DomainError("an A/B split has no bake: it ends with its verdict",
                              field="analysis.bake_s")
    fields: dict[str, Any] = {
        "strategy": strategy, "analysis": settings_given, "sticky_header": header,
        "unload_previous": bool(unload_previous), "dry_run": bool(dry_run),
        "requires_approval": bool(require_approval or deployment.production),
    }
    alias_chosen = (routes.PRODUCTION_ALIAS if deployment.production else "") if (
        alias_given is None) else alias_given
    if strategy == Rollout.Strategy.CANARY:
        candidate, base_number, parsed_steps = None, None, None
        with errors.gather():
            if version is None:
                raise DomainError("name the version to roll out", field="version")
            candidate = specs.find_version(deployment, version, "version")
        with errors.gather():
            base_number = _default_baseline(deployment, ready) if baseline is None else int(
                specs.find_version(deployment, baseline, "baseline").version)
            if base_number not in ready:
                raise DomainError(f"v{base_number} is not ready on the deployment's servers: "
                                  "the baseline carries the traffic back", field="baseline")
        with errors.gather():
            parsed_steps = specs.parse_steps(steps, webhooks=webhooks)
        if candidate is not None and base_number is not None:
            with errors.gather():
                if candidate.version == base_number:
                    raise DomainError(f"v{candidate.version} is the baseline already",
                                      field="version")
                loads.check_loadable(deployment, candidate)
                chosen = _canary_servers(deployment, candidate, base_number, ready, servers)
                loads.check_runtime(candidate, list(deployment.servers.filter(name__in=chosen)))
                fields.update(baseline=deployment.model.versions.get(version=base_number),
                              candidate=candidate, servers=chosen)
        errors.raise_any()
        fields.update(steps=parsed_steps, promote=True, alias=alias_chosen)
    elif strategy == Rollout.Strategy.AB:
        parsed: list[dict[str, Any]] = []
        with errors.gather():
            parsed = specs.ab_variants(deployment, variants)
            for item in parsed:
                loads.check_loadable(deployment,
                                     deployment.model.versions.get(version=item["version"]))
        with errors.gather():
            if seconds is None and size is None and not errors.refused("duration_s",
                                                                       "sample_size"):
                raise DomainError("an A/B split ends after duration_s seconds or sample_size "
                                  "requests a variant: give one", field="duration_s")
        names = list(deployment.servers.order_by("name").values_list("name", flat=True))
        with errors.gather():
            if servers:
                unknown = sorted(set(servers) - set(names))
                if unknown:
                    raise DomainError(f"deployment {deployment.name} has no server named "
                                      f"{', '.join(unknown)}", field="servers")
                names = sorted(set(servers))
        errors.raise_any()
        fields.update(
            baseline=deployment.model.versions.get(version=parsed[0]["version"]),
            variants=parsed, servers=names, promote=bool(promote),
            duration_s=seconds, sample_size=size, alias=alias_chosen,
        )
    errors.raise_any()
    fingerprint = idempotency.fingerprint(deployment=deployment, **fields)
    # Should two requests race past the checks, the constraints decide, and say which.
    return idempotency.create_once(
        lambda: _create(actor, deployment, fields, idempotency_key, fingerprint, reason),
        key=idempotency_key, replay=lambda: _replay(deployment, idempotency_key, fingerprint),
        refuse=lambda: _refuse_second(deployment))


def _replay(deployment: Deployment, key: str, fingerprint: str) -> Rollout | None:
    earlier = Rollout.objects.filter(tenant=deployment.tenant, idempotency_key=key).first()
    if earlier is None:
        return None
    idempotency.check_replay(earlier.request_fingerprint, fingerprint)
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
        record_event(rollout, Kind.REQUEST, f"{what} requested by {rollout.requested_by_label}"
               + (f": {reason}" if reason else ""), actor=rollout.requested_by_label,
               data={"steps": rollout.steps, "analysis": rollout.analysis})
        audit.record(actor, "requested_rollout", rollout, tenant=deployment.tenant,
                     after={"strategy": rollout.strategy, "versions": rollout.versions},
                     reason=reason)
        if pending:
            record_event(rollout, Kind.APPROVAL, "waiting for an approver who is not the requester "
                   f"({'a production deployment' if deployment.production else 'asked for'})")
            notify(rollout, "rollout.approval_needed", "")
        _enqueue_on_commit(rollout.pk)
    return rollout, True


def _enqueue_on_commit(rollout_id: int) -> None:
    send_soon("rollouts.tasks.advance_rollout", rollout_id)


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
        if action == Rollout.Action.PROMOTE and locked.dry_run:
            raise Conflict("a dry run moves no traffic and promotes nothing: start a rollout "
                           "to promote", field="action")
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
        record_event(locked, Kind.ACTION, f"{action} asked for by {label}" + (f": {reason}" if reason else ""),
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
        record_event(locked, Kind.APPROVAL, f"{where} approved by {label}" + (f": {reason}" if reason else ""),
               state=to, actor=label)
        audit.record(actor, "approved_rollout", locked, tenant=locked.tenant, reason=reason,
                     before={"state": State.PENDING_APPROVAL}, after={"state": to})
        locked.state = to
        notify(locked, "rollout.state_changed", State.PENDING_APPROVAL)
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
            record_event(locked, Kind.ACTION, f"retried by {label} (attempt {locked.attempt + 1})"
                   + (f": {reason}" if reason else ""), state=to, actor=label)
            audit.record(actor, "retried_rollout", locked, tenant=locked.tenant, reason=reason,
                         before={"state": locked.state}, after={"state": to})
            previous, locked.state = locked.state, to
            notify(locked, "rollout.state_changed", previous)
            _enqueue_on_commit(locked.pk)
    except IntegrityError:
        _refuse_second(rollout.deployment)
        raise
    locked.refresh_from_db()
    return locked
