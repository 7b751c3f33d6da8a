"""Rollout console pages: the list, a rollout's page with its live part and chart, its actions.

Decisions go through ``rollouts.deployments.forms`` to the functions of ``rollouts.canary.requests`` the API calls;
what is here only shapes rows for the templates (steps, weights, which buttons to show) and
the chart's series.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import redis
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HTMX_STOP_POLLING

from console.paging import paginate, querystring_without_page
from fleet.api.refs import is_id
from fleet.models import Membership
from fleet.tenancy.scoping import has_role
from fleet.tenancy.tokens import person_id
from rollouts.canary import requests as rollout_domain
from rollouts.deployments.forms import RolloutActionForm, RolloutStartForm
from rollouts.models import Deployment, Rollout, RolloutAnalysis, Route
from rollouts.traffic import latency, samples

State = Rollout.State
STATE_FILTERS = (("active", "Active"), ("finished", "Finished"), ("all", "All"))
CHART_WINDOW_S = 300  # the chart's window: 5 minutes at one point a second
LIVE_EVENTS = 5  # the live part's last events
TIMELINE_MAX = 500  # events on the page at most (the newest)


def _rollouts(request: HttpRequest) -> Any:
    return Rollout.objects.visible_to(request.user).select_related(
        "tenant", "deployment", "baseline", "candidate", "requested_by"
    )


def _rollout(request: HttpRequest, pk: int) -> Rollout:
    return get_object_or_404(_rollouts(request), pk=pk)


# --------------------------------------------------------------------------------------------
# Presentation helpers
# --------------------------------------------------------------------------------------------


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
        for action, states in rollout_domain.ACTION_FROM.items():
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


def latest_analysis(rollout: Rollout) -> RolloutAnalysis | None:
    return (RolloutAnalysis.objects.filter(rollout=rollout, attempt=rollout.attempt)
            .order_by("-updated_at", "-id").first())


def _versions_of_variants(deployment_id: int) -> dict[str, int]:
    route = Route.objects.filter(pk=deployment_id).first()
    meaning = route.variants if route is not None else {}
    return {name: int(v["version"]) for name, v in meaning.items() if v.get("version") is not None}


def interim_ab_verdict(rollout: Rollout) -> dict[str, Any] | None:
    """The A/B numbers so far (on the page only, not the live part: the bootstrap intervals
    take a moment), or None before the split is in force or when Redis cannot be read."""
    if (rollout.strategy != Rollout.Strategy.AB or rollout.state != State.PROGRESSING
            or not rollout.weights or rollout.step_started_at is None):
        return None
    seconds = max(time.time() - rollout.step_started_at.timestamp(), 0.001)
    of_variant = _versions_of_variants(rollout.deployment_id)
    try:
        found = samples.window(rollout.deployment_id, seconds)
    except redis.RedisError:
        return None
    by_version: dict[int, list[samples.Sample]] = defaultdict(list)
    for variant, rows in found.items():
        if variant in of_variant:
            by_version[of_variant[variant]].extend(rows)
    return rollout_domain.ab_verdict(rollout, dict(by_version))


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


# --------------------------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------------------------


def list_context(request: HttpRequest, found: Any, active: list[str], final: list[str],
                 decorate: Callable[[Any], None]) -> dict[str, Any]:
    """The rollout and benchmark lists' page: ``found`` narrowed by ``?state=active|finished|all``
    and ``?deployment=<id>``, paginated, each row passed to ``decorate``."""
    state = request.GET.get("state", "all")
    if state not in dict(STATE_FILTERS):
        state = "all"
    if state == "active":
        found = found.filter(state__in=active)
    elif state == "finished":
        found = found.filter(state__in=final)
    deployments = Deployment.objects.visible_to(request.user).select_related("tenant").order_by(
        "tenant__slug", "name")
    deployment = request.GET.get("deployment", "")
    if is_id(deployment):
        found = found.filter(deployment_id=int(deployment))
    else:
        deployment = ""
    page = paginate(request, found)
    for item in page:
        decorate(item)
    return {
        "page": page, "state": state, "states": STATE_FILTERS, "deployment": deployment,
        "deployments": deployments, "qs": querystring_without_page(request),
    }


@login_required
def rollout_list(request: HttpRequest) -> HttpResponse:
    """Rollouts of the viewer's tenants, newest first; ``?state=active|finished|all`` and
    ``?deployment=<id>`` narrow it."""

    def decorate(item: Rollout) -> None:
        item.weight_rows = weight_rows(item)
        item.step_text = step_summary(item)

    context = list_context(request, _rollouts(request), Rollout.ACTIVE, Rollout.FINAL, decorate)
    template = "rollouts/rollout_list.html#results" if request.htmx else "rollouts/rollout_list.html"
    return render(request, template, context)


def _live_context(rollout: Rollout) -> dict[str, Any]:
    return {
        "rollout": rollout,
        "steps": step_rows(rollout),
        "step_text": step_summary(rollout),
        "weights": weight_rows(rollout),
        "latest": latest_analysis(rollout),
        "recent_events": list(rollout.events.order_by("-created_at", "-id")[:LIVE_EVENTS])[::-1],
    }


def _render_rollout(request: HttpRequest, rollout: Rollout, form: RolloutActionForm | None = None,
                    status: int = 200) -> HttpResponse:
    events = list(rollout.events.order_by("-created_at", "-id")[:TIMELINE_MAX])[::-1]
    context = _live_context(rollout) | actions_for(request.user, rollout) | {
        "form": form,
        "analyses": rollout.analyses.order_by("-attempt", "step_index"),
        "approvals": rollout.approvals.select_related("approved_by"),
        "events": events,
        "events_cut": rollout.events.count() > len(events),
        "interim": interim_ab_verdict(rollout),
        "chart_window_s": chart_window(rollout),
        # Route samples are kept 15 minutes: a chart of an older rollout would be empty.
        "show_chart": rollout.is_active or (
            rollout.finished_at is not None
            and time.time() - rollout.finished_at.timestamp() < samples.keep_s()),
    }
    return render(request, "rollouts/rollout_detail.html", context, status=status)


@login_required
def rollout_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return _render_rollout(request, _rollout(request, pk))


@login_required
def rollout_status(request: HttpRequest, pk: int) -> HttpResponse:
    """The live part (htmx, every 2 s): 286 once the rollout is final. When its state or
    attempt moved on from the one the page was drawn with (``?seen=state:attempt``), the
    page is reloaded too, so its buttons and history match the new state."""
    rollout = _rollout(request, pk)
    status = HTMX_STOP_POLLING if rollout.state in Rollout.FINAL else 200
    response = render(request, "rollouts/partials/rollout_status.html", _live_context(rollout),
                      status=status)
    seen = request.GET.get("seen")
    if request.htmx and seen and seen != f"{rollout.state}:{rollout.attempt}":
        response["HX-Refresh"] = "true"
    return response


@login_required
@require_GET
def rollout_latency(request: HttpRequest, pk: int) -> JsonResponse:
    """The chart's data (``latency_series``); 286 once the rollout is final, which tells the
    chart to stop polling as it tells htmx."""
    rollout = _rollout(request, pk)
    try:
        window = min(max(int(request.GET.get("window", CHART_WINDOW_S)), 10), samples.keep_s())
    except ValueError:
        window = CHART_WINDOW_S
    data = latency_series(rollout, window)
    return JsonResponse(data, status=HTMX_STOP_POLLING if data["final"] else 200,
                        json_dumps_params={"allow_nan": False})


@login_required
@require_POST
def rollout_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    """Pause, resume, promote, abort, approve or retry: back to the page with what was done,
    or the page again with the refusal in place (a role too low is a 403 naming the role)."""
    rollout = _rollout(request, pk)
    if action not in RolloutActionForm.ACTIONS:
        raise Http404(f"no action {action!r} on rollouts")
    form = RolloutActionForm(request.POST, actor=request.user, rollout=rollout, action=action)
    done = form.save()
    if done is None:
        return _render_rollout(request, _rollout(request, pk), form, status=form.status_code)
    messages.success(request, done)
    return redirect("rollouts:rollout", pk=rollout.pk)


def start_rollout(request: HttpRequest, deployment: Deployment) -> tuple[Rollout | None,
                                                                         RolloutStartForm]:
    """Bind and run the deployment page's start form; (the rollout, the form) or (None, the
    form with the refusal on the field it names)."""
    form = RolloutStartForm(request.POST, actor=request.user, deployment=deployment)
    made = form.save()
    if made is not None:
        messages.success(request, f"Rollout {made.pk} of {deployment.name} requested.")
    return made, form
