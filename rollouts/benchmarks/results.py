"""Using what benchmark jobs measured: a job's best config, a version's newest figures, the
rollout's benchmark gate, and registering a measured config as a new version."""

from __future__ import annotations

from typing import Any

from console.exceptions import Conflict, DomainError
from fleet.models import Membership
from fleet.quota import admission as quota
from fleet.tenancy.scoping import require_role
from rollouts.benchmarks import sweep
from rollouts.benchmarks.specs import full_config
from rollouts.models import BenchmarkJob, ModelVersion

State = BenchmarkJob.State


def summarize_job(job: BenchmarkJob) -> dict[str, Any]:
    """The best config (most load within the SLO) and its figures."""
    best_index = None
    for i, entry in enumerate(job.results):
        if entry.get("summary") and not entry.get("error") and sweep.better(
                entry["summary"], job.results[best_index]["summary"] if best_index is not None else None):
            best_index = i
    best = job.results[best_index] if best_index is not None else None
    return {
        "device_class": quota.device_class_of(job.server),
        "best_config": best_index,
        "best_label": best["label"] if best else None,
        "best": best["summary"] if best else None,
        "configs": [{"label": e["label"], "max_load": (e.get("summary") or {}).get("max_load"),
                     "max_load_rps": (e.get("summary") or {}).get("max_load_rps"),
                     "error": e.get("error", "")} for e in job.results],
    }


def latest_result(version: ModelVersion, *, runtime: str | None = None,
                  mode: str | None = None) -> BenchmarkJob | None:
    """The newest succeeded benchmark of a version (on servers of ``runtime``, in ``mode``)."""
    found = BenchmarkJob.objects.filter(version=version, state=State.SUCCEEDED)
    if runtime:
        found = found.filter(server__runtime=runtime)
    if mode:
        found = found.filter(mode=mode)
    return found.order_by("-finished_at", "-pk").first()


def gate(candidate: ModelVersion, baseline: ModelVersion, max_drop_pct: float,
         *, mode: str | None = None) -> dict[str, Any]:
    """The benchmark gate of a rollout: the candidate's max load within the SLO may fall
    below the baseline's by at most ``max_drop_pct`` percent. ``passed`` is None when either
    has no benchmark yet (with what to run in ``message``)."""
    base_job = latest_result(baseline, mode=mode)
    cand_job = latest_result(candidate, mode=mode or (base_job.mode if base_job else None))
    missing = [f"v{v.version}" for v, j in ((candidate, cand_job), (baseline, base_job)) if j is None]
    if missing:
        return {"passed": None, "message": f"no benchmark of {' and '.join(missing)} yet: run one first"}
    classes = [(j.summary or {}).get("device_class") for j in (cand_job, base_job)]
    if classes[0] != classes[1]:
        return {"passed": None, "message": f"v{candidate.version} was benchmarked on {classes[0]} and "
                f"v{baseline.version} on {classes[1]}: benchmark both on one device class",
                "candidate_job": cand_job.pk, "baseline_job": base_job.pk}
    base = ((base_job.summary or {}).get("best") or {}).get("max_load_rps")
    cand = ((cand_job.summary or {}).get("best") or {}).get("max_load_rps")
    data = {"candidate_job": cand_job.pk, "baseline_job": base_job.pk, "candidate_rps": cand,
            "baseline_rps": base, "max_drop_pct": max_drop_pct}
    if not base:
        return {"passed": None, "message": f"v{baseline.version}'s benchmark found no load "
                f"within its SLO to compare with", **data}
    floor = base * (1 - max_drop_pct / 100.0)
    drop = (1 - (cand or 0.0) / base) * 100.0
    data["drop_pct"] = round(drop, 2)
    if (cand or 0.0) >= floor:
        return {"passed": True, "message": f"v{candidate.version} carries {cand or 0:.0f} req/s within "
                f"its SLO against {base:.0f} for v{baseline.version} ({drop:+.1f}% drop, "
                f"{max_drop_pct:g}% allowed)", **data}
    return {"passed": False, "message": f"v{candidate.version} carries {cand or 0:.0f} req/s within its "
            f"SLO, {drop:.1f}% below v{baseline.version}'s {base:.0f} (at most {max_drop_pct:g}% "
            "allowed)", **data}


def register_config(actor: Any, job: BenchmarkJob, index: int | None = None) -> ModelVersion:
    """Register the best (or ``index``) config of a config sweep as a new version of the model:
    the same artifact, the measured config, lineage pointing at the job."""
    from rollouts.registry import versions as registry

    require_role(actor, job.tenant, Membership.Role.DEPLOYER)
    if job.state != State.SUCCEEDED or not job.configs:
        raise Conflict("only a finished config sweep has a config to register", field="job")
    chosen = job.summary.get("best_config") if index is None else index
    if chosen is None or not 0 <= chosen < len(job.results) or job.results[chosen].get("error"):
        raise DomainError("no measured config with that index", field="config")
    version = job.version
    from django.db.models import Max

    # Registered from this job's config already (a retry, a second click): that version.
    label = job.results[chosen]["label"]
    for earlier in version.model.versions.filter(labels__benchmark_job=str(job.pk)):
        if earlier.labels.get("benchmark_config") == label:
            return earlier

    data = {name: getattr(version, name) for name in registry.VERSION_FIELDS}
    data["version"] = (version.model.versions.aggregate(top=Max("version"))["top"] or 0) + 1
    data["triton_config"] = full_config(version, job.configs[chosen])
    data["labels"] = {**(version.labels or {}), "derived_from": f"v{version.version}",
                      "benchmark_job": str(job.pk), "benchmark_config": job.results[chosen]["label"]}
    made, _ = registry.register_version(actor, version.model, data)
    return made
