"""Small formatting filters for the console."""

from __future__ import annotations

import json
from datetime import datetime

from django import template
from django.urls import ResolverMatch
from django.utils import timezone
from django.utils.html import format_html

from console.forms import FormAlert
from console.forms import form_alert as alert_for

register = template.Library()
NO_VALUE = "\u2013"  # what a number that is not there reads as (an en dash)


def _ago_text(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} s ago"
    if seconds < 90 * 60:
        return f"{seconds // 60} min ago"
    if seconds < 36 * 3600:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


@register.filter
def ago(value: datetime | None) -> str:
    """'4 s ago', '3 min ago', '2 h ago', '5 d ago' ('never' for None), as a ``<time>`` that
    keeps counting in the browser (console.js) and names the moment on hover."""
    if value is None:
        return "never"
    seconds = max(int((timezone.now() - value).total_seconds()), 0)
    return format_html('<time datetime="{}" data-ago="{}" title="{}">{}</time>',
                       value.isoformat(), seconds, when(value), _ago_text(seconds))


@register.filter
def when(value: datetime | None) -> str:
    """A moment as the console writes every time: 24-hour, in the console's time zone, named
    ("2026-11-24 14:05:09 UTC")."""
    if value is None:
        return "\u2013"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")


@register.filter
def clock(value: datetime | None) -> str:
    """The time of day of a moment, as timelines show it: "14:05:09 UTC"."""
    if value is None:
        return "\u2013"
    return timezone.localtime(value).strftime("%H:%M:%S %Z")


@register.filter
def served_state(entry: object) -> str:
    """A model state as a server reports it, for its badge. Triton marks a version it was
    told to unload UNAVAILABLE with the reason "unloaded": that is no failure, so it reads
    UNLOADED (grey), and only a real UNAVAILABLE stays red."""
    if not isinstance(entry, dict):
        return ""
    state = str(entry.get("state", ""))
    if state == "UNAVAILABLE" and entry.get("reason") == "unloaded":
        return "UNLOADED"
    return state


@register.filter
def counted(value: int, plural_label: str) -> str:
    """A count with its unit, singular for one: '1 GPU', '2 GPUs', '1 model instance'."""
    label = plural_label[:-1] if value == 1 and plural_label.endswith("s") else plural_label
    return f"{value} {label}"


@register.filter
def mib(value: int | None) -> str:
    """MiB as a readable size: '512 MiB', '80 GiB'."""
    if value is None:
        return "\u2013"  # en dash: no value
    if value >= 1024:
        gib = value / 1024
        return f"{gib:.0f} GiB" if gib == int(gib) else f"{gib:.1f} GiB"
    return f"{value} MiB"


@register.filter
def bytes_h(value: int | None) -> str:
    if value is None:
        return "\u2013"  # en dash: no value
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"


@register.filter
def level(percent: int) -> str:
    """CSS level for a usage bar."""
    if percent >= 90:
        return "bad"
    return "warn" if percent >= 75 else ""


@register.filter
def get_item(mapping: dict, key: str) -> object:
    return mapping.get(key, "") if isinstance(mapping, dict) else ""


@register.filter
def verb(value: str) -> str:
    """'requested_approval' → 'requested approval'."""
    return value.replace("_", " ")


@register.filter
def as_json(value: object) -> str:
    """Indented JSON, for showing configs as users write them."""
    return json.dumps(value, indent=2, sort_keys=True)


def nav_section(match: ResolverMatch | None) -> str:
    """The top navigation item a page belongs to ("" for none): a load, a workload or any
    action of a deployment is under Deployments, a version or an alias under Registry."""
    if match is None:
        return ""
    namespace, name = match.namespace, match.url_name or ""
    if namespace == "console":
        return "audit" if name == "audit" else "dashboard"
    if namespace == "fleet":
        for prefix, section in (("quota", "quotas"), ("token", "tokens"), ("webhook", "webhooks")):
            if name.startswith(prefix):
                return section
        return "fleet"
    if namespace == "rollouts":
        for prefixes, section in ((("deployment", "load", "workload"), "deployments"),
                                  (("rollout",), "rollouts"), (("benchmark",), "benchmarks"),
                                  (("costs",), "costs")):
            if name.startswith(prefixes):
                return section
        return "registry"
    return ""


@register.simple_tag(takes_context=True)
def current_section(context: template.Context) -> str:
    """``{% current_section as section %}``: :func:`nav_section` of the page being rendered."""
    request = context.get("request")
    return nav_section(getattr(request, "resolver_match", None))


@register.simple_tag(takes_context=True)
def form_alert(context: template.Context) -> FormAlert | None:
    """``{% form_alert as alert %}``: what the top of the page says about a refused form."""
    return alert_for(context.flatten().values())


@register.filter
def sig(value: object) -> str:
    """A number to three significant digits: a tiny one in scientific notation (1.2e-05),
    never rounded away to 0.0000; a dash for none."""
    if value is None or value == "":
        return NO_VALUE
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value)
    if number == 0:
        return "0"
    if abs(number) >= 1000:
        return f"{number:.0f}"
    return f"{number:.3g}"


@register.filter
def gate_badge(gate: dict, analysis: object) -> str:
    """An SLO gate's badge on an analysis: "over" once it fails, "waiting (4 of 100)" until
    the canary has the requests the step asks for, else its state."""
    if gate.get("state") == "fail":
        return "over"
    have = (getattr(analysis, "judgement", None) or {}).get("canary_samples") or 0
    need = (getattr(analysis, "config", None) or {}).get("min_samples") or 0
    if have < need:
        return f"waiting ({have} of {need})"
    return str(gate.get("state") or "waiting")


def in_words(value: object) -> str:
    """A recorded value as people read it: none, yes and no for None and booleans; a list
    joined with commas; a mapping as "key: value" pairs; never a Python repr."""
    if value is None or value == "":
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        if not value:
            return "none"
        return ", ".join(f"{str(k).replace('_', ' ')}: {in_words(v)}" for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return ", ".join(in_words(v) for v in value) if value else "none"
    return str(value)


@register.simple_tag
def change_rows(before: object, after: object) -> list[dict[str, str]]:
    """``{% change_rows e.before e.after as rows %}``: an audit event's change, field by
    field in words (``field``, ``before`` or "" when it had none, ``after``)."""
    before = before if isinstance(before, dict) else {}
    after = after if isinstance(after, dict) else {}
    return [{"field": str(k).replace("_", " "),
             "before": in_words(before[k]) if k in before else "", "after": in_words(v)}
            for k, v in after.items()]
