"""The canary decision, all in one place: whether a candidate goes on, goes back or waits for a
person. Here are the analysis settings (defaults, limits and their check), the evidence (the
route's samples by version), the health watch, the SLO gates, the policy of an analysis step
(a verdict per look, the timeout and the failure limit) and the A/B verdict. The statistics a
look rests on are in :mod:`rollouts.canary.judge`; :mod:`rollouts.canary.reconciler` carries out
what is decided here (the next step, the way back, a pause).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

from django.utils import timezone

from console.exceptions import DomainError
from fleet.models import InferenceServer
from rollouts.canary import judge
from rollouts.models import ModelLoad, ModelVersion, Rollout, RolloutAnalysis, Route
from rollouts.traffic import sample_types, samples

log = logging.getLogger(__name__)
Verdict = RolloutAnalysis.Verdict

# How analyses judge, unless the rollout (or the step) says otherwise. ``max_p99_ms`` and
# ``max_error_rate`` default to the deployment's SLO.
ANALYSIS_DEFAULTS: dict[str, Any] = {
    "planned_samples": 1000,
    "min_samples": 100,
    "latency_tolerance_pct": 5.0,
    "error_tolerance_pct": 1.0,
    "alpha": 0.05,
    "failure_limit": 0,
    "timeout_s": 900,
    "max_p50_ms": None,
    "max_p95_ms": None,
    "max_p99_ms": None,
    "max_error_rate": None,
}
# The range and type of each analysis setting: parse_analysis refuses outside them, and the
# API's schema states them.
ANALYSIS_LIMITS: dict[str, tuple[float, float, type]] = {
    "planned_samples": (10, 10_000_000, int),
    "min_samples": (10, 10_000_000, int),
    "latency_tolerance_pct": (0, 1000, float),
    "error_tolerance_pct": (0, 100, float),
    "alpha": (0.0001, 0.4999, float),
    "failure_limit": (0, 1000, int),
    "timeout_s": (1, 7 * 24 * 3600, int),
    "max_p50_ms": (0.001, 3_600_000, float),
    "max_p95_ms": (0.001, 3_600_000, float),
    "max_p99_ms": (0.001, 3_600_000, float),
    "max_error_rate": (0, 100, float),
}
# The candidate's requests failing upstream (no answer, 502, 504) over this many seconds, at
# least UPSTREAM_MIN of them and at least UPSTREAM_SHARE of its requests: its server is down.
UPSTREAM_WINDOW_S = 3.0
UPSTREAM_MIN = 5
UPSTREAM_SHARE = 0.5
# What :func:`look` answers when a look failed within the failures allowed: the analysis
# starts again on a fresh window.
JUDGE_AGAIN = "judge_again"


# --------------------------------------------------------------------------------------------
# The settings
# --------------------------------------------------------------------------------------------


def is_number(value: object) -> bool:
    """A finite int or float, not a bool: what a number in a request body may be."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_analysis(raw: object, field: str = "analysis") -> dict[str, Any]:
    """The analysis settings given (an object of the keys of :data:`ANALYSIS_DEFAULTS`),
    checked; a DomainError naming ``field.key`` otherwise. Keys not given are left out."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DomainError("must be an object", field=field)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in ANALYSIS_LIMITS:
            known = ", ".join(sorted(ANALYSIS_LIMITS))
            raise DomainError(f"unknown setting {str(key)[:40]!r}; known: {known}", field=field)
        if value is None and ANALYSIS_DEFAULTS[key] is None:
            out[key] = None
            continue
        low, high, kind = ANALYSIS_LIMITS[key]
        if not is_number(value) or (kind is int and value != int(value)) or not low <= value <= high:
            what = "an integer" if kind is int else "a number"
            raise DomainError(f"must be {what} from {low:g} to {high:g}, got {value!r}"[:200],
                              field=f"{field}.{key}")
        out[key] = kind(value)
    merged = {**ANALYSIS_DEFAULTS, **out}
    if merged["planned_samples"] < merged["min_samples"]:
        raise DomainError("must be at least min_samples", field=f"{field}.planned_samples")
    return out


def analysis_config(rollout: Rollout, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings an analysis runs with: defaults, the rollout's, the step's; the SLO
    ceilings from the deployment where none were given."""
    config = {**ANALYSIS_DEFAULTS, **(rollout.analysis or {}), **(overrides or {})}
    if config["max_p99_ms"] is None:
        config["max_p99_ms"] = float(rollout.deployment.slo_p99_ms)
    if config["max_error_rate"] is None:
        config["max_error_rate"] = float(rollout.deployment.slo_error_rate)
    return config


# --------------------------------------------------------------------------------------------
# The evidence and the health watch
# --------------------------------------------------------------------------------------------


def samples_by_version(rollout: Rollout, seconds: float) -> tuple[dict[int, list[sample_types.Sample]], float]:
    """The route's samples of the last ``seconds``, by version; and the time they were read."""
    now = time.time()
    route = Route.objects.filter(pk=rollout.deployment_id).first()
    meaning = route.variants if route is not None else {}
    by_version: dict[int, list[sample_types.Sample]] = {}
    for variant, found in samples.window(rollout.deployment_id, seconds, now=now).items():
        number = (meaning.get(variant) or {}).get("version")
        if number is not None:
            by_version.setdefault(int(number), []).extend(found)
    return by_version, now


def health_problem(rollout: Rollout, watched: list[ModelVersion]) -> tuple[str, dict[str, Any]] | None:
    """Why the versions under test (``watched``) are unhealthy, with the evidence, or None: a
    load no longer ready, a server the health probes call unhealthy or unreachable, or the
    version's requests failing upstream (no answer, 502/504)."""
    servers = list(rollout.deployment.servers.filter(name__in=rollout.servers))
    for version in watched:
        for server in servers:
            load = ModelLoad.objects.filter(server=server, version=version).order_by("-created_at").first()
            if load is None or load.state != ModelLoad.State.READY:
                state = load.get_state_display().lower() if load else "not loaded"
                return (f"v{version.version} is no longer ready on {server.name} ({state})",
                        {"server": server.name, "load": load.pk if load else None,
                         "load_state": load.state if load else None,
                         "error": load.error if load else ""})
            if server.health in (InferenceServer.Health.UNHEALTHY, InferenceServer.Health.UNREACHABLE):
                return (f"{server.name}, serving v{version.version}, is {server.health}: "
                        f"{server.health_detail}",
                        {"server": server.name, "health": server.health,
                         "detail": server.health_detail})
    try:
        by_version, _ = samples_by_version(rollout, UPSTREAM_WINDOW_S)
    except Exception as exc:  # redis down: the analysis says so; health is not judged on it
        log.warning("rollout %s: cannot read samples: %s", rollout.pk, exc)
        return None
    for version in watched:
        found = by_version.get(version.version, [])
        failed = [s for s in found if s.upstream_failed]
        if len(failed) >= UPSTREAM_MIN and len(failed) >= UPSTREAM_SHARE * len(found):
            return (f"v{version.version}'s server did not answer {len(failed)} of its "
                    f"{len(found)} requests in the last {UPSTREAM_WINDOW_S:g} s",
                    {"requests": len(found), "upstream_failures": len(failed),
                     "statuses": sorted({s.status for s in failed})})
    return None


# --------------------------------------------------------------------------------------------
# An analysis step: SLO gates, the judge, the timeout and the failure limit
# --------------------------------------------------------------------------------------------


def slo_gates(found: list[sample_types.Sample], config: dict[str, Any]) -> dict[str, Any]:
    """The candidate's p50/p95/p99 and error rate against their ceilings (those set)."""
    summary = samples.summarize(found, 1.0)
    gates = []
    for name, key, limit_key in (("p50", "p50_ms", "max_p50_ms"), ("p95", "p95_ms", "max_p95_ms"),
                                 ("p99", "p99_ms", "max_p99_ms"),
                                 ("error rate", "error_rate", "max_error_rate")):
        limit = config.get(limit_key)
        if limit is None:
            continue
        value = summary.get(key)
        gates.append({"name": name, "value": value, "limit": limit,
                      "ok": value is None or value <= limit})
    checked = len(found) >= config["min_samples"]
    return {"checked": checked, "samples": len(found), "gates": gates,
            "ok": not checked or all(g["ok"] for g in gates)}


def analysis_row(rollout: Rollout, config: dict[str, Any]) -> RolloutAnalysis:
    """The record of the analysis of the rollout's current step (this attempt's), made at its
    first look: its window starts then."""
    row, _ = RolloutAnalysis.objects.get_or_create(
        rollout=rollout, attempt=rollout.attempt, step_index=rollout.step_index,
        defaults={"window_start": time.time(), "weight": rollout.candidate_weight,
                  "config": config},
    )
    return row


def look(row: RolloutAnalysis, config: dict[str, Any], canary: list[sample_types.Sample],
         baseline: list[sample_types.Sample], now: float) -> str:
    """One look of a running analysis at the requests of the candidate and the baseline
    since its window began (read at ``now``), recorded on ``row``. Returns the step's end:
    ``pass``, ``fail`` or ``inconclusive`` (the planned sample reached without a verdict, or
    ``timeout_s`` passed); ``running`` to look again next tick; :data:`JUDGE_AGAIN` after a
    failed look within ``failure_limit`` (the window starts afresh).

    The SLO gates fail the candidate whatever the judge says; with all the traffic on the
    candidate there is no baseline to compare with, and the gates alone decide."""
    gates = slo_gates(canary, config)
    if row.weight >= 100:
        judgement = judge.Judgement(
            judge.PASS if gates["checked"] else judge.INCONCLUSIVE,
            ["the canary carries all traffic: judged by the SLO gates alone"
             + ("" if gates["checked"] else f" once it has {config['min_samples']} requests")],
            len(canary), 0, min(len(canary) / config["planned_samples"], 1.0), 0.0, 0.0)
    else:
        judge_config = judge.JudgeConfig(
            planned_samples=config["planned_samples"], min_samples=config["min_samples"],
            latency_tolerance_pct=config["latency_tolerance_pct"],
            error_tolerance_pct=config["error_tolerance_pct"], alpha=config["alpha"],
        )
        judgement = judge.judge_samples(canary, baseline, judge_config, spent_before=row.spent)
    reasons = list(judgement.reasons)
    verdict = judgement.verdict
    if not gates["ok"]:
        verdict = judge.FAIL
        reasons = [f"SLO: the canary's {g['name']} is {g['value']:.4g} against a ceiling of "
                   f"{g['limit']:g}" for g in gates["gates"] if not g["ok"]] + (
            reasons if judgement.verdict == judge.FAIL else [])
    elapsed = now - row.window_start
    if verdict == judge.INCONCLUSIVE and (judgement.information >= 1 or elapsed >= config["timeout_s"]):
        ended = verdict
        if judgement.information < 1:
            reasons.append(f"{elapsed:.0f} s passed without a verdict (timeout {config['timeout_s']} s)")
    else:
        ended = verdict if verdict != judge.INCONCLUSIVE else Verdict.RUNNING
    fields: dict[str, Any] = {
        "looks": row.looks + 1, "spent": judgement.spent, "judgement": judgement.to_json(),
        "slo": gates, "reasons": reasons, "updated_at": timezone.now(),
    }
    if ended == judge.FAIL:
        fields["failed_looks"] = row.failed_looks + 1
        if fields["failed_looks"] <= config["failure_limit"]:
            # Within the failures allowed: judge again on a fresh window.
            fields.update(window_start=time.time(), spent=0.0)
            _record(row, fields)
            return JUDGE_AGAIN
    if ended != Verdict.RUNNING:
        fields.update(verdict=ended, finished_at=timezone.now())
    _record(row, fields)
    return ended


def _record(row: RolloutAnalysis, fields: dict[str, Any]) -> None:
    RolloutAnalysis.objects.filter(pk=row.pk).update(**fields)
    for key, value in fields.items():
        setattr(row, key, value)


# --------------------------------------------------------------------------------------------
# The A/B verdict
# --------------------------------------------------------------------------------------------


def ab_done(rollout: Rollout, counts: dict[int, int], elapsed: float) -> bool:
    """Whether an A/B split has run its course: ``duration_s`` passed, or every variant has
    ``sample_size`` requests (``counts``, by version)."""
    done_by_time = rollout.duration_s is not None and elapsed >= rollout.duration_s
    done_by_size = rollout.sample_size is not None and min(counts.values()) >= rollout.sample_size
    return done_by_time or done_by_size


def ab_verdict(rollout: Rollout, by_version: dict[int, list[sample_types.Sample]]) -> dict[str, Any]:
    """Each variant against the reference: p50/p95 and error-rate differences with their
    intervals, whether the sample could see the effect the team set (``analysis``'s
    ``latency_tolerance_pct``), how many more requests it needs if not, and a summary."""
    config = analysis_config(rollout)
    reference = rollout.baseline.version
    ref = by_version.get(reference, [])
    rows = []
    for item in rollout.variants[1:]:
        number = item["version"]
        found = by_version.get(number, [])
        if len(found) < 2 or len(ref) < 2:
            rows.append({"version": number, "samples": len(found), "reference_samples": len(ref),
                         "enough": False, "difference": "unknown",
                         "note": "too few requests to compare"})
            continue
        diff = judge.ab_difference(
            f"v{number}", [s.latency_ms for s in found], sum(s.is_error for s in found),
            f"v{reference}", [s.latency_ms for s in ref], sum(s.is_error for s in ref),
            effect_pct=max(config["latency_tolerance_pct"], 0.1), alpha=config["alpha"],
        )
        data = dataclasses.asdict(diff)
        p50, p95, err = diff.p50_diff_ms, diff.p95_diff_ms, diff.error_diff_pct
        slower = p50.low > 0 or p95.low > 0
        faster = p50.high < 0 or p95.high < 0
        more_errors, fewer_errors = err.low > 0, err.high < 0
        if (slower or more_errors) and not (faster or fewer_errors):
            difference = "worse"
        elif (faster or fewer_errors) and not (slower or more_errors):
            difference = "better"
        elif slower or faster or more_errors or fewer_errors:
            difference = "mixed"
        else:
            difference = "none"
        rows.append({"version": number, **_jsonable(data), "difference": difference})
    better = [r for r in rows if r["difference"] == "better"]
    if all(r["difference"] == "none" for r in rows):
        summary = "no difference between the variants"
        if not all(r.get("enough") for r in rows):
            summary += " (the sample was too small to rule out the effect set)"
    else:
        summary = "; ".join(f"v{r['version']} {r['difference']} than v{reference}"
                            if r["difference"] in ("worse", "better") else
                            f"v{r['version']}: {r['difference']}" for r in rows)
    winner = None
    if better:
        winner = min(better, key=lambda r: r["p50_diff_ms"]["estimate"])["version"]
    return {"reference": reference, "variants": rows, "summary": summary, "winner": winner,
            "samples": {str(n): len(v) for n, v in by_version.items()}}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return _jsonable(dict(value.__dict__))
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value
