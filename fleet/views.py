"""Fleet console pages: inventory with live health, quotas with usage, API tokens."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from fleet import health, loadstats, tokens
from fleet.errors import DomainError
from fleet.models import (
    GPU,
    APIToken,
    Cluster,
    InferenceServer,
    Membership,
    Node,
    Placement,
    Quota,
    Tenant,
)
from fleet.quota import usage_for
from fleet.tenancy import has_role


def _clusters(user: object) -> list[Cluster]:
    servers = InferenceServer.objects.order_by("name")
    nodes = Node.objects.prefetch_related(
        Prefetch("gpus", queryset=GPU.objects.filter(parent__isnull=True).prefetch_related("mig_slices")),
        Prefetch("servers", queryset=servers),
    )
    return list(
        Cluster.objects.visible_to(user).prefetch_related(
            Prefetch("nodes", queryset=nodes), Prefetch("servers", queryset=servers)
        )
    )


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    return render(request, "fleet/overview.html", {"clusters": _clusters(request.user)})


@login_required
def servers_partial(request: HttpRequest) -> HttpResponse:
    """The live server table, re-rendered every few seconds by htmx."""
    servers = list(InferenceServer.objects.visible_to(request.user).select_related("cluster", "node"))
    loads = loadstats.server_loads([s.pk for s in servers])
    now = timezone.now()
    for server in servers:
        load = loads.get(server.pk)
        server.load_rps = load["rps"] if load else None
        server.load_age_s = now.timestamp() - load["t"] if load else None
    return render(request, "fleet/partials/server_table.html", {"servers": servers, "now": now})


@login_required
def server_detail(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(InferenceServer.objects.visible_to(request.user), pk=pk)
    placements = (
        Placement.objects.visible_to(request.user)
        .filter(server=server, state__in=Placement.HOLDING)
        .select_related("tenant", "model_version__model")
    )
    return render(
        request,
        "fleet/server_detail.html",
        {"server": server, "now": timezone.now(), "placements": placements},
    )


@login_required
def server_status(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(InferenceServer.objects.visible_to(request.user), pk=pk)
    return render(
        request, "fleet/partials/server_status.html", {"server": server, "now": timezone.now()}
    )


@login_required
@require_POST
def server_check(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(InferenceServer.objects.visible_to(request.user), pk=pk)
    health.check_server(server.pk)
    server.refresh_from_db()
    return render(
        request, "fleet/partials/server_status.html", {"server": server, "now": timezone.now()}
    )


@login_required
def quotas(request: HttpRequest) -> HttpResponse:
    rows = usage_for(list(Quota.objects.visible_to(request.user).select_related("tenant")))
    template = "fleet/partials/quota_table.html" if request.htmx else "fleet/quotas.html"
    return render(request, template, {"usages": rows})


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    admin_tenants = [
        t for t in Tenant.objects.visible_to(request.user) if has_role(request.user, t, "admin")
    ]
    token_rows = APIToken.objects.filter(tenant__in=admin_tenants).select_related("tenant", "created_by")
    return render(
        request,
        "fleet/tokens.html",
        {
            "tokens": token_rows,
            "tenants": admin_tenants,
            "roles": Membership.Role.choices,
            "issued": request.session.pop("issued_token", None),
        },
    )


@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    tenant = get_object_or_404(Tenant.objects.visible_to(request.user), slug=request.POST.get("tenant"))
    name = request.POST.get("name", "").strip()
    role = request.POST.get("role", Membership.Role.DEPLOYER)
    expires_raw = request.POST.get("expires_at", "").strip()
    expires_at = parse_datetime(expires_raw) if expires_raw else None
    if expires_at is not None and timezone.is_naive(expires_at):
        expires_at = timezone.make_aware(expires_at)
    if not name:
        messages.error(request, "Give the token a name, e.g. the pipeline that will use it.")
    elif role not in Membership.Role.values:
        messages.error(request, f"Unknown role {role!r}.")
    elif expires_raw and expires_at is None:
        messages.error(request, "The expiry date is not a date and time.")
    else:
        try:
            issued = tokens.issue(request.user, tenant, name, role, expires_at)
        except DomainError as exc:
            messages.error(request, exc.message)
        else:
            request.session["issued_token"] = {"name": name, "secret": issued.secret}
    return redirect("fleet:tokens")


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(APIToken.objects.visible_to(request.user), pk=pk)
    try:
        tokens.revoke(request.user, token, request.POST.get("reason", ""))
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Token {token.name} revoked.")
    return redirect("fleet:tokens")
