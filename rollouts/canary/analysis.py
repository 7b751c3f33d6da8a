"""The canary decision applied to the database: the analysis settings' check, the evidence (the
route's samples by version, the windows of an attempt's analysis steps), the health watch, an
analysis step's looks recorded on its row (with the failure limit), and the A/B verdict. The
decision itself is pure: :mod:`rollouts.canary.judge` (one look, on the bounds of
:mod:`rollouts.canary.sequential`), :mod:`rollouts.canary.policy` (how a step ends) and
:mod:`rollouts.canary.abtest` and :mod:`rollouts.canary.clustered` (the A/B numbers, per
request and per user); :mod:`rollouts.canary.reconciler` carries out what is decided (the next
step, the way back, a pause).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np
from django.utils import timezone

from console.exceptions import DomainError
from fleet.models import InferenceServer
from rollouts.canary import abtest, clustered, judge, metrics, policy, verdicts
from rollouts.models import ModelLoad, ModelVersion, Rollout, RolloutAnalysis, Route
from rollouts.traffic import sample_types, samples, window_cache
from rollouts.traffic.columns import Columns, ended_since

# One side's samples: a list of them, or their columns.
Sided = list[sample_types.Sample] | Columns

log = logging.getLogger(__name__)
Verdict = RolloutAnalysis.Verdict

# How analyses judge, and the range of each setting: with the decision they tune
# (rollouts.canary.policy), where the bench reads them too.
ANALYSIS_DEFAULTS = policy.ANALYSIS_DEFAULTS
ANALYSIS_LIMITS = policy.ANALYSIS_LIMITS
is_number = policy.is_number
# The candidate's requests failing upstream (no answer, 502, 504) over this many seconds, at
# least UPSTREAM_MIN of them and at least UPSTREAM_SHARE of its requests: its server is down.
UPSTREAM_WINDOW_S = 3.0
UPSTREAM_MIN = 5
UPSTREAM_SHARE = 0.5
# The rollback webhook is asked this often unless the rollout says otherwise.
ROLLBACK_EVERY_S = 10
# What :func:`look` answers when a look failed within the failures allowed: the analysis
# starts again on a fresh window.
JUDGE_AGAIN = "judge_again"
# ... and after an inconclusive end within the inconclusive ends allowed.
JUDGE_AGAIN_INCONCLUSIVE = "judge_again_inconclusive"


# --------------------------------------------------------------------------------------------
# The settings
# --------------------------------------------------------------------------------------------


def parse_analysis(raw: object, field: str = "analysis", *, rollout: bool = True) -> dict[str, Any]:
    """The analysis settings given (an object of the keys of :data:`ANALYSIS_DEFAULTS`, and
    ``metrics``; the rollout's own, ``rollout``, also ``bake_s`` and ``rollback``), checked; a
    DomainError naming ``field.key`` otherwise. Keys not given are left out. The rollback
    webhook's name is checked against the tenant's webhooks by the request."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DomainError("must be an object", field=field)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in policy.ROLLOUT_ONLY and not rollout:
            raise DomainError(f"{key} is a setting of the whole rollout (its analysis), not "
                              "of a step", field=f"{field}.{key}")
        if key == "metrics":
            out[key] = metrics.parse(value, f"{field}.metrics")
            continue
        if key == "rollback":
            out[key] = parse_rollback(value, f"{field}.rollback")
            continue
        if key not in ANALYSIS_LIMITS:
            known = ", ".join(sorted([*ANALYSIS_LIMITS, "metrics", "rollback"]))
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


def parse_rollback(value: object, field: str) -> dict[str, Any] | None:
    """The rollback webhook: ``{"webhook": NAME, "every_s": 1-3600 (10)}`` (or None: none).
    While the rollout runs (progressing, paused or baking) the webhook is asked every
    ``every_s`` with a signed ``rollout.rollback`` POST; a 2xx answer rolls the rollout back."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"webhook", "every_s"}:
        raise DomainError('rollback is {"webhook": NAME} and, optionally, "every_s"', field=field)
    name = value.get("webhook")
    if not isinstance(name, str) or not name or len(name) > 100:
        raise DomainError("name one of the tenant's webhooks", field=f"{field}.webhook")
    every = value.get("every_s", ROLLBACK_EVERY_S)
    if not is_number(every) or every != int(every) or not 1 <= every <= 3600:
        raise DomainError(f"an integer from 1 to 3600, got {every!r}"[:200], field=f"{field}.every_s")
    return {"webhook": name, "every_s": int(every)}


def analysis_config(rollout: Rollout, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings an analysis runs with: defaults, the rollout's, the step's; the SLO
    ceilings from the deployment where none were given."""
    config = {**ANALYSIS_DEFAULTS, "metrics": [], "rollback": None, **(rollout.analysis or {}),
              **(overrides or {})}
    # An LLM route's streamed answers are judged on their first token and the rest too.
    config["streamed"] = rollout.baseline.runtime != ModelVersion.Runtime.TRITON
    if config["max_p99_ms"] is None:
        config["max_p99_ms"] = float(rollout.deployment.slo_p99_ms)
    if config["max_error_rate"] is None:
        config["max_error_rate"] = float(rollout.deployment.slo_error_rate)
    return config


# --------------------------------------------------------------------------------------------
# The evidence and the health watch
# --------------------------------------------------------------------------------------------


def samples_by_version(rollout: Rollout, seconds: float, *, mirror: bool = False,
                       ) -> tuple[dict[int, list[sample_types.Sample]], float]:
    """The route's samples of the last ``seconds``, by version (with ``mirror``, the copies
    mirrored to each); and the time they were read."""
    now = time.time()
    meaning = _variants_meaning(rollout)
    by_version: dict[int, list[sample_types.Sample]] = {}
    for variant, found in samples.window(rollout.deployment_id, seconds, mirror=mirror,
                                         now=now).items():
        number = (meaning.get(variant) or {}).get("version")
        if number is not None:
            by_version.setdefault(int(number), []).extend(found)
    return by_version, now


def columns_by_version(rollout: Rollout, since: float) -> tuple[dict[int, Columns], float]:
    """The route's samples from ``since`` (epoch s) on, by version, as columns, read through
    this worker's :data:`~rollouts.traffic.window_cache.CACHE`: a look reads from Redis and
    parses only the samples that arrived since this worker's previous look at the route; and
    the time they were read."""
    now = time.time()
    meaning = _variants_meaning(rollout)
    parts: dict[int, list[Columns]] = {}
    for variant, found in window_cache.CACHE.window(rollout.deployment_id, min(since, now),
                                                    now=now).items():
        number = (meaning.get(variant) or {}).get("version")
        if number is not None:
            parts.setdefault(int(number), []).append(found)
    return {number: Columns.joined(found) for number, found in parts.items()}, now


def _variants_meaning(rollout: Rollout) -> dict[str, Any]:
    route = Route.objects.filter(pk=rollout.deployment_id).first()
    return route.variants if route is not None else {}


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
# An analysis step: the evidence, the judge and the step's end
# --------------------------------------------------------------------------------------------


def analysis_row(rollout: Rollout, config: dict[str, Any]) -> RolloutAnalysis:
    """The record of the analysis of the rollout's current step (this attempt's), made at its
    first look: its window starts then."""
    row, _ = RolloutAnalysis.objects.get_or_create(
        rollout=rollout, attempt=rollout.attempt, step_index=rollout.step_index,
        defaults={"window_start": time.time(), "weight": rollout.candidate_weight,
                  "config": config},
    )
    return row


def evidence_windows(row: RolloutAnalysis, config: dict[str, Any]) -> list[policy.StepWindow]:
    """The stretches of time whose requests are this look's evidence: the attempt's earlier
    analysis steps that passed with a baseline beside the canary, then this step's, each less
    its warm-up; after a failed look within the failures allowed (a fresh start), this step's
    alone."""
    here = policy.StepWindow(row.window_start, None, config["warmup_s"])
    if row.failed_looks or row.inconclusive_ends or row.weight >= 100:
        return [here]  # a fresh start judges its own window
    # Copies (weight 0: a shadow, a dry run) and live requests are evidence apart.
    kind = {"weight": 0} if row.weight == 0 else {"weight__gt": 0, "weight__lt": 100}
    earlier = RolloutAnalysis.objects.filter(
        rollout_id=row.rollout_id, attempt=row.attempt, step_index__lt=row.step_index,
        verdict=Verdict.PASS, finished_at__isnull=False, **kind,
    ).order_by("step_index")
    return [policy.StepWindow(r.window_start, r.finished_at.timestamp(),
                              float((r.config or {}).get("warmup_s", config["warmup_s"])))
            for r in earlier] + [here]


def is_last_analysis(rollout: Rollout) -> bool:
    """Whether no later analysis step of the rollout compares the canary with a baseline (one
    before a step that sets its weight to 100)."""
    weight = rollout.candidate_weight
    for step in rollout.steps[rollout.step_index + 1:]:
        if "set_weight" in step:
            weight = step["set_weight"]
        elif "analysis" in step and weight < 100:
            return False
    return True


def shadow_pairs(copies: list[sample_types.Sample], originals: list[sample_types.Sample],
                 ) -> tuple[list[sample_types.Sample], list[sample_types.Sample]]:
    """The copies mirrored to the candidate and the baseline's own requests they copy, matched
    by request id, in the same order. An id seen more than once on a side (a client that
    sends its own ``X-Request-Id`` again) pairs nothing."""
    def once(found: list[sample_types.Sample]) -> dict[str, sample_types.Sample]:
        seen: dict[str, sample_types.Sample | None] = {}
        for s in found:
            if s.request_id:
                seen[s.request_id] = None if s.request_id in seen else s
        return {k: v for k, v in seen.items() if v is not None}

    by_id, mine = once(originals), once(copies)
    matched = [(c, by_id[rid]) for rid, c in mine.items() if rid in by_id]
    matched.sort(key=lambda pair: pair[1].t)
    return [c for c, _ in matched], [b for _, b in matched]


def look(row: RolloutAnalysis, config: dict[str, Any],
         canary: list[sample_types.Sample] | Columns,
         baseline: list[sample_types.Sample] | Columns, now: float, *,
         windows: list[policy.StepWindow], last: bool = True, shadow: bool = False) -> str:
    """One look of a running analysis at the requests of the candidate and the baseline
    (read at ``now``, from the start of ``windows`` on), recorded on ``row``. Returns the
    step's end (``pass``, ``fail``, ``inconclusive``: :func:`rollouts.canary.policy.step_end`
    decides), ``running`` to look again next tick, :data:`JUDGE_AGAIN` after a failed look
    within ``failure_limit``, or :data:`JUDGE_AGAIN_INCONCLUSIVE` after an inconclusive end
    within ``inconclusive_limit`` (the evidence starts afresh either way). With all the traffic on the
    candidate there is no baseline to compare with, and the SLO gates alone decide. With
    ``shadow``, ``canary`` are the copies mirrored to the candidate, judged each against the
    baseline's answer to the same request (:func:`rollouts.canary.judge.judge_pairs`). The
    samples come as lists of samples or as :class:`~rollouts.traffic.columns.Columns` (a
    shadow's as lists: they are paired by request id)."""
    canary, baseline, kept = same_span(canary, baseline, windows[0].start, now)
    evidence = policy.evidence(canary, windows)
    recent: dict[str, Any] = {}
    if config["window_s"] and not shadow:
        start, block = policy.recent_block(windows, now, config["window_s"])
        recent = {"recent_from": start, "block": block, "seconds": config["window_s"]}
    if shadow:
        evidence, paired = shadow_pairs(evidence, policy.evidence(baseline, windows))
        judgement = judge.judge_pairs(evidence, paired, policy.judge_config(config))
        step_samples = len(evidence)
    else:
        judgement = judge.judge_samples(
            evidence, policy.evidence(baseline, windows) if row.weight < 100 else None,
            policy.judge_config(config), **recent)
        step_samples = len(policy.evidence(canary, windows[-1:]))
    ended, headline = policy.step_end(
        judgement, step_samples=step_samples,
        min_samples=config["min_samples"], last=last or row.weight >= 100,
        planned_samples=config["planned_samples"], elapsed_s=now - row.window_start,
        timeout_s=config["timeout_s"], shadow=shadow)
    slo = gates_json(judgement)
    gate_reasons: list[str] = []
    if config.get("metrics"):
        ended, headline, slo["metrics"] = _metric_gates(row, config, ended, headline, now)
        slo["window_start"] = row.window_start
        gate_reasons = [metrics.describe(m) for m in slo["metrics"]]
    fields: dict[str, Any] = {
        "looks": row.looks + 1, "spent": config["alpha"] / policy.fresh_starts(config),
        "judgement": judgement.to_json(), "slo": slo,
        "reasons": [headline, *judgement.reasons, *gate_reasons, *([kept] if kept else [])],
        "updated_at": timezone.now(),
    }
    if ended == judge.FAIL:
        fields["failed_looks"] = row.failed_looks + 1
        if fields["failed_looks"] <= config["failure_limit"]:
            # Within the failures allowed: judge again on fresh evidence, with the next share
            # of the error budget.
            fields.update(window_start=time.time())
            _record(row, fields)
            return JUDGE_AGAIN
    if ended == judge.INCONCLUSIVE and row.inconclusive_ends < config["inconclusive_limit"]:
        # Within the inconclusive ends allowed (traffic too thin for the plan, say): judge
        # again on fresh evidence, with the next share of the error budget.
        fields.update(inconclusive_ends=row.inconclusive_ends + 1, window_start=time.time())
        _record(row, fields)
        return JUDGE_AGAIN_INCONCLUSIVE
    if ended != policy.RUNNING:
        fields.update(verdict=ended, finished_at=timezone.now())
    _record(row, fields)
    return ended


def _metric_gates(row: RolloutAnalysis, config: dict[str, Any], ended: str, headline: str,
                  now: float) -> tuple[str, str, list[dict[str, Any]]]:
    """The analysis's metric gates measured (those due) and judged with the look's end: a
    gate that fails the analysis fails it whatever the judge said; a pass waits for every
    gate's latest measurement within its range. Measurements of an earlier window (before a
    fresh start) are not carried over."""
    kept = row.slo or {}
    previous = kept.get("metrics", []) if kept.get("window_start") == row.window_start else []
    rows, failed, ok = metrics.judge(config["metrics"], previous, row.rollout, now)
    if failed and ended != judge.FAIL:
        return judge.FAIL, failed, rows
    if ended == judge.PASS and not ok:
        waiting = ", ".join(r["template"] for r in rows if r.get("state") != "ok")
        why = f"the judge is settled; waiting for metric {waiting} to be measured within its range"
        return policy.RUNNING, why, rows
    return ended, headline, rows


def same_span(canary: Sided, baseline: Sided, since: float, now: float) -> tuple[Sided, Sided, str]:
    """Both sides over the same span of time: where one side's kept samples are capped
    (``SWITCHYARD_SAMPLES_MAX_PER_VARIANT``) the other is cut to match, so no request is
    compared with one of another time; and, when the evidence wanted (from ``since``) is
    older than what is kept (capped, or past ``SWITCHYARD_SAMPLES_KEEP_S``), a sentence
    saying so."""
    cap, keep = samples.max_per_variant(), samples.keep_s()
    start = now - keep
    for side in (canary, baseline):
        if len(side) and len(side) >= cap:
            start = max(start, float(side.t.min()) if isinstance(side, Columns) else side[0].t)
    if start <= since:
        return canary, baseline, ""
    reason = (f"the evidence starts {now - start:.0f} s ago, not {now - since:.0f}: older "
              f"requests are no longer kept ({cap} a version at most, for {keep} s)")
    return ended_since(canary, start), ended_since(baseline, start), reason


def gates_json(judgement: judge.Judgement) -> dict[str, Any]:
    """The SLO gates of a look, in the units they were set in (ms, percent)."""
    rows = []
    for g in judgement.gates:
        shown = g.shown()
        rows.append({"name": g.name, "value": shown["estimate"], "low": shown["low"],
                     "high": shown["high"], "limit": shown["tolerance"], "state": g.state,
                     "ok": g.state != judge.FAIL, "note": g.note})
    return {"gates": rows, "checked": any(g["value"] is not None for g in rows),
            "ok": all(g["ok"] for g in rows)}


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


def _units(found: Any, ref: Any) -> dict[str, Any]:
    """The unit of a verdict row, and each side's users when it is the user."""
    if not isinstance(found, clustered.UserArm) or not isinstance(ref, clustered.UserArm):
        return {"unit": "request"}
    return {"unit": "user", "users": found.user_count, "reference_users": ref.user_count}


def ab_verdict(rollout: Rollout, by_version: dict[int, list[sample_types.Sample]]) -> dict[str, Any]:
    """Each variant against the reference: p50/p95 and error-rate differences with their
    intervals, whether the sample could see the effect the team set (``analysis``'s
    ``latency_tolerance_pct``), how many more requests it needs if not, and a summary.

    A split with a ``sticky_header`` is judged per user (:mod:`rollouts.canary.clustered`, the
    samples' ``key``): its rows say ``unit`` "user" and how many users each side had. Where no
    sample has a key (an Envoy gateway's lines), it is judged per request."""
    config = analysis_config(rollout)
    reference = rollout.baseline.version
    per_user = bool(rollout.sticky_header) and any(
        s.key for found in by_version.values() for s in found)
    arm = clustered.UserArm.of if per_user else judge.Arm.of
    ref = arm(by_version.get(reference, []))
    comparisons = max(len(rollout.variants) - 1, 1)
    confidence = 1 - config["alpha"] / (3 * comparisons)
    options = {"effect_pct": max(config["latency_tolerance_pct"], 0.1), "alpha": config["alpha"],
               "confidence": confidence}
    rows = []
    for item in rollout.variants[1:]:
        number = item["version"]
        found = arm(by_version.get(number, []))
        if len(found.latencies) < 2 or len(ref.latencies) < 2:
            rows.append({"version": number, "samples": found.total, "reference_samples": ref.total,
                         "enough": False, "difference": "unknown",
                         "note": "too few requests to compare", **_units(found, ref)})
            continue
        if per_user:
            diff = clustered.ab_difference_by_user(f"v{number}", found, f"v{reference}", ref,
                                                   **options)
        else:
            diff = abtest.ab_difference(f"v{number}", found.latencies, found.errors,
                                        f"v{reference}", ref.latencies, ref.errors, **options)
        difference = abtest.classify(
            diff, float(np.median(ref.latencies)), float(np.quantile(ref.latencies, 0.95)),
            config["latency_tolerance_pct"], config["error_tolerance_pct"])
        rows.append({"version": number, **verdicts.jsonable(dataclasses.asdict(diff)),
                     "difference": difference, "client_errors": found.client_errors})
    better = [r for r in rows if r["difference"] == "better"]
    if all(r["difference"] == "none" for r in rows):
        summary = (f"no difference beyond {config['latency_tolerance_pct']:g}% latency or "
                   f"{config['error_tolerance_pct']:g} points of errors between the variants")
        if not all(r.get("enough") for r in rows):
            summary += " (the sample was too small to rule out the effect set)"
    else:
        summary = "; ".join(f"v{r['version']} {r['difference']} than v{reference}"
                            if r["difference"] in ("worse", "better") else
                            f"v{r['version']}: {r['difference']}" for r in rows)
    if per_user:
        users = ", ".join([f"v{reference} {ref.user_count}",
                           *(f"v{r['version']} {r['users']}" for r in rows)])
        summary += f"; judged per user of {rollout.sticky_header} ({users} users)"
    winner = None
    if better:
        winner = min(better, key=lambda r: r["p50_diff_ms"]["estimate"])["version"]
    return {"reference": reference, "variants": rows, "summary": summary, "winner": winner,
            "samples": {str(n): len(v) for n, v in by_version.items()}}
