"""SLO partials: the dashboard's summary and a deployment's panel, refreshed by htmx."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from rollouts.deployments.pages import visible_deployment
from rollouts.slo import pages


@login_required
def slo_summary(request: HttpRequest) -> HttpResponse:
    return render(request, "rollouts/partials/slo_summary.html", {"slo": pages.summary(request.user)})


@login_required
def deployment_slo(request: HttpRequest, pk: int) -> HttpResponse:
    deployment = visible_deployment(request, pk)
    return render(request, "rollouts/partials/deployment_slo.html",
                  {"deployment": deployment, **pages.deployment_panel(request.user, deployment)})
