"""Registry console pages: the models, a model's page with its versions and aliases, a
version's page, registering and changing models and versions, moving an alias, a version's
approval actions and the approvals queue. Forms call the domain functions the API calls
(``rollouts.registry.forms``)."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Max, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from console.forms import next_or
from console.paging import paginate, querystring_without_page
from fleet.models import AuditEvent, DevicePrice, Membership, Placement, Tenant
from fleet.tenancy.scoping import has_role, require_role, tenant_roles
from rollouts.benchmarks.pages import version_benchmark_context
from rollouts.canary.pages import actions_for
from rollouts.models import Model, ModelVersion, Rollout
from rollouts.registry import approvals, costs
from rollouts.registry.forms import (
    AliasForm,
    ModelCreateForm,
    ModelEditForm,
    VersionActionForm,
    VersionForm,
)
from rollouts.registry.outcomes import mark_latest_rolled_back, mark_rolled_back


def _form_page(request: HttpRequest, template: str, form: Any, status: int = 200,
               **context: Any) -> HttpResponse:
    return render(request, template, {"form": form, **context}, status=status)


def _model(request: HttpRequest, pk: int) -> Model:
    return get_object_or_404(Model.objects.visible_to(request.user).select_related("tenant"), pk=pk)


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
    page = context["page"]
    page.object_list = list(page.object_list)  # read once: the rows carry what is marked
    mark_latest_rolled_back(page.object_list)
    template = "rollouts/model_list.html#results" if request.htmx else "rollouts/model_list.html"
    return render(request, template, context)


@login_required
def model_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return render_model(request, _model(request, pk))


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
    page = context["page"]
    page.object_list = list(page.object_list)
    mark_rolled_back(page.object_list)
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
    mark_rolled_back([version])
    history = AuditEvent.objects.filter(object_type="rollouts.modelversion", object_id=str(version.pk))
    context = {
        "version": version,
        "history": history,
        "can_request": has_role(request.user, tenant, Membership.Role.DEPLOYER),
        "can_decide": has_role(request.user, tenant, Membership.Role.APPROVER),
        "is_requester": approvals.is_requester(request.user, version),
        "form": form,
    } | version_benchmark_context(version) | cost_context(version)
    return render(request, "rollouts/version_detail.html", context, status=status)


def cost_context(version: ModelVersion) -> dict[str, Any]:
    """What the version costs (``rollouts.registry.costs``), for its page."""
    found = costs.of_version(version)
    return {"cost_readings": [r for r in (found["benchmark"], found["live"]) if r],
            "cost_compared": found["compared"]}


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
    return redirect(next_or(request, reverse("rollouts:version", args=[version.pk])))


@login_required
@require_http_methods(["GET", "POST"])
def model_create(request: HttpRequest) -> HttpResponse:
    """Register a model in one of the viewer's tenants (deployer role there)."""
    if request.method == "GET":
        return _form_page(request, "rollouts/model_form.html", ModelCreateForm(actor=request.user))
    form = ModelCreateForm(request.POST, actor=request.user)
    model = form.save()
    if model is None:
        return _form_page(request, "rollouts/model_form.html", form, status=form.status_code)
    if form.created:
        messages.success(request, f"Model {model.name} registered. Register its first version.")
        return redirect("rollouts:version-create", pk=model.pk)
    messages.info(request, f"{model.tenant.slug} already has a model named {model.name}: here it is.")
    return redirect("rollouts:model", pk=model.pk)


@login_required
@require_http_methods(["GET", "POST"])
def model_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """Change a model's description (deployer role)."""
    model = _model(request, pk)
    require_role(request.user, model.tenant, Membership.Role.DEPLOYER)
    form = ModelEditForm(request.POST or None, actor=request.user, model=model)
    if request.method == "POST" and form.save() is not None:
        messages.success(request, f"Model {model.name} saved.")
        return redirect("rollouts:model", pk=model.pk)
    status = form.status_code if form.is_bound else 200
    return _form_page(request, "rollouts/model_form.html", form, status=status, model=model)


@login_required
@require_http_methods(["GET", "POST"])
def version_create(request: HttpRequest, pk: int) -> HttpResponse:
    """Register a version of a model (deployer role)."""
    model = _model(request, pk)
    require_role(request.user, model.tenant, Membership.Role.DEPLOYER)
    form = VersionForm(request.POST or None, actor=request.user, model=model)
    if request.method == "POST":
        version = form.save()
        if version is not None:
            if form.created:
                asked = " and approval asked for" if version.status == ModelVersion.Status.PENDING_APPROVAL else ""
                messages.success(request, f"{model.name} v{version.version} registered{asked}.")
            else:
                messages.info(request, f"{model.name} v{version.version} was already registered "
                                       "with this digest: nothing changed.")
            return redirect("rollouts:version", pk=version.pk)
    status = form.status_code if form.is_bound else 200
    return _form_page(request, "rollouts/version_form.html", form, status=status, model=model)


@login_required
@require_POST
def alias_set(request: HttpRequest, pk: int) -> HttpResponse:
    """Point an alias of the model at a version (deployer role). A risky move of the
    production alias comes back with the reasons and a box to confirm it."""
    model = _model(request, pk)
    require_role(request.user, model.tenant, Membership.Role.DEPLOYER)
    form = AliasForm(request.POST, actor=request.user, model=model)
    alias = form.save()
    if alias is None:
        return render_model(request, model, alias_form=form, status=form.status_code)
    messages.success(request, f"@{alias.name} now points at v{alias.version.version}.")
    return redirect("rollouts:model", pk=model.pk)


@login_required
def approval_queue(request: HttpRequest) -> HttpResponse:
    """What waits for an approver in the viewer's tenants, oldest request first: versions
    (with who asked and what changed since the version before) and rollouts."""
    versions = list(
        ModelVersion.objects.visible_to(request.user)
        .filter(status=ModelVersion.Status.PENDING_APPROVAL)
        .select_related("model__tenant", "approval_requested_by",
                        "approval_requested_by_token__created_by")
        .order_by("status_changed_at", "id")
    )
    for version in versions:
        version.previous, version.changes = approvals.changes_from_previous(version)
        version.can_decide = has_role(request.user, version.model.tenant, Membership.Role.APPROVER)
        version.is_requester = approvals.is_requester(request.user, version)
    rollouts = (
        Rollout.objects.visible_to(request.user)
        .filter(state=Rollout.State.PENDING_APPROVAL)
        .select_related("deployment__tenant", "candidate", "baseline")
        .order_by("created_at", "id")
    )
    rollouts = list(rollouts)
    for rollout in rollouts:
        allowed = actions_for(request.user, rollout)
        rollout.can_approve = allowed["can_approve"]
        rollout.is_requester = allowed["is_requester"]
        rollout.can_abort = any(a["name"] == Rollout.Action.ABORT for a in allowed["actions"])
    tenant_filter = request.GET.get("tenant", "").strip()
    if tenant_filter:
        versions = [v for v in versions if v.model.tenant.slug == tenant_filter]
        rollouts = [r for r in rollouts if r.deployment.tenant.slug == tenant_filter]
    return render(request, "rollouts/approvals.html", {
        "versions": versions, "rollouts": rollouts, "tenant": tenant_filter,
    })


@login_required
def costs_page(request: HttpRequest) -> HttpResponse:
    """What each of the viewer's tenants held, per day this month or per month this year,
    priced where the platform has priced its device class; the prices."""
    period = "month" if request.GET.get("period") == "month" else "day"
    now = timezone.now().astimezone(UTC)
    start = (now.replace(day=1) if period == "day" else now.replace(month=1, day=1)).replace(
        hour=0, minute=0, second=0, microsecond=0)
    roles = tenant_roles(request.user)
    rows = costs.chargeback(None if roles is None else sorted(roles), start, now, period)
    return render(request, "rollouts/costs.html", {
        "period": period, "rows": rows, "start": start, "end": now,
        "prices": DevicePrice.objects.visible_to(request.user),
        "totals": _totals(rows),
    })


def _totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tenant and device class over the whole page: unit-hours and cost."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        total = found.setdefault((row["tenant"], row["device_class"]), {
            "tenant": row["tenant"], "device_class": row["device_class"], "unit_hours": 0.0,
            "cost": None, "currency": row["currency"]})
        total["unit_hours"] += row["unit_hours"]
        if row["cost"] is not None:
            total["cost"] = (total["cost"] or 0.0) + row["cost"]
    return list(found.values())
