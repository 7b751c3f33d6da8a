"""What the rollout pages show: rows for the templates (steps, weights, which buttons to show),
the A/B numbers so far, the chart's series, and the deployment page's Rollouts panel.

Nothing here decides: decisions go through ``rollouts.canary.forms`` to the functions of
``rollouts.canary.requests`` the API calls."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

import redis
from django.http import HttpRequest

from fleet.models import Membership
from fleet.tenancy.scoping import has_role
from fleet.tenancy.tokens import person_id
from rollouts.canary import requests as rollout_domain
from rollouts.canary.analysis import ab_verdict
from rollouts.canary.forms import RolloutStartForm
from rollouts.canary.specs import ACTION_FROM
from rollouts.models import Deployment, Rollout, RolloutAnalysis, Route
from rollouts.traffic import latency, sample_types, samples

State = Rollout.State
CHART_WINDOW_S = 300  # the chart's window: 5 minutes at one point a second


def role_of(rollout: Rollout, number: int) -> str:
    """What a version is in the rollout: baseline and canary, or reference and variant."""
    if rollout.strategy == Rollout.Strategy.AB:
        return "reference" if number == rollout.baseline.version else "variant"
    if number == rollout.baseline.version:
        return "baseline"
    return "canary" if rollout.candidate_id and number == rollout.candidate.version else ""


def weight_rows(rollout: Rollout) -> list[dict[str, Any]]:
    """The traffic asked for, by version, with each version's part in the rollout."""
    rows = []
    for key, weight in sorted((rollout.weights or {}).items(), key=lambda kv: int(kv[0])):
        rows.append({"version": int(key), "weight": int(weight), "role": role_of(rollout, int(key))})
    return rows


def describe_step(step: dict[str, Any]) -> str:
    (kind, value), = step.items()
    if kind == "set_weight":
        return f"{value}% of the traffic to the canary"
    if kind == "pause":
        seconds = (value or {}).get("seconds")
        return f"pause {seconds:g} s" if seconds else "pause until a person resumes"
    if kind == "analysis":
        given = ", ".join(f"{k} {v}" for k, v in (value or {}).items())
        return "analysis" + (f" ({given})" if given else "")
    if kind == "shadow":
        given = ", ".join(f"{k} {v}" for k, v in value.items() if k != "percent")
        return (f"shadow: copies of {value['percent']}% of the requests, judged each against "
                "its own time on the stable version" + (f" ({given})" if given else ""))
    if kind == "confirm":
        return (f"confirm: wait for webhook {value['webhook']} to answer 2xx (asked every "
                f"{value['every_s']} s, back to stable after {value['timeout_s']} s)")
    if kind == "benchmark":
        return (f"benchmark gate: capacity within its SLO at most {value['max_drop_pct']:g}% "
                "below the stable version's")
    if kind == "cost":
        return (f"cost gate: at most {value['max_increase_pct']:g}% more per request than the "
                "stable version")
    return "approval by an approver who is not the requester"


def step_rows(rollout: Rollout) -> list[dict[str, Any]]:
    """A canary's steps, each done, current, to come or (where a rollout ended early) where
    it stopped."""
    started = rollout.started_at is not None and rollout.state != State.LOADING
    rows = []
    for index, step in enumerate(rollout.steps or []):
        if rollout.state == State.SUCCEEDED or (started and index < rollout.step_index):
            status = "done"
        elif started and index == rollout.step_index:
            status = "current" if rollout.is_active else "stopped"
        else:
            status = "to come"
        (kind, _), = step.items()
        rows.append({"number": index + 1, "kind": kind, "text": describe_step(step),
                     "status": status})
    return rows


def step_summary(rollout: Rollout) -> str:
    """'step 3 of 6: analysis', or what the rollout does instead."""
    if rollout.strategy == Rollout.Strategy.AB:
        return "split in force" if rollout.weights and rollout.is_active else ""
    total = len(rollout.steps or [])
    if rollout.state == State.SUCCEEDED:
        return "the one step done" if total == 1 else f"all {total} steps done"
    step = rollout.current_step
    if rollout.state == State.BAKING:
        return "every step passed: baking at 100%"
    if step is None or rollout.state == State.LOADING or rollout.started_at is None:
        if rollout.state == State.PROMOTING:
            return "every step passed"
        return f"{total} step{'' if total == 1 else 's'}"
    return f"step {rollout.step_index + 1} of {total}: {describe_step(step)}"


def actions_for(user: Any, rollout: Rollout) -> dict[str, Any]:
    """The buttons the viewer may press on the rollout in its state: deployers pause,
    resume, promote, abort (``rollout.ACTION_FROM``) and retry (``Rollout.RETRYABLE``);
    approvers who did not ask for it approve."""
    deployer = has_role(user, rollout.tenant, Membership.Role.DEPLOYER)
    actions = []
    if deployer:
        for action, states in ACTION_FROM.items():
            if rollout.state not in states:
                continue
            if action == Rollout.Action.PROMOTE and rollout.strategy == Rollout.Strategy.AB:
                continue
            actions.append({"name": str(action), "label": Rollout.Action(action).label,
                            "danger": action == Rollout.Action.ABORT})
    requester = person_id(user) == rollout_domain.requester_person_id(rollout)
    waiting = rollout.state == State.PENDING_APPROVAL
    return {
        "actions": actions,
        "can_retry": deployer and rollout.state in Rollout.RETRYABLE,
        "can_approve": waiting and not requester
        and has_role(user, rollout.tenant, Membership.Role.APPROVER),
        "is_requester": waiting and requester,
    }


def chart_window(rollout: Rollout) -> int:
    """Seconds the chart shows: the rollout so far with a little before it, from 2 minutes
    to CHART_WINDOW_S."""
    start = (rollout.started_at or rollout.created_at).timestamp()
    end = rollout.finished_at.timestamp() if rollout.finished_at else time.time()
    return int(min(CHART_WINDOW_S, max(120, end - start + 30)))


def latest_analysis(analyses: list[RolloutAnalysis], attempt: int) -> RolloutAnalysis | None:
    """The analysis of ``attempt`` last written, among the rollout's ``analyses``."""
    found = [a for a in analyses if a.attempt == attempt]
    return max(found, key=lambda a: (a.updated_at, a.pk)) if found else None


def _versions_of_variants(deployment_id: int) -> dict[str, int]:
    route = Route.objects.filter(pk=deployment_id).first()
    meaning = route.variants if route is not None else {}
    return {name: int(v["version"]) for name, v in meaning.items() if v.get("version") is not None}


def interim_ab_verdict(rollout: Rollout) -> dict[str, Any] | None:
    """The A/B numbers so far (on the page only, not the live part: reading every sample of
    the split takes a moment), or None before the split is in force or when Redis cannot be read."""
    if (rollout.strategy != Rollout.Strategy.AB or rollout.state != State.PROGRESSING
            or not rollout.weights or rollout.step_started_at is None):
        return None
    seconds = max(time.time() - rollout.step_started_at.timestamp(), 0.001)
    of_variant = _versions_of_variants(rollout.deployment_id)
    try:
        found = samples.window(rollout.deployment_id, seconds)
    except redis.RedisError:
        return None
    by_version: dict[int, list[sample_types.Sample]] = defaultdict(list)
    for variant, rows in found.items():
        if variant in of_variant:
            by_version[of_variant[variant]].extend(rows)
    return ab_verdict(rollout, dict(by_version))


def _merge_points(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One version's points from those of its variants (one per server): counts and rates
    added, p50/p95 weighted by requests, p99 the worst (exact when there is one server)."""
    if len(parts) == 1:
        return parts[0]
    by_t: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for points in parts:
        for point in points:
            by_t[point["t"]].append(point)
    merged = []
    for t in sorted(by_t):
        points = by_t[t]
        count = sum(p["count"] for p in points)
        errors = sum(p["errors"] for p in points)

        def weighted(name: str, points: list[dict[str, Any]] = points) -> float | None:
            pairs = [(p[name], p["count"]) for p in points if p.get(name) is not None]
            total = sum(n for _, n in pairs)
            return sum(v * n for v, n in pairs) / total if total else None

        p99 = [p["p99_ms"] for p in points if p.get("p99_ms") is not None]
        merged.append({
            "t": t, "count": count, "rps": sum(p["rps"] for p in points), "errors": errors,
            "error_rate": 100.0 * errors / count if count else 0.0,
            "p50_ms": weighted("p50_ms"), "p95_ms": weighted("p95_ms"),
            "p99_ms": max(p99) if p99 else None, "avg_ms": weighted("avg_ms"),
        })
    return merged


def latency_series(rollout: Rollout, window_s: int = CHART_WINDOW_S) -> dict[str, Any]:
    """The rollout's versions side by side, per second, from the route's samples
    (``samples.buckets``, mapped to versions through the route's variants), in the shape the
    live latency charts read (``static/switchyard/latency.js``). ``final``: the rollout has
    ended and the chart stops polling."""
    now = time.time()
    step = max(1, math.ceil(window_s / latency.ROUTER_POINTS))
    wanted = set(rollout.versions)
    of_variant = _versions_of_variants(rollout.deployment_id)
    error = None
    try:
        sliced = samples.buckets(rollout.deployment_id, window_s, step, now=now)
    except redis.RedisError as exc:
        sliced, error = {}, f"the route's samples cannot be read: {exc}"
    grouped: dict[int, list[list[dict[str, Any]]]] = defaultdict(list)
    for (variant, mirror), found in sorted(sliced.items()):
        number = of_variant.get(variant)
        if not mirror and number in wanted:
            grouped[number].append(found["points"])
    versions = {}
    for number, parts in sorted(grouped.items()):
        fields = ("t", *latency.FIELDS, "count", "errors")
        points = [{f: p.get(f) for f in fields} for p in _merge_points(parts)]
        role = role_of(rollout, number)
        versions[f"v{number}"] = {"label": f"v{number} {role}".strip(), "version": number,
                                  "role": role, "points": points}
    newest = max((v["points"][-1]["t"] for v in versions.values() if v["points"]), default=None)
    deployment = rollout.deployment
    return {
        "rollout": rollout.pk,
        "state": rollout.state,
        "final": rollout.state in Rollout.FINAL,
        "slo_p99_ms": deployment.slo_p99_ms,
        "slo_error_rate": float(deployment.slo_error_rate),
        "window_s": window_s,
        "step_s": step,
        "source": "router",
        "live_error": error,
        "age_s": round(now - newest, 2) if newest else None,
        "versions": versions,
    }


def deployment_rollouts_context(
    request: HttpRequest, deployment: Deployment, can_deploy: bool,
    form: RolloutStartForm | None = None,
) -> dict[str, Any]:
    """The deployment page's Rollouts panel: the rollout in flight, how many came before,
    and (deployers, while none is in flight) the forms that start one."""
    found = Rollout.objects.filter(deployment=deployment).select_related("baseline", "candidate")
    active = found.filter(state__in=Rollout.ACTIVE).first()
    forms: dict[str, RolloutStartForm] = {}
    if can_deploy and (active is None or form is not None):
        for strategy in Rollout.Strategy.values:
            forms[strategy] = (form if form is not None and form.strategy_posted == strategy
                               else RolloutStartForm(actor=request.user, deployment=deployment,
                                                     strategy=strategy))
    return {
        "active_rollout": active,
        "active_weights": weight_rows(active) if active else [],
        "active_step": step_summary(active) if active else "",
        "past_rollouts": found.exclude(state__in=Rollout.ACTIVE).count(),
        "canary_form": forms.get(Rollout.Strategy.CANARY),
        "ab_form": forms.get(Rollout.Strategy.AB),
        "rollout_form_open": form is not None,
    }
