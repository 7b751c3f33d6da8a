"""What a rollout request may ask for, checked, with every limit of it: a canary's steps, an A/B
split's variants and how it ends (``duration_s``, ``sample_size``), the sticky header, the alias
promotion moves, and the actions a person may ask for from each state. Each check raises a
DomainError naming the field (``steps[2]``, ``variants[0].weight``); the API's serializer and the
console's form shape the input (types, required fields) and show these messages. The analysis settings are checked
next to the decision they tune (``rollouts.canary.analysis.parse_analysis``).

A canary's steps::

    {"set_weight": 25}              traffic to the candidate, in percent
    {"pause": {"seconds": 60}}      wait (the canary keeps its traffic and is watched)
    {"pause": {}}                   wait until a person resumes
    {"analysis": {...}}             judge the canary until it passes (overrides ``analysis``)
    {"approval": {}}                wait until an approver who is not the requester approves
    {"benchmark": {"max_drop_pct": 10}}
                                    the candidate's max load within its SLO (its newest
                                    benchmark) may fall below the baseline's by at most 10%;
                                    without a benchmark of both it pauses for a person
    {"cost": {"max_increase_pct": 10}}
                                    the candidate may cost at most 10% more per request than
                                    the baseline (``rollouts.registry.costs``: their benchmarks,
                                    else their live traffic); without a reading of both it
                                    pauses for a person
    {"shadow": {"percent": 100, ...}}
                                    before the candidate serves anyone: copies of ``percent``
                                    of the requests go to it (its answers discarded) and each
                                    copy's time is judged against the same request's time on
                                    the baseline; the other keys are analysis settings. Only
                                    where the candidate's weight is still 0
    {"confirm": {"webhook": "release-bot", "timeout_s": 3600, "every_s": 10}}
                                    hold until the tenant's webhook answers a signed POST
                                    (event rollout.confirm) with a 2xx, asking every
                                    ``every_s``; no 2xx within ``timeout_s`` goes back to the
                                    baseline. First: confirm-rollout; before the end:
                                    confirm-promotion; between weights: confirm the increase
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from console.exceptions import DomainError
from rollouts.canary.analysis import is_number, parse_analysis
from rollouts.models import Deployment, ModelVersion, Rollout

State = Rollout.State

DEFAULT_STEPS: list[dict[str, Any]] = [
    {"set_weight": 5}, {"analysis": {}},
    {"set_weight": 25}, {"analysis": {}},
    {"set_weight": 50}, {"analysis": {}},
]
MAX_STEPS = 100
SHADOW_PERCENT = 100  # a shadow step copies every request unless it says otherwise
CONFIRM_TIMEOUT_S = 3600  # a confirm step waits this long for a 2xx
CONFIRM_EVERY_S = 10  # ... asking this often
MAX_PAUSE_S = 7 * 24 * 3600
ALIAS_NAME = re.compile(r"[A-Za-z0-9_-]{0,64}")
HEADER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,63}")
# An A/B split ends after MAX_DURATION_S at most, or once every variant has sample_size
# requests, from AB_MIN_SAMPLES to MAX_SAMPLE_SIZE.
MAX_DURATION_S = 30 * 24 * 3600
AB_MIN_SAMPLES = 20
MAX_SAMPLE_SIZE = 10_000_000
MIN_VARIANTS, MAX_VARIANTS = 2, 10
MIN_WEIGHT, MAX_WEIGHT = 1, 99  # a variant's share of the traffic, in percent

# The actions a person may ask for, and the states each is carried out from.
ACTION_FROM: dict[str, list[str]] = {
    Rollout.Action.PAUSE: [State.PROGRESSING],
    Rollout.Action.RESUME: [State.PAUSED],
    Rollout.Action.PROMOTE: [State.PROGRESSING, State.PAUSED, State.BAKING],
    Rollout.Action.ABORT: [State.PENDING_APPROVAL, State.LOADING, State.PROGRESSING,
                           State.PAUSED, State.BAKING],
}


def parse_steps(raw: object, webhooks: Collection[str] | None = None) -> list[dict[str, Any]]:
    """A canary's step list, checked (see the module's documentation for the forms);
    ``webhooks``: the names a confirm step may use (None: not checked here)."""
    if raw is None:
        return [dict(s) for s in DEFAULT_STEPS]
    if not isinstance(raw, list) or not raw:
        raise DomainError("must be a non-empty list of steps", field="steps")
    if len(raw) > MAX_STEPS:
        raise DomainError(f"at most {MAX_STEPS} steps", field="steps")
    out: list[dict[str, Any]] = []
    weight = 0  # the candidate's weight where each step runs
    for index, step in enumerate(raw):
        where = f"steps[{index}]"
        if not isinstance(step, dict) or len(step) != 1:
            raise DomainError("a step is an object with one of set_weight, pause, analysis, "
                              "approval, benchmark, cost, shadow, confirm", field=where)
        (kind, value), = step.items()
        if kind == "set_weight":
            if not is_number(value) or value != int(value) or not 0 <= value <= 100:
                raise DomainError(f"set_weight is an integer from 0 to 100, got {value!r}"[:200],
                                  field=where)
            weight = int(value)
            out.append({"set_weight": weight})
        elif kind == "pause":
            if not isinstance(value, dict) or set(value) - {"seconds"}:
                raise DomainError('pause is {} (until resumed) or {"seconds": N}', field=where)
            seconds = value.get("seconds")
            if seconds is not None and (not is_number(seconds) or not 1 <= seconds <= MAX_PAUSE_S):
                raise DomainError(f"pause seconds run from 1 to {MAX_PAUSE_S}", field=where)
            out.append({"pause": {} if seconds is None else {"seconds": float(seconds)}})
        elif kind == "analysis":
            out.append({"analysis": parse_analysis({} if value is None else value, field=where,
                                                   rollout=False)})
        elif kind == "approval":
            if value not in ({}, None):
                raise DomainError("approval takes no settings: {}", field=where)
            out.append({"approval": {}})
        elif kind == "benchmark":
            out.append({"benchmark": _parse_benchmark_step(value, where)})
        elif kind == "cost":
            out.append({"cost": _parse_cost_step(value, where)})
        elif kind == "confirm":
            out.append({"confirm": _parse_confirm_step(value, where, webhooks)})
        elif kind == "shadow":
            if weight:
                raise DomainError(f"a shadow step runs before the candidate serves anyone; here "
                                  f"it has {weight}% of the traffic: put the shadow step before "
                                  "the first set_weight above 0", field=where)
            out.append({"shadow": _parse_shadow_step(value, where)})
        else:
            raise DomainError(f"unknown step {str(kind)[:40]!r}: set_weight, pause, analysis, "
                              "approval, benchmark, cost, shadow or confirm", field=where)
    return out


def _parse_confirm_step(value: object, where: str,
                        webhooks: Collection[str] | None) -> dict[str, Any]:
    """``{"webhook": NAME, "timeout_s": 1-7 days (3600), "every_s": 1-3600 (10)}``, checked."""
    if not isinstance(value, dict) or set(value) - {"webhook", "timeout_s", "every_s"}:
        raise DomainError('confirm is {"webhook": NAME} and, optionally, "timeout_s" and '
                          '"every_s"', field=where)
    name = value.get("webhook")
    if not isinstance(name, str) or not name:
        raise DomainError("name one of the tenant's webhooks", field=f"{where}.webhook")
    check_webhook(name, webhooks, f"{where}.webhook")
    out: dict[str, Any] = {"webhook": name}
    for key, default, high in (("timeout_s", CONFIRM_TIMEOUT_S, MAX_PAUSE_S),
                               ("every_s", CONFIRM_EVERY_S, 3600)):
        got = value.get(key, default)
        if not is_number(got) or got != int(got) or not 1 <= got <= high:
            raise DomainError(f"an integer from 1 to {high}, got {got!r}"[:200],
                              field=f"{where}.{key}")
        out[key] = int(got)
    return out


def check_webhook(name: str, webhooks: Collection[str] | None, field: str) -> None:
    """A DomainError naming ``field`` unless ``name`` is one of ``webhooks`` (the tenant's
    active webhooks; None: not checked here)."""
    if webhooks is not None and name not in webhooks:
        known = ", ".join(sorted(webhooks)[:20]) or "none yet"
        raise DomainError(f"the tenant has no active webhook named {name[:100]!r}; its "
                          f"webhooks: {known}", field=field)


def _parse_shadow_step(value: object, where: str) -> dict[str, Any]:
    """``{"percent": 1-100 (default 100), **analysis settings}``, checked."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise DomainError('shadow is {"percent": N} and, optionally, analysis settings',
                          field=where)
    settings = dict(value)
    percent = settings.pop("percent", SHADOW_PERCENT)
    if not is_number(percent) or percent != int(percent) or not 1 <= percent <= 100:
        raise DomainError(f"percent is an integer from 1 to 100, got {percent!r}"[:200],
                          field=f"{where}.percent")
    return {"percent": int(percent), **parse_analysis(settings, field=where, rollout=False)}


def _parse_benchmark_step(value: object, where: str) -> dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, dict) or set(value) - {"max_drop_pct", "mode"}:
        raise DomainError('benchmark is {"max_drop_pct": N} (and optionally "mode": '
                          '"concurrency" or "rate")', field=where)
    drop = value.get("max_drop_pct", 10)
    if not is_number(drop) or not 0 <= drop <= 100:
        raise DomainError(f"max_drop_pct is a percentage from 0 to 100, got {drop!r}"[:200], field=where)
    mode = value.get("mode")
    if mode not in (None, "concurrency", "rate"):
        raise DomainError("mode is concurrency or rate", field=where)
    return {"max_drop_pct": float(drop), **({"mode": mode} if mode else {})}


def _parse_cost_step(value: object, where: str) -> dict[str, Any]:
    """``{"max_increase_pct": N}``: 0 to 1000 (default 10)."""
    if value is None:
        value = {}
    if not isinstance(value, dict) or set(value) - {"max_increase_pct"}:
        raise DomainError('cost is {"max_increase_pct": N}', field=where)
    most = value.get("max_increase_pct", 10)
    if not is_number(most) or not 0 <= most <= 1000:
        raise DomainError(f"max_increase_pct is a percentage from 0 to 1000, got {most!r}"[:200],
                          field=where)
    return {"max_increase_pct": float(most)}


def find_version(deployment: Deployment, number: object, field: str) -> ModelVersion:
    """The version of the deployment's model numbered ``number``; a DomainError on ``field``
    when it is not a version number or the model has no such version."""
    if not is_number(number) or number != int(number):
        raise DomainError(f"a version number, got {number!r}"[:200], field=field)
    version = deployment.model.versions.filter(version=int(number)).first()
    if version is None:
        raise DomainError(f"{deployment.model.name} has no version {number}", field=field)
    return version


def ab_variants(deployment: Deployment, raw: object) -> list[dict[str, int]]:
    """An A/B split's variants ([{version, weight}], the reference first), checked."""
    if not isinstance(raw, list) or not MIN_VARIANTS <= len(raw) <= MAX_VARIANTS:
        raise DomainError(f"an A/B split names {MIN_VARIANTS} to {MAX_VARIANTS} variants: "
                          "[{version, weight}]", field="variants")
    out: list[dict[str, int]] = []
    for index, item in enumerate(raw):
        where = f"variants[{index}]"
        if not isinstance(item, dict) or set(item) - {"version", "weight"} or "version" not in item:
            raise DomainError("a variant is {version, weight}", field=where)
        version = find_version(deployment, item["version"], f"{where}.version")
        weight = item.get("weight")
        if not is_number(weight) or weight != int(weight) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
            raise DomainError(f"weight is an integer from {MIN_WEIGHT} to {MAX_WEIGHT}, got "
                              f"{weight!r}"[:200], field=f"{where}.weight")
        if any(v["version"] == version.version for v in out):
            raise DomainError(f"v{version.version} is named twice", field=where)
        out.append({"version": version.version, "weight": int(weight)})
    total = sum(v["weight"] for v in out)
    if total != 100:
        raise DomainError(f"the weights must sum to 100, got {total}", field="variants")
    return out


def duration_s(value: object) -> int | None:
    """How many seconds an A/B split runs (None: not given), checked."""
    if value is None:
        return None
    if not is_number(value) or not 1 <= value <= MAX_DURATION_S:
        raise DomainError(f"seconds from 1 to {MAX_DURATION_S}, got {value!r}"[:200],
                          field="duration_s")
    return int(value)


def sample_size(value: object) -> int | None:
    """How many requests each variant of an A/B split collects (None: not given), checked."""
    if value is None:
        return None
    if (not is_number(value) or value != int(value)
            or not AB_MIN_SAMPLES <= value <= MAX_SAMPLE_SIZE):
        raise DomainError(f"an integer from {AB_MIN_SAMPLES} to {MAX_SAMPLE_SIZE}, got "
                          f"{value!r}"[:200], field="sample_size")
    return int(value)


def sticky_header(value: object) -> str:
    """The request header that keeps a client on its variant ("" for none), checked."""
    if not value:
        return ""
    if not isinstance(value, str) or not HEADER_NAME.fullmatch(value):
        raise DomainError("a header name (a letter, then letters, digits and -, at most 64)",
                          field="sticky_header")
    return value


def alias_name(alias: object) -> str:
    """The alias promotion moves ("" for none), checked."""
    if not isinstance(alias, str) or not ALIAS_NAME.fullmatch(alias):
        raise DomainError("an alias name (ASCII letters, digits, - and _, at most 64), or empty "
                          "for none", field="alias")
    return alias
