"""Benchmark console pages: the list, a job's page with its live part and curve, its actions
(cancel, register the best config), two jobs compared, and the start of a benchmark from the
deployment page.

Decisions go through ``rollouts.benchmarks.forms`` to the functions of ``rollouts.benchmarks.requests``
the API calls; what the pages show (levels, the summary, the configs, the curve's series) is
shaped in ``rollouts.benchmarks.pages``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from django_htmx.http import HTMX_STOP_POLLING

from fleet.api.refs import is_id
from fleet.models import Membership
from fleet.tenancy.scoping import require_role
from rollouts.benchmarks import specs
from rollouts.benchmarks.forms import BenchmarkActionForm, BenchmarkStartForm
from rollouts.benchmarks.pages import (
    actions_for,
    best_figures,
    config_sections,
    configs_to_come,
    curve_data,
    curve_series,
    number_or_none,
    unit_of,
)
from rollouts.deployments.pages import job_list_context, render_deployment, visible_deployment
from rollouts.models import BenchmarkJob, ModelVersion

State = BenchmarkJob.State


def _jobs(request: HttpRequest) -> Any:
    return BenchmarkJob.objects.visible_to(request.user).select_related(
        "tenant", "deployment", "version__model", "server")


def _job(request: HttpRequest, pk: int) -> BenchmarkJob:
    return get_object_or_404(_jobs(request), pk=pk)


# --------------------------------------------------------------------------------------------
# Presentation helpers
# --------------------------------------------------------------------------------------------


def previous_job(request: HttpRequest, job: BenchmarkJob) -> BenchmarkJob | None:
    """The benchmark of the same model before this one (another version, or another run of
    the same), preferring finished ones with a result."""
    earlier = _jobs(request).filter(version__model=job.version.model, pk__lt=job.pk)
    return earlier.filter(state=State.SUCCEEDED).first() or earlier.first()


# --------------------------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------------------------


@login_required
def benchmark_list(request: HttpRequest) -> HttpResponse:
    """Benchmarks of the viewer's tenants, newest first; ``?state=active|finished|all`` and
    ``?deployment=<id>`` narrow it."""

    def decorate(item: BenchmarkJob) -> None:
        item.figures = best_figures(item)

    context = job_list_context(request, _jobs(request), BenchmarkJob.ACTIVE, BenchmarkJob.FINAL, decorate)
    template = ("rollouts/benchmark_list.html#results" if request.htmx
                else "rollouts/benchmark_list.html")
    return render(request, template, context)


def _live_context(job: BenchmarkJob) -> dict[str, Any]:
    total = max(len(job.configs or []), 1)
    return {
        "job": job,
        "progress_pct": round(100.0 * min(max(job.progress or 0.0, 0.0), 1.0), 1),
        "config_total": total,
        "config_number": min(job.config_index + 1, total),
        "sections": config_sections(job),
        "to_come": configs_to_come(job),
        "figures": best_figures(job) if (job.summary or {}).get("best") else None,
        "curve": curve_data(job),
        "unit": unit_of(job),
        "seen": "active" if job.is_active else "final",
    }


def _render_job(request: HttpRequest, job: BenchmarkJob, form: BenchmarkActionForm | None = None,
                status: int = 200) -> HttpResponse:
    context = _live_context(job) | actions_for(request.user, job) | {
        "form": form,
        "previous": previous_job(request, job),
        "config_labels": [specs.config_label(c) for c in job.configs or []],
    }
    return render(request, "rollouts/benchmark_detail.html", context, status=status)


@login_required
def benchmark_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return _render_job(request, _job(request, pk))


@login_required
def benchmark_status(request: HttpRequest, pk: int) -> HttpResponse:
    """The live part (htmx, every second), with the results out of band: 286 once the job
    is final. When the job ended after the page was drawn (``?seen=active``), the page is
    reloaded too, so its buttons match."""
    job = _job(request, pk)
    final = job.state in BenchmarkJob.FINAL
    response = render(request, "rollouts/partials/benchmark_status.html",
                      _live_context(job) | {"oob": True},
                      status=HTMX_STOP_POLLING if final else 200)
    if request.htmx and final and request.GET.get("seen") == "active":
        response["HX-Refresh"] = "true"
    return response


@login_required
@require_POST
def benchmark_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    """Cancel, or register a measured config as a new version: on to the page (or the new
    version's), or the page again with the refusal in place (a role too low is a 403 naming
    the role)."""
    job = _job(request, pk)
    if action not in BenchmarkActionForm.ACTIONS:
        raise Http404(f"no action {action!r} on benchmarks")
    form = BenchmarkActionForm(request.POST, actor=request.user, job=job, action=action)
    done = form.save()
    if done is None:
        return _render_job(request, _job(request, pk), form, status=form.status_code)
    if isinstance(done, ModelVersion):
        messages.success(request, f"Registered {done.model.name} v{done.version} with "
                                  f"{done.labels.get('benchmark_config', 'the measured config')} "
                                  f"from benchmark {job.pk}.")
        return redirect("rollouts:version", pk=done.pk)
    messages.success(request, done)
    return redirect("rollouts:benchmark", pk=job.pk)


@login_required
def benchmark_compare(request: HttpRequest) -> HttpResponse:
    """Two benchmarks side by side (``?a=<id>&b=<id>``): their figures, both curves on one
    chart (each job's best config), and B's max load within the SLO against A's. An id
    missing or not a number is a 400 naming it; one the viewer cannot see, a 404."""
    raw = {name: (request.GET.get(name) or "").strip() for name in ("a", "b")}
    choices = list(_jobs(request).filter(state=BenchmarkJob.State.SUCCEEDED)[:50])
    if not raw["a"] and not raw["b"]:
        # Nothing named yet: the page to pick the two.
        return render(request, "rollouts/benchmark_compare.html", {"choose": True, "choices": choices})
    errors = {name: "give the id of a benchmark, e.g. ?a=12&b=15"
              for name, value in raw.items() if not is_id(value)}
    if errors:
        return render(request, "rollouts/benchmark_compare.html",
                      {"errors": errors, "choose": True, "choices": choices}, status=400)
    sides = {name: _job(request, int(value)) for name, value in raw.items()}
    a, b = sides["a"], sides["b"]
    fa, fb = best_figures(a), best_figures(b)
    delta = None
    if fa["max_load_rps"] and fb["max_load_rps"] is not None:
        delta = round(100.0 * (fb["max_load_rps"] - fa["max_load_rps"]) / fa["max_load_rps"], 1)
    slo_a = number_or_none((a.slo or {}).get("p99_ms"))
    slo_b = number_or_none((b.slo or {}).get("p99_ms"))
    curve = {"final": True, "slo_p99_ms": slo_a,
             "series": curve_series(a, only_best=True, prefix="A: ")
             + curve_series(b, only_best=True, prefix="B: ")}
    context = {"a": a, "b": b, "fa": fa, "fb": fb, "delta": delta, "curve": curve,
               "slo_differs": slo_a != slo_b, "slo_b": slo_b,
               "same_version": a.version_id == b.version_id}
    return render(request, "rollouts/benchmark_compare.html", context)


@login_required
@require_POST
def deployment_benchmark_start(request: HttpRequest, pk: int) -> HttpResponse:
    """Start a benchmark: on to the job's page, or the deployment page again with the
    refusal next to the field it names."""
    deployment = visible_deployment(request, pk)
    require_role(request.user, deployment.tenant, Membership.Role.DEPLOYER)
    form = BenchmarkStartForm(request.POST, actor=request.user, deployment=deployment)
    made = form.save()
    if made is None:
        return render_deployment(request, deployment, status=form.status_code,
                                 benchmark_form=form)
    messages.success(request, f"Benchmark {made.pk} of v{made.version.version} on "
                              f"{made.server.name} requested.")
    return redirect("rollouts:benchmark", pk=made.pk)
