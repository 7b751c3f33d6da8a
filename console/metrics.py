"""``/metrics``: Switchyard's own Prometheus endpoint.

One registry built per request from :data:`COLLECTORS` (each a ``prometheus_client``
collector class): the per-deployment autoscaling signal and SLO request counters
(:class:`DeploymentCollector`), what
Switchyard's own processes counted (:class:`TelemetryCollector`: requests by view, Celery
tasks, reconcile ticks, failed scrapes; console.telemetry), the broker's queue lengths
(:class:`QueueCollector`), and the state of its rows (:class:`StateCollector`: loads,
rollouts, benchmarks by state, quota use per tenant and device class). Nothing is scraped
from the servers while answering: the figures are what Switchyard already keeps in Redis
and the database.

Who may read it (decided in :func:`refusal`): a platform-level scraper, never a tenant.
The series carry every tenant's label values (tenant slugs, deployment names), so

* a scraper sends ``Authorization: Bearer <SWITCHYARD_METRICS_TOKEN>`` (401 without it or
  with another one), from any address unless ``SWITCHYARD_METRICS_ALLOW_NETS``
  (comma-separated CIDRs) narrows where from (403 elsewhere; with
  ``SWITCHYARD_TRUST_PROXY_HEADERS`` the address is the one the proxy saw,
  ``fleet.tenancy.lockouts.client_ip``);
* a platform admin's console session may read it too, to look (same networks rule);
* with no token set, no scraper can read it: 403 saying to set one. Loopback is not
  trusted: on a shared host (or behind a proxy on it) every local process, a tenant's
  benchmark or model server included, would read every tenant's series.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from console import telemetry
from fleet.models import Quota
from fleet.quota import admission as quota
from fleet.tenancy.lockouts import client_ip
from fleet.tenancy.scoping import is_platform_admin
from rollouts.models import BenchmarkJob, ModelLoad, Rollout
from rollouts.slo import counters as slo_counters
from rollouts.slo.status import LATENCY_BUDGET
from rollouts.workloads import autoscaling

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# --------------------------------------------------------------------------------------------
# Per-deployment autoscaling signal
# --------------------------------------------------------------------------------------------

#: Every deployment series carries these labels. ``deployment`` is Switchyard's deployment
#: name (the ``switchyard.io/deployment`` label of its pods); ``kube_namespace`` and
#: ``kube_deployment`` name its Kubernetes Deployment when it has exactly one (empty, that is
#: absent for Prometheus, otherwise), so prometheus-adapter can tie a series to that object.
#: Not ``namespace``: Prometheus' Kubernetes service discovery sets that label to the scrape
#: target's own namespace, and would rename ours to ``exported_namespace``.
DEPLOYMENT_LABELS = ("tenant", "deployment", "cluster", "kube_namespace", "kube_deployment")

#: name -> (help, unit conversion from the Recommendation). Gauges: each is the value over the
#: last minute as Switchyard measured it, ready for an HPA's External or Object metric.
DEPLOYMENT_GAUGES: dict[str, str] = {
    "switchyard_deployment_p99_latency_seconds":
        "p99 request latency over the last minute (router samples, else the servers' metrics)",
    "switchyard_deployment_requests_per_second":
        "Requests per second over the last minute",
    "switchyard_deployment_queue_time_seconds":
        "Mean time a request waited in the server's queue over the last minute",
    "switchyard_deployment_error_ratio":
        "Share of requests that failed over the last minute (0 to 1)",
    "switchyard_deployment_slo_p99_seconds":
        "The deployment's p99 latency SLO",
    "switchyard_deployment_slo_error_ratio":
        "The deployment's error-rate ceiling (0 to 1): its error budget",
    "switchyard_deployment_slo_latency_objective_ratio":
        "Share of the answered requests that must be faster than the p99 latency SLO (0.99: "
        "a latency budget of 1%)",
    "switchyard_deployment_capacity_requests_per_second":
        "Requests per second one replica carries within the SLO (newest benchmark of the "
        "version serving most traffic)",
    "switchyard_deployment_replicas":
        "Replicas the deployment has now (its Kubernetes workloads' replicas, else its servers)",
    "switchyard_deployment_replicas_recommended":
        "Replicas needed for the last minute's rate at the target utilisation "
        "(absent without a benchmark or a measured rate)",
}
SIGNAL_UP = "switchyard_deployment_signal_up"


def _deployment_values(rec: autoscaling.Recommendation) -> dict[str, float | None]:
    sig, deployment = rec.signal, rec.deployment

    def seconds(ms: float | None) -> float | None:
        return ms / 1000.0 if ms is not None else None

    return {
        "switchyard_deployment_p99_latency_seconds": seconds(sig.p99_ms),
        "switchyard_deployment_requests_per_second": sig.rps,
        "switchyard_deployment_queue_time_seconds": seconds(sig.queue_ms),
        "switchyard_deployment_error_ratio":
            sig.error_rate / 100.0 if sig.error_rate is not None else None,
        "switchyard_deployment_slo_p99_seconds": deployment.slo_p99_ms / 1000.0,
        "switchyard_deployment_slo_error_ratio": float(deployment.slo_error_rate) / 100.0,
        "switchyard_deployment_slo_latency_objective_ratio": 1.0 - LATENCY_BUDGET,
        "switchyard_deployment_capacity_requests_per_second": rec.capacity_rps,
        "switchyard_deployment_replicas": float(rec.current),
        "switchyard_deployment_replicas_recommended":
            float(rec.recommended) if rec.recommended is not None else None,
    }


class DeploymentCollector(Collector):
    """One series per deployment in use (archived ones left out) and gauge; a gauge without
    a value for a deployment (nothing measured, no benchmark) is left out for it, so an HPA
    reading it holds its replicas instead of acting on a made-up zero. The SLO counters
    (:func:`slo_counter_families`) carry the same labels, so the two join one to one."""

    def describe(self) -> Iterable[Metric]:
        # Names only, so registering does not query anything.
        families = [GaugeMetricFamily(n, h, labels=DEPLOYMENT_LABELS)
                    for n, h in DEPLOYMENT_GAUGES.items()]
        counters = [CounterMetricFamily(_strip_total(n), h, labels=DEPLOYMENT_LABELS)
                    for n, (_, h) in SLO_COUNTERS.items()]
        return [*families, GaugeMetricFamily(SIGNAL_UP, ""), *counters,
                GaugeMetricFamily(SLO_COUNTERS_UP, "")]

    def collect(self) -> Iterator[Metric]:
        families = {name: GaugeMetricFamily(name, text, labels=DEPLOYMENT_LABELS)
                    for name, text in DEPLOYMENT_GAUGES.items()}
        up = 1.0
        labelled: dict[int, list[str]] = {}
        for rec in autoscaling.recommendations():
            if rec.signal.error:
                up = 0.0
            deployment = rec.deployment
            labels = [deployment.tenant.slug, deployment.name, deployment.cluster.name,
                      rec.namespace, rec.kube_deployment]
            labelled[deployment.pk] = labels
            for name, value in _deployment_values(rec).items():
                if value is not None:
                    families[name].add_metric(labels, value)
        yield from families.values()
        yield GaugeMetricFamily(
            SIGNAL_UP, "1 when the live window in Redis could be read for every deployment; "
            "0 when it could not (their live gauges are then absent)", value=up)
        yield from slo_counter_families(labelled)


#: Cumulative request counts per deployment (rollouts.slo.counters, added by the scrape
#: tick): name -> (field of the Redis hash, help). deploy/prometheus/slo-rules.yml turns them
#: into the error and latency burn rates.
SLO_COUNTERS: dict[str, tuple[str, str]] = {
    "switchyard_deployment_requests_total": (
        "requests", "Requests sent to the deployment, failed ones included"),
    "switchyard_deployment_failed_requests_total": (
        "failures", "Requests to the deployment that failed (what its error SLO counts)"),
    "switchyard_deployment_slow_requests_total": (
        "slow", "Answered requests slower than the deployment's p99 latency SLO (what its "
                "latency SLO counts)"),
}
SLO_COUNTERS_UP = "switchyard_deployment_slo_counters_up"


def slo_counter_families(labelled: dict[int, list[str]]) -> list[Metric]:
    """The SLO counters of each deployment id in ``labelled`` (id -> its label values, in
    :data:`DEPLOYMENT_LABELS` order) and their up gauge. When Redis cannot be read the
    counters are absent (never zeros, which Prometheus would read as a counter reset)."""
    families = {name: CounterMetricFamily(_strip_total(name), text, labels=DEPLOYMENT_LABELS)
                for name, (_, text) in SLO_COUNTERS.items()}
    store = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        counts = slo_counters.read(store, labelled)
    except redis.RedisError as exc:
        log.warning("/metrics: the deployments' SLO counters cannot be read from Redis: %s", exc)
        found: list[Metric] = []
        up = 0.0
    else:
        for pk, labels in labelled.items():
            for name, (field, _) in SLO_COUNTERS.items():
                families[name].add_metric(labels, counts[pk][field])
        found, up = list(families.values()), 1.0
    finally:
        store.close()
    return [*found, GaugeMetricFamily(
        SLO_COUNTERS_UP, "1 when the deployments' SLO counters could be read from Redis; 0 when "
        "not (they are then absent)", value=up)]


# --------------------------------------------------------------------------------------------
# Switchyard's own work: requests, tasks, ticks, scrapes (counted in Redis by every process)
# --------------------------------------------------------------------------------------------

TELEMETRY_HELP: dict[str, tuple[str, tuple[str, ...]]] = {
    telemetry.HTTP_REQUESTS: ("Requests answered, by view (URL pattern name), method and status",
                              ("view", "method", "status")),
    telemetry.HTTP_DURATION: ("Time to answer a request, by view and method",
                              ("view", "method")),
    telemetry.TASKS: ("Celery tasks run, by task and outcome (success, failure, retry)",
                      ("task", "state")),
    telemetry.TASK_DURATION: ("Time a Celery task ran, by task", ("task",)),
    telemetry.TICK_DURATION: ("Time one periodic reconcile tick took, by kind (health, "
                              "latency_scrape, loads, rollouts, ...)", ("kind",)),
    telemetry.SCRAPE_FAILURES: ("Metrics scrapes of an inference server that failed, by "
                                "server", ("cluster", "server")),
}
TELEMETRY_UP = "switchyard_telemetry_up"


def _strip_total(name: str) -> str:
    # prometheus_client adds "_total" to a counter family's name itself.
    return name.removesuffix("_total")


class TelemetryCollector(Collector):
    """The counters and histograms of console.telemetry; when Redis cannot be read they are
    absent (never zeros, which would read as a counter reset) and the up gauge says 0."""

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(TELEMETRY_UP, "")]

    def collect(self) -> Iterator[Metric]:
        families: list[Metric] = []
        try:
            for name in telemetry.COUNTERS:
                text, labels = TELEMETRY_HELP[name]
                counter = CounterMetricFamily(_strip_total(name), text, labels=labels)
                for values, n in telemetry.read_counter(name):
                    counter.add_metric([values.get(k, "") for k in labels], n)
                families.append(counter)
            for name in telemetry.HISTOGRAMS:
                text, labels = TELEMETRY_HELP[name]
                histogram = HistogramMetricFamily(name, text, labels=labels)
                for found in telemetry.read_histogram(name):
                    histogram.add_metric([found.labels.get(k, "") for k in labels],
                                         found.buckets, found.total)
                families.append(histogram)
            up = 1.0
        except Exception as exc:  # a scrape shows what it has, and says so
            log.warning("/metrics: Switchyard's own counters cannot be read from Redis: %s", exc)
            families, up = [], 0.0
        yield from families
        yield GaugeMetricFamily(TELEMETRY_UP, "1 when Switchyard's own request, task and "
                                "scrape counters could be read from Redis; 0 when not (they "
                                "are then absent)", value=up)


QUEUE_LENGTH = "switchyard_celery_queue_length"


class QueueCollector(Collector):
    """Messages waiting in each of the broker's queues (the Redis list of each queue)."""

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(QUEUE_LENGTH, "", labels=("queue",))]

    def collect(self) -> Iterator[Metric]:
        from console.celery import app

        family = GaugeMetricFamily(QUEUE_LENGTH, "Celery messages waiting in the queue, not "
                                   "yet taken by a worker", labels=("queue",))
        names = {app.conf.task_default_queue, *(q.name for q in app.conf.task_queues or ())}
        try:
            with app.connection_for_read() as conn:
                client = conn.default_channel.client
                for name in sorted(names):
                    family.add_metric([name], float(client.llen(name)))
        except Exception as exc:  # the broker is away: the gauge is absent
            log.warning("/metrics: queue lengths cannot be read from the broker: %s", exc)
            family = GaugeMetricFamily(QUEUE_LENGTH, family.documentation, labels=("queue",))
        yield family


# --------------------------------------------------------------------------------------------
# What the database holds: work by state, quota use
# --------------------------------------------------------------------------------------------

QUOTA_GAUGES = {
    "switchyard_quota_units": "Units (GPUs, or model instances for cpu) the tenant's quota allows",
    "switchyard_quota_units_used": "Units the tenant's loaded and loading versions hold",
    "switchyard_quota_memory_bytes": "Memory the tenant's quota allows",
    "switchyard_quota_memory_used_bytes": "Memory the tenant's loaded and loading versions hold",
    "switchyard_quota_units_borrowed": "Of the units used, those held above the quota, "
                                       "borrowed from the tenant's cohort",
    "switchyard_quota_units_lent": "Of the quota's units left, those other members of the "
                                   "tenant's cohort borrow now",
}
MIB = 1024 * 1024


def _by_state(name: str, text: str, model: Any) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=("tenant", "state"))
    rows = (model.objects.values_list("tenant__slug", "state").order_by()
            .annotate(n=Count("pk")))
    for tenant, state, n in sorted(rows):
        family.add_metric([tenant, state], float(n))
    return family


class StateCollector(Collector):
    """Model loads, rollouts and benchmark jobs by tenant and state, and each quota's
    allowance and use (one aggregate query each)."""

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(n, "") for n in
                ("switchyard_model_loads", "switchyard_rollouts", "switchyard_benchmark_jobs",
                 *QUOTA_GAUGES)]

    def collect(self) -> Iterator[Metric]:
        yield _by_state("switchyard_model_loads", "Model loads, by tenant and state", ModelLoad)
        yield _by_state("switchyard_rollouts", "Rollouts, by tenant and state", Rollout)
        yield _by_state("switchyard_benchmark_jobs", "Benchmark jobs, by tenant and state",
                        BenchmarkJob)
        labels = ("tenant", "device_class")
        families = {n: GaugeMetricFamily(n, t, labels=labels) for n, t in QUOTA_GAUGES.items()}
        quotas = list(Quota.objects.select_related("tenant__cohort"))
        for use in quota.usage_for(quotas):
            key = [use.quota.tenant.slug, use.quota.device_class]
            families["switchyard_quota_units"].add_metric(key, float(use.quota.units))
            families["switchyard_quota_units_used"].add_metric(key, float(use.units_used))
            families["switchyard_quota_memory_bytes"].add_metric(key, float(use.quota.memory_mib * MIB))
            families["switchyard_quota_memory_used_bytes"].add_metric(
                key, float(use.memory_used_mib * MIB))
            families["switchyard_quota_units_borrowed"].add_metric(key, float(use.units_borrowed))
            families["switchyard_quota_units_lent"].add_metric(key, float(use.units_lent))
        yield from families.values()


#: The collectors /metrics serves, in order. Add new ones here.
COLLECTORS: list[type[Collector]] = [
    DeploymentCollector, TelemetryCollector, QueueCollector, StateCollector,
]


def registry() -> CollectorRegistry:
    """A fresh registry of every collector in :data:`COLLECTORS`."""
    found = CollectorRegistry(auto_describe=False)
    for collector in COLLECTORS:
        found.register(collector())
    return found


# --------------------------------------------------------------------------------------------
# Access
# --------------------------------------------------------------------------------------------


def allowed_networks() -> tuple[Network, ...]:
    """``SWITCHYARD_METRICS_ALLOW_NETS`` parsed (a list, or a comma-separated string). An
    entry that is not a network allows nothing (it is logged)."""
    raw = getattr(settings, "SWITCHYARD_METRICS_ALLOW_NETS", ()) or ()
    entries = raw.split(",") if isinstance(raw, str) else list(raw)
    nets = []
    for entry in (str(e).strip() for e in entries):
        if not entry:
            continue
        try:
            nets.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            log.warning("SWITCHYARD_METRICS_ALLOW_NETS: %r is not a network; ignored", entry)
    return tuple(nets)


def _address(request: HttpRequest) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = client_ip(request)
    if text is None:
        return None
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _plain(status: int, text: str) -> HttpResponse:
    return HttpResponse(text + "\n", status=status, content_type="text/plain; charset=utf-8")


def _bearer_matches(request: HttpRequest, token: str) -> bool:
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(
        sent.strip().encode(), token.encode())


def refusal(request: HttpRequest) -> HttpResponse | None:
    """The answer to a caller who may not read /metrics (None: they may); see the module's
    docstring for the rules."""
    token = str(getattr(settings, "SWITCHYARD_METRICS_TOKEN", "") or "")
    admin = is_platform_admin(getattr(request, "user", None))
    if not admin and not token:
        return _plain(403, "/metrics is off: set SWITCHYARD_METRICS_TOKEN and scrape with "
                           "Authorization: Bearer <SWITCHYARD_METRICS_TOKEN> (its series name "
                           "every tenant, so no address is trusted without it)")
    if not admin and not _bearer_matches(request, token):
        answer = _plain(401, "/metrics needs Authorization: Bearer <SWITCHYARD_METRICS_TOKEN>")
        answer["WWW-Authenticate"] = 'Bearer realm="switchyard-metrics"'
        return answer
    nets = allowed_networks()
    if not nets:
        return None
    address = _address(request)
    if address is None or not any(address in net for net in nets
                                  if net.version == address.version):
        return _plain(403, f"/metrics is not served to {address or 'this address'}: add its "
                           "network to SWITCHYARD_METRICS_ALLOW_NETS")
    return None


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """The exposition of every collector, in the format the scraper asks for (Prometheus
    text, or OpenMetrics through ``Accept``)."""
    refused = refusal(request)
    if refused is not None:
        return refused
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry()), content_type=content_type)
