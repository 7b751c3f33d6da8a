"""Console pages that create and change registry objects and deployments, and the lists a
team works from: every load, and the approvals queue. Forms call the domain functions the API
calls (``rollouts.registry.forms``)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console.paging import paginate, querystring_without_page
from fleet.api.refs import is_id
from fleet.models import InferenceServer, Membership
from fleet.tenancy.scoping import has_role, require_role
from rollouts.deployments.views import render_model
from rollouts.models import Deployment, Model, ModelLoad, ModelVersion, Rollout
from rollouts.registry import approvals
from rollouts.registry.forms import (
    AliasForm,
    DeploymentForm,
    ModelCreateForm,
    ModelEditForm,
    VersionForm,
)


def _form_page(request: HttpRequest, template: str, form: Any, status: int = 200,
               **context: Any) -> HttpResponse:
    return render(request, template, {"form": form, **context}, status=status)


def _model(request: HttpRequest, pk: int) -> Model:
    return get_object_or_404(Model.objects.visible_to(request.user).select_related("tenant"), pk=pk)


@login_required
@require_http_methods(["GET", "POST"])
def model_create(request: HttpRequest) -> HttpResponse:
    """Register a model in one of the viewer's tenants (deployer role there)."""
    if request.method == "GET":
        return _form_page(request, "rollouts/model_form.html", ModelCreateForm(actor=request.user))
    form = ModelCreateForm(request.POST, actor=request.user)
    model = form.save()
    if model is None:
        return _form_page(request, "rollouts/model_form.html", form, status=form.status_code)
    if form.created:
        messages.success(request, f"Model {model.name} registered. Register its first version.")
        return redirect("rollouts:version-create", pk=model.pk)
    messages.info(request, f"{model.tenant.slug} already has a model named {model.name}: here it is.")
    return redirect("rollouts:model", pk=model.pk)


@login_required
@require_http_methods(["GET", "POST"])
def model_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """Change a model's description (deployer role)."""
    model = _model(request, pk)
    require_role(request.user, model.tenant, Membership.Role.DEPLOYER)
    form = ModelEditForm(request.POST or None, actor=request.user, model=model)
    if request.method == "POST" and form.save() is not None:
        messages.success(request, f"Model {model.name} saved.")
        return redirect("rollouts:model", pk=model.pk)
    status = form.status_code if form.is_bound else 200
    return _form_page(request, "rollouts/model_form.html", form, status=status, model=model)


@login_required
@require_http_methods(["GET", "POST"])
def version_create(request: HttpRequest, pk: int) -> HttpResponse:
    """Register a version of a model (deployer role)."""
    model = _model(request, pk)
    require_role(request.user, model.tenant, Membership.Role.DEPLOYER)
    form = VersionForm(request.POST or None, actor=request.user, model=model)
    if request.method == "POST":
        version = form.save()
        if version is not None:
            if form.created:
                asked = " and approval asked for" if version.status == ModelVersion.Status.PENDING_APPROVAL else ""
                messages.success(request, f"{model.name} v{version.version} registered{asked}.")
            else:
                messages.info(request, f"{model.name} v{version.version} was already registered "
                                       "with this digest: nothing changed.")
            return redirect("rollouts:version", pk=version.pk)
    status = form.status_code if form.is_bound else 200
    return _form_page(request, "rollouts/version_form.html", form, status=status, model=model)


@login_required
@require_POST
def alias_set(request: HttpRequest, pk: int) -> HttpResponse:
    """Point an alias of the model at a version (deployer role). A risky move of the
    production alias comes back with the reasons and a box to confirm it."""
    model = _model(request, pk)
    require_role(request.user, model.tenant, Membership.Role.DEPLOYER)
    form = AliasForm(request.POST, actor=request.user, model=model)
    alias = form.save()
    if alias is None:
        return render_model(request, model, alias_form=form, status=form.status_code)
    messages.success(request, f"@{alias.name} now points at v{alias.version.version}.")
    return redirect("rollouts:model", pk=model.pk)


def _deployment_form_page(request: HttpRequest, form: DeploymentForm, deployment: Deployment | None,
                          status: int = 200) -> HttpResponse:
    return _form_page(request, "rollouts/deployment_form.html", form, status=status,
                      deployment=deployment)


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


LOAD_FILTERS = ("state", "deployment", "version", "server")


@login_required
def load_list(request: HttpRequest) -> HttpResponse:
    """Every load and unload of the viewer's tenants, newest first; ``state``, ``deployment``
    (id), ``version`` (number) and ``server`` (id) narrow it."""
    rows = ModelLoad.objects.visible_to(request.user).select_related(
        "deployment", "server", "version__model"
    ).order_by("-created_at", "-id")
    chosen = {name: request.GET.get(name, "").strip() for name in LOAD_FILTERS}
    if chosen["state"] == "in_flight":
        rows = rows.filter(state__in=ModelLoad.IN_FLIGHT)
    elif chosen["state"] in ModelLoad.State.values:
        rows = rows.filter(state=chosen["state"])
    if is_id(chosen["deployment"]):
        rows = rows.filter(deployment_id=int(chosen["deployment"]))
    if is_id(chosen["version"]):
        rows = rows.filter(version__version=int(chosen["version"]))
    if is_id(chosen["server"]):
        rows = rows.filter(server_id=int(chosen["server"]))
    deployments = Deployment.objects.visible_to(request.user).filter(loads__isnull=False).distinct()
    context = {
        "page": paginate(request, rows),
        "qs": querystring_without_page(request),
        "chosen": chosen,
        "states": ModelLoad.State.choices,
        "deployments": deployments.select_related("tenant").order_by("tenant__slug", "name"),
        "servers": InferenceServer.objects.filter(
            model_loads__in=ModelLoad.objects.visible_to(request.user)
        ).distinct().order_by("name"),
    }
    template = "rollouts/load_list.html#results" if request.htmx else "rollouts/load_list.html"
    return render(request, template, context)


@login_required
def approval_queue(request: HttpRequest) -> HttpResponse:
    """What waits for an approver in the viewer's tenants, oldest request first: versions
    (with who asked and what changed since the version before) and rollouts."""
    versions = list(
        ModelVersion.objects.visible_to(request.user)
        .filter(status=ModelVersion.Status.PENDING_APPROVAL)
        .select_related("model__tenant", "approval_requested_by",
                        "approval_requested_by_token__created_by")
        .order_by("status_changed_at", "id")
    )
    for version in versions:
        version.previous, version.changes = approvals.changes_from_previous(version)
        version.can_decide = has_role(request.user, version.model.tenant, Membership.Role.APPROVER)
        version.is_requester = approvals.is_requester(request.user, version)
    rollouts = (
        Rollout.objects.visible_to(request.user)
        .filter(state=Rollout.State.PENDING_APPROVAL)
        .select_related("deployment__tenant", "candidate", "baseline")
        .order_by("created_at", "id")
    )
    tenant_filter = request.GET.get("tenant", "").strip()
    if tenant_filter:
        versions = [v for v in versions if v.model.tenant.slug == tenant_filter]
        rollouts = rollouts.filter(deployment__tenant__slug=tenant_filter)
    return render(request, "rollouts/approvals.html", {
        "versions": versions, "rollouts": rollouts, "tenant": tenant_filter,
    })
