"""Webhook console pages: a tenant admin's webhooks, making one (its secret shown once), its
delivery log, a test ping, turning it on or off, deleting it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from fleet.models import Membership, Tenant, Webhook, WebhookDelivery
from fleet.tenancy.scoping import has_role, require_role
from fleet.webhooks import requests as webhook_requests
from fleet.webhooks.events import EVENTS
from fleet.webhooks.forms import WebhookForm


def _webhooks_page(
    request: HttpRequest, form: WebhookForm, created: webhook_requests.CreatedWebhook | None = None,
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
        "webhooks": rows, "tenants": admin_tenants, "events": EVENTS.items(),
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
                  {"webhook": webhook, "deliveries": deliveries, "events": EVENTS})


@login_required
@require_POST
def webhook_test(request: HttpRequest, pk: int) -> HttpResponse:
    webhook = _webhook(request, pk)
    webhook_requests.send_test(request.user, webhook)
    messages.success(request, f"Ping queued for {webhook.name}; its answer shows below.")
    return redirect("fleet:webhook", pk=webhook.pk)


@login_required
@require_POST
def webhook_toggle(request: HttpRequest, pk: int) -> HttpResponse:
    webhook = _webhook(request, pk)
    webhook_requests.update_webhook(request.user, webhook, active=not webhook.active)
    messages.success(request, f"Webhook {webhook.name} {'on' if webhook.active else 'off'}.")
    return redirect("fleet:webhook", pk=webhook.pk)


@login_required
@require_POST
def webhook_delete(request: HttpRequest, pk: int) -> HttpResponse:
    webhook = _webhook(request, pk)
    webhook_requests.delete_webhook(request.user, webhook)
    messages.success(request, f"Webhook {webhook.name} deleted.")
    return redirect("fleet:webhooks")
