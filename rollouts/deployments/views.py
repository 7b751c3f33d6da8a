"""Registry and deployment console pages. Decisions call the same domain functions as the API."""

from __future__ import annotations

from typing import Any

import redis
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Max, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HTMX_STOP_POLLING

from console.paging import paginate, querystring_without_page
from fleet.inventory.routers import has_router
from fleet.models import AuditEvent, InferenceServer, Membership, Placement, Tenant
from fleet.tenancy.scoping import has_role, require_role
from fleet.tenancy.visibility import reported_models
from rollouts.benchmarks.views import (
    deployment_benchmarks_context,
    start_benchmark,
    version_benchmark_context,
)
from rollouts.canary.views import deployment_rollouts_context, start_rollout
from rollouts.deployments import calling
from rollouts.deployments import lifecycle as deployments
from rollouts.deployments.forms import (
    BenchmarkStartForm,
    DeploymentDeleteForm,
    DeploymentLoadForm,
    RolloutStartForm,
    RouteDefaultForm,
    RouteForm,
    RouteRemoveForm,
    VersionActionForm,
)
from rollouts.models import Deployment, Model, ModelLoad, ModelVersion, Route
from rollouts.registry import approvals
from rollouts.registry import versions as registry
from rollouts.registry.forms import AliasForm
from rollouts.traffic import routes, samples

TRAFFIC_WINDOW_S = 60  # the Traffic panel's measured split covers the last minute
# The windows the Live latency panel offers (seconds, label); the first is shown first.
LATENCY_WINDOWS = [(300, "5 min"), (3600, "1 h"), (86400, "24 h"), (7 * 86400, "7 days")]


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
        .order_by("tenant__slug", "name")
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
    return render_model(request, model)


def render_model(request: HttpRequest, model: Model, alias_form: AliasForm | None = None,
                 status: int = 200) -> HttpResponse:
    """A model's page; ``alias_form`` is a refused alias change, shown with its errors."""
    versions = model.versions.select_related("registered_by", "registered_by_token").prefetch_related("aliases")
    version_status = request.GET.get("status", "")
    if version_status:
        versions = versions.filter(status=version_status)
    can_deploy = has_role(request.user, model.tenant, Membership.Role.DEPLOYER)
    context = {
        "model": model,
        "page": paginate(request, versions),
        "status": version_status,
        "statuses": ModelVersion.Status.choices,
        "aliases": model.aliases.select_related("version"),
        "deployments": model.deployments.filter(archived_at__isnull=True).select_related("cluster"),
        "placements": Placement.objects.filter(
            model_version__model=model, state__in=Placement.HOLDING
        ).select_related("server", "model_version"),
        "qs": querystring_without_page(request),
        "can_deploy": can_deploy,
        "alias_form": alias_form or (
            AliasForm(actor=request.user, model=model) if can_deploy else None),
    }
    template = "rollouts/model_detail.html#versions" if request.htmx else "rollouts/model_detail.html"
    return render(request, template, context, status=status)


def _version(request: HttpRequest, pk: int) -> ModelVersion:
    return get_object_or_404(
        ModelVersion.objects.visible_to(request.user).select_related(
            "model__tenant", "registered_by", "registered_by_token", "approval_requested_by",
            "approval_requested_by_token__created_by", "decided_by",
        ),
        pk=pk,
    )


def _render_version(
    request: HttpRequest, version: ModelVersion, form: VersionActionForm | None = None, status: int = 200
) -> HttpResponse:
    tenant = version.model.tenant
    history = AuditEvent.objects.filter(object_type="rollouts.modelversion", object_id=str(version.pk))
    context = {
        "version": version,
        "history": history,
        "can_request": has_role(request.user, tenant, Membership.Role.DEPLOYER),
        "can_decide": has_role(request.user, tenant, Membership.Role.APPROVER),
        "is_requester": approvals.is_requester(request.user, version),
        "form": form,
    } | version_benchmark_context(version)
    return render(request, "rollouts/version_detail.html", context, status=status)


@login_required
def version_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return _render_version(request, _version(request, pk))


@login_required
@require_POST
def version_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    """Request approval, approve, reject or archive; too low a role is a 403 naming the role."""
    version = _version(request, pk)
    if action not in VersionActionForm.ACTIONS:
        raise Http404(f"no action {action!r} on versions")
    form = VersionActionForm(request.POST, actor=request.user, version=version, action=action)
    done = form.save()
    if done is None:
        return _render_version(request, _version(request, pk), form, status=form.status_code)
    messages.success(request, done)
    return redirect("rollouts:version", pk=version.pk)


@login_required
def deployment_list(request: HttpRequest) -> HttpResponse:
    """Deployments in use; ``?archived=true`` lists the archived ones instead."""
    archived = request.GET.get("archived", "").lower() in ("true", "1", "yes")
    visible = Deployment.objects.visible_to(request.user)
    deployments = (
        visible.filter(archived_at__isnull=not archived)
        .select_related("tenant", "model", "cluster")
        .prefetch_related("servers")
    )
    context = {
        "page": paginate(request, deployments),
        "qs": querystring_without_page(request),
        "archived": archived,
        "archived_count": visible.filter(archived_at__isnull=False).count(),
    }
    return render(request, "rollouts/deployment_list.html", context)


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


def _deployment(request: HttpRequest, pk: int) -> Deployment:
    return get_object_or_404(
        Deployment.objects.visible_to(request.user).select_related("tenant", "model", "cluster"), pk=pk
    )


@login_required
def deployment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return _render_deployment(request, _deployment(request, pk))


@login_required
def deployment_route_split(request: HttpRequest, pk: int) -> HttpResponse:
    """The Traffic panel's split table with the share each variant got (htmx, every 2 s)."""
    deployment = _deployment(request, pk)
    route = Route.objects.filter(pk=deployment.pk).first()
    split = _measured_split(deployment, route)
    if not split:
        return HttpResponse(status=HTMX_STOP_POLLING)
    return render(request, "rollouts/partials/route_split.html", {
        "deployment": deployment, "route": route, "route_split": split,
        "traffic_window_s": TRAFFIC_WINDOW_S,
    })


def _measured_split(deployment: Deployment, route: Route | None) -> list[dict[str, Any]]:
    """The split in force, each variant with what it got in the last TRAFFIC_WINDOW_S: its
    share of the requests, its figures and its mirrored copies' (no figures while Redis is
    away), and whether its version is still ready on its server."""
    split = route.split() if route is not None else []
    if not split:
        return split
    try:
        measured = samples.summary(deployment.pk, TRAFFIC_WINDOW_S)
    except redis.RedisError:
        measured = {}
    total = sum(m["count"] for m in measured.values())
    ready = {(load.version_id, load.server_id) for load in routes.ready_loads(deployment)}
    for row in split:
        meaning = route.variants.get(row["name"]) or {}
        figures = measured.get(row["name"]) or {}
        count = figures.get("count", 0)
        row["requests"] = count
        row["figures"] = figures if count else None
        copies = figures.get("mirror") or {}
        row["copies"] = copies if copies.get("count") else None
        row["measured"] = round(100 * count / total, 1) if total else None
        row["gone"] = (meaning.get("version_id"), meaning.get("server_id")) not in ready
    return split


def _traffic_context(
    request: HttpRequest, deployment: Deployment, can_deploy: bool,
    form: RouteForm | RouteDefaultForm | RouteRemoveForm | None,
) -> dict[str, Any]:
    """The Traffic panel: the route in force with the share each variant got in the last
    minute, the change form (deployers) and the history."""
    route = Route.objects.filter(pk=deployment.pk).first()
    split = _measured_split(deployment, route)
    refused = form if isinstance(form, RouteDefaultForm | RouteRemoveForm) else None
    if can_deploy and not isinstance(form, RouteForm) and routes.ready_loads(deployment):
        form = RouteForm(actor=request.user, deployment=deployment)
    return {
        "route_refusal": refused,
        "route": route,
        "route_split": split,
        "route_revisions": route.revisions.all()[:10] if route is not None else [],
        "route_form": form if can_deploy and isinstance(form, RouteForm) else None,
        "has_router": has_router(deployment.cluster),
        "can_route": can_deploy,
        "traffic_window_s": TRAFFIC_WINDOW_S,
    }


def _render_deployment(
    request: HttpRequest, deployment: Deployment, form: DeploymentLoadForm | None = None,
    status: int = 200, route_form: RouteForm | RouteDefaultForm | RouteRemoveForm | None = None,
    rollout_form: RolloutStartForm | None = None, benchmark_form: BenchmarkStartForm | None = None,
) -> HttpResponse:
    loadable = deployment.model.versions.exclude(
        status__in=[ModelVersion.Status.REJECTED, ModelVersion.Status.ARCHIVED]
    )
    if deployment.production:
        loadable = loadable.filter(status=ModelVersion.Status.APPROVED)
    loadable = list(loadable.order_by("-version").prefetch_related("aliases"))
    failed = registry.failed_version_ids(loadable)
    for version in loadable:
        version.last_load_failed = version.pk in failed
    can_deploy = has_role(request.user, deployment.tenant, Membership.Role.DEPLOYER) and (
        not deployment.is_archived
    )
    servers = list(deployment.servers.all())
    seen = reported_models(request.user, servers)
    for server in servers:
        # What the server reports of this deployment's model, of what the viewer may see.
        server.own_reported = [
            m for m in seen[server.pk].models if m.get("name") == deployment.model.name_on(server)
        ]
    context = _deployment_context(request, deployment) | {
        "servers": servers,
        # Loads change what these run; a Kubernetes workload runs the version it started with.
        "load_servers": [s for s in servers if s.source != InferenceServer.Source.MANAGED],
        "aliases": deployment.model.aliases.select_related("version"),
        "loadable": loadable,
        "default_load": _default_load(loadable),
        "can_deploy": can_deploy,
        "can_delete": has_role(request.user, deployment.tenant, Membership.Role.ADMIN)
        and not deployment.is_archived,
        "load_form": form,
        "latency_url": reverse("api:deployment-latency", args=[deployment.pk]),
        "latency_windows": LATENCY_WINDOWS,
        "placements": Placement.objects.filter(
            server__in=deployment.servers.all(), model_version__model=deployment.model,
            state__in=Placement.HOLDING,
        ).select_related("server", "model_version"),
    } | _traffic_context(request, deployment, can_deploy, route_form) | (
        deployment_rollouts_context(request, deployment, can_deploy, rollout_form)) | (
        deployment_benchmarks_context(request, deployment, can_deploy, benchmark_form))
    return render(request, "rollouts/deployment_detail.html", context, status=status)


def _default_load(loadable: list[ModelVersion]) -> ModelVersion | None:
    """The version the load form offers first: the production alias's, else the newest, but
    never one whose last load failed while another is there to offer."""
    healthy = [v for v in loadable if not v.last_load_failed]
    for version in healthy:
        if any(a.name == routes.PRODUCTION_ALIAS for a in version.aliases.all()):
            return version
    return (healthy or loadable or [None])[0]


@login_required
def deployment_call(request: HttpRequest, pk: int) -> HttpResponse:
    """The "How to call it" panel, loaded after the page (it may ask a server for metadata)."""
    deployment = _deployment(request, pk)
    return render(request, "rollouts/partials/call_guide.html",
                  {"deployment": deployment, "guide": calling.guide(deployment)})


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
    """Load or unload a version; refusals re-render the page with the form's errors."""
    deployment = _deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    form = DeploymentLoadForm(request.POST, actor=request.user, deployment=deployment)
    done = form.save()
    if done is None:
        return _render_deployment(request, deployment, form, status=form.status_code)
    messages.success(request, done)
    return redirect("rollouts:deployment", pk=deployment.pk)


def _route_action(
    request: HttpRequest, pk: int, form_class: type[RouteForm | RouteDefaultForm | RouteRemoveForm]
) -> HttpResponse:
    """A deployer's change of the route through ``form_class``: back to the Traffic panel, or
    the page again with the refusal in place (nginx's own message when it refused)."""
    deployment = _deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    form = form_class(request.POST, actor=request.user, deployment=deployment)
    done = form.save()
    if done is None:
        return _render_deployment(request, deployment, status=form.status_code, route_form=form)
    messages.success(request, done)
    return redirect(reverse("rollouts:deployment", args=[deployment.pk]) + "#traffic")


@login_required
@require_POST
def deployment_route(request: HttpRequest, pk: int) -> HttpResponse:
    """Change the traffic split, policy and mirror."""
    return _route_action(request, pk, RouteForm)


@login_required
@require_POST
def deployment_route_default(request: HttpRequest, pk: int) -> HttpResponse:
    """Give the deployment its default route: all traffic to the production alias's version
    when it is ready, else to the newest ready version."""
    return _route_action(request, pk, RouteDefaultForm)


@login_required
@require_POST
def deployment_route_remove(request: HttpRequest, pk: int) -> HttpResponse:
    """Take the route off the router, so its versions can be unloaded."""
    return _route_action(request, pk, RouteRemoveForm)


@login_required
@require_POST
def deployment_rollout_start(request: HttpRequest, pk: int) -> HttpResponse:
    """Start a canary or an A/B split: on to the rollout's page, or the deployment page again
    with the refusal next to the field it names."""
    deployment = _deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    made, form = start_rollout(request, deployment)
    if made is None:
        return _render_deployment(request, deployment, status=form.status_code, rollout_form=form)
    return redirect("rollouts:rollout", pk=made.pk)


@login_required
@require_POST
def deployment_benchmark_start(request: HttpRequest, pk: int) -> HttpResponse:
    """Start a benchmark: on to the job's page, or the deployment page again with the
    refusal next to the field it names."""
    deployment = _deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    made, form = start_benchmark(request, deployment)
    if made is None:
        return _render_deployment(request, deployment, status=form.status_code,
                                  benchmark_form=form)
    return redirect("rollouts:benchmark", pk=made.pk)


@login_required
def deployment_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """Confirm, then delete: archived when it has had loads, refused while anything is loaded."""
    deployment = _deployment(request, pk)
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
