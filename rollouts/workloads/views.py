"""Console: the "Servers on Kubernetes" panel of a deployment on a Kubernetes cluster, and the
deployment page's Replicas panel (the replica recommendation, for any deployment).

The deployment page loads the Kubernetes panel (htmx), which polls itself while a server is
being applied, waited for, rolled back or deleted. Its forms post to the views here, which
call :mod:`rollouts.workloads.requests` through ``rollouts.workloads.forms`` as the API does:
done, back to the deployment page; refused, the panel on a page of its own with the refusal
in place. The Replicas panel loads itself and refreshes every REFRESH_S seconds.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HTMX_STOP_POLLING

from fleet.models import InferenceServer, Membership
from fleet.tenancy.scoping import has_role, require_role
from rollouts.deployments.pages import visible_deployment
from rollouts.models import Deployment, ServerWorkload
from rollouts.workloads import autoscaling
from rollouts.workloads.forms import WorkloadActionForm, WorkloadCreateForm

State = ServerWorkload.State
PANEL = "rollouts/partials/workloads_panel.html"
PAGE = "rollouts/partials/workloads_page.html"
REFRESH_S = 10  # the Replicas panel refreshes itself this often


def _deployment(request: HttpRequest, pk: int) -> Deployment:
    deployment = visible_deployment(request, pk)
    if not deployment.cluster.is_kubernetes:
        raise Http404("the deployment is not on a Kubernetes cluster")
    return deployment


def _back(deployment: Deployment) -> str:
    return reverse("rollouts:deployment", args=[deployment.pk]) + "#workloads"


def panel_context(request: HttpRequest, deployment: Deployment, *,
                  create_form: WorkloadCreateForm | None = None,
                  action_form: WorkloadActionForm | None = None) -> dict[str, Any]:
    """The panel: the deployment's servers on Kubernetes (deleted ones left out) with what
    the cluster last said of them, and the forms a deployer may use."""
    rows = list(
        ServerWorkload.objects.filter(deployment=deployment).exclude(state=State.DELETED)
        .select_related("version", "previous_version", "server", "placement")
        .order_by("name")
    )
    can_deploy = has_role(request.user, deployment.tenant, Membership.Role.DEPLOYER) and (
        not deployment.is_archived
    )
    if can_deploy and create_form is None:
        create_form = WorkloadCreateForm(actor=request.user, deployment=deployment)
    versions = list(deployment.model.versions.order_by("-version"))
    for row in rows:
        row.ready_replicas = (row.observed or {}).get("ready")
        row.changeable = can_deploy and row.state in (State.READY, State.FAILED) and bool(
            row.applied_spec)
        row.deletable = can_deploy and row.state not in (State.DELETING, State.DELETED)
        row.roll_to = [v for v in versions if v.pk != row.version_id and not v.adapter_of] if (
            row.runtime == InferenceServer.Runtime.VLLM) else []
        row.refusal = action_form if action_form is not None and (
            action_form.workload.pk == row.pk) else None
    return {
        "deployment": deployment,
        "workloads": rows,
        "in_flight": any(row.state in ServerWorkload.IN_FLIGHT for row in rows),
        "can_deploy": can_deploy,
        "create_form": create_form if can_deploy else None,
        "action_form": action_form,  # a refused action: the page's top says so
    }


@login_required
@require_GET
def deployment_workloads(request: HttpRequest, pk: int) -> HttpResponse:
    """The panel (htmx: polling while a server is in flight, 286 once none is), or without
    htmx a page of its own."""
    deployment = _deployment(request, pk)
    context = panel_context(request, deployment)
    if not request.htmx:
        return render(request, PAGE, context)
    return render(request, PANEL, context,
                  status=200 if context["in_flight"] else HTMX_STOP_POLLING)


@login_required
@require_POST
def deployment_workload_create(request: HttpRequest, pk: int) -> HttpResponse:
    """Ask for a server on the deployment's cluster (deployer role)."""
    deployment = _deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    form = WorkloadCreateForm(request.POST, actor=request.user, deployment=deployment)
    done = form.save()
    if done is None:
        return render(request, PAGE, panel_context(request, deployment, create_form=form),
                      status=form.status_code)
    messages.success(request, done)
    return redirect(_back(deployment))


@login_required
@require_POST
def workload_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    """Scale, roll or delete a server (deployer role)."""
    if action not in WorkloadActionForm.ACTIONS:
        raise Http404("no such action")
    workload = get_object_or_404(
        ServerWorkload.objects.visible_to(request.user).select_related(
            "deployment__model", "deployment__cluster", "deployment__tenant", "version",
            "tenant", "server", "placement"),
        pk=pk,
    )
    deployment = workload.deployment
    require_role(request.user, workload.tenant, Membership.Role.DEPLOYER)
    form = WorkloadActionForm(request.POST, actor=request.user, workload=workload, action=action)
    done = form.save()
    if done is None:
        return render(request, PAGE, panel_context(request, deployment, action_form=form),
                      status=form.status_code)
    messages.success(request, done)
    return redirect(_back(deployment))


@login_required
def deployment_replicas(request: HttpRequest, pk: int) -> HttpResponse:
    """The Replicas panel for any member of the deployment's tenant; an archived deployment's
    panel says so once and stops polling."""
    deployment = visible_deployment(request, pk)
    context = {"deployment": deployment, "refresh_s": REFRESH_S}
    if deployment.is_archived:
        return render(request, "rollouts/partials/replica_recommendation.html", context,
                      status=HTMX_STOP_POLLING)
    context["rec"] = autoscaling.recommend_replicas(deployment)
    return render(request, "rollouts/partials/replica_recommendation.html", context)
