"""The rollout reconciler: it advances rollouts tick by tick.

:func:`advance` is what Celery calls (beat every ``SWITCHYARD_ROLLOUT_INTERVAL_S``, and a task
sent after each request, action and step that lets the next one follow at once). It claims the
row with a lease (:mod:`rollouts.leases`, kept alive by a heartbeat while a step runs), carries
out the action a person asked for or at most one step (the steps are listed in
:mod:`rollouts.canary.specs` and carried out in :mod:`rollouts.canary.steps`, through
:mod:`rollouts.canary.actions`), records what it saw and did on the timeline (with the
evidence) and returns. Every step is idempotent: the weight of a step is put in force and the step index
moved on only while the lease is held, so a step repeated by another worker after one died
changes nothing twice.

What to do is decided in :mod:`rollouts.canary.analysis` (the health watch every tick of a
running rollout, the analysis looks, the A/B verdict); here it is carried out. Rolling back
puts 100% of the traffic on the baseline in the tick that found the failure; should the router
refuse the change for now, the rollout stays ``rolling_back`` and the next tick tries again.
The candidate's loads are then unloaded (the quota comes back).
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
from console.exceptions import Conflict, DomainError
from rollouts import leases
from rollouts.canary import actions, analysis, judge, policy, steps
from rollouts.canary.specs import ACTION_FROM
from rollouts.canary.timeline import record_event
from rollouts.loads import reconciler as load_reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, ModelVersion, Rollout, RolloutAnalysis, RolloutEvent, Route
from rollouts.registry import versions as registry

log = logging.getLogger(__name__)
State = Rollout.State
Kind = RolloutEvent.Kind
Verdict = RolloutAnalysis.Verdict


def _claim(rollout_id: int, force: bool) -> Rollout | None:
    def due(rollout: Rollout, now: Any) -> bool:
        return rollout.state in Rollout.ACTIVE and (
            force or not (rollout.next_tick_at and rollout.next_tick_at > now))

    return leases.claim(
        Rollout.objects.select_related("deployment__model", "deployment__cluster", "baseline",
                                       "candidate", "tenant"),
        rollout_id, lease_s=settings.SWITCHYARD_ROLLOUT_LEASE_S, due=due,
        on_take_over=lambda rollout, dead: record_event(
            rollout, Kind.ERROR, f"took over from a worker whose lease ran out ({dead[:8]})"),
    )


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
    if rollout.started_at is None:
        actions.update(rollout, started_at=timezone.now())
    waiting: list[str] = []
    for version in _needed(rollout):
        if not _load_on(rollout, version, rollout.servers, servers, waiting):
            return False
    if waiting:
        _wait_for(rollout, "loads: " + ", ".join(waiting))
        return False
    mixed = _mixed_configs(rollout, servers)
    if mixed:
        actions.back_to_baseline(rollout, mixed, State.ROLLED_BACK)
        return False
    if not Route.objects.filter(pk=deployment.pk, state=Route.State.IN_FORCE).exists():
        actions.route(rollout, {rollout.baseline.version: 100}, "the route the rollout starts from")
    actions.move(rollout, State.PROGRESSING, "everything the rollout needs is ready on "
                 f"{', '.join(rollout.servers)}", step_index=0, step_started_at=timezone.now(),
                 waiting_for="")
    return True


def _wait_for(rollout: Rollout, text: str) -> None:
    if rollout.waiting_for != text[:200]:
        actions.update(rollout, waiting_for=text[:200])


def _load_on(rollout: Rollout, version: ModelVersion, names: list[str], servers: dict[str, Any],
             waiting: list[str]) -> bool:
    """Ask for ``version`` on the servers ``names`` where it is not ready or on its way, and
    follow those loads as the rollout's own; what is still on its way is added to
    ``waiting``. False when it went back to the baseline (a load failed or was refused)."""
    load_ids = set(rollout.load_ids)
    missing = []
    for name in names:
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
            actions.back_to_baseline(rollout, why, State.ROLLED_BACK,
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
            made, _new = loads.load_for(rollout.deployment, version, missing, f"rollout {rollout.pk}")
        except DomainError as exc:
            # Over quota, or not loadable any more: the rollout cannot go on.
            actions.back_to_baseline(rollout, f"loading v{version.version} was refused: {exc.message}",
                                     State.ROLLED_BACK, data={"error": exc.message})
            return False
        load_ids.update(load.pk for load in made)
        record_event(rollout, Kind.LOAD, f"loading v{version.version} on {', '.join(missing)}",
               data={"loads": [load.pk for load in made]})
        waiting.extend(f"v{version.version} on {name}" for name in missing)
    if sorted(load_ids) != sorted(rollout.load_ids):
        actions.update(rollout, load_ids=sorted(load_ids))
    return True


def _everywhere(rollout: Rollout) -> bool:
    """Before a canary takes all the traffic, its version is ready with one config on every
    server the baseline serves from, as well as its own (all or none: a load that fails sends
    the rollout back). A vLLM base model cannot share a server with another: it stays where it
    ran as the canary."""
    cand = rollout.candidate
    if cand.runtime == ModelVersion.Runtime.VLLM and not cand.adapter_of:
        return True
    deployment = rollout.deployment
    names = set(rollout.servers) | set(ModelLoad.objects.filter(
        deployment=deployment, version=rollout.baseline, state=ModelLoad.State.READY)
        .values_list("server__name", flat=True))
    servers = {s.name: s for s in deployment.servers.filter(name__in=names)}
    waiting: list[str] = []
    if not _load_on(rollout, cand, sorted(servers), servers, waiting):
        return False
    if waiting:
        _wait_for(rollout, f"promotion: v{cand.version} first on every server: "
                  + ", ".join(waiting))
        return False
    mixed = _mixed_configs(rollout, servers)
    if mixed:
        actions.back_to_baseline(rollout, mixed, State.ROLLED_BACK)
        return False
    return True


def _mixed_configs(rollout: Rollout, servers: dict[str, Any]) -> str:
    """Why the versions the rollout needs do not run alike on all its servers (each ready
    with one config hash everywhere), or "" when they do: one version behind a route runs
    one configuration."""
    for version in _needed(rollout):
        hashes = dict(ModelLoad.objects.filter(
            version=version, server__in=servers.values(), state=ModelLoad.State.READY)
            .order_by("server__name").values_list("server__name", "config_hash"))
        if len(set(hashes.values())) > 1:
            return (f"v{version.version} runs with different configs on its servers: "
                    + ", ".join(f"{name} {digest[:12]}" for name, digest in hashes.items()))
    return ""


def _watch(rollout: Rollout) -> bool:
    """Roll back when the versions under test are unhealthy; True when it did."""
    watched = [v for v in _needed(rollout) if v.pk != rollout.baseline_id]
    problem = analysis.health_problem(rollout, watched)
    if problem is None:
        return False
    why, evidence = problem
    actions.back_to_baseline(rollout, why, State.ROLLED_BACK, data={"health": evidence})
    return True


def _progressing(rollout: Rollout) -> bool:
    if _watch(rollout) or steps.rollback_asked(rollout):
        return False
    if rollout.strategy == Rollout.Strategy.AB:
        return _ab_tick(rollout)
    step = rollout.current_step
    if step is None and rollout.dry_run:
        return steps.end_dry_run(rollout)
    if step is None:
        actions.move(rollout, State.PROMOTING, "every step passed: promoting "
                     f"v{rollout.candidate.version}", waiting_for="")
        return True
    (kind, value), = step.items()
    return steps.STEP_KINDS[kind](rollout, value)


def _ab_tick(rollout: Rollout) -> bool:
    weights = {v["version"]: v["weight"] for v in rollout.variants}
    if not rollout.weights:
        try:
            actions.route(rollout, weights, "A/B split", sticky=True)
        except Conflict as exc:
            record_event(rollout, Kind.ERROR, f"the split did not take: {exc.message}; trying again")
            return False
        with transaction.atomic():
            actions.update(rollout, weights={str(k): w for k, w in weights.items()},
                           step_started_at=timezone.now())
            record_event(rollout, Kind.STEP, "split in force: " + ", ".join(
                f"v{k} {w}%" for k, w in weights.items())
                + (f", sticky by {rollout.sticky_header}" if rollout.sticky_header else ""))
        return False
    started = rollout.step_started_at or timezone.now()
    elapsed = (timezone.now() - started).total_seconds()
    try:
        by_version, _ = analysis.samples_by_version(rollout, max(elapsed, 0.001))
    except Exception as exc:
        record_event(rollout, Kind.ERROR, f"cannot read the route's samples: {exc}")
        return False
    counts = {n: len(by_version.get(n, [])) for n in weights}
    if not analysis.ab_done(rollout, counts, elapsed):
        text = "collecting: " + ", ".join(f"v{n} {c}" for n, c in counts.items()) + " requests"
        if rollout.waiting_for != text:
            actions.update(rollout, waiting_for=text[:200])
        return False
    result = analysis.ab_verdict(rollout, by_version)
    winner = result.get("winner")
    if rollout.promote and winner is not None and winner != rollout.baseline.version:
        with transaction.atomic():
            actions.update(rollout, verdict=result,
                           candidate=rollout.deployment.model.versions.get(version=winner))
            actions.move(rollout, State.PROMOTING, f"verdict: {result['summary']}; promoting v{winner}",
                         kind=Kind.ANALYSIS, data=result, waiting_for="")
        return True
    base = rollout.baseline.version
    try:
        actions.route(rollout, {base: 100}, f"A/B ended: back to v{base}")
    except Conflict as exc:
        record_event(rollout, Kind.ERROR, f"going back to v{base} did not take: {exc.message}")
        return False
    actions.move(rollout, State.SUCCEEDED, f"verdict: {result['summary']}; all traffic back on v{base}",
                 kind=Kind.ANALYSIS, data=result, verdict=result, weights={str(base): 100},
                 reason=result["summary"], finished_at=timezone.now(), waiting_for="")
    return False


def _paused(rollout: Rollout) -> bool:
    if not _watch(rollout):
        steps.rollback_asked(rollout)
    return False


def _promoting(rollout: Rollout) -> bool:
    cand = rollout.candidate.version
    if rollout.strategy == Rollout.Strategy.CANARY and not _everywhere(rollout):
        return False
    try:
        actions.route(rollout, {cand: 100}, f"promoting v{cand}")
    except Conflict as exc:
        record_event(rollout, Kind.ERROR, f"promotion did not take: {exc.message}; trying again")
        return False
    bake_s = analysis.analysis_config(rollout)["bake_s"]
    if (rollout.strategy == Rollout.Strategy.CANARY and bake_s
            and not (rollout.step_state or {}).get("baked")):
        until = timezone.localtime() + timedelta(seconds=bake_s)
        actions.move(rollout, State.BAKING, f"v{cand} carries all the traffic: baking {bake_s} s "
                     f"before the promotion ends; v{rollout.baseline.version} stays loaded to go "
                     "back to", weights={str(cand): 100}, step_started_at=timezone.now(),
                     step_state={}, waiting_for=_bake_text(rollout, until))
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
    actions.move(rollout, State.SUCCEEDED, f"v{cand} promoted: all traffic{moved}",
                 weights={str(cand): 100}, finished_at=timezone.now(), waiting_for="",
                 reason=rollout.reason if rollout.strategy == Rollout.Strategy.AB else f"v{cand} promoted")
    if rollout.unload_previous and rollout.baseline_id != rollout.candidate_id:
        actions.unload(rollout, rollout.baseline, f"v{cand} replaced it",
                       everywhere=rollout.strategy == Rollout.Strategy.CANARY)
    return False


def _bake_text(rollout: Rollout, until: Any) -> str:
    return (f"baking at 100% until {until.strftime('%H:%M:%S %Z')}: back to "
            f"v{rollout.baseline.version} if v{rollout.candidate.version} regresses")


def _baking(rollout: Rollout) -> bool:
    """The bake after 100%: the candidate is watched (health, the rollback webhook, and
    ``policy.bake_look``: itself over time and the SLO gates) for ``bake_s`` with the baseline
    still loaded; a regression goes back to it, the end of the bake finishes the promotion
    (the alias moves, the previous version is unloaded)."""
    if _watch(rollout) or steps.rollback_asked(rollout):
        return False
    config = analysis.analysis_config(rollout)
    cand = rollout.candidate.version
    started = rollout.step_started_at or timezone.now()
    elapsed = (timezone.now() - started).total_seconds()
    if elapsed >= config["bake_s"]:
        actions.move(rollout, State.PROMOTING, f"baked {config['bake_s']} s at 100% with no "
                     f"regression shown: v{cand} is promoted", step_state={"baked": True},
                     waiting_for="")
        return True
    try:
        by_version, now = analysis.samples_by_version(rollout, elapsed + 1)
    except Exception as exc:
        record_event(rollout, Kind.ERROR, f"cannot read the route's samples: {exc}")
        return False
    judgement = policy.bake_look(by_version.get(cand, []), started.timestamp(), now, config)
    if judgement.verdict == judge.FAIL:
        actions.back_to_baseline(rollout, f"v{cand} regressed while baking at 100%: "
                                 f"{'; '.join(judgement.reasons)}", State.ROLLED_BACK,
                                 data={"bake": judgement.to_json()})
    return False


def _rolling_back(rollout: Rollout) -> bool:
    actions.back_to_baseline(rollout, rollout.reason or "rolling back", rollout.waiting_for
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
    State.BAKING: _baking,
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
        actions.update(rollout, requested_action="")
        record_event(rollout, Kind.ACTION, f"{action} by {who} no longer applies: the rollout is "
               f"{rollout.get_state_display().lower()}")
        return True
    if action == Rollout.Action.ABORT:
        actions.update(rollout, requested_action="")
        actions.back_to_baseline(rollout, f"aborted by {who}{said}", State.ABORTED)
    elif action == Rollout.Action.PAUSE:
        actions.move(rollout, State.PAUSED, f"paused by {who}{said}", kind=Kind.ACTION,
                     requested_action="", waiting_for=f"a person to resume (paused by {who})")
    elif action == Rollout.Action.PROMOTE and rollout.state == State.BAKING:
        actions.move(rollout, State.PROMOTING, f"promotion asked for by {who}{said}: the rest of "
                     "the bake is skipped", kind=Kind.ACTION, requested_action="", waiting_for="",
                     step_state={"baked": f"skipped by {who}"})
    elif action == Rollout.Action.PROMOTE:
        actions.move(rollout, State.PROMOTING, f"promotion asked for by {who}{said}: the remaining "
                     "steps are skipped", kind=Kind.ACTION, requested_action="", waiting_for="")
    elif action == Rollout.Action.RESUME:
        step = rollout.current_step or {}
        row = RolloutAnalysis.objects.filter(rollout=rollout, attempt=rollout.attempt,
                                             step_index=rollout.step_index).first()
        accept = ("pause" in step and not step["pause"].get("seconds")) or (
            ("analysis" in step or "shadow" in step) and row is not None
            and row.verdict == Verdict.INCONCLUSIVE)
        with transaction.atomic():
            actions.move(rollout, State.PROGRESSING, f"resumed by {who}{said}"
                         + ("; the step is accepted" if accept else ""), kind=Kind.ACTION,
                         requested_action="", waiting_for="")
            if accept:
                actions.next_step(rollout, f"step {rollout.step_index + 1} accepted by {who}")
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
            record_event(rollout, Kind.ERROR, f"unexpected error while {rollout.state}",
                   data={"trace": traceback.format_exc()[-4000:]})
            actions.back_to_baseline(rollout, f"Switchyard failed unexpectedly while "
                                     f"{rollout.get_state_display().lower()} ({type(exc).__name__}: "
                                     f"{exc})", State.FAILED)
    except leases.LostLease:
        log.debug("rollout %s: another worker took over", rollout_id)
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
