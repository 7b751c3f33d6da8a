"""What the benchmark pages show: a job's levels, configs and summary as rows for the templates,
its latency-throughput curve, which buttons the viewer gets, and the panels other pages show
(the deployment page's Benchmarks, the version page's Measured capacity).

Nothing here decides: decisions go through ``rollouts.benchmarks.forms`` to the functions of
``rollouts.benchmarks.requests`` the API calls."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from fleet.models import Membership
from fleet.tenancy.scoping import has_role
from rollouts.benchmarks import results, specs
from rollouts.benchmarks.forms import BenchmarkStartForm
from rollouts.models import BenchmarkJob, Deployment, ModelVersion

State = BenchmarkJob.State
RECENT = 5  # benchmarks listed on a deployment's page


def unit_of(job: BenchmarkJob) -> str:
    return "concurrency" if job.mode == BenchmarkJob.Mode.CONCURRENCY else "req/s offered"


def level_name(job: BenchmarkJob, value: float | None) -> str:
    return specs.level_name(job.mode, value)


def number_or_none(value: Any) -> float | None:
    """A figure of the results as a float; None when it is missing, not a number or NaN."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and value == value else None


def level_rows(job: BenchmarkJob, levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each level run, in load order: the client's figures, the server's own view of the same
    window, and the gap between them (what the client and the network add)."""
    rows = []
    for level in sorted(levels, key=lambda r: r.get("value", 0)):
        latency = level.get("latency_ms") or {}
        server = level.get("server") or {}
        mean = number_or_none(latency.get("mean"))
        served = number_or_none(server.get("request_ms")) if server.get("available") else None
        if job.is_llm and server.get("available"):
            served = number_or_none((server.get("e2e_ms") or {}).get("mean"))
        errors = level.get("errors") or {}
        rows.append({
            "value": level.get("value"),
            "name": level_name(job, level.get("value")),
            "refinement": bool(level.get("refinement")),
            "offered_rps": number_or_none(level.get("offered_rps")),
            "throughput_rps": number_or_none(level.get("throughput_rps")),
            "requests": level.get("requests", 0),
            "latency": {k: number_or_none(latency.get(k)) for k in ("p50", "p90", "p95", "p99", "max",
                                                          "mean")},
            "error_rate_pct": 100.0 * (level.get("error_rate") or 0.0),
            "errors": sorted(errors.items(), key=lambda kv: -kv[1]),
            "first_error": level.get("first_error") or "",
            "goodput_rps": number_or_none(level.get("goodput_rps")),
            "ttft": level.get("ttft_ms") or None,
            "itl": level.get("itl_ms") or None,
            "tokens_per_s": number_or_none(level.get("output_tokens_per_s")),
            "server": server,
            "server_ttft": number_or_none((server.get("ttft_ms") or {}).get("mean")),
            "server_itl": number_or_none((server.get("itl_ms") or {}).get("mean")),
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
            rps = number_or_none(level.get("throughput_rps"))
            if rps is None or not level.get("ok"):
                continue
            points.append({"rps": round(rps, 2), "p50": number_or_none(latency.get("p50")),
                           "p99": number_or_none(latency.get("p99")), "value": level.get("value"),
                           "passes": not level.get("verdict")})
        label = entry.get("label") or "default"
        if not job.configs:
            label = f"v{job.version.version}"
        series.append({"key": f"{prefix}{index}", "label": f"{prefix}{label}".strip(),
                       "points": points, "best": best == index,
                       "max_load_rps": number_or_none((entry.get("summary") or {}).get("max_load_rps"))})
        if only_best and best is None:
            break
    return series


def curve_data(job: BenchmarkJob) -> dict[str, Any]:
    return {"job": job.pk, "final": job.state in BenchmarkJob.FINAL,
            "slo_p99_ms": number_or_none((job.slo or {}).get("p99_ms")), "series": curve_series(job)}


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
        "max_load_rps": number_or_none(best.get("max_load_rps")),
        "p99_ms": number_or_none(best.get("max_load_p99_ms")),
        "peak_rps": number_or_none(best.get("peak_rps")),
        "goodput_rps": number_or_none(best.get("goodput_rps")),
        "best_label": (job.summary or {}).get("best_label") if job.configs else None,
        "first_failing_name": level_name(job, best.get("first_failing"))
        if best.get("first_failing") is not None else "",
        "first_failing_why": best.get("first_failing_why") or [],
        "stopped_early": best.get("stopped_early") or "",
        "client_overhead_ms": number_or_none(best.get("client_overhead_ms")),
    }


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


def version_benchmark_context(version: ModelVersion) -> dict[str, Any]:
    """The version page's Measured capacity panel: the newest finished benchmark."""
    latest = results.latest_result(version)
    return {"benchmark": best_figures(latest),
            "benchmarks_running": version.benchmark_jobs.filter(
                state__in=BenchmarkJob.ACTIVE).first()}
