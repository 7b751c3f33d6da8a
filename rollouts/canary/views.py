"""Rollout console pages: the list, a rollout's page with its live part and chart, its actions,
and the start of a rollout from the deployment page.

Decisions go through ``rollouts.canary.forms`` to the functions of ``rollouts.canary.requests``
the API calls; what the pages show is shaped in ``rollouts.canary.pages``.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HTMX_STOP_POLLING

from console.forms import next_or
from fleet.models import Membership
from fleet.tenancy.scoping import require_role
from rollouts.canary.forms import RolloutActionForm, RolloutStartForm
from rollouts.canary.pages import (
    CHART_WINDOW_S,
    actions_for,
    chart_window,
    interim_ab_verdict,
    latency_series,
    latest_analysis,
    step_rows,
    step_summary,
    weight_rows,
)
from rollouts.deployments.pages import job_list_context, render_deployment, visible_deployment
from rollouts.models import Rollout
from rollouts.registry import costs
from rollouts.traffic import samples

LIVE_EVENTS = 5  # the live part's last events
TIMELINE_MAX = 500  # events on the page at most (the newest)


def _rollouts(request: HttpRequest) -> Any:
    return Rollout.objects.visible_to(request.user).select_related(
        "tenant", "deployment", "baseline", "candidate", "requested_by"
    )


def _rollout(request: HttpRequest, pk: int) -> Rollout:
    return get_object_or_404(_rollouts(request), pk=pk)


@login_required
def rollout_list(request: HttpRequest) -> HttpResponse:
    """Rollouts of the viewer's tenants, newest first; ``?state=active|finished|all`` and
    ``?deployment=<id>`` narrow it."""

    def decorate(item: Rollout) -> None:
        item.weight_rows = weight_rows(item)
        item.step_text = step_summary(item)

    context = job_list_context(request, _rollouts(request), Rollout.ACTIVE, Rollout.FINAL, decorate)
    template = "rollouts/rollout_list.html#results" if request.htmx else "rollouts/rollout_list.html"
    return render(request, template, context)


def _live_context(rollout: Rollout) -> dict[str, Any]:
    # "Latest analysis" and the Analyses panel are drawn from the same rows, read once.
    analyses = list(rollout.analyses.order_by("-attempt", "step_index"))
    return {
        "rollout": rollout,
        "steps": step_rows(rollout),
        "step_text": step_summary(rollout),
        "weights": weight_rows(rollout),
        "analyses": analyses,
        "latest": latest_analysis(analyses, rollout.attempt),
        "recent_events": list(rollout.events.order_by("-created_at", "-id")[:LIVE_EVENTS])[::-1],
    }


def _render_rollout(request: HttpRequest, rollout: Rollout, form: RolloutActionForm | None = None,
                    status: int = 200) -> HttpResponse:
    events = list(rollout.events.order_by("-created_at", "-id")[:TIMELINE_MAX])[::-1]
    context = _live_context(rollout) | actions_for(request.user, rollout) | {
        "form": form,
        "approvals": rollout.approvals.select_related("approved_by"),
        "events": events,
        "events_cut": rollout.events.count() > len(events),
        "interim": interim_ab_verdict(rollout),
        # What the candidate costs per request against the baseline, before it is promoted.
        "cost_compared": (costs.compare(rollout.candidate, rollout.baseline)
                          if rollout.strategy == Rollout.Strategy.CANARY and rollout.candidate
                          and rollout.baseline else None),
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
    # The Analyses panel comes along (out of band), so it never lags "Latest analysis".
    response = render(request, "rollouts/partials/rollout_status.html",
                      _live_context(rollout) | {"oob": True}, status=status)
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
    return redirect(next_or(request, reverse("rollouts:rollout", args=[rollout.pk])))


@login_required
@require_POST
def deployment_rollout_start(request: HttpRequest, pk: int) -> HttpResponse:
    """Start a canary or an A/B split: on to the rollout's page, or the deployment page again
    with the refusal next to the field it names."""
    deployment = visible_deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    form = RolloutStartForm(request.POST, actor=request.user, deployment=deployment)
    made = form.save()
    if made is None:
        return render_deployment(request, deployment, status=form.status_code, rollout_form=form)
    messages.success(request, f"Rollout {made.pk} of {deployment.name} requested.")
    return redirect("rollouts:rollout", pk=made.pk)
