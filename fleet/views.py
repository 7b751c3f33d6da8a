"""Fleet console pages: inventory with live health, quotas with usage, API tokens, webhooks."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from fleet import health, loadstats, tokens, webhooks
from fleet.forms import TokenForm, WebhookForm
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
    Webhook,
    WebhookDelivery,
)
from fleet.quota import usage_for
from fleet.tenancy import has_role, require_role
from fleet.visibility import reported_models, reported_models_of


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
    shown = reported_models(request.user, servers)
    now = timezone.now()
    for server in servers:
        server.shown_models = shown[server.pk]
        load = loads.get(server.pk)
        server.load_rps = load["rps"] if load else None
        server.load_age_s = now.timestamp() - load["t"] if load else None
    routers = Cluster.objects.visible_to(request.user).filter(
        Q(kind=Cluster.Kind.LOCAL) | Q(router_kind=Cluster.RouterKind.NGINX)
    ).order_by("name")
    return render(request, "fleet/partials/server_table.html",
                  {"servers": servers, "routers": routers, "now": now})


@login_required
def server_detail(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(InferenceServer.objects.visible_to(request.user), pk=pk)
    placements = (
        Placement.objects.visible_to(request.user)
        .filter(server=server, state__in=Placement.HOLDING)
        .select_related("tenant", "model_version__model")
    )
    server.shown_models = reported_models_of(request.user, server)
    return render(
        request,
        "fleet/server_detail.html",
        {"server": server, "now": timezone.now(), "placements": placements},
    )


def _status(request: HttpRequest, server: InferenceServer) -> HttpResponse:
    server.shown_models = reported_models_of(request.user, server)
    return render(
        request, "fleet/partials/server_status.html", {"server": server, "now": timezone.now()}
    )


@login_required
def server_status(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(InferenceServer.objects.visible_to(request.user), pk=pk)
    return _status(request, server)


@login_required
@require_POST
def server_check(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(InferenceServer.objects.visible_to(request.user), pk=pk)
    health.check_server(server.pk)
    server.refresh_from_db()
    return _status(request, server)


@login_required
def quotas(request: HttpRequest) -> HttpResponse:
    rows = usage_for(list(Quota.objects.visible_to(request.user).select_related("tenant")))
    template = "fleet/partials/quota_table.html" if request.htmx else "fleet/quotas.html"
    return render(request, template, {"usages": rows})


def _tokens_page(
    request: HttpRequest, form: TokenForm, issued: tokens.IssuedToken | None = None, status: int = 200
) -> HttpResponse:
    admin_tenants = [
        t for t in Tenant.objects.visible_to(request.user) if has_role(request.user, t, "admin")
    ]
    token_rows = APIToken.objects.filter(tenant__in=admin_tenants).select_related(
        "tenant", "created_by", "created_by_token"
    )
    response = render(
        request,
        "fleet/tokens.html",
        {
            "tokens": token_rows,
            "tenants": admin_tenants,
            "roles": Membership.Role.choices,
            "form": form,
            "issued": issued,
        },
        status=status,
    )
    # The page that shows a new secret is not kept by the browser or any cache on the way.
    add_never_cache_headers(response)
    return response


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    return _tokens_page(request, TokenForm(actor=request.user))


@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    """Issue a token and show its secret in this response only: it is never written to the
    session, a message or the database (which keeps only its HMAC)."""
    form = TokenForm(request.POST, actor=request.user)
    issued = form.save()
    if issued is None:
        return _tokens_page(request, form, status=form.status_code)
    return _tokens_page(request, TokenForm(actor=request.user), issued=issued)


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(APIToken.objects.visible_to(request.user), pk=pk)
    # Too low a role is a 403 page naming the role needed, as on every console action.
    tokens.revoke(request.user, token, request.POST.get("reason", ""))
    messages.success(request, f"Token {token.name} revoked.")
    return redirect("fleet:tokens")


def _webhooks_page(
    request: HttpRequest, form: WebhookForm, created: webhooks.CreatedWebhook | None = None,
    status: int = 200,
) -> HttpResponse:
    admin_tenants = [
        t for t in Tenant.objects.visible_to(request.user) if has_role(request.user, t, "admin")
    ]
    rows = list(Webhook.objects.filter(tenant__in=admin_tenants).select_related("tenant"))
    last: dict[int, WebhookDelivery] = {}
    for delivery in WebhookDelivery.objects.filter(webhook__in=rows).order_by("created_at", "id"):
        last[delivery.webhook_id] = delivery
    for webhook in rows:
        webhook.last_delivery = last.get(webhook.pk)
    response = render(request, "fleet/webhooks.html", {
        "webhooks": rows, "tenants": admin_tenants, "events": webhooks.EVENTS.items(),
        "formats": Webhook.Format.choices, "form": form, "created": created,
    }, status=status)
    # The page that shows a new secret is not kept by the browser or any cache on the way.
    add_never_cache_headers(response)
    return response


@login_required
def webhook_list(request: HttpRequest) -> HttpResponse:
    return _webhooks_page(request, WebhookForm(actor=request.user))


@login_required
@require_POST
def webhook_create(request: HttpRequest) -> HttpResponse:
    """Make a webhook and show its secret in this response only."""
    form = WebhookForm(request.POST, actor=request.user)
    created = form.save()
    if created is None:
        return _webhooks_page(request, form, status=form.status_code)
    return _webhooks_page(request, WebhookForm(actor=request.user), created=created)


def _webhook(request: HttpRequest, pk: int) -> Webhook:
    webhook = get_object_or_404(Webhook.objects.visible_to(request.user).select_related("tenant"),
                                pk=pk)
    require_role(request.user, webhook.tenant, Membership.Role.ADMIN)
    return webhook


@login_required
def webhook_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """The webhook and its delivery log, newest first (the last 100)."""
    webhook = _webhook(request, pk)
    deliveries = webhook.deliveries.order_by("-created_at", "-id")[:100]
    return render(request, "fleet/webhook_detail.html",
                  {"webhook": webhook, "deliveries": deliveries, "events": webhooks.EVENTS})


@login_required
@require_POST
def webhook_test(request: HttpRequest, pk: int) -> HttpResponse:
    webhook = _webhook(request, pk)
    webhooks.send_test(request.user, webhook)
    messages.success(request, f"Ping queued for {webhook.name}; its answer shows below.")
    return redirect("fleet:webhook", pk=webhook.pk)


@login_required
@require_POST
def webhook_toggle(request: HttpRequest, pk: int) -> HttpResponse:
    webhook = _webhook(request, pk)
    webhooks.update_webhook(request.user, webhook, active=not webhook.active)
    messages.success(request, f"Webhook {webhook.name} {'on' if webhook.active else 'off'}.")
    return redirect("fleet:webhook", pk=webhook.pk)


@login_required
@require_POST
def webhook_delete(request: HttpRequest, pk: int) -> HttpResponse:
    webhook = _webhook(request, pk)
    webhooks.delete_webhook(request.user, webhook)
    messages.success(request, f"Webhook {webhook.name} deleted.")
    return redirect("fleet:webhooks")
