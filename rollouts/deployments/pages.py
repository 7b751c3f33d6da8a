"""What every deployment page shows, for the views of every room that draws it (deployments,
loads, traffic, canary, benchmarks): the deployment looked up for the viewer, its page with
all of its panels and a refused form in place, the live loads panel, and the filters of the
lists of a deployment's jobs (rollouts, benchmarks).

Each room's panel is its own (``rollouts.traffic.pages``, ``rollouts.canary.pages``,
``rollouts.benchmarks.pages``); this module only puts them on the one page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from console.paging import paginate, querystring_without_page
from fleet.api.refs import is_id
from fleet.models import InferenceServer, Membership, Placement
from fleet.tenancy.scoping import has_role
from fleet.tenancy.visibility import reported_models
from rollouts.benchmarks.forms import BenchmarkStartForm
from rollouts.benchmarks.pages import deployment_benchmarks_context
from rollouts.canary.forms import RolloutStartForm
from rollouts.canary.pages import deployment_rollouts_context
from rollouts.deployments import consistency
from rollouts.deployments.forms import ConvergeForm
from rollouts.loads.forms import DeploymentLoadForm
from rollouts.models import Deployment, ModelLoad, ModelVersion
from rollouts.registry import versions as registry
from rollouts.traffic import routes
from rollouts.traffic.forms import RouteDefaultForm, RouteForm, RouteRemoveForm
from rollouts.traffic.pages import traffic_panel_context

# The windows the Live latency panel offers (seconds, label); the first is shown first.
LATENCY_WINDOWS = [(300, "5 min"), (3600, "1 h"), (86400, "24 h"), (7 * 86400, "7 days")]
# What the rollout and benchmark lists narrow to (``?state=``).
STATE_FILTERS = (("active", "Active"), ("finished", "Finished"), ("all", "All"))


def visible_deployment(request: HttpRequest, pk: int) -> Deployment:
    """The deployment ``pk`` if the viewer may see it (with its tenant, model and cluster),
    else a 404."""
    return get_object_or_404(
        Deployment.objects.visible_to(request.user).select_related("tenant", "model", "cluster"), pk=pk
    )


def loads_panel_context(deployment: Deployment) -> dict[str, Any]:
    """The live loads panel: the deployment's recent loads, the ready ones, and whether any
    is still in flight (the panel polls while one is)."""
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


def render_deployment(
    request: HttpRequest, deployment: Deployment, form: DeploymentLoadForm | None = None,
    status: int = 200, route_form: RouteForm | RouteDefaultForm | RouteRemoveForm | None = None,
    rollout_form: RolloutStartForm | None = None, benchmark_form: BenchmarkStartForm | None = None,
    converge_form: ConvergeForm | None = None,
) -> HttpResponse:
    """The deployment's page with every panel; a refused form (a load, a route change, a
    rollout or a benchmark start, a converge) is shown in its panel with its errors, with
    ``status``."""
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
    context = loads_panel_context(deployment) | {
        "servers": servers,
        # Loads change what these run; a Kubernetes workload runs the version it started with.
        "load_servers": [s for s in servers if s.source != InferenceServer.Source.MANAGED],
        "aliases": deployment.model.aliases.select_related("version"),
        "loadable": loadable,
        "default_load": default_load(loadable),
        "can_deploy": can_deploy,
        "can_delete": has_role(request.user, deployment.tenant, Membership.Role.ADMIN)
        and not deployment.is_archived,
        "load_form": form,
        "consistency": consistency.view(deployment),
        "converge_blocker": consistency.blocker(deployment),
        "converge_form": converge_form,
        "latency_url": reverse("api:deployment-latency", args=[deployment.pk]),
        "latency_windows": LATENCY_WINDOWS,
        "placements": Placement.objects.filter(
            server__in=deployment.servers.all(), model_version__model=deployment.model,
            state__in=Placement.HOLDING,
        ).select_related("server", "model_version"),
    } | traffic_panel_context(request, deployment, can_deploy, route_form) | (
        deployment_rollouts_context(request, deployment, can_deploy, rollout_form)) | (
        deployment_benchmarks_context(request, deployment, can_deploy, benchmark_form))
    return render(request, "rollouts/deployment_detail.html", context, status=status)


def default_load(loadable: list[ModelVersion]) -> ModelVersion | None:
    """The version the load form offers first: the production alias's, else the newest, but
    never one whose last load failed while another is there to offer."""
    healthy = [v for v in loadable if not v.last_load_failed]
    for version in healthy:
        if any(a.name == routes.PRODUCTION_ALIAS for a in version.aliases.all()):
            return version
    return (healthy or loadable or [None])[0]


def job_list_context(request: HttpRequest, found: Any, active: list[str],
                     final: list[str], decorate: Callable[[Any], None]) -> dict[str, Any]:
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
