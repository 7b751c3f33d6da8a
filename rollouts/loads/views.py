"""Load console pages: every load of the viewer's tenants, one load's page, the deployment
page's live loads panel, and loading or unloading a version from the deployment page.
Decisions go through ``rollouts.loads.forms`` to the functions of ``rollouts.loads.requests``
the API calls."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Exists, OuterRef
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from django_htmx.http import HTMX_STOP_POLLING

from console.paging import keyset_paginate, querystring_without_cursor
from fleet.api.refs import is_id
from fleet.models import InferenceServer, Membership
from fleet.tenancy.scoping import require_role
from rollouts.deployments.pages import loads_panel_context, render_deployment, visible_deployment
from rollouts.loads import drift
from rollouts.loads.forms import DeploymentLoadForm
from rollouts.models import Deployment, ModelLoad

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
    # EXISTS, one index probe a deployment or server, where a join would read every load.
    visible = ModelLoad.objects.visible_to(request.user)
    deployments = Deployment.objects.visible_to(request.user).filter(
        Exists(visible.filter(deployment=OuterRef("pk"))))
    context = {
        "page": keyset_paginate(request, rows),
        "qs": querystring_without_cursor(request),
        "chosen": chosen,
        "states": ModelLoad.State.choices,
        # Choices as plain values: a fleet's thousand deployments and servers as model rows
        # took most of the page's time.
        "deployments": deployments.order_by("tenant__slug", "name")
        .values("pk", "name", "tenant__slug"),
        "servers": InferenceServer.objects.filter(
            Exists(visible.filter(server=OuterRef("pk")))
        ).order_by("name").values("pk", "name"),
    }
    template = "rollouts/load_list.html#results" if request.htmx else "rollouts/load_list.html"
    return render(request, template, context)


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
    context = {"load": load, "events": load.events.all(),
               "on_server": drift.on_server(load) if load.state == ModelLoad.State.READY else ""}
    return render(request, template, context, status=status)


@login_required
def deployment_loads(request: HttpRequest, pk: int) -> HttpResponse:
    """The live loads panel; tells htmx to stop polling once nothing is in flight."""
    deployment = get_object_or_404(Deployment.objects.visible_to(request.user), pk=pk)
    context = loads_panel_context(deployment)
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
    deployment = visible_deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    form = DeploymentLoadForm(request.POST, actor=request.user, deployment=deployment)
    done = form.save()
    if done is None:
        return render_deployment(request, deployment, form, status=form.status_code)
    messages.success(request, done)
    return redirect("rollouts:deployment", pk=deployment.pk)
