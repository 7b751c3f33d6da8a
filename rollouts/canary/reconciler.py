"""The rollout reconciler: it advances rollouts tick by tick.

:func:`advance` is what Celery calls (beat every ``SWITCHYARD_ROLLOUT_INTERVAL_S``, and a task
sent after each request, action and step that lets the next one follow at once). It claims the
row with a lease (:mod:`rollouts.leases`, kept alive by a heartbeat while a step runs), carries
out the action a person asked for or at most one step (the steps are listed in
:mod:`rollouts.canary.specs`), records what it saw and did on the timeline (with the evidence)
and returns. Every step is idempotent: the weight of a step is put in force and the step index
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
from rollouts.benchmarks import results as benchmark_results
from rollouts.canary import analysis
from rollouts.canary.specs import ACTION_FROM
from rollouts.canary.timeline import notify, record_event
from rollouts.loads import reconciler as load_reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, ModelVersion, Rollout, RolloutAnalysis, RolloutEvent, Route
from rollouts.registry import versions as registry
from rollouts.traffic import routes
from rollouts.traffic.specs import MirrorTarget

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


def _update(rollout: Rollout, **fields: Any) -> None:
    """Write fields only while we still hold the lease."""
    leases.update(rollout, **fields)


def _move(rollout: Rollout, to: str, message: str, *, kind: str = Kind.STATE,
          data: dict[str, Any] | None = None, **fields: Any) -> None:
    previous = rollout.state
    with transaction.atomic():  # the state, its event and its notification, together
        _update(rollout, state=to, **fields)
        record_event(rollout, kind, message, data=data)
        if to != previous:
            notify(rollout, "rollout.state_changed", previous)
            if to == State.ROLLED_BACK:
                notify(rollout, "rollout.rolled_back", previous)
            if to == State.PENDING_APPROVAL:
                notify(rollout, "rollout.approval_needed", previous)


def _route(rollout: Rollout, weights: dict[int, int], why: str, *, sticky: bool = False,
           mirror: MirrorTarget | None = None) -> None:
    """Put ``weights`` (by version) in force on the deployment's route, by the system on the
    rollout's behalf, with ``mirror`` (copies to a version) or none; the route in force
    already is a no-op. Raises the route's errors."""
    policy = "sticky" if sticky and rollout.sticky_header else "weighted"
    routes.set_route_as_system(
        rollout.deployment, {n: w for n, w in weights.items()}, policy=policy,
        sticky_header=rollout.sticky_header if policy == "sticky" else "", mirror=mirror,
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
        record_event(rollout, Kind.LOAD, f"v{version.version} stays loaded ({why}), the unload was "
               f"refused: {exc.message}")
        return
    if taken:
        record_event(rollout, Kind.LOAD, f"unloading v{version.version} from "
               f"{', '.join(sorted({load.server.name for load in taken}))}: {why}",
               data={"loads": [load.pk for load in taken]})


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
            record_event(rollout, Kind.LOAD, f"loading v{version.version} on {', '.join(missing)}",
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


def _watch(rollout: Rollout) -> bool:
    """Roll back when the versions under test are unhealthy; True when it did."""
    watched = [v for v in _needed(rollout) if v.pk != rollout.baseline_id]
    problem = analysis.health_problem(rollout, watched)
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
    if step is None and rollout.dry_run:
        return _end_dry_run(rollout)
    if step is None:
        _move(rollout, State.PROMOTING, "every step passed: promoting "
              f"v{rollout.candidate.version}", waiting_for="")
        return True
    (kind, value), = step.items()
    return STEP_KINDS[kind](rollout, value)


def _end_dry_run(rollout: Rollout) -> bool:
    """A dry run whose steps all passed: the copies stop, the candidate is unloaded where
    the rollout loaded it, and nothing is promoted."""
    base, cand = rollout.baseline.version, rollout.candidate.version
    if not _copies(rollout, 0, "the dry run ended"):
        return False
    why = (f"dry run: every step passed on copies of the requests; v{cand} would have been "
           f"promoted. All traffic stayed on v{base}")
    _move(rollout, State.SUCCEEDED, why, reason=why, weights={str(base): 100},
          finished_at=timezone.now(), waiting_for="")
    _unload(rollout, rollout.candidate, "the dry run ended", own_only=True)
    return False


def _next_step(rollout: Rollout, message: str, data: dict[str, Any] | None = None, **fields: Any) -> None:
    with transaction.atomic():
        index = rollout.step_index
        record_event(rollout, Kind.STEP, message, data=data)
        _update(rollout, step_index=index + 1, step_started_at=timezone.now(), waiting_for="",
                failures=0, **fields)


def _set_weight(rollout: Rollout, weight: int) -> bool:
    base, cand = rollout.baseline.version, rollout.candidate.version
    if rollout.dry_run:
        return _dry_weight(rollout, weight)
    weights = {base: 100 - weight, cand: weight} if weight < 100 else {cand: 100}
    try:
        _route(rollout, weights, f"step {rollout.step_index + 1}: {weight}% to v{cand}")
    except DomainError as exc:
        if isinstance(exc, Conflict):  # refused or busy for now: try again next tick
            record_event(rollout, Kind.ERROR, f"setting {weight}% to v{cand} did not take: "
                   f"{exc.message}; trying again next tick")
            return False
        raise
    _next_step(rollout, f"step {rollout.step_index + 1}: {weight}% of the traffic to v{cand}, "
               f"{100 - weight}% to v{base}",
               weights={str(base): 100 - weight, str(cand): weight})
    return True


def _dry_weight(rollout: Rollout, weight: int) -> bool:
    """A dry run's weight: copies of that share of the requests to the candidate (none at
    0%), all traffic staying on the baseline."""
    base, cand = rollout.baseline.version, rollout.candidate.version
    step = f"step {rollout.step_index + 1}"
    if not _copies(rollout, weight, f"{step}: dry run"):
        return False
    text = (f"copies of {weight}% of the requests go to v{cand}" if weight
            else f"no copies to v{cand}")
    _next_step(rollout, f"{step}: dry run: {text}; all traffic stays on v{base}",
               weights={str(base): 100})
    return True


def _copies(rollout: Rollout, percent: int, why: str) -> bool:
    """All traffic on the baseline, with copies of ``percent`` of the requests to the
    candidate (none at 0). False when the route is busy (next tick tries again); a copy the
    router cannot make ends the rollout (the route in force is unchanged)."""
    base, cand = rollout.baseline.version, rollout.candidate.version
    mirror = MirrorTarget(version=cand, percent=percent) if percent else None
    try:
        _route(rollout, {base: 100}, f"{why}: copies of {percent}% of the requests to v{cand}",
               mirror=mirror)
    except DomainError as exc:
        if isinstance(exc, Conflict) and not isinstance(exc, routes.RouteFailed):
            record_event(rollout, Kind.ERROR, f"copying {percent}% of the requests to v{cand} "
                         f"did not take: {exc.message}; trying again next tick")
            return False  # another change holds the route: next tick
        # The router cannot copy this (a share it does not support): the route in force
        # is unchanged, and the rollout cannot go on as asked.
        _back_to_baseline(rollout, f"{why}: the copies cannot start: {exc.message}",
                          State.ROLLED_BACK)
        return False
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


def _analysis_step(rollout: Rollout, overrides: dict[str, Any]) -> bool:
    """Look at the candidate once (``analysis.look`` decides); act on the step's end."""
    config = analysis.analysis_config(rollout, overrides)
    if rollout.dry_run:  # the share copied by the dry run's last weight
        shares = [s["set_weight"] for s in rollout.steps[:rollout.step_index] if "set_weight" in s]
        config["shadow_percent"] = shares[-1] if shares else 0
    row = analysis.analysis_row(rollout, config)
    return _look(rollout, config, row, shadow=rollout.dry_run)


def _look(rollout: Rollout, config: dict[str, Any], row: RolloutAnalysis, *,
          shadow: bool = False) -> bool:
    if row.verdict != Verdict.RUNNING:  # decided by a worker that died before moving on
        return _after_analysis(rollout, row)
    windows = analysis.evidence_windows(row, config)
    seconds = max(time.time() - windows[0].start, 0.001)
    try:
        by_version, now = analysis.samples_by_version(rollout, seconds)
        copies = analysis.samples_by_version(rollout, seconds, mirror=True)[0] if shadow else {}
    except Exception as exc:
        record_event(rollout, Kind.ERROR, f"cannot read the route's samples: {exc}")
        return False
    canary = (copies if shadow else by_version).get(rollout.candidate.version, [])
    ended = analysis.look(row, config, canary, by_version.get(rollout.baseline.version, []), now,
                          windows=windows, last=analysis.is_last_analysis(rollout),
                          shadow=shadow)
    if ended in (analysis.JUDGE_AGAIN, analysis.JUDGE_AGAIN_INCONCLUSIVE):
        what = (f"failed a look ({row.failed_looks} of {config['failure_limit']} allowed)"
                if ended == analysis.JUDGE_AGAIN else f"ended inconclusive "
                f"({row.inconclusive_ends} of {config['inconclusive_limit']} allowed)")
        record_event(rollout, Kind.ANALYSIS, f"analysis {what}: {'; '.join(row.reasons)}; "
                     "judging again on fresh evidence",
                     data={"analysis": row.pk, "judgement": row.judgement, "slo": row.slo})
        return False
    if ended == Verdict.RUNNING:
        return False
    return _after_analysis(rollout, row)


def _shadow_step(rollout: Rollout, value: dict[str, Any]) -> bool:
    """Copies of ``percent`` of the requests to the candidate, which serves nobody yet, each
    judged against the baseline's answer to the same request (``analysis.look`` with
    ``shadow``). The copies start before the step's first look, whose window starts then."""
    base, cand = rollout.baseline.version, rollout.candidate.version
    percent = value["percent"]
    config = analysis.analysis_config(
        rollout, {k: v for k, v in value.items() if k != "percent"})
    row = RolloutAnalysis.objects.filter(rollout=rollout, attempt=rollout.attempt,
                                         step_index=rollout.step_index).first()
    if row is None:
        if not _copies(rollout, percent, f"step {rollout.step_index + 1}: shadow"):
            return False
        with transaction.atomic():
            _update(rollout, weights={str(base): 100})
            record_event(rollout, Kind.STEP, f"step {rollout.step_index + 1}: shadow: copies of "
                         f"{percent}% of the requests go to v{cand} (its answers are discarded); "
                         f"all traffic stays on v{base}")
            row = analysis.analysis_row(rollout, {**config, "shadow_percent": percent})
    return _look(rollout, config, row, shadow=True)


def _stop_copies(rollout: Rollout) -> None:
    """The route without the shadow's copies (the weights as they are)."""
    base = rollout.baseline.version
    _route(rollout, {int(k): v for k, v in (rollout.weights or {str(base): 100}).items()},
           "the shadow step ended: no more copies")


def _after_analysis(rollout: Rollout, row: RolloutAnalysis) -> bool:
    evidence = {"analysis": row.pk, "judgement": row.judgement, "slo": row.slo}
    text = "; ".join(row.reasons)
    if row.verdict == Verdict.PASS and row.weight == 0 and not rollout.dry_run:
        try:
            _stop_copies(rollout)
        except Conflict as exc:
            record_event(rollout, Kind.ERROR, f"stopping the copies did not take: {exc.message}; "
                         "trying again next tick")
            return False
        _next_step(rollout, f"step {rollout.step_index + 1}: shadow passed: {text}",
                   data=evidence)
        return True
    if row.verdict == Verdict.PASS:
        _next_step(rollout, f"step {rollout.step_index + 1}: analysis passed at "
                   f"{row.weight}%: {text}", data=evidence)
        return True
    if row.verdict == Verdict.FAIL:
        where = ("on its shadow copies" if row.weight == 0 else f"at {row.weight}% to")
        if rollout.dry_run:
            where = "in the dry run on the copies to"
        _back_to_baseline(rollout, f"analysis failed {where} v{rollout.candidate.version}: "
                          f"{text}", State.ROLLED_BACK, data=evidence)
        return False
    _move(rollout, State.PAUSED, f"step {rollout.step_index + 1}: analysis inconclusive: {text}",
          kind=Kind.ANALYSIS, data=evidence,
          waiting_for="a person: the analysis was inconclusive (resume accepts it, abort goes back)")
    return False


def _benchmark_step(rollout: Rollout, value: dict[str, Any]) -> bool:
    """The benchmark gate: the candidate's measured capacity against the baseline's."""
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
    "shadow": _shadow_step,
}


def _ab_tick(rollout: Rollout) -> bool:
    weights = {v["version"]: v["weight"] for v in rollout.variants}
    if not rollout.weights:
        try:
            _route(rollout, weights, "A/B split", sticky=True)
        except Conflict as exc:
            record_event(rollout, Kind.ERROR, f"the split did not take: {exc.message}; trying again")
            return False
        with transaction.atomic():
            _update(rollout, weights={str(k): w for k, w in weights.items()},
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
            _update(rollout, waiting_for=text[:200])
        return False
    result = analysis.ab_verdict(rollout, by_version)
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
        record_event(rollout, Kind.ERROR, f"going back to v{base} did not take: {exc.message}")
        return False
    _move(rollout, State.SUCCEEDED, f"verdict: {result['summary']}; all traffic back on v{base}",
          kind=Kind.ANALYSIS, data=result, verdict=result, weights={str(base): 100},
          reason=result["summary"], finished_at=timezone.now(), waiting_for="")
    return False


def _paused(rollout: Rollout) -> bool:
    _watch(rollout)
    return False


def _promoting(rollout: Rollout) -> bool:
    cand = rollout.candidate.version
    try:
        _route(rollout, {cand: 100}, f"promoting v{cand}")
    except Conflict as exc:
        record_event(rollout, Kind.ERROR, f"promotion did not take: {exc.message}; trying again")
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
        record_event(rollout, Kind.ACTION, f"{action} by {who} no longer applies: the rollout is "
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
            ("analysis" in step or "shadow" in step) and row is not None
            and row.verdict == Verdict.INCONCLUSIVE)
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
            record_event(rollout, Kind.ERROR, f"unexpected error while {rollout.state}",
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
