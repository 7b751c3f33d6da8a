"""Autoscaling: each deployment's live signal, and how many replicas it needs.

**The signal** (:func:`signal`) is what the last minute (:data:`WINDOW_S`) of traffic looked
like, read from what Switchyard already keeps in Redis (nothing is scraped again here):

* the route's per-request samples (:mod:`rollouts.traffic.samples`), when the deployment's traffic
  goes through its route: the exact p99 of every request of every variant (mirrored copies
  left out), their rate and error rate (every 4xx and 5xx). Source ``router``;
* otherwise the points the latency scraper writes per version (:mod:`rollouts.traffic.latency`): the
  rate is the requests counted over the seconds the points cover, the p99 the highest any
  point of the minute reported (as the minute rollups take it). Source ``servers``;
* the queue time, the mean time a request waited in the server's queue, comes from the
  servers' points in both cases (nginx cannot see it), where they carry ``queue_ms``.

No data in the window (no samples, no points) is "nothing measured" (``source`` ""), not a
rate of 0: the scraper or the collector may be down.

**The recommendation** (:func:`recommend_replicas`) divides the measured rate by what one
replica carries within the SLO, at a target utilisation that leaves headroom::

    replicas = ceil(rate / (capacity per replica x target utilisation))

bounded to [:data:`MIN_REPLICAS`, :data:`MAX_REPLICAS`]. The capacity is the max load within
the SLO (``max_load_rps``) of the newest succeeded benchmark of the version that carries most
of the deployment's traffic (``rollouts.benchmarks.results.latest_result``): one benchmark
measures one server, that is one replica. The target (``SWITCHYARD_AUTOSCALE_TARGET_UTILIZATION``,
default 0.7) keeps 30% of each replica's measured capacity free for bursts and for the time a
new replica takes to start. Without a benchmark, or without a measured rate, there is no
number: the recommendation says what to do instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings
from django.db.models import Prefetch

from rollouts.benchmarks.results import latest_result
from rollouts.models import BenchmarkJob, Deployment, ModelVersion, Route, ServerWorkload
from rollouts.traffic import latency, routes, sample_types, samples

WINDOW_S = 60
DEFAULT_TARGET_UTILIZATION = 0.7
MIN_TARGET_UTILIZATION = 0.05
MIN_REPLICAS = 1
MAX_REPLICAS = 100  # ServerWorkload.replicas' own ceiling

# Recommendation states
OK = "ok"
NO_VERSION = "no_version"
NO_BENCHMARK = "no_benchmark"
NO_CAPACITY = "no_capacity"
NO_TRAFFIC = "no_traffic"

# Workloads that run (or are about to run) pods: deleted and deleting ones count no more.
LIVE_WORKLOADS = [s for s in ServerWorkload.ACTIVE if s != ServerWorkload.State.DELETING]


def target_utilization() -> float:
    """The share of a replica's measured capacity to plan for (0.05 to 1.0; default 0.7)."""
    raw = getattr(settings, "SWITCHYARD_AUTOSCALE_TARGET_UTILIZATION", DEFAULT_TARGET_UTILIZATION)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return DEFAULT_TARGET_UTILIZATION
    if not math.isfinite(value):
        return DEFAULT_TARGET_UTILIZATION
    return min(max(value, MIN_TARGET_UTILIZATION), 1.0)


# --------------------------------------------------------------------------------------------
# The signal
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signal:
    """A deployment's traffic over the last ``window_s`` seconds.

    ``source``: ``router`` (per-request samples), ``servers`` (the scraper's points) or ""
    (nothing measured: every figure None). ``rps`` requests per second; ``p99_ms`` None when
    no request was timed; ``queue_ms`` the mean queue time per request (None where the
    servers' points do not carry it); ``error_rate`` in percent, as ``slo_error_rate``;
    ``updated_at`` the newest data (epoch s). ``error`` says why Redis could not be read.
    """

    deployment_id: int
    window_s: int
    source: str = ""
    requests: float | None = None
    rps: float | None = None
    p99_ms: float | None = None
    queue_ms: float | None = None
    error_rate: float | None = None
    updated_at: float | None = None
    error: str = ""

    @property
    def measured(self) -> bool:
        return bool(self.source)


def _covered(found: list[sample_types.Sample], seconds: float, now: float) -> float:
    """The seconds a variant's samples stand for: the window, unless the per-variant cap of
    the sample store cut its start (then from the oldest sample kept)."""
    if found and len(found) >= samples.max_per_variant():
        return max(min(seconds, now - found[0].t), 1e-3)
    return float(seconds)


def _router_figures(deployment_id: int, window_s: int, now: float,
                    store: redis.Redis) -> dict[str, Any] | None:
    read = samples.window(deployment_id, window_s, now=now, store=store)
    everything = [s for found in read.values() for s in found]
    if not everything:
        return None
    latencies = sorted(s.latency_ms for s in everything)
    errors = sum(1 for s in everything if s.is_error)
    return {
        "requests": float(len(everything)),
        "rps": sum(len(found) / _covered(found, window_s, now) for found in read.values()),
        "p99_ms": samples.percentile(latencies, 0.99),
        "error_rate": 100.0 * errors / len(everything),
        "updated_at": max(s.t for s in everything),
    }


def _server_figures(deployment_id: int, window_s: int, now: float,
                    store: redis.Redis) -> dict[str, Any] | None:
    requests = failures = rps = 0.0
    p99s: list[float] = []
    queued: list[tuple[float, float]] = []
    newest = None
    for points in latency.live_points(store, deployment_id, now - window_s).values():
        counted = sum(p.get("requests", 0.0) for p in points)
        seconds = sum(p.get("seconds", 0.0) for p in points)
        requests += counted
        failures += sum(p.get("failures", 0.0) for p in points)
        rps += counted / seconds if seconds > 0 else 0.0
        p99s += [p["p99_ms"] for p in points if p.get("p99_ms") is not None]
        queued += [(p["queue_ms"], p.get("requests", 0.0)) for p in points
                   if p.get("queue_ms") is not None]
        newest = max(newest or 0.0, max(p["t"] for p in points))
    if newest is None:
        return None
    weight = sum(n for _, n in queued)
    return {
        "requests": requests,
        "rps": rps,
        "p99_ms": max(p99s) if p99s else None,
        "queue_ms": sum(v * n for v, n in queued) / weight if weight else None,
        "error_rate": 100.0 * failures / requests if requests else 0.0,
        "updated_at": newest,
    }


def signal(deployment: Deployment, *, window_s: int = WINDOW_S, now: float | None = None,
           store: redis.Redis | None = None) -> Signal:
    """The deployment's p99, request rate, error rate and queue time over the last
    ``window_s`` seconds, from Redis (see the module's docstring for which source wins)."""
    now = time.time() if now is None else now
    try:
        store = store or samples.connect()
        routed = _router_figures(deployment.pk, window_s, now, store)
        served = _server_figures(deployment.pk, window_s, now, store)
    except redis.RedisError as exc:
        return Signal(deployment.pk, window_s,
                      error=f"the live window in Redis cannot be read: {exc}")
    if routed is None and served is None:
        return Signal(deployment.pk, window_s)
    queue_ms = served.get("queue_ms") if served else None
    figures = routed or served
    assert figures is not None
    return Signal(
        deployment_id=deployment.pk,
        window_s=window_s,
        source="router" if routed else "servers",
        requests=figures["requests"],
        rps=figures["rps"],
        p99_ms=figures["p99_ms"],
        queue_ms=queue_ms,
        error_rate=figures["error_rate"],
        updated_at=figures["updated_at"],
    )


# --------------------------------------------------------------------------------------------
# The recommendation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    """How many replicas a deployment needs now, and why.

    ``state``: ``ok`` (``recommended`` is set), ``no_version`` (nothing is served),
    ``no_benchmark`` (the version's capacity was never measured), ``no_capacity`` (its newest
    benchmark found no load within the SLO), ``no_traffic`` (no rate measured in the last
    minute). ``current``: the replicas asked of its Kubernetes workloads (an autoscaled one's:
    what its HPA set, as last read; ``replicas_from`` "workloads"), else its servers
    ("servers"). ``capacity_rps``: what one replica carries
    within the SLO; ``utilization``: the measured rate over what the current replicas carry.
    ``explanation`` is one readable paragraph; ``notes`` are warnings (a capacity measured
    under another SLO, a p99 over the SLO now, a capped number). ``namespace`` and
    ``kube_deployment`` name its Kubernetes Deployment where there is exactly one.
    """

    deployment: Deployment
    state: str
    signal: Signal
    recommended: int | None = None
    current: int = 0
    replicas_from: str = "servers"
    capacity_rps: float | None = None
    target_utilization: float = DEFAULT_TARGET_UTILIZATION
    utilization: float | None = None
    version: ModelVersion | None = None
    benchmark: BenchmarkJob | None = None
    explanation: str = ""
    notes: tuple[str, ...] = ()
    namespace: str = ""
    kube_deployment: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate_rps(self) -> float | None:
        return self.signal.rps


def _live_workloads(deployment: Deployment) -> list[ServerWorkload]:
    cached = getattr(deployment, "live_workloads", None)
    if cached is not None:
        return list(cached)
    return list(deployment.workloads.filter(state__in=LIVE_WORKLOADS).select_related("version"))


def serving_version(deployment: Deployment,
                    workloads: list[ServerWorkload] | None = None) -> tuple[ModelVersion | None, str]:
    """The version that carries most of the deployment's traffic, and how it was chosen:
    the route's heaviest version, else the version a new route would choose among the ready
    ones, else the newest version its Kubernetes workloads start with."""
    route = Route.objects.filter(pk=deployment.pk, state__in=[
        Route.State.IN_FORCE, Route.State.FAILED]).first()
    shares = route.version_weights if route is not None else {}
    shares = {number: weight for number, weight in shares.items() if weight > 0}
    if shares:
        number = max(shares, key=lambda n: (shares[n], n))
        found = ModelVersion.objects.filter(model_id=deployment.model_id, version=number).first()
        if found is not None:
            return found, f"the route sends it {shares[number]}% of the traffic"
    ready = routes.ready_loads(deployment)
    if ready:
        number, why = routes.default_version(deployment, ready)
        return next(load.version for load in ready if load.version.version == number), why
    workloads = _live_workloads(deployment) if workloads is None else workloads
    if workloads:
        version = max((w.version for w in workloads), key=lambda v: v.version)
        return version, "its Kubernetes workload starts with it"
    return None, ""


def _capacity(job: BenchmarkJob) -> float | None:
    best = (job.summary or {}).get("best") or {}
    value = best.get("max_load_rps")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _slo_notes(deployment: Deployment, job: BenchmarkJob) -> list[str]:
    """Where the benchmark held the version to another SLO than the deployment's."""
    notes = []
    measured_p99 = (job.slo or {}).get("p99_ms")
    if measured_p99 is not None and float(measured_p99) > deployment.slo_p99_ms:
        notes.append(
            f"benchmark #{job.pk} measured the capacity within a p99 of {float(measured_p99):g} ms, "
            f"looser than this deployment's {deployment.slo_p99_ms} ms: the capacity is overstated "
            "and the recommendation too low; benchmark again with the deployment's SLO")
    elif measured_p99 is not None and float(measured_p99) < deployment.slo_p99_ms:
        notes.append(
            f"benchmark #{job.pk} measured the capacity within a p99 of {float(measured_p99):g} ms, "
            f"stricter than this deployment's {deployment.slo_p99_ms} ms: the recommendation errs "
            "on the safe side")
    elif measured_p99 is None:
        notes.append(f"benchmark #{job.pk} had no p99 SLO: its max load is the most it carried "
                     "without errors, whatever the latency")
    return notes


def _workload_replicas(workload: ServerWorkload) -> int:
    """The replicas a workload runs now: those Switchyard asked for; for an autoscaled one,
    those its HPA set on the Deployment as last read (``observed``; its minimum before any
    read), never a count Switchyard chose."""
    if not workload.autoscaled:
        return workload.replicas
    desired = (workload.observed or {}).get("desired")
    return desired if isinstance(desired, int) else workload.min_replicas


def _current(deployment: Deployment, workloads: list[ServerWorkload]) -> tuple[int, str]:
    if workloads:
        return sum(_workload_replicas(w) for w in workloads), "workloads"
    servers = getattr(deployment, "server_count", None)
    if servers is None:
        servers = deployment.servers.count()
    return servers, "servers"


def _kube_names(workloads: list[ServerWorkload]) -> tuple[str, str]:
    """(namespace, Deployment name) of the one workload; the shared namespace of several."""
    namespaces = {w.namespace for w in workloads}
    namespace = namespaces.pop() if len(namespaces) == 1 else ""
    name = workloads[0].name if len(workloads) == 1 else ""
    return namespace, name


def _rate_words(sig: Signal) -> str:
    where = ("every request through the route" if sig.source == "router"
             else "the servers' own metrics")
    return f"{sig.rps:.1f} req/s over the last {sig.window_s} s ({where})"


def recommend_replicas(deployment: Deployment, *, sig: Signal | None = None,
                       now: float | None = None, store: redis.Redis | None = None) -> Recommendation:
    """How many replicas ``deployment`` needs for the rate it had over the last minute.

    ``ceil(rate / (capacity per replica x target utilisation))``, at least 1 and at most 100;
    see the module's docstring. ``sig`` is the deployment's :func:`signal` when the caller
    read it already.
    """
    sig = sig if sig is not None else signal(deployment, now=now, store=store)
    target = target_utilization()
    workloads = _live_workloads(deployment)
    current, replicas_from = _current(deployment, workloads)
    namespace, kube_name = _kube_names(workloads)
    base: dict[str, Any] = {
        "deployment": deployment, "signal": sig, "current": current,
        "replicas_from": replicas_from, "target_utilization": target,
        "namespace": namespace, "kube_deployment": kube_name,
    }
    no_rate = _no_rate_words(sig)
    version, chosen_because = serving_version(deployment, workloads)
    if version is None:
        return Recommendation(state=NO_VERSION, **base, explanation=(
            f"{deployment.name} serves no version yet: load one onto its servers (or start its "
            "Kubernetes workload); the recommendation needs the capacity of the version it "
            "serves."))
    job = latest_result(version)
    if job is None:
        return Recommendation(state=NO_BENCHMARK, version=version, **base, explanation=(
            f"No benchmark of v{version.version} yet ({chosen_because}): start one from the "
            f"Benchmarks panel on one of {deployment.name}'s servers to measure how much load one "
            "replica carries within the SLO." + (f" Also: {no_rate}" if no_rate else "")))
    capacity = _capacity(job)
    notes = _slo_notes(deployment, job)
    if capacity is None:
        return Recommendation(state=NO_CAPACITY, version=version, benchmark=job, **base,
                              notes=tuple(notes), explanation=(
            f"Benchmark #{job.pk} of v{version.version} found no load within its SLO: no "
            "replica count meets it. Look at its levels (the first one already failed), then "
            "change the config or the SLO and benchmark again."))
    if not sig.measured or sig.rps is None:
        return Recommendation(state=NO_TRAFFIC, version=version, benchmark=job,
                              capacity_rps=capacity, **base, notes=tuple(notes),
                              explanation=f"{no_rate} One replica of v{version.version} "
                              f"({chosen_because}) carries {capacity:.1f} req/s within its SLO "
                              f"(benchmark #{job.pk}).")
    raw = sig.rps / (capacity * target)
    # A hair over a whole number is float noise (70 / (100 x 0.7)), not one more replica.
    needed = max(MIN_REPLICAS, math.ceil(raw - 1e-9))
    recommended = min(needed, MAX_REPLICAS)
    if needed > MAX_REPLICAS:
        notes.append(f"the rate needs {needed} replicas; capped at {MAX_REPLICAS}")
    if sig.p99_ms is not None and sig.p99_ms > deployment.slo_p99_ms:
        notes.append(f"p99 is {sig.p99_ms:.1f} ms now, over the SLO of {deployment.slo_p99_ms} ms: "
                     "the current replicas are too few, or the benchmark overstates what one "
                     "carries here")
    if sig.error_rate is not None and sig.error_rate > float(deployment.slo_error_rate):
        notes.append(f"the error rate is {sig.error_rate:.2f}% now, over the ceiling of "
                     f"{deployment.slo_error_rate}%")
    utilization = sig.rps / (current * capacity) if current else None
    device = (job.summary or {}).get("device_class") or "its server"
    explanation = (
        f"{_rate_words(sig)} / ({capacity:.1f} req/s per replica x {target:.0%} target "
        f"utilisation) = {raw:.2f} → {recommended} replica{'s' if recommended != 1 else ''}"
        f"{' (the minimum)' if needed == MIN_REPLICAS and raw < 1 else ''}. "
        f"v{version.version} ({chosen_because}) carried {capacity:.1f} req/s within its SLO on "
        f"{device} in benchmark #{job.pk}. "
    )
    if utilization is not None:
        explanation += (f"The {current} replica{'s' if current != 1 else ''} now run at "
                        f"{utilization:.0%} of their measured capacity.")
    else:
        explanation += "Nothing runs it now."
    return Recommendation(
        state=OK, recommended=recommended, version=version, benchmark=job,
        capacity_rps=capacity, utilization=utilization, explanation=explanation,
        notes=tuple(notes), extra={"raw": raw, "needed": needed}, **base,
    )


def _no_rate_words(sig: Signal) -> str:
    if sig.measured:
        return ""
    if sig.error:
        return f"No rate measured: {sig.error}."
    return (f"No traffic measured in the last {sig.window_s} s: no request went through the "
            "route and the latency scraper wrote no point. Send traffic, or check that Celery "
            "beat runs the scraper and that the servers' metrics endpoints answer.")


def recommendations(now: float | None = None) -> Iterator[Recommendation]:
    """:func:`recommend_replicas` for every deployment in use (archived ones left out), with
    one Redis connection: when Redis cannot be reached, every signal says so at once instead
    of each waiting for its own timeout."""
    now = time.time() if now is None else now
    deployments = (
        Deployment.objects.filter(archived_at__isnull=True)
        .select_related("tenant", "model", "cluster")
        .prefetch_related(Prefetch(
            "workloads", to_attr="live_workloads",
            queryset=ServerWorkload.objects.filter(state__in=LIVE_WORKLOADS)
            .select_related("version").order_by("name"),
        ))
        .order_by("tenant__slug", "name")
    )
    store = samples.connect()
    down = ""
    try:
        store.ping()
    except redis.RedisError as exc:
        down = f"the live window in Redis cannot be read: {exc}"
    for deployment in deployments:
        sig = (Signal(deployment.pk, WINDOW_S, error=down) if down
               else signal(deployment, now=now, store=store))
        yield recommend_replicas(deployment, sig=sig, now=now)
