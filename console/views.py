"""Cross-app console pages: the dashboard and the audit log; the site's /favicon.ico."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.utils import timezone
from django.utils.cache import patch_cache_control

from console.paging import keyset_paginate, querystring_without_cursor
from fleet.api.filters import AuditEventFilter
from fleet.audit import export as audit_export_domain
from fleet.models import AuditEvent, InferenceServer, Quota, Tenant
from fleet.quota.admission import usage_for
from rollouts.models import Deployment, Model, ModelVersion
from rollouts.slo import pages as slo_pages

# The audit log's Action and Object type filters offer what this many of the newest events say.
VOCABULARY_WINDOW = 5000


def health_dots(user: Any) -> list[InferenceServer]:
    """The servers of the fleet-health card: a dot each, so only its name and health (a
    thousand full rows with their clusters took most of the dashboard's time)."""
    return list(InferenceServer.objects.visible_to(user).only("pk", "name", "health"))


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    user = request.user
    versions = ModelVersion.objects.visible_to(user)
    pending = versions.filter(status=ModelVersion.Status.PENDING_APPROVAL)
    servers = health_dots(user)
    context = {
        "model_count": Model.objects.visible_to(user).count(),
        "version_count": versions.count(),
        "pending": pending.select_related("model__tenant")[:10],
        "pending_count": pending.count(),
        "deployment_count": Deployment.objects.visible_to(user).filter(archived_at__isnull=True).count(),
        "servers": servers,
        "healthy_count": sum(s.is_healthy for s in servers),
        "usages": usage_for(list(Quota.objects.visible_to(user).select_related("tenant__cohort"))),
        "recent": AuditEvent.objects.visible_to(user).select_related("tenant")[:8],
        "tenants": Tenant.objects.visible_to(user),
        "now": timezone.now(),
        "slo": slo_pages.summary(user),
    }
    return render(request, "console/dashboard.html", context)


@login_required
def fleet_health_partial(request: HttpRequest) -> HttpResponse:
    servers = health_dots(request.user)
    return render(
        request,
        "console/partials/fleet_health.html",
        {"servers": servers, "healthy_count": sum(s.is_healthy for s in servers)},
    )


@login_required
def audit_log(request: HttpRequest) -> HttpResponse:
    events = AuditEvent.objects.visible_to(request.user).select_related("tenant")
    filterset = AuditEventFilter(request.GET, queryset=events)
    verbs, object_types = recent_vocabulary(events, request.GET)
    context = {
        "filter": filterset,
        "page": keyset_paginate(request, filterset.qs if filterset.is_valid() else events.none()),
        "tenants": Tenant.objects.visible_to(request.user),
        "verbs": verbs,
        "object_types": object_types,
        "qs": querystring_without_cursor(request),
    }
    if request.htmx:
        # htmx swaps only 2xx answers: the partial shows the error in place.
        return render(request, "console/audit_log.html#results", context)
    # A page whose filter could not be read says so in its status too (the page names the field).
    return render(request, "console/audit_log.html", context,
                  status=200 if filterset.is_valid() else 400)


def recent_vocabulary(events: QuerySet, chosen: Any) -> tuple[list[str], list[str]]:
    """The actions and object types the filters offer: those of the newest
    ``VOCABULARY_WINDOW`` events the viewer may see (a DISTINCT over every event would read
    all of them), and the ones chosen."""
    seen = list(events.order_by("-created_at", "-id")
                .values_list("verb", "object_type")[:VOCABULARY_WINDOW])
    verbs = {v for v, _ in seen} | ({chosen["verb"]} if chosen.get("verb") else set())
    types = {t for _, t in seen} | ({chosen["object_type"]} if chosen.get("object_type") else set())
    return sorted(verbs), sorted(types)


@login_required
def audit_export(request: HttpRequest) -> HttpResponse:
    """The audit log as the page's filters select it, downloaded as CSV or JSON Lines
    (``?as=csv|jsonl``), streamed."""
    kind = request.GET.get("as", "csv")
    events = AuditEvent.objects.visible_to(request.user)
    filterset = AuditEventFilter(request.GET, queryset=events)
    if kind not in audit_export_domain.FORMATS or not filterset.is_valid():
        problems = {} if kind in audit_export_domain.FORMATS else {
            "as": [f"must be one of {', '.join(audit_export_domain.FORMATS)}"]}
        problems.update(filterset.errors)
        text = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in problems.items())
        return HttpResponse(f"Cannot export: {text}", status=400, content_type="text/plain")
    return audit_export_domain.response(filterset.qs, kind)


def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico where a page names no icon (an API answer, a file): the
    console's SVG icon, whose static URL changes with its content in production."""
    response = redirect(static("switchyard/favicon.svg"))
    patch_cache_control(response, public=True, max_age=24 * 3600)
    return response
