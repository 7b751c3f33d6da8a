"""Benchmark console pages: the list, a job's page with its live part and curve, its actions
(cancel, register the best config), two jobs compared, and the panels the deployment and the
version pages show.

Decisions go through ``rollouts.deployments.forms`` to the functions of ``rollouts.benchmarks.jobs`` the
API calls; what is here only shapes rows for the templates (levels, the summary, the configs)
and the curve's series.
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
from fleet.tenancy.scoping import has_role
from rollouts.benchmarks import results, specs
from rollouts.canary.views import list_context
from rollouts.deployments.forms import BenchmarkActionForm, BenchmarkStartForm
from rollouts.models import BenchmarkJob, Deployment, ModelVersion

State = BenchmarkJob.State
RECENT = 5  # benchmarks listed on a deployment's page


def _jobs(request: HttpRequest) -> Any:
    return BenchmarkJob.objects.visible_to(request.user).select_related(
        "tenant", "deployment", "version__model", "server")


def _job(request: HttpRequest, pk: int) -> BenchmarkJob:
    return get_object_or_404(_jobs(request), pk=pk)


# --------------------------------------------------------------------------------------------
# Presentation helpers
# --------------------------------------------------------------------------------------------


def unit_of(job: BenchmarkJob) -> str:
    return "concurrency" if job.mode == BenchmarkJob.Mode.CONCURRENCY else "req/s offered"


def level_name(job: BenchmarkJob, value: float | None) -> str:
    if value is None:
        return "\u2013"
    return f"concurrency {value:g}" if job.mode == BenchmarkJob.Mode.CONCURRENCY \
        else f"{value:g} req/s"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and value == value else None


def level_rows(job: BenchmarkJob, levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each level run, in load order: the client's figures, the server's own view of the same
    window, and the gap between them (what the client and the network add)."""
    rows = []
    for level in sorted(levels, key=lambda r: r.get("value", 0)):
        latency = level.get("latency_ms") or {}
        server = level.get("server") or {}
        mean = _num(latency.get("mean"))
        served = _num(server.get("request_ms")) if server.get("available") else None
        if job.is_llm and server.get("available"):
            served = _num((server.get("e2e_ms") or {}).get("mean"))
        errors = level.get("errors") or {}
        rows.append({
            "value": level.get("value"),
            "refinement": bool(level.get("refinement")),
            "offered_rps": _num(level.get("offered_rps")),
            "throughput_rps": _num(level.get("throughput_rps")),
            "requests": level.get("requests", 0),
            "latency": {k: _num(latency.get(k)) for k in ("p50", "p90", "p95", "p99", "max",
                                                          "mean")},
            "error_rate_pct": 100.0 * (level.get("error_rate") or 0.0),
            "errors": sorted(errors.items(), key=lambda kv: -kv[1]),
            "first_error": level.get("first_error") or "",
            "goodput_rps": _num(level.get("goodput_rps")),
            "ttft": level.get("ttft_ms") or None,
            "itl": level.get("itl_ms") or None,
            "tokens_per_s": _num(level.get("output_tokens_per_s")),
            "server": server,
            "server_ttft": _num((server.get("ttft_ms") or {}).get("mean")),
            "server_itl": _num((server.get("itl_ms") or {}).get("mean")),
            "gap_ms": round(mean - served, 3) if mean is not None and served is not None
            else None,
            "verdict": level.get("verdict") or [],
            "passes": not level.get("verdict") and bool(level.get("ok")),
            "cancelled": bool(level.get("cancelled")),
        })
    return rows


def config_sections(job: BenchmarkJob) -> list[dict[str, Any]]:
    """One section per config measured (or being measured): its levels and summary."""
    best = (job.summary or {}).get("best_config")
    sections = []
    for index, entry in enumerate(job.results or []):
        summary = entry.get("summary") or {}
        sections.append({
            "index": index,
            "label": entry.get("label") or specs.config_label(entry.get("config")),
            "rows": level_rows(job, entry.get("levels") or []),
            "summary": summary,
            "max_load_name": level_name(job, summary.get("max_load")),
            "first_failing_name": level_name(job, summary.get("first_failing")),
            "error": (entry.get("error") or "").split("\n", 1)[0],
            "is_best": best == index,
            "measuring": job.is_active and index == job.config_index,
        })
    return sections


def configs_to_come(job: BenchmarkJob) -> list[str]:
    """Labels of the configs of a sweep not measured yet."""
    return [specs.config_label(c) for c in (job.configs or [])[len(job.results or []):]]


def curve_series(job: BenchmarkJob, *, only_best: bool = False, prefix: str = "") -> list[
        dict[str, Any]]:
    """The latency-throughput curve: one series per config, its levels in load order as
    points of throughput (x) and p50/p99 latency (y)."""
    best = (job.summary or {}).get("best_config")
    series = []
    for index, entry in enumerate(job.results or []):
        if only_best and best is not None and index != best:
            continue
        points = []
        for level in sorted(entry.get("levels") or [], key=lambda r: r.get("value", 0)):
            latency = level.get("latency_ms") or {}
            rps = _num(level.get("throughput_rps"))
            if rps is None or not level.get("ok"):
                continue
            points.append({"rps": round(rps, 2), "p50": _num(latency.get("p50")),
                           "p99": _num(latency.get("p99")), "value": level.get("value"),
                           "passes": not level.get("verdict")})
        label = entry.get("label") or "default"
        if not job.configs:
            label = f"v{job.version.version}"
        series.append({"key": f"{prefix}{index}", "label": f"{prefix}{label}".strip(),
                       "points": points, "best": best == index,
                       "max_load_rps": _num((entry.get("summary") or {}).get("max_load_rps"))})
        if only_best and best is None:
            break
    return series


def curve_data(job: BenchmarkJob) -> dict[str, Any]:
    return {"job": job.pk, "final": job.state in BenchmarkJob.FINAL,
            "slo_p99_ms": _num((job.slo or {}).get("p99_ms")), "series": curve_series(job)}


def best_figures(job: BenchmarkJob | None) -> dict[str, Any] | None:
    """The headline of a finished job: max load within the SLO, its req/s and p99, the
    config that carried it."""
    if job is None:
        return None
    best = (job.summary or {}).get("best") or {}
    return {
        "job": job,
        "max_load": best.get("max_load"),
        "max_load_name": level_name(job, best.get("max_load")),
        "max_load_rps": _num(best.get("max_load_rps")),
        "p99_ms": _num(best.get("max_load_p99_ms")),
        "peak_rps": _num(best.get("peak_rps")),
        "goodput_rps": _num(best.get("goodput_rps")),
        "best_label": (job.summary or {}).get("best_label") if job.configs else None,
        "first_failing_name": level_name(job, best.get("first_failing"))
        if best.get("first_failing") is not None else "",
        "first_failing_why": best.get("first_failing_why") or [],
        "stopped_early": best.get("stopped_early") or "",
        "client_overhead_ms": _num(best.get("client_overhead_ms")),
    }


def previous_job(request: HttpRequest, job: BenchmarkJob) -> BenchmarkJob | None:
    """The benchmark of the same model before this one (another version, or another run of
    the same), preferring finished ones with a result."""
    earlier = _jobs(request).filter(version__model=job.version.model, pk__lt=job.pk)
    return earlier.filter(state=State.SUCCEEDED).first() or earlier.first()


def actions_for(user: Any, job: BenchmarkJob) -> dict[str, Any]:
    """Deployers cancel a job while it runs, and register the best config of a finished
    config sweep as the model's next version."""
    deployer = has_role(user, job.tenant, Membership.Role.DEPLOYER)
    best = (job.summary or {}).get("best_config")
    can_register = (deployer and job.state == State.SUCCEEDED and bool(job.configs)
                    and best is not None)
    next_version = None
    if can_register:
        top = job.version.model.versions.order_by("-version").values_list(
            "version", flat=True).first() or 0
        next_version = top + 1
    registered = ModelVersion.objects.filter(
        model=job.version.model, labels__benchmark_job=str(job.pk)).order_by("version")
    return {
        "can_cancel": deployer and job.is_active and not job.cancel_requested_by,
        "can_register": can_register,
        "next_version": next_version,
        "registered": list(registered),
    }


# --------------------------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------------------------


@login_required
def benchmark_list(request: HttpRequest) -> HttpResponse:
    """Benchmarks of the viewer's tenants, newest first; ``?state=active|finished|all`` and
    ``?deployment=<id>`` narrow it."""

    def decorate(item: BenchmarkJob) -> None:
        item.figures = best_figures(item)

    context = list_context(request, _jobs(request), BenchmarkJob.ACTIVE, BenchmarkJob.FINAL, decorate)
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
    slo_a, slo_b = _num((a.slo or {}).get("p99_ms")), _num((b.slo or {}).get("p99_ms"))
    curve = {"final": True, "slo_p99_ms": slo_a,
             "series": curve_series(a, only_best=True, prefix="A: ")
             + curve_series(b, only_best=True, prefix="B: ")}
    context = {"a": a, "b": b, "fa": fa, "fb": fb, "delta": delta, "curve": curve,
               "slo_differs": slo_a != slo_b, "slo_b": slo_b,
               "same_version": a.version_id == b.version_id}
    return render(request, "rollouts/benchmark_compare.html", context)


# --------------------------------------------------------------------------------------------
# Panels of other pages
# --------------------------------------------------------------------------------------------


def deployment_benchmarks_context(
    request: HttpRequest, deployment: Deployment, can_deploy: bool,
    form: BenchmarkStartForm | None = None,
) -> dict[str, Any]:
    """The deployment page's Benchmarks panel: its recent benchmarks and (deployers) the
    form that starts one."""
    recent = list(deployment.benchmark_jobs.select_related("version", "server")[:RECENT])
    for job in recent:
        job.figures = best_figures(job)
    if can_deploy and form is None:
        form = BenchmarkStartForm(actor=request.user, deployment=deployment)
    return {
        "recent_benchmarks": recent,
        "benchmark_count": deployment.benchmark_jobs.count(),
        "benchmark_form": form if can_deploy else None,
        "benchmark_form_open": form is not None and form.is_bound,
    }


def start_benchmark(request: HttpRequest, deployment: Deployment) -> tuple[
        BenchmarkJob | None, BenchmarkStartForm]:
    """Bind and run the deployment page's benchmark form; (the job, the form) or (None, the
    form with the refusal on the field it names)."""
    form = BenchmarkStartForm(request.POST, actor=request.user, deployment=deployment)
    made = form.save()
    if made is not None:
        messages.success(request, f"Benchmark {made.pk} of v{made.version.version} on "
                                  f"{made.server.name} requested.")
    return made, form


def version_benchmark_context(version: ModelVersion) -> dict[str, Any]:
    """The version page's Measured capacity panel: the newest finished benchmark."""
    latest = results.latest_result(version)
    return {"benchmark": best_figures(latest),
            "benchmarks_running": version.benchmark_jobs.filter(
                state__in=BenchmarkJob.ACTIVE).first()}
