"""What a version costs: unit-seconds (GPU-seconds, or model-instance-seconds on CPU nodes) per
1,000 requests, and money where a platform admin has priced its device class
(``fleet.models.DevicePrice``).

Two readings of it, each with the numbers it rests on:

* **benchmark**: from the version's newest succeeded benchmark, the most load it carried
  within its SLO on one server (``max_load_rps``) and the units it asks for on that server's
  device class (``rollouts.loads.demand``): each unit-second serves ``max_load_rps / units``
  requests at the SLO, so ``units x 1000 / max_load_rps`` unit-seconds per 1,000 requests. What
  a version costs when it is kept busy.
* **live**: over a window (the last 24 hours by default), the unit-seconds its placements held
  (each placement's units times the part of the window it was loading or active), over the
  requests its deployments served in that window (the latency rollups of its series). What it
  costs as it is used, idle capacity included.

:func:`compare` puts a candidate beside a baseline ("v3 costs 18% more per request than v1"),
preferring the benchmark reading when both have one (same load, same SLO) and the live one
otherwise. :func:`chargeback` adds up what each tenant's placements held per day or month.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Q, Sum
from django.utils import timezone

from fleet.adapters.vllm import adapter_name
from fleet.models import DevicePrice, InferenceServer, Placement
from fleet.quota import admission as quota
from rollouts.benchmarks import results as benchmark_results
from rollouts.loads.demand import demand
from rollouts.models import LatencyRollup, ModelVersion

LIVE_WINDOW = timedelta(hours=24)
# Fewer requests than this in the window and the live reading says so rather than dividing.
MIN_LIVE_REQUESTS = 100


@dataclass(frozen=True)
class Reading:
    """One way of reading a version's cost. ``unit_seconds_per_1000``: None when it cannot be
    read (``note`` says why); ``price``: per 1,000 requests in ``currency``, None without a
    price for ``device_class``."""

    source: str  # "benchmark" or "live"
    device_class: str
    unit_seconds_per_1000: float | None
    price: float | None
    currency: str
    note: str
    numbers: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _priced(device_class: str, unit_seconds: float | None) -> tuple[float | None, str]:
    found = DevicePrice.objects.filter(device_class=device_class).first()
    if found is None or unit_seconds is None:
        return None, found.currency if found else ""
    return float(Decimal(str(unit_seconds)) / 3600 * found.per_unit_hour), found.currency


def benchmark_reading(version: ModelVersion) -> Reading | None:
    """The benchmark reading, or None when the version has no succeeded benchmark."""
    job = benchmark_results.latest_result(version)
    if job is None:
        return None
    summary = job.summary or {}
    device_class = summary.get("device_class") or quota.device_class_of(job.server)
    units, _memory = demand(version, device_class)
    rps = (summary.get("best") or {}).get("max_load_rps")
    numbers = {"benchmark": job.pk, "max_load_rps": rps, "units": units,
               "finished_at": job.finished_at.isoformat() if job.finished_at else None}
    if not rps or rps <= 0:
        return Reading("benchmark", device_class, None, None, "",
                       f"benchmark {job.pk} found no load within the SLO", numbers)
    unit_seconds = units * 1000.0 / rps
    price, currency = _priced(device_class, unit_seconds)
    return Reading("benchmark", device_class, unit_seconds, price, currency,
                   f"{units} unit{'s' if units != 1 else ''} of {device_class} carried "
                   f"{rps:.0f} requests a second within the SLO (benchmark {job.pk})", numbers)


def _overlap(units: int, created: datetime, released: datetime | None, state: str,
             start: datetime, end: datetime) -> float:
    """Unit-seconds one placement held between ``start`` and ``end``."""
    if released is None and state not in Placement.HOLDING:
        return 0.0  # released without a time: nothing to count
    begin, stop = max(created, start), min(released or end, end)
    return units * (stop - begin).total_seconds() if stop > begin else 0.0


def _held_rows(placements: Any, start: datetime, end: datetime) -> Any:
    return placements.filter(created_at__lt=end).filter(
        Q(released_at__isnull=True) | Q(released_at__gt=start))


def held_unit_seconds(placements: Any, start: datetime, end: datetime) -> dict[str, float]:
    """Unit-seconds the ``placements`` held between ``start`` and ``end``, by device class:
    each one's units times the part of the window from its creation to its release (or
    ``end`` while it still holds)."""
    out: dict[str, float] = defaultdict(float)
    for device_class, units, created, released, state in _held_rows(
            placements, start, end).values_list("device_class", "units", "created_at",
                                                "released_at", "state"):
        if seconds := _overlap(units, created, released, state, start, end):
            out[device_class] += seconds
    return dict(out)


def labels_of(version: ModelVersion) -> set[str]:
    """The names a version's traffic is rolled up under (``LatencyRollup.label``): ``v<N>``
    on Triton, the name it is served under on vLLM."""
    labels = {f"v{version.version}"}
    for server in InferenceServer.objects.filter(placements__model_version=version).distinct():
        name = version.name_on(server)
        labels.add(adapter_name(name, version.version) if version.adapter_of else name)
    return labels


def served_requests(version: ModelVersion, start: datetime, end: datetime) -> int:
    """Requests the version's deployments served between ``start`` and ``end`` (whole
    minutes of the latency rollups)."""
    return int(LatencyRollup.objects.filter(
        deployment__model_id=version.model_id, label__in=labels_of(version),
        minute__gte=start, minute__lt=end).aggregate(n=Sum("requests"))["n"] or 0)


def live_reading(version: ModelVersion, *, end: datetime | None = None,
                 window: timedelta = LIVE_WINDOW) -> Reading | None:
    """The live reading over ``window`` up to ``end`` (now), or None when the version held
    nothing in it."""
    end = end or timezone.now()
    start = end - window
    held = held_unit_seconds(Placement.objects.filter(model_version=version), start, end)
    if not held:
        return None
    # One class in practice; several (servers of two classes) are read as the largest.
    device_class = max(held, key=held.__getitem__)
    unit_seconds = sum(held.values())
    served = served_requests(version, start, end)
    numbers = {"unit_seconds": round(unit_seconds, 3), "requests": served,
               "from": start.isoformat(), "to": end.isoformat()}
    if served < MIN_LIVE_REQUESTS:
        return Reading("live", device_class, None, None, "",
                       f"{served} requests served in the window: too few to divide by", numbers)
    per_1000 = unit_seconds * 1000.0 / served
    price, currency = _priced(device_class, per_1000)
    return Reading("live", device_class, per_1000, price, currency,
                   f"{unit_seconds:.0f} unit-seconds held for {served} requests in the last "
                   f"{window.total_seconds() / 3600:g} h", numbers)


def replaced(version: ModelVersion) -> ModelVersion | None:
    """The version this one would replace: the one its model's ``production`` alias names,
    else the newest other version ready on a server; None when there is none."""
    alias = version.model.aliases.filter(name="production").select_related("version").first()
    if alias is not None and alias.version_id != version.pk:
        return alias.version
    return (ModelVersion.objects.filter(model_id=version.model_id, loads__state="ready")
            .exclude(pk=version.pk).order_by("-version").distinct().first())


def cost_of(version: ModelVersion, *, end: datetime | None = None) -> dict[str, Any]:
    """Both readings of the version's cost (None where there is none)."""
    found = {"benchmark": benchmark_reading(version), "live": live_reading(version, end=end)}
    return {key: reading.as_dict() if reading else None for key, reading in found.items()}


def of_version(version: ModelVersion) -> dict[str, Any]:
    """A version's readings (``benchmark``, ``live``), the version it would replace
    (``replaces``, its number) and the comparison with it (``compared``)."""
    other = replaced(version)
    return {"version": version.pk, **cost_of(version),
            "replaces": other.version if other else None,
            "compared": compare(version, other) if other else None}


def compare(candidate: ModelVersion, baseline: ModelVersion, *,
            end: datetime | None = None) -> dict[str, Any]:
    """The candidate's cost per request against the baseline's, on the first reading both
    have (benchmark, then live): ``change_pct`` (``+18.0``: 18% more), the readings, and a
    sentence. ``change_pct`` None when no reading is common to both."""
    readers = {"benchmark": benchmark_reading,
               "live": lambda v: live_reading(v, end=end)}
    for source, read in readers.items():
        cand, base = read(candidate), read(baseline)
        if cand and base and cand.unit_seconds_per_1000 and base.unit_seconds_per_1000:
            change = 100.0 * (cand.unit_seconds_per_1000 / base.unit_seconds_per_1000 - 1.0)
            more = "more" if change >= 0 else "less"
            what = (f"v{candidate.version} costs {abs(change):.0f}% {more} per request than "
                    f"v{baseline.version} ({cand.unit_seconds_per_1000:.3g} against "
                    f"{base.unit_seconds_per_1000:.3g} unit-seconds per 1,000 requests, "
                    f"{source})")
            if source == "live":
                # Held over served: a canary at 5% holds its placement for a twentieth of the
                # requests, so the live reading says what each cost as it was used.
                what += (f"; live readings count idle capacity at the traffic each served "
                         f"({cand.numbers['requests']:,} and {base.numbers['requests']:,} "
                         "requests): benchmark both to compare them at the same load")
            return {"source": source, "change_pct": round(change, 2), "message": what,
                    "candidate": cand.as_dict(), "baseline": base.as_dict()}
    return {"source": None, "change_pct": None, "candidate": None, "baseline": None,
            "message": (f"no cost reading common to v{candidate.version} and "
                        f"v{baseline.version}: benchmark both, or serve both with traffic")}


def chargeback(tenant_ids: list[int] | None, start: datetime, end: datetime,
               period: str = "day") -> list[dict[str, Any]]:
    """What each tenant's placements held, per ``period`` ("day" or "month", UTC) between
    ``start`` and ``end``: unit-seconds and unit-hours by device class, and money where the
    class has a price. ``tenant_ids`` None: every tenant. One query for the placements."""
    placements = Placement.objects.all()
    if tenant_ids is not None:
        placements = placements.filter(tenant_id__in=tenant_ids)
    held = list(_held_rows(placements, start, end).values_list(
        "tenant_id", "tenant__slug", "device_class", "units", "created_at", "released_at",
        "state"))
    prices = {p.device_class: p for p in DevicePrice.objects.all()}
    rows = []
    for slot_start, slot_end in _periods(start, end, period):
        sums: dict[tuple[str, int, str], float] = defaultdict(float)
        for tenant_id, slug, device_class, units, created, released, state in held:
            if seconds := _overlap(units, created, released, state, slot_start, slot_end):
                sums[(slug, tenant_id, device_class)] += seconds
        for (slug, tenant_id, device_class), seconds in sorted(sums.items()):
            price = prices.get(device_class)
            rows.append({
                "period": (slot_start.date().isoformat() if period == "day"
                           else slot_start.strftime("%Y-%m")),
                "tenant": slug, "tenant_id": tenant_id, "device_class": device_class,
                "unit_seconds": round(seconds, 3), "unit_hours": round(seconds / 3600, 4),
                "cost": (round(float(Decimal(str(seconds)) / 3600 * price.per_unit_hour), 4)
                         if price else None),
                "currency": price.currency if price else "",
            })
    return rows


def _periods(start: datetime, end: datetime, period: str) -> list[tuple[datetime, datetime]]:
    """Whole UTC days or months covering ``start`` to ``end``, each cut to the window."""
    out = []
    cursor = start.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        cursor = cursor.replace(day=1)
    while cursor < end:
        if period == "month":
            following = (cursor.replace(day=28) + timedelta(days=4)).replace(day=1)
        else:
            following = cursor + timedelta(days=1)
        out.append((max(cursor, start), min(following, end)))
        cursor = following
    return out
