"""The deployment page's Replicas panel: the replica recommendation, refreshed by htmx."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django_htmx.http import HTMX_STOP_POLLING

from rollouts.models import Deployment
from rollouts.workloads import autoscaling

REFRESH_S = 10


@login_required
def deployment_replicas(request: HttpRequest, pk: int) -> HttpResponse:
    """The panel for any member of the deployment's tenant; an archived deployment's panel
    says so once and stops polling."""
    deployment = get_object_or_404(
        Deployment.objects.visible_to(request.user).select_related("tenant", "model", "cluster"),
        pk=pk,
    )
    context = {"deployment": deployment, "refresh_s": REFRESH_S}
    if deployment.is_archived:
        return render(request, "rollouts/partials/replica_recommendation.html", context,
                      status=HTMX_STOP_POLLING)
    context["rec"] = autoscaling.recommend_replicas(deployment)
    return render(request, "rollouts/partials/replica_recommendation.html", context)
