"""Deployment console pages: the list, a deployment's page, how to call it, and creating,
changing and deleting one. Decisions call the same domain functions as the API, through
``rollouts.deployments.forms``; the page itself is drawn by ``rollouts.deployments.pages``,
which the other rooms' views (loads, traffic, rollouts, benchmarks) draw it with too."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console.paging import paginate, querystring_without_page
from fleet.api.refs import is_id
from fleet.models import Membership
from fleet.tenancy.scoping import require_role
from rollouts.deployments import calling, consistency
from rollouts.deployments import lifecycle as deployments
from rollouts.deployments.forms import ConvergeForm, DeploymentDeleteForm, DeploymentForm
from rollouts.deployments.pages import render_deployment, visible_deployment
from rollouts.models import Deployment, SloStatus


@login_required
def deployment_list(request: HttpRequest) -> HttpResponse:
    """Deployments in use; ``?archived=true`` lists the archived ones instead."""
    archived = request.GET.get("archived", "").lower() in ("true", "1", "yes")
    visible = Deployment.objects.visible_to(request.user)
    deployments = (
        visible.filter(archived_at__isnull=not archived)
        .select_related("tenant", "model", "cluster", "slo")
        .prefetch_related("servers")
    )
    wanted = [s for s in request.GET.getlist("slo_status") if s in SloStatus.State.values]
    if wanted:
        found = Q(slo__state__in=wanted)
        if SloStatus.State.NO_TRAFFIC in wanted:
            found |= Q(slo__isnull=True)
        deployments = deployments.filter(found)
    page = paginate(request, deployments)
    states = consistency.states_of(list(page))
    for deployment in page:
        deployment.consistency_state = states.get(deployment.pk, consistency.CONSISTENT)
    context = {
        "slo_states": SloStatus.State.choices,
        "slo_wanted": wanted,
        "page": page,
        "qs": querystring_without_page(request),
        "archived": archived,
        "archived_count": visible.filter(archived_at__isnull=False).count(),
    }
    return render(request, "rollouts/deployment_list.html", context)


@login_required
def deployment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return render_deployment(request, visible_deployment(request, pk))


@login_required
@require_POST
def deployment_converge(request: HttpRequest, pk: int) -> HttpResponse:
    """Make the deployment's servers agree; a refusal re-renders the page with it in place."""
    deployment = visible_deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    form = ConvergeForm(request.POST, actor=request.user, deployment=deployment)
    done = form.save()
    if done is None:
        return render_deployment(request, deployment, converge_form=form, status=form.status_code)
    messages.success(request, done)
    return redirect("rollouts:deployment", pk=deployment.pk)


@login_required
def deployment_call(request: HttpRequest, pk: int) -> HttpResponse:
    """The "How to call it" panel, loaded after the page (it may ask a server for metadata)."""
    deployment = visible_deployment(request, pk)
    return render(request, "rollouts/partials/call_guide.html",
                  {"deployment": deployment, "guide": calling.guide(deployment)})


def _deployment_form_page(request: HttpRequest, form: DeploymentForm, deployment: Deployment | None,
                          status: int = 200) -> HttpResponse:
    return render(request, "rollouts/deployment_form.html",
                  {"form": form, "deployment": deployment}, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def deployment_create(request: HttpRequest) -> HttpResponse:
    """Create a deployment of one of the viewer's models (deployer role in its tenant);
    ``?model=<id>`` picks the model."""
    initial = {"model": request.GET.get("model")} if is_id(request.GET.get("model", "")) else {}
    form = DeploymentForm(request.POST or None, actor=request.user, initial=initial)
    if request.method == "POST":
        deployment = form.save()
        if deployment is not None:
            messages.success(request, f"Deployment {deployment.name} created. Load a version onto it.")
            return redirect("rollouts:deployment", pk=deployment.pk)
    return _deployment_form_page(request, form, None, form.status_code if form.is_bound else 200)


@login_required
@require_http_methods(["GET", "POST"])
def deployment_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """Change a deployment's cluster, servers, SLO and production flag (deployer role)."""
    deployment = get_object_or_404(
        Deployment.objects.visible_to(request.user).select_related("tenant", "model"), pk=pk
    )
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    form = DeploymentForm(request.POST or None, actor=request.user, deployment=deployment)
    if request.method == "POST":
        saved = form.save()
        if saved is not None:
            messages.success(request, f"Deployment {saved.name} saved.")
            return redirect("rollouts:deployment", pk=saved.pk)
    return _deployment_form_page(request, form, deployment, form.status_code if form.is_bound else 200)


@login_required
def deployment_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """Confirm, then delete: archived when it has had loads, refused while anything is loaded."""
    deployment = visible_deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.ADMIN)
    if deployment.is_archived:
        messages.info(request, f"Deployment {deployment.name} is already archived.")
        return redirect("rollouts:deployment", pk=deployment.pk)
    form = DeploymentDeleteForm(
        request.POST if request.method == "POST" else None, actor=request.user, deployment=deployment
    )
    status = 200
    if request.method == "POST":
        done = form.save()
        if done is not None:
            messages.success(request, done)
            if deployment.is_archived:
                return redirect("rollouts:deployment", pk=deployment.pk)
            return redirect("rollouts:deployments")
        status = form.status_code
    context = {
        "deployment": deployment,
        "form": form,
        "blockers": deployments.blockers(deployment),
        "load_count": deployment.loads.count(),
    }
    return render(request, "rollouts/deployment_delete.html", context, status=status)
