"""Metric gates: numbers from the platform's Prometheus that an analysis also judges the
canary on (``analysis.metrics``), as Argo Rollouts' AnalysisTemplate and Flagger's
MetricTemplate do. Each names a :class:`~rollouts.models.MetricTemplate` (PromQL written by a
platform admin, with the rollout's names put in: ``{{ model }}``, ``{{ candidate }}``...) and
the range its value must stay in::

    {"template": "gpu-memory-ratio", "max": 0.9, "every_s": 10, "failures": 2}

A gate is measured every ``every_s`` seconds (10) while its analysis runs. Its value beyond
``min``/``max`` in ``failures`` measurements in a row (2) fails the analysis (the canary goes
back to the baseline); Prometheus not answering, or answering no series or several, in
:data:`ERROR_LIMIT` measurements in a row fails it too, since nothing can be judged (the safe
side). The analysis passes only once every gate's latest measurement is within its range.

These are point values, not bounds: their noise is not in the error budget of
:mod:`rollouts.canary.judge`, which is why one value beyond is not enough to fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.conf import settings

from console.exceptions import DomainError
from fleet.adapters.base import AdapterError
from fleet.adapters.metrics.prometheus import PrometheusSource, escape_label_value
from rollouts.canary.policy import is_number
from rollouts.models import MetricTemplate, Rollout
from rollouts.models.metrics import PLACEHOLDER, VARIABLES
from rollouts.traffic.specs import route_name

MAX_GATES = 10
EVERY_S = 10.0  # seconds between two measurements of a gate
FAILURES = 2  # measurements in a row beyond the range that fail the analysis
ERROR_LIMIT = 4  # measurements in a row Prometheus could not give that fail it
INTERVAL_S = 60  # the window {{ interval }} stands for
LIMITS = {"every_s": (1, 3600), "failures": (1, 100), "interval_s": (10, 86400)}

Query = Callable[[str], list[tuple[dict[str, str], float]]]


def parse(raw: object, field: str) -> list[dict[str, Any]]:
    """The ``metrics`` of an analysis, checked: a DomainError naming ``field[i].key``."""
    if not isinstance(raw, list):
        raise DomainError('a list of {"template", "min" and/or "max"}', field=field)
    if len(raw) > MAX_GATES:
        raise DomainError(f"at most {MAX_GATES} metric gates", field=field)
    if raw and not settings.SWITCHYARD_PROMETHEUS_URL:
        raise DomainError("metric gates read the platform's Prometheus, and none is set up "
                          "(SWITCHYARD_PROMETHEUS_URL)", field=field)
    out = []
    for index, item in enumerate(raw):
        where = f"{field}[{index}]"
        known = {"template", "min", "max", *LIMITS}
        if not isinstance(item, dict) or set(item) - known:
            raise DomainError(f"a metric gate has the keys {', '.join(sorted(known))}", field=where)
        name = item.get("template")
        if not isinstance(name, str) or not MetricTemplate.objects.filter(name=name).exists():
            names = ", ".join(MetricTemplate.objects.values_list("name", flat=True)[:20]) or "none yet"
            raise DomainError(f"no metric template named {str(name)[:63]!r}; known: {names}",
                              field=f"{where}.template")
        gate: dict[str, Any] = {"template": name}
        for key in ("min", "max"):
            if item.get(key) is not None:
                if not is_number(item[key]):
                    raise DomainError(f"a number, got {item[key]!r}"[:200], field=f"{where}.{key}")
                gate[key] = float(item[key])
        if "min" not in gate and "max" not in gate:
            raise DomainError("give min, max or both: the range the value must stay in",
                              field=where)
        if gate.get("min", -math.inf) > gate.get("max", math.inf):
            raise DomainError("min is above max", field=f"{where}.min")
        for key, (low, high) in LIMITS.items():
            if key in item:
                value = item[key]
                if not is_number(value) or value != int(value) or not low <= value <= high:
                    raise DomainError(f"an integer from {low} to {high}, got {value!r}"[:200],
                                      field=f"{where}.{key}")
                gate[key] = int(value)
        out.append(gate)
    return out


def variables(rollout: Rollout, interval_s: int) -> dict[str, str]:
    """What each placeholder stands for, for this rollout."""
    deployment = rollout.deployment
    return {
        "tenant": rollout.tenant.slug, "deployment": deployment.name,
        "deployment_id": str(deployment.pk), "route": route_name(deployment),
        "model": deployment.model.name,
        "candidate": str(rollout.candidate.version) if rollout.candidate_id else "",
        "baseline": str(rollout.baseline.version), "interval": f"{interval_s}s",
    }


def render(query: str, values: dict[str, str]) -> str:
    """The template's query with its placeholders filled in, each value escaped as inside a
    PromQL string (so a name can never close the quotes it stands in)."""
    def fill(match: Any) -> str:
        name = match.group(1)
        if name not in VARIABLES:
            raise ValueError(f"unknown placeholder {name}")
        return escape_label_value(values[name])

    return PLACEHOLDER.sub(fill, query)


def prometheus() -> Query:
    """The platform's Prometheus, asked with a short timeout (a look is one tick)."""
    return PrometheusSource(settings.SWITCHYARD_PROMETHEUS_URL,
                            timeout=settings.SWITCHYARD_PROMETHEUS_TIMEOUT_S).query


def _range(gate: dict[str, Any]) -> str:
    low, high = gate.get("min"), gate.get("max")
    if low is not None and high is not None:
        return f"{low:g} to {high:g}"
    return f"at most {high:g}" if high is not None else f"at least {low:g}"


def measure(gate: dict[str, Any], query: str, ask: Query) -> tuple[str, float | None, str]:
    """One measurement: (``ok``/``beyond``/``error``, the value, what went wrong)."""
    try:
        found = ask(query)
    except AdapterError as exc:
        # Tenants read this: the platform's own address stays out of it.
        said = str(exc).replace(settings.SWITCHYARD_PROMETHEUS_URL, "the platform's Prometheus")
        return "error", None, said[:300]
    if len(found) != 1:
        what = "no series" if not found else f"{len(found)} series"
        return "error", None, f"the query answered {what}, not one number"
    value = found[0][1]
    if not math.isfinite(value):
        return "error", None, f"the query answered {value}"
    beyond = value < gate.get("min", -math.inf) or value > gate.get("max", math.inf)
    return ("beyond" if beyond else "ok"), value, ""


def judge(gates: list[dict[str, Any]], previous: list[dict[str, Any]], rollout: Rollout,
          now: float, ask: Query | None = None) -> tuple[list[dict[str, Any]], str, bool]:
    """Measure the gates that are due (every ``every_s``) and judge them: (each gate's row
    to keep for the next look, why the analysis fails or "", whether every gate's latest
    measurement is within its range)."""
    rows, failed = [], ""
    templates = {t.name: t for t in MetricTemplate.objects.filter(
        name__in=[g["template"] for g in gates])}
    for index, gate in enumerate(gates):
        before = previous[index] if index < len(previous) and previous[
            index].get("template") == gate["template"] else {}
        row = {**before, "template": gate["template"], "range": _range(gate),
               "min": gate.get("min"), "max": gate.get("max")}
        template = templates.get(gate["template"])
        due = now - float(before.get("at", -math.inf)) >= gate.get("every_s", EVERY_S)
        if template is None:
            state, value, note = "error", None, "the template was deleted"
        elif due:
            ask = ask or prometheus()
            query = render(template.query, variables(rollout, gate.get("interval_s", INTERVAL_S)))
            state, value, note = measure(gate, query, ask)
            row.update(query=query, unit=template.unit)
        else:
            rows.append(row)
            continue
        row.update(state=state, value=value, note=note, at=now,
                   beyond_run=before.get("beyond_run", 0) + 1 if state == "beyond" else 0,
                   error_run=before.get("error_run", 0) + 1 if state == "error" else 0,
                   measured=before.get("measured", 0) + 1)
        rows.append(row)
        if not failed and row["beyond_run"] >= gate.get("failures", FAILURES):
            failed = (f"metric {gate['template']} {value:g}{template.unit if template else ''} "
                      f"is beyond {row['range']} ({row['beyond_run']} measurements in a row)")
        elif not failed and row["error_run"] >= ERROR_LIMIT:
            failed = (f"metric {gate['template']} could not be measured {row['error_run']} "
                      f"times in a row ({note}): nothing to judge it on")
    ok = all(r.get("state") == "ok" for r in rows)
    return rows, failed, ok


def describe(row: dict[str, Any]) -> str:
    """One gate's latest measurement in words."""
    name = f"metric {row['template']}"
    if row.get("state") is None:
        return f"{name}: not measured yet (allowed {row['range']})"
    if row["state"] == "error":
        return f"{name}: not measured ({row.get('note', '')}), allowed {row['range']}"
    value = f"{row['value']:g}{row.get('unit') or ''}"
    if row["state"] == "beyond":
        return f"{name} {value}, allowed {row['range']}: beyond it ({row['beyond_run']} in a row)"
    return f"{name} {value}, allowed {row['range']}: within"
