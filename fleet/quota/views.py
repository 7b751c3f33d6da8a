"""Quota console pages: each tenant's quotas with live usage, what is borrowed, and the
requests for more (tenant admins ask, platform admins decide)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from fleet.models import Membership, Placement, Quota, QuotaRequest, Tenant
from fleet.quota.admission import usage_for
from fleet.quota.forms import QuotaDecisionForm, QuotaRequestForm
from fleet.tenancy.scoping import has_role, is_platform_admin, require_platform_admin


@login_required
def quotas(request: HttpRequest) -> HttpResponse:
    rows = usage_for(list(Quota.objects.visible_to(request.user).select_related("tenant__cohort")))
    if request.htmx:
        return render(request, "fleet/partials/quota_table.html", {"usages": rows})
    return _quotas_page(request, rows)


def _quotas_page(request: HttpRequest, rows: list[Any] | None = None,
                 form: QuotaRequestForm | None = None, status: int = 200) -> HttpResponse:
    """The quotas and the requests for more: the ask form for tenant admins, the decision
    buttons for platform admins."""
    if rows is None:
        rows = usage_for(list(Quota.objects.visible_to(request.user).select_related("tenant__cohort")))
    admin_of = [t for t in Tenant.objects.visible_to(request.user)
                if has_role(request.user, t, Membership.Role.ADMIN)]
    return render(request, "fleet/quotas.html", {
        "usages": rows,
        "borrowed": Placement.objects.visible_to(request.user).filter(
            state__in=Placement.HOLDING).filter(
            Q(borrowed_units__gt=0) | Q(borrowed_memory_mib__gt=0)).select_related(
            "tenant__cohort", "server", "model_version__model").order_by("priority", "-created_at")[:100],
        "requests": QuotaRequest.objects.visible_to(request.user).select_related("tenant")[:50],
        "ask_form": form or (QuotaRequestForm(actor=request.user) if admin_of else None),
        "can_decide": is_platform_admin(request.user),
    }, status=status)


@login_required
@require_POST
def quota_request_create(request: HttpRequest) -> HttpResponse:
    """A tenant admin asks for more quota; a refusal comes back on the page's form."""
    form = QuotaRequestForm(request.POST, actor=request.user)
    made = form.save()
    if made is None:
        return _quotas_page(request, form=form, status=form.status_code)
    messages.success(request, f"Asked for {made.units} x {made.device_class}: a platform admin decides.")
    return redirect("fleet:quotas")


@login_required
@require_POST
def quota_request_decide(request: HttpRequest, pk: int) -> HttpResponse:
    """A platform admin approves or refuses a quota request."""
    asked = get_object_or_404(QuotaRequest.objects.visible_to(request.user), pk=pk)
    require_platform_admin(request.user)
    form = QuotaDecisionForm(request.POST, actor=request.user, request=asked)
    done = form.save()
    if done is None:
        errors = "; ".join(f"{k}: {' '.join(v)}" if k != "__all__" else " ".join(v)
                           for k, v in form.errors.items())
        messages.error(request, f"Quota request {asked.pk}: {errors}")
    else:
        messages.success(request, f"Quota request {done.pk} {done.state}.")
    return redirect("fleet:quotas")
