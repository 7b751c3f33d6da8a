"""Traffic console pages: the deployment page's measured split (htmx), and a deployer's
changes of the route from its Traffic panel. Decisions go through ``rollouts.traffic.forms``
to the functions of ``rollouts.traffic.routes`` the API calls."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HTMX_STOP_POLLING

from fleet.models import Membership
from fleet.tenancy.scoping import require_role
from rollouts.deployments.pages import render_deployment, visible_deployment
from rollouts.models import Route
from rollouts.traffic.forms import RouteDefaultForm, RouteForm, RouteRemoveForm
from rollouts.traffic.pages import TRAFFIC_WINDOW_S, measured_split


@login_required
def deployment_route_split(request: HttpRequest, pk: int) -> HttpResponse:
    """The Traffic panel's split table with the share each variant got (htmx, every 2 s)."""
    deployment = visible_deployment(request, pk)
    route = Route.objects.filter(pk=deployment.pk).first()
    split = measured_split(deployment, route)
    if not split:
        return HttpResponse(status=HTMX_STOP_POLLING)
    return render(request, "rollouts/partials/route_split.html", {
        "deployment": deployment, "route": route, "route_split": split,
        "traffic_window_s": TRAFFIC_WINDOW_S,
    })


def _route_action(
    request: HttpRequest, pk: int, form_class: type[RouteForm | RouteDefaultForm | RouteRemoveForm]
) -> HttpResponse:
    """A deployer's change of the route through ``form_class``: back to the Traffic panel, or
    the page again with the refusal in place (nginx's own message when it refused)."""
    deployment = visible_deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    form = form_class(request.POST, actor=request.user, deployment=deployment)
    done = form.save()
    if done is None:
        return render_deployment(request, deployment, status=form.status_code, route_form=form)
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
