"""``/metrics``: who may read it, what it exports, and that prometheus-adapter's rules and the
example HPA (deploy/prometheus-adapter/) name what it really exports.

The exposition is parsed with ``prometheus_client.parser``, the parser Prometheus' own
client ships; the HPA is checked against the official Kubernetes client's model.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from django.utils import timezone
from kubernetes import client as kube
from kubernetes.utils import parse_quantity
from prometheus_client.parser import text_string_to_metric_families

from console import metrics
from tests.factories import DeploymentFactory, TenantFactory
from tests.kube.schemas import validate_builtin
from tests.rollouts.workloads.test_autoscaling import (
    benchmark,
    make_deployment,
    record,
    route_lines,
    workload,
)

pytestmark = pytest.mark.django_db
ADAPTER = Path(__file__).resolve().parents[1] / "deploy" / "prometheus-adapter"
OUTSIDE = "203.0.113.5"
TOKEN = "s3cret-metrics-token-0123456789"


@pytest.fixture(autouse=True)
def scraper_settings(settings):
    """A platform's scraper: the token set, no networks named, no proxy trusted."""
    settings.SWITCHYARD_METRICS_TOKEN = TOKEN
    settings.SWITCHYARD_METRICS_ALLOW_NETS = []
    settings.SWITCHYARD_TRUST_PROXY_HEADERS = False


def get(address: str = "127.0.0.1", token: str | None = TOKEN, **headers: str) -> Any:
    """/metrics from ``address``, as the scraper asks (with the token) unless ``token`` is
    None."""
    if token is not None:
        headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {token}")
    return Client().get("/metrics", REMOTE_ADDR=address, **headers)


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples_of(text: str, name: str) -> list[Any]:
    return families(text)[name].samples


def by_deployment(text: str, name: str) -> dict[str, float]:
    return {s.labels["deployment"]: s.value for s in samples_of(text, name)}


# --------------------------------------------------------------------------------------------
# Access
# --------------------------------------------------------------------------------------------


@pytest.fixture
def two_tenants():
    """acme's and globex's deployments, whose names and slugs are label values."""
    for slug in ("acme", "globex"):
        DeploymentFactory(tenant=TenantFactory(slug=slug), name=f"{slug}-secret-deployment")


def test_loopback_without_the_token_reads_nothing(two_tenants):
    """A local process (a tenant's benchmark or model server on the same host) asking
    without the token learns no tenant's label values."""
    for address in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        answer = get(address, token=None)
        text = answer.content.decode()
        assert answer.status_code == 401, address
        assert answer["WWW-Authenticate"] == 'Bearer realm="switchyard-metrics"'
        assert "acme" not in text and "globex" not in text
        assert "switchyard_deployment" not in text


def test_with_no_token_set_nobody_reads_it_not_even_loopback(settings, two_tenants):
    settings.SWITCHYARD_METRICS_TOKEN = ""

    for answer in (get(token=None), get("::1", token=None), get(token="anything"),
                   get(OUTSIDE, token=None)):
        text = answer.content.decode()
        assert answer.status_code == 403
        assert "set SWITCHYARD_METRICS_TOKEN" in text
        assert "acme" not in text and "switchyard_deployment" not in text


def test_a_tenant_members_session_does_not_read_it_a_platform_admins_does(
        settings, alice, root, two_tenants):
    member, admin = Client(), Client()
    member.force_login(alice)
    admin.force_login(root)

    assert member.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 401
    answer = admin.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert answer.status_code == 200
    assert 'tenant="globex"' in answer.content.decode()
    settings.SWITCHYARD_METRICS_TOKEN = ""
    assert member.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    assert admin.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200


def test_the_scraper_holding_the_token_reads_every_tenants_series(two_tenants):
    answer = get(OUTSIDE)

    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/plain; version=")
    text = answer.content.decode()
    assert 'tenant="acme"' in text and 'tenant="globex"' in text


@pytest.mark.parametrize("nets", [["10.0.0.0/8", "not-a-network"], "10.0.0.0/8, fd00::/8"])
def test_allowed_networks_narrow_where_the_token_is_taken_from(settings, nets):
    settings.SWITCHYARD_METRICS_ALLOW_NETS = nets

    assert get("10.1.2.3").status_code == 200
    assert get("127.0.0.1").status_code == 403
    assert get(OUTSIDE).status_code == 403
    assert get("10.1.2.3", token=None).status_code == 401


def test_allowed_networks_read_the_address_a_trusted_proxy_saw(settings):
    settings.SWITCHYARD_METRICS_ALLOW_NETS = ["10.0.0.0/8"]
    untrusted = get(HTTP_X_FORWARDED_FOR="10.1.2.3")
    settings.SWITCHYARD_TRUST_PROXY_HEADERS = True
    from_outside = get(HTTP_X_FORWARDED_FOR=OUTSIDE)
    from_inside = get(HTTP_X_FORWARDED_FOR="10.1.2.3")

    assert untrusted.status_code == 403  # the socket's 127.0.0.1, not the header
    assert from_outside.status_code == 403
    assert from_inside.status_code == 200


def test_the_token_is_required_and_enough():
    missing = get(token=None)
    wrong = get(token=f"{TOKEN}x")
    basic = get(HTTP_AUTHORIZATION=f"Basic {TOKEN}")
    right = get(OUTSIDE)
    lower = get(OUTSIDE, HTTP_AUTHORIZATION=f"bearer {TOKEN}")

    for answer in (missing, wrong, basic):
        assert answer.status_code == 401
        assert answer["WWW-Authenticate"] == 'Bearer realm="switchyard-metrics"'
        assert "switchyard_deployment" not in answer.content.decode()
    assert right.status_code == lower.status_code == 200
    assert "# TYPE switchyard_deployment_signal_up gauge" in right.content.decode()


def test_only_reads_are_served():
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    answer = Client().post("/metrics", REMOTE_ADDR="127.0.0.1", **auth)

    assert answer.status_code == 405
    assert Client().head("/metrics", REMOTE_ADDR="127.0.0.1", **auth).status_code == 200


# --------------------------------------------------------------------------------------------
# What it exports
# --------------------------------------------------------------------------------------------


def served_world() -> dict[str, Any]:
    """fraud-scorer: 2.5 req/s through its route at 20 ms, v1 benchmarked at 1 req/s within
    its SLO of 250 ms, run as Deployment serving/triton-fraud-v1 with 3 replicas. quiet: no
    traffic, no benchmark. old: archived."""
    busy = make_deployment(name="fraud-scorer", slo_p99_ms=250)
    benchmark(busy, max_load_rps=1.0)
    workload(busy, "triton-fraud-v1", 3)
    now = time.time()
    record(route_lines(busy, "v1-a", [20.0] * 147 + [30.0] * 3, end=now - 1), now)
    quiet = make_deployment(name="quiet", tenant=busy.tenant, slo_p99_ms=100)
    old = make_deployment(name="old", tenant=busy.tenant)
    old.archived_at = timezone.now()
    old.save(update_fields=["archived_at"])
    return {"busy": busy, "quiet": quiet}


def test_it_exports_each_deployments_signal_and_recommendation():
    world = served_world()

    text = get().content.decode()
    found = families(text)

    assert {n for n in metrics.DEPLOYMENT_GAUGES} <= set(found)
    assert all(found[n].type == "gauge" for n in metrics.DEPLOYMENT_GAUGES)
    p99 = samples_of(text, "switchyard_deployment_p99_latency_seconds")
    assert [s.labels for s in p99] == [{
        "tenant": world["busy"].tenant.slug, "deployment": "fraud-scorer", "cluster": "gpu-east",
        "kube_namespace": "serving", "kube_deployment": "triton-fraud-v1"}]
    assert p99[0].value == pytest.approx(0.030)
    assert by_deployment(text, "switchyard_deployment_requests_per_second") == {
        "fraud-scorer": pytest.approx(2.5)}
    assert by_deployment(text, "switchyard_deployment_error_ratio") == {"fraud-scorer": 0.0}
    assert by_deployment(text, "switchyard_deployment_replicas_recommended") == {
        "fraud-scorer": 4.0}  # ceil(2.5 / (1.0 x 0.7))
    assert by_deployment(text, "switchyard_deployment_capacity_requests_per_second") == {
        "fraud-scorer": 1.0}
    assert by_deployment(text, "switchyard_deployment_replicas") == {
        "fraud-scorer": 3.0, "quiet": 1.0}
    assert by_deployment(text, "switchyard_deployment_slo_p99_seconds") == {
        "fraud-scorer": 0.25, "quiet": 0.1}
    assert by_deployment(text, "switchyard_deployment_slo_error_ratio") == {
        "fraud-scorer": 0.01, "quiet": 0.01}
    # Nothing measured for quiet: no made-up zero; archived deployments are not exported.
    assert "quiet" not in by_deployment(text, "switchyard_deployment_requests_per_second")
    assert "old" not in {s.labels.get("deployment") for f in families(text).values()
                         for s in f.samples}
    assert samples_of(text, "switchyard_deployment_signal_up")[0].value == 1.0


def test_the_queue_time_is_exported_in_seconds_where_measured():
    import json

    from rollouts.traffic import latency

    dep = make_deployment()
    now = time.time()
    point = {"t": now - 3, "seconds": 2.0, "requests": 8, "failures": 0, "queue_ms": 4.0}
    latency._redis().zadd(latency._series_key(dep.pk, "v1"), {json.dumps(point): now - 3})
    latency._redis().sadd(latency._labels_key(dep.pk), "v1")

    text = get().content.decode()

    assert by_deployment(text, "switchyard_deployment_queue_time_seconds") == {
        dep.name: pytest.approx(0.004)}


def test_when_redis_is_down_the_live_gauges_are_absent_and_it_says_so(settings):
    served_world()
    settings.REDIS_URL = "redis://127.0.0.1:9/0"

    text = get().content.decode()

    assert samples_of(text, "switchyard_deployment_signal_up")[0].value == 0.0
    assert samples_of(text, "switchyard_deployment_requests_per_second") == []
    assert samples_of(text, "switchyard_deployment_replicas_recommended") == []
    assert by_deployment(text, "switchyard_deployment_slo_p99_seconds")["fraud-scorer"] == 0.25


def add_slo_counts(dep: Any, **counts: float) -> None:
    """What the scrape tick adds to ``dep``'s SLO counters in Redis."""
    import redis
    from django.conf import settings

    from rollouts.slo import counters

    pipe = redis.Redis.from_url(settings.REDIS_URL).pipeline()
    counters.add(pipe, dep.pk, **counts)
    pipe.execute()


SLO_COUNTER_NAMES = ("switchyard_deployment_requests_total",
                     "switchyard_deployment_failed_requests_total",
                     "switchyard_deployment_slow_requests_total")


def counter_samples(text: str) -> dict[str, dict[str, float]]:
    """name -> deployment -> value of the SLO counters' samples (``_created`` left out)."""
    found: dict[str, dict[str, float]] = {name: {} for name in SLO_COUNTER_NAMES}
    for family in families(text).values():
        for sample in family.samples:
            if sample.name in found:
                found[sample.name][sample.labels["deployment"]] = sample.value
    return found


def test_it_exports_each_deployments_slo_counters_with_the_gauges_labels():
    """GIVEN fraud-scorer, whose scrape ticks counted 1,000 requests, 12 failed and 30 slow,
    and quiet, never counted
    WHEN /metrics is read
    THEN both carry the three counters (quiet at 0), with the labels of their gauges, and
    the latency objective of their SLO."""
    world = served_world()
    add_slo_counts(world["busy"], requests=600, failures=10, slow=20)
    add_slo_counts(world["busy"], requests=400, failures=2, slow=10)

    text = get().content.decode()

    assert counter_samples(text) == {
        "switchyard_deployment_requests_total": {"fraud-scorer": 1000.0, "quiet": 0.0},
        "switchyard_deployment_failed_requests_total": {"fraud-scorer": 12.0, "quiet": 0.0},
        "switchyard_deployment_slow_requests_total": {"fraud-scorer": 30.0, "quiet": 0.0},
    }
    found = families(text)
    gauge_labels = {s.labels["deployment"]: s.labels
                    for s in found["switchyard_deployment_slo_error_ratio"].samples}
    for name in SLO_COUNTER_NAMES:
        family = next(f for f in found.values() if name in {s.name for s in f.samples})
        assert family.type == "counter"
        for sample in family.samples:
            assert sample.labels == gauge_labels[sample.labels["deployment"]]
    assert gauge_labels["fraud-scorer"]["kube_deployment"] == "triton-fraud-v1"
    assert by_deployment(text, "switchyard_deployment_slo_latency_objective_ratio") == {
        "fraud-scorer": pytest.approx(0.99), "quiet": pytest.approx(0.99)}
    assert samples_of(text, "switchyard_deployment_slo_counters_up")[0].value == 1.0


def test_the_slo_counters_only_grow_between_scrapes():
    dep = make_deployment()
    add_slo_counts(dep, requests=10, failures=1, slow=0)
    first = counter_samples(get().content.decode())
    add_slo_counts(dep, requests=5, failures=0, slow=2)

    second = counter_samples(get().content.decode())

    assert first["switchyard_deployment_requests_total"] == {dep.name: 10.0}
    assert second == {"switchyard_deployment_requests_total": {dep.name: 15.0},
                      "switchyard_deployment_failed_requests_total": {dep.name: 1.0},
                      "switchyard_deployment_slow_requests_total": {dep.name: 2.0}}


def test_when_redis_is_down_the_slo_counters_are_absent_and_it_says_so(settings, caplog):
    world = served_world()
    add_slo_counts(world["busy"], requests=100, failures=1, slow=1)
    settings.REDIS_URL = "redis://127.0.0.1:9/0"

    answer = get()

    text = answer.content.decode()
    assert answer.status_code == 200
    assert counter_samples(text) == {name: {} for name in SLO_COUNTER_NAMES}
    assert samples_of(text, "switchyard_deployment_slo_counters_up")[0].value == 0.0
    assert by_deployment(text, "switchyard_deployment_slo_error_ratio")["fraud-scorer"] == 0.01
    assert "SLO counters cannot be read from Redis" in caplog.text


def test_openmetrics_is_served_when_asked_for():
    served_world()

    answer = get(HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")

    assert answer["Content-Type"].startswith("application/openmetrics-text")
    assert answer.content.decode().rstrip().endswith("# EOF")


def test_the_endpoint_takes_more_collectors(monkeypatch):
    from prometheus_client.core import GaugeMetricFamily

    class Extra:
        def collect(self):
            yield GaugeMetricFamily("switchyard_extra", "a later collector", value=7)

    monkeypatch.setattr(metrics, "COLLECTORS", [*metrics.COLLECTORS, Extra])

    text = get().content.decode()

    assert samples_of(text, "switchyard_extra")[0].value == 7
    assert "switchyard_deployment_signal_up" in families(text)


# --------------------------------------------------------------------------------------------
# prometheus-adapter rules and the example HPA
# --------------------------------------------------------------------------------------------


def adapter_config() -> dict[str, Any]:
    return yaml.safe_load((ADAPTER / "config.yaml").read_text())


def rule_names(rule: dict[str, Any], exported: set[str]) -> set[str]:
    """The exported metric names a rule's seriesQuery selects (its ``__name__`` regex, fully
    anchored as PromQL's are), renamed through its ``name`` section."""
    match = re.search(r'__name__=~"([^"]+)"', rule["seriesQuery"])
    assert match, rule["seriesQuery"]
    pattern = re.compile(match.group(1))
    selected = {n for n in exported if pattern.fullmatch(n)}
    rename = re.compile(rule["name"]["matches"])
    served = set()
    for name in selected:
        found = rename.fullmatch(name)
        assert found, (name, rule["name"])
        served.add(re.sub(r"\$\{(\d+)\}", lambda m: found.group(int(m.group(1))), rule["name"]["as"]))
    return served


def series_labels(rule: dict[str, Any]) -> set[str]:
    """Every label a rule's queries and resource overrides name."""
    named = set(rule["resources"]["overrides"])
    named |= set(re.findall(r"([a-z_]+)!?=~?\"", rule["seriesQuery"])) - {"__name__"}
    by = re.search(r"by \(([^)<]+)\)", rule["metricsQuery"])
    if by:
        named |= {label.strip() for label in by.group(1).split(",")}
    return named


def test_the_adapter_rules_name_what_metrics_exports():
    served_world()
    text = get().content.decode()
    exported = set(families(text))
    labels = set(metrics.DEPLOYMENT_LABELS)
    config = adapter_config()

    custom = set().union(*(rule_names(r, exported) for r in config["rules"]))
    external = set().union(*(rule_names(r, exported) for r in config["externalRules"]))

    wanted = {"switchyard_deployment_p99_latency_seconds", "switchyard_deployment_requests_per_second",
              "switchyard_deployment_queue_time_seconds", "switchyard_deployment_replicas_recommended"}
    assert wanted <= custom and wanted <= external
    assert custom <= exported and external <= exported
    for rule in config["rules"] + config["externalRules"]:
        assert series_labels(rule) <= labels, rule
        # The namespace label is ours (kube_namespace), not the scrape target's namespace.
        assert rule["resources"]["overrides"]["kube_namespace"] == {"resource": "namespace"}
    assert config["rules"][0]["resources"]["overrides"]["kube_deployment"] == {
        "group": "apps", "resource": "deployment"}


def hpa() -> dict[str, Any]:
    return yaml.safe_load((ADAPTER / "hpa-example.yaml").read_text())


def test_the_example_hpa_is_a_valid_autoscaling_v2_object():
    obj = hpa()

    validate_builtin(obj, kube.V2HorizontalPodAutoscaler)

    assert obj["apiVersion"] == "autoscaling/v2"
    assert obj["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "triton-fraud-v1"}
    assert obj["spec"]["minReplicas"] >= 1


def test_the_example_hpa_reads_series_that_metrics_exports_for_its_deployment():
    """What prometheus-adapter would answer the HPA: for each of its metrics, the exported
    series of that name in the HPA's namespace that its selector (External) or its described
    Deployment (Object) picks: exactly one each, with Switchyard's own figures."""
    served_world()
    text = get().content.decode()
    config = adapter_config()
    exported = set(families(text))
    obj = hpa()
    namespace, target = obj["metadata"]["namespace"], obj["spec"]["scaleTargetRef"]["name"]
    picked: dict[str, float] = {}

    for metric in obj["spec"]["metrics"]:
        if metric["type"] == "External":
            spec = metric["external"]
            assert spec["metric"]["name"] in set().union(
                *(rule_names(r, exported) for r in config["externalRules"]))
            wanted = {"kube_namespace": namespace, **spec["metric"]["selector"]["matchLabels"]}
        else:
            spec = metric["object"]
            assert spec["describedObject"] == {
                "apiVersion": "apps/v1", "kind": "Deployment", "name": target}
            assert spec["metric"]["name"] in set().union(
                *(rule_names(r, exported) for r in config["rules"]))
            wanted = {"kube_namespace": namespace, "kube_deployment": target}
        found = [s for s in samples_of(text, spec["metric"]["name"])
                 if all(s.labels.get(k) == v for k, v in wanted.items())]
        assert len(found) == 1, (spec["metric"]["name"], wanted)
        picked[spec["metric"]["name"]] = found[0].value

    assert picked == {"switchyard_deployment_replicas_recommended": 4.0,
                      "switchyard_deployment_p99_latency_seconds": pytest.approx(0.030)}
    # The latency guard's target is the deployment's SLO as /metrics exports it.
    latency_target = next(m["object"]["target"] for m in obj["spec"]["metrics"]
                          if m["type"] == "Object")
    slo = by_deployment(text, "switchyard_deployment_slo_p99_seconds")["fraud-scorer"]
    assert float(parse_quantity(latency_target["value"])) == slo
