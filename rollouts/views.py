"""Registry and deployment console pages. Decisions call the same domain functions as the API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HTMX_STOP_POLLING

from console.paging import paginate, querystring_without_page
from fleet.errors import DomainError
from fleet.models import AuditEvent, Membership, Placement, Tenant
from fleet.tenancy import has_role
from rollouts import approvals, loads
from rollouts.models import Deployment, Model, ModelLoad, ModelVersion


@login_required
def model_list(request: HttpRequest) -> HttpResponse:
    models = (
        Model.objects.visible_to(request.user)
        .select_related("tenant")
        .annotate(
            version_count=Count("versions", distinct=True),
            latest=Max("versions__version"),
            pending=Count("versions", filter=Q(versions__status="pending_approval"), distinct=True),
        )
    )
    q = request.GET.get("q", "").strip()
    tenant = request.GET.get("tenant", "")
    if q:
        models = models.filter(Q(name__icontains=q) | Q(description__icontains=q))
    if tenant:
        models = models.filter(tenant__slug=tenant)
    context = {
        "page": paginate(request, models),
        "q": q,
        "tenant": tenant,
        "tenants": Tenant.objects.visible_to(request.user),
        "qs": querystring_without_page(request),
    }
    template = "rollouts/model_list.html#results" if request.htmx else "rollouts/model_list.html"
    return render(request, template, context)


@login_required
def model_detail(request: HttpRequest, pk: int) -> HttpResponse:
    model = get_object_or_404(Model.objects.visible_to(request.user).select_related("tenant"), pk=pk)
    versions = model.versions.select_related("registered_by", "registered_by_token").prefetch_related("aliases")
    status = request.GET.get("status", "")
    if status:
        versions = versions.filter(status=status)
    context = {
        "model": model,
        "page": paginate(request, versions),
        "status": status,
        "statuses": ModelVersion.Status.choices,
        "aliases": model.aliases.select_related("version"),
        "deployments": model.deployments.select_related("cluster"),
        "placements": Placement.objects.filter(
            model_version__model=model, state__in=Placement.HOLDING
        ).select_related("server", "model_version"),
        "qs": querystring_without_page(request),
    }
    template = "rollouts/model_detail.html#versions" if request.htmx else "rollouts/model_detail.html"
    return render(request, template, context)


@login_required
def version_detail(request: HttpRequest, pk: int) -> HttpResponse:
    version = get_object_or_404(
        ModelVersion.objects.visible_to(request.user).select_related(
            "model__tenant", "registered_by", "registered_by_token", "approval_requested_by",
            "approval_requested_by_token__created_by", "decided_by",
        ),
        pk=pk,
    )
    tenant = version.model.tenant
    history = AuditEvent.objects.filter(object_type="rollouts.modelversion", object_id=str(version.pk))
    context = {
        "version": version,
        "history": history,
        "can_request": has_role(request.user, tenant, Membership.Role.DEPLOYER),
        "can_decide": has_role(request.user, tenant, Membership.Role.APPROVER),
        "is_requester": approvals.is_requester(request.user, version),
    }
    return render(request, "rollouts/version_detail.html", context)


ACTIONS: dict[str, tuple[Callable[..., ModelVersion], str]] = {
    "request-approval": (approvals.request_approval, "Approval requested for {v}."),
    "approve": (approvals.approve, "{v} approved."),
    "reject": (approvals.reject, "{v} rejected."),
    "archive": (approvals.archive, "{v} archived."),
}


@login_required
@require_POST
def version_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    version = get_object_or_404(ModelVersion.objects.visible_to(request.user), pk=pk)
    if action not in ACTIONS:
        raise PermissionDenied(f"unknown action {action}")
    fn, done = ACTIONS[action]
    try:
        fn(request.user, version, request.POST.get("reason", "").strip())
    except (DomainError, PermissionDenied) as exc:
        messages.error(request, getattr(exc, "message", None) or str(exc))
    else:
        messages.success(request, done.format(v=f"{version.model.name} v{version.version}"))
    return redirect("rollouts:version", pk=version.pk)


@login_required
def deployment_list(request: HttpRequest) -> HttpResponse:
    deployments = Deployment.objects.visible_to(request.user).select_related(
        "tenant", "model", "cluster"
    ).prefetch_related("servers")
    return render(request, "rollouts/deployment_list.html", {"page": paginate(request, deployments), "qs": ""})


def _deployment_context(request: HttpRequest, deployment: Deployment) -> dict[str, Any]:
    recent = list(
        deployment.loads.select_related("server", "version").order_by("-created_at")[:15]
    )
    ready = [load for load in recent if load.state == ModelLoad.State.READY]
    return {
        "deployment": deployment,
        "recent_loads": recent,
        "ready_loads": ready,
        "in_flight": any(load.state in ModelLoad.IN_FLIGHT for load in recent),
    }


@login_required
def deployment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    deployment = get_object_or_404(
        Deployment.objects.visible_to(request.user).select_related("tenant", "model", "cluster"), pk=pk
    )
    loadable = deployment.model.versions.exclude(
        status__in=[ModelVersion.Status.REJECTED, ModelVersion.Status.ARCHIVED]
    )
    if deployment.production:
        loadable = loadable.filter(status=ModelVersion.Status.APPROVED)
    context = _deployment_context(request, deployment) | {
        "servers": deployment.servers.all(),
        "aliases": deployment.model.aliases.select_related("version"),
        "loadable": loadable,
        "can_deploy": has_role(request.user, deployment.tenant, Membership.Role.DEPLOYER),
        "latency_url": reverse("api:deployment-latency", args=[deployment.pk]),
        "placements": Placement.objects.filter(
            server__in=deployment.servers.all(), model_version__model=deployment.model,
            state__in=Placement.HOLDING,
        ).select_related("server", "model_version"),
    }
    return render(request, "rollouts/deployment_detail.html", context)


@login_required
def deployment_loads(request: HttpRequest, pk: int) -> HttpResponse:
    """The live loads panel; tells htmx to stop polling once nothing is in flight."""
    deployment = get_object_or_404(Deployment.objects.visible_to(request.user), pk=pk)
    context = _deployment_context(request, deployment)
    if context["in_flight"]:
        return render(request, "rollouts/partials/load_panel.html", context)
    # Everything settled: stop polling and refresh the page, whose other panels (placements,
    # what the servers report, the unload buttons) changed with it.
    response = render(request, "rollouts/partials/load_panel.html", context, status=HTMX_STOP_POLLING)
    response["HX-Refresh"] = "true"
    return response


@login_required
@require_POST
def deployment_load_action(request: HttpRequest, pk: int) -> HttpResponse:
    deployment = get_object_or_404(Deployment.objects.visible_to(request.user), pk=pk)
    version = get_object_or_404(deployment.model.versions.all(), pk=request.POST.get("version"))
    action = request.POST.get("action", "load")
    try:
        if action == "unload":
            rows = loads.request_unload(request.user, deployment, version)
            messages.success(request, f"Unloading v{version.version} from {len(rows)} server(s)."
                             if rows else f"v{version.version} was not loaded.")
        else:
            rows, created = loads.request_load(request.user, deployment, version)
            messages.success(request, f"Loading v{version.version} onto {len(rows)} server(s)."
                             if created else f"v{version.version} is already ready.")
    except (DomainError, PermissionDenied) as exc:
        messages.error(request, getattr(exc, "message", None) or str(exc))
    return redirect("rollouts:deployment", pk=deployment.pk)


@login_required
def load_detail(request: HttpRequest, pk: int) -> HttpResponse:
    load = get_object_or_404(
        ModelLoad.objects.visible_to(request.user).select_related(
            "deployment", "server", "version__model", "placement"
        ),
        pk=pk,
    )
    template = "rollouts/partials/load_status.html" if request.htmx else "rollouts/load_detail.html"
    status = HTMX_STOP_POLLING if request.htmx and load.state not in ModelLoad.IN_FLIGHT else 200
    return render(request, template, {"load": load, "events": load.events.all()}, status=status)
