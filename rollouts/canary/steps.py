"""The steps of a canary, one function each (the kinds of :mod:`rollouts.canary.specs`), and
the end of a dry run. Each is called by the reconciler's tick with the rollout under its lease
and the step's settings, does at most one thing and says whether the next step may follow at
once; what it does to the world goes through :mod:`rollouts.canary.actions`."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from console.exceptions import Conflict, DomainError
from fleet.models import Webhook
from fleet.webhooks import delivery as webhook_delivery
from rollouts.benchmarks import results as benchmark_results
from rollouts.canary import actions, analysis
from rollouts.canary.timeline import record_event
from rollouts.models import Rollout, RolloutAnalysis, RolloutEvent
from rollouts.registry import costs

State = Rollout.State
Kind = RolloutEvent.Kind
Verdict = RolloutAnalysis.Verdict
CONFIRM_EVENT = "rollout.confirm"  # what a confirm step's POST says it is
ROLLBACK_EVENT = "rollout.rollback"  # ... and the rollback webhook's


def end_dry_run(rollout: Rollout) -> bool:
    """A dry run whose steps all passed: the copies stop, the candidate is unloaded where
    the rollout loaded it, and nothing is promoted."""
    base, cand = rollout.baseline.version, rollout.candidate.version
    if not actions.copies(rollout, 0, "the dry run ended"):
        return False
    why = (f"dry run: every step passed on copies of the requests; v{cand} would have been "
           f"promoted. All traffic stayed on v{base}")
    actions.move(rollout, State.SUCCEEDED, why, reason=why, weights={str(base): 100},
                 finished_at=timezone.now(), waiting_for="")
    actions.unload(rollout, rollout.candidate, "the dry run ended", own_only=True)
    return False


def _set_weight(rollout: Rollout, weight: int) -> bool:
    base, cand = rollout.baseline.version, rollout.candidate.version
    if rollout.dry_run:
        return _dry_weight(rollout, weight)
    weights = {base: 100 - weight, cand: weight} if weight < 100 else {cand: 100}
    try:
        actions.route(rollout, weights, f"step {rollout.step_index + 1}: {weight}% to v{cand}")
    except DomainError as exc:
        if isinstance(exc, Conflict):  # refused or busy for now: try again next tick
            record_event(rollout, Kind.ERROR, f"setting {weight}% to v{cand} did not take: "
                   f"{exc.message}; trying again next tick")
            return False
        raise
    actions.next_step(rollout, f"step {rollout.step_index + 1}: {weight}% of the traffic to v{cand}, "
                      f"{100 - weight}% to v{base}",
                      weights={str(base): 100 - weight, str(cand): weight})
    return True


def _dry_weight(rollout: Rollout, weight: int) -> bool:
    """A dry run's weight: copies of that share of the requests to the candidate (none at
    0%), all traffic staying on the baseline."""
    base, cand = rollout.baseline.version, rollout.candidate.version
    step = f"step {rollout.step_index + 1}"
    if not actions.copies(rollout, weight, f"{step}: dry run"):
        return False
    text = (f"copies of {weight}% of the requests go to v{cand}" if weight
            else f"no copies to v{cand}")
    actions.next_step(rollout, f"{step}: dry run: {text}; all traffic stays on v{base}",
                      weights={str(base): 100})
    return True


def _pause(rollout: Rollout, value: dict[str, Any]) -> bool:
    seconds = value.get("seconds")
    started = rollout.step_started_at or timezone.now()
    if seconds is None:
        actions.move(rollout, State.PAUSED, f"step {rollout.step_index + 1}: paused until a person "
                     "resumes", waiting_for=f"a person to resume (step {rollout.step_index + 1})")
        return False
    until = started + timedelta(seconds=seconds)
    if timezone.now() >= until:
        actions.next_step(rollout, f"step {rollout.step_index + 1}: paused {seconds:g} s")
        return True
    text = f"pause until {until.strftime('%H:%M:%S %Z')}"
    if rollout.waiting_for != text:
        actions.update(rollout, waiting_for=text)
    return False


def _approval_step(rollout: Rollout, _value: dict[str, Any]) -> bool:
    actions.move(rollout, State.PENDING_APPROVAL, f"step {rollout.step_index + 1}: waiting for an "
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
        if shadow:  # copies are paired with their originals by request id: as samples
            by_version, now = analysis.samples_by_version(rollout, seconds)
            copies = analysis.samples_by_version(rollout, seconds, mirror=True)[0]
        else:
            by_version, now = analysis.columns_by_version(rollout, windows[0].start)
            copies = {}
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
        if not actions.copies(rollout, percent, f"step {rollout.step_index + 1}: shadow"):
            return False
        with transaction.atomic():
            actions.update(rollout, weights={str(base): 100})
            record_event(rollout, Kind.STEP, f"step {rollout.step_index + 1}: shadow: copies of "
                         f"{percent}% of the requests go to v{cand} (its answers are discarded); "
                         f"all traffic stays on v{base}")
            row = analysis.analysis_row(rollout, {**config, "shadow_percent": percent})
    return _look(rollout, config, row, shadow=True)


def _stop_copies(rollout: Rollout) -> None:
    """The route without the shadow's copies (the weights as they are)."""
    base = rollout.baseline.version
    actions.route(rollout, {int(k): v for k, v in (rollout.weights or {str(base): 100}).items()},
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
        actions.next_step(rollout, f"step {rollout.step_index + 1}: shadow passed: {text}",
                          data=evidence)
        return True
    if row.verdict == Verdict.PASS:
        actions.next_step(rollout, f"step {rollout.step_index + 1}: analysis passed at "
                          f"{row.weight}%: {text}", data=evidence)
        return True
    if row.verdict == Verdict.FAIL:
        where = ("on its shadow copies" if row.weight == 0 else f"at {row.weight}% to")
        if rollout.dry_run:
            where = "in the dry run on the copies to"
        actions.back_to_baseline(rollout, f"analysis failed {where} v{rollout.candidate.version}: "
                                 f"{text}", State.ROLLED_BACK, data=evidence)
        return False
    actions.move(rollout, State.PAUSED, f"step {rollout.step_index + 1}: analysis inconclusive: {text}",
                 kind=Kind.ANALYSIS, data=evidence,
                 waiting_for="a person: the analysis was inconclusive (resume accepts it, abort goes back)")
    return False


def _confirm_step(rollout: Rollout, value: dict[str, Any]) -> bool:
    """Hold until the tenant's webhook answers a signed ``rollout.confirm`` POST with a 2xx,
    asking every ``every_s``; back to the baseline when ``timeout_s`` passes without one, or
    when the webhook is gone. The traffic stays as it is while it waits."""
    step, name = f"step {rollout.step_index + 1}", value["webhook"]
    kept = rollout.step_state or {}
    webhook = Webhook.objects.filter(tenant=rollout.tenant_id, name=name, active=True).first()
    if webhook is None:
        actions.back_to_baseline(rollout, f"{step}: webhook {name} is gone or inactive: nobody can "
                                 "confirm", State.ROLLED_BACK)
        return False
    waited = (timezone.now() - (rollout.step_started_at or timezone.now())).total_seconds()
    if waited >= value["timeout_s"]:
        actions.back_to_baseline(rollout, f"{step}: {name} did not confirm within "
                                 f"{value['timeout_s']} s (asked {kept.get('asks', 0)} times, last "
                                 f"answer: {kept.get('last', 'none')})", State.ROLLED_BACK,
                                 data={"confirm": kept})
        return False
    if time.time() - float(kept.get("at", 0)) < value["every_s"]:
        return False
    cand, base = rollout.candidate.version, rollout.baseline.version
    status, reason = webhook_delivery.ask(
        webhook, CONFIRM_EVENT, _hook_payload(rollout),
        summary=f"rollout {rollout.pk} of {rollout.deployment.name} asks to go on past "
                f"{step} (v{cand} against v{base})")
    answer = f"HTTP {status}" if status is not None else reason
    if status is not None and 200 <= status < 300:
        actions.next_step(rollout, f"{step}: {name} confirmed ({answer})",
                          data={"confirm": {**kept, "last": answer}})
        return True
    asks = int(kept.get("asks", 0)) + 1
    with transaction.atomic():
        actions.update(rollout, step_state={**kept, "at": time.time(), "asks": asks, "last": answer},
                       waiting_for=f"{name} to confirm (asked {asks} times, last answer: {answer})"[:200])
        if kept.get("last") != answer:  # each new answer once in the timeline
            record_event(rollout, Kind.STEP, f"{step}: {name} did not confirm yet ({answer}); "
                         f"asking every {value['every_s']} s for up to {value['timeout_s']} s")
    return False


def _hook_payload(rollout: Rollout) -> dict[str, Any]:
    """What a confirm or rollback webhook is told about the rollout."""
    cand = rollout.candidate.version if rollout.candidate_id else None
    ahead = (rollout.steps[rollout.step_index + 1] if rollout.step_index + 1 < len(rollout.steps)
             else {"promote": cand})
    return {
        "rollout": rollout.pk, "deployment": rollout.deployment.name,
        "model": rollout.deployment.model.name, "candidate": cand,
        "baseline": rollout.baseline.version, "state": rollout.state,
        "step": rollout.step_index + 1, "steps": len(rollout.steps), "weights": rollout.weights,
        "dry_run": rollout.dry_run, "next": ahead,
    }


def rollback_asked(rollout: Rollout) -> bool:
    """The rollback webhook (the rollout's ``analysis.rollback``), asked every ``every_s``
    while the rollout runs with a signed ``rollout.rollback`` POST: a 2xx answer sends all
    traffic back to the baseline (True); any other answer, or none, lets it go on. A webhook
    gone or made inactive is said once in the timeline and no longer asked."""
    hook = (rollout.analysis or {}).get("rollback")
    if not hook:
        return False
    kept = rollout.step_state or {}
    if kept.get("rollback_gone") or time.time() - float(kept.get("rollback_at", 0)) < hook["every_s"]:
        return False
    name = hook["webhook"]
    webhook = Webhook.objects.filter(tenant=rollout.tenant_id, name=name, active=True).first()
    if webhook is None:
        with transaction.atomic():
            actions.update(rollout, step_state={**kept, "rollback_gone": True})
            record_event(rollout, Kind.ERROR, f"the rollback webhook {name} is gone or inactive: "
                         "it is no longer asked (abort still goes back)")
        return False
    status, reason = webhook_delivery.ask(
        webhook, ROLLBACK_EVENT, _hook_payload(rollout),
        summary=f"rollout {rollout.pk} of {rollout.deployment.name} asks whether to roll back")
    answer = f"HTTP {status}" if status is not None else reason
    if status is not None and 200 <= status < 300:
        actions.back_to_baseline(rollout, f"the rollback webhook {name} asked for a rollback "
                                 f"({answer})", State.ROLLED_BACK,
                                 data={"rollback_webhook": {"webhook": name, "answer": answer}})
        return True
    actions.update(rollout, step_state={**kept, "rollback_at": time.time(),
                                        "rollback_last": answer[:200]})
    return False


def _benchmark_step(rollout: Rollout, value: dict[str, Any]) -> bool:
    """The benchmark gate: the candidate's measured capacity against the baseline's."""
    found = benchmark_results.gate(rollout.candidate, rollout.baseline, value.get("max_drop_pct", 10),
                                mode=value.get("mode"))
    step = f"step {rollout.step_index + 1}: benchmark gate"
    if found["passed"] is True:
        actions.next_step(rollout, f"{step} passed: {found['message']}", data={"benchmark": found})
        return True
    if found["passed"] is False:
        actions.back_to_baseline(rollout, f"{step} failed: {found['message']}", State.ROLLED_BACK,
                                 data={"benchmark": found})
        return False
    actions.move(rollout, State.PAUSED, f"{step}: {found['message']}", data={"benchmark": found},
                 waiting_for="a person: the benchmark gate has nothing to compare (run the "
                             "benchmarks, then resume to judge again; promote skips it)")
    return False


def _cost_step(rollout: Rollout, value: dict[str, Any]) -> bool:
    """The cost gate: the candidate's cost per request against the baseline's, kept in the
    timeline's data like every other judgement."""
    found = costs.compare(rollout.candidate, rollout.baseline)
    most = value.get("max_increase_pct", 10)
    step = f"step {rollout.step_index + 1}: cost gate"
    data = {"cost": {**found, "max_increase_pct": most}}
    change = found["change_pct"]
    if change is None:
        actions.move(rollout, State.PAUSED, f"{step}: {found['message']}", data=data,
                     waiting_for="a person: the cost gate has nothing to compare (benchmark "
                                 "both versions, or let both serve traffic, then resume to judge "
                                 "again; promote skips it)")
        return False
    if change <= most:
        actions.next_step(rollout, f"{step} passed: {found['message']} (at most {most:g}% more "
                                   "allowed)", data=data)
        return True
    actions.back_to_baseline(rollout, f"{step} failed: {found['message']} (at most {most:g}% "
                                      "more allowed)", State.ROLLED_BACK, data=data)
    return False


STEP_KINDS: dict[str, Callable[[Rollout, Any], bool]] = {
    "set_weight": _set_weight,
    "pause": _pause,
    "analysis": _analysis_step,
    "approval": _approval_step,
    "benchmark": _benchmark_step,
    "cost": _cost_step,
    "shadow": _shadow_step,
    "confirm": _confirm_step,
}
