"""Switchyard's own figures on ``/metrics``: requests by view, Celery tasks and reconcile
ticks (counted by a real worker), queue depth, failed scrapes, loads by state and quota
use; what happens when Redis is away; and the Grafana dashboard and Prometheus config in
deploy/ checked against what is really exported, by a real Prometheus scraping Switchyard.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from django.conf import settings as django_settings
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from console import telemetry
from fleet.models import Placement
from rollouts.models import ModelLoad
from rollouts.traffic import latency
from tests.factories import (
    DeploymentFactory,
    InferenceServerFactory,
    ModelVersionFactory,
    QuotaFactory,
    TenantFactory,
)
from tests.fixtures.celery_worker import CeleryWorker
from tests.fixtures.prometheus import prometheus_binary, start_prometheus

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "switchyard.json"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DEAD_REDIS = "redis://127.0.0.1:9/0"


TOKEN = "own-metrics-token-0123456789"


@pytest.fixture(autouse=True)
def scraper_token(settings):
    """/metrics always needs the token; the scraper here sends it."""
    settings.SWITCHYARD_METRICS_TOKEN = TOKEN
    settings.SWITCHYARD_METRICS_ALLOW_NETS = []
    telemetry.resume()


def scrape(**headers: str) -> dict[str, Any]:
    headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {TOKEN}")
    answer = Client().get("/metrics", REMOTE_ADDR="127.0.0.1", **headers)
    assert answer.status_code == 200, answer.content
    return {f.name: f for f in text_string_to_metric_families(answer.content.decode())}


def value(families: dict[str, Any], sample: str, **labels: str) -> float | None:
    """The value of sample ``sample`` (a family's name plus a suffix) with these labels."""
    for family in families.values():
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_requests_are_counted_and_timed_by_view_not_by_path(token_client, tenant_a):
    api = token_client(tenant_a)
    model_ids = [ModelVersionFactory(model__tenant=tenant_a).model_id for _ in range(2)]
    for pk in model_ids:
        assert api.get(f"/api/v1/models/{pk}/").status_code == 200
    assert api.get("/api/v1/models/999999/").status_code == 404
    assert Client().get("/api/v1/models/").status_code == 401

    found = scrape()

    view = "api:model-detail"
    assert value(found, "switchyard_http_requests_total", view=view, method="GET",
                 status="200") == 2
    assert value(found, "switchyard_http_requests_total", view=view, status="404") == 1
    assert value(found, "switchyard_http_requests_total", view="api:model-list",
                 status="401") == 1
    assert value(found, "switchyard_http_request_duration_seconds_count", view=view,
                 method="GET") == 3
    assert value(found, "switchyard_http_request_duration_seconds_bucket", view=view,
                 le="+Inf") == 3
    assert value(found, "switchyard_http_request_duration_seconds_sum", view=view) > 0
    # The ids in the paths never become labels.
    paths = {s.labels.get("view") for f in found.values() for s in f.samples}
    assert not any(str(pk) in (p or "") for p in paths for pk in model_ids)
    assert value(found, "switchyard_telemetry_up") == 1


@pytest.mark.django_db
def test_a_redis_that_is_away_fails_no_request_and_metrics_says_the_counts_are_missing(
        token_client, tenant_a, settings):
    api = token_client(tenant_a)
    settings.REDIS_URL = DEAD_REDIS
    started = time.monotonic()
    answers = [api.get("/api/v1/models/").status_code for _ in range(5)]
    elapsed = time.monotonic() - started

    assert answers == [200] * 5
    # One failed try (at most the 0.25 s timeout), then recording pauses: five requests
    # take nowhere near five timeouts.
    assert elapsed < 4 * telemetry.TIMEOUT_S + 1.0

    telemetry.resume()
    found = scrape()
    assert value(found, "switchyard_telemetry_up") == 0
    assert "switchyard_http_requests" not in found


# --------------------------------------------------------------------------------------------
# Celery tasks, ticks and queues (a real worker)
# --------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_counts_its_tasks_and_reconcile_ticks(celery_worker: CeleryWorker,
                                                          settings):
    from fleet.tasks import check_server, check_servers

    # The worker records under the prefix its own environment gives it.
    settings.SWITCHYARD_REDIS_PREFIX = celery_worker.env.get("SWITCHYARD_REDIS_PREFIX",
                                                             "switchyard")

    def counts() -> dict[str, float]:
        found = scrape()
        return {
            "ok": value(found, "switchyard_celery_tasks_total",
                        task="fleet.tasks.check_servers", state="success") or 0,
            "failed": value(found, "switchyard_celery_tasks_total",
                            task="fleet.tasks.check_server", state="failure") or 0,
            "tick": value(found, "switchyard_reconcile_tick_duration_seconds_count",
                          kind="health") or 0,
            "timed": value(found, "switchyard_celery_task_duration_seconds_count",
                           task="fleet.tasks.check_servers") or 0,
        }

    before = counts()
    celery_worker.send(check_servers)
    celery_worker.send(check_server, "not-a-number")  # the task fails
    after = celery_worker.wait_for(
        lambda: (c := counts())["ok"] > before["ok"] and c["failed"] > before["failed"] and c,
        what="the worker's tasks counted on /metrics")

    assert after["ok"] == before["ok"] + 1
    assert after["failed"] == before["failed"] + 1
    assert after["tick"] == before["tick"] + 1
    assert after["timed"] == before["timed"] + 1


@pytest.mark.django_db
def test_queue_depth_is_the_messages_no_worker_took_yet(monkeypatch):
    from console.celery import app
    from fleet.tasks import check_servers

    queue = f"switchyard-test-idle-{uuid.uuid4().hex[:8]}"
    monkeypatch.setitem(app.conf, "task_default_queue", queue)
    try:
        assert value(scrape(), "switchyard_celery_queue_length", queue=queue) == 0
        for _ in range(3):
            check_servers.apply_async(queue=queue)
        assert value(scrape(), "switchyard_celery_queue_length", queue=queue) == 3
    finally:
        import redis

        with redis.Redis.from_url(django_settings.REDIS_URL) as client:
            client.delete(queue, f"_kombu.binding.{queue}")


# --------------------------------------------------------------------------------------------
# Scrapes, loads and quotas
# --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_failed_scrape_is_counted_for_its_server():
    server = InferenceServerFactory(metrics_url="http://127.0.0.1:9/metrics")
    DeploymentFactory(cluster=server.cluster).servers.add(server)

    latency.tick()
    latency.tick()

    assert value(scrape(), "switchyard_scrape_failures_total", server=server.name,
                 cluster=server.cluster.name) == 2


@pytest.mark.django_db
def test_loads_by_state_and_quota_use_per_tenant_and_class():
    tenant, other = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    QuotaFactory(tenant=tenant, device_class="nvidia-a100-80gb", units=4, memory_mib=81920 * 4)
    QuotaFactory(tenant=other, device_class="cpu", units=8, memory_mib=16384)
    deployment = DeploymentFactory(model__tenant=tenant, tenant=tenant)
    server = InferenceServerFactory(cluster=deployment.cluster)
    for state in ("ready", "ready", "failed"):
        version = ModelVersionFactory(model=deployment.model)
        ModelLoad.objects.create(tenant=tenant, deployment=deployment, server=server,
                                 version=version, state=state, requested_by_label="ci")
        if state == "ready":
            Placement.objects.create(tenant=tenant, server=server, model_version=version,
                                     device_class="nvidia-a100-80gb", units=1,
                                     memory_mib=81920, state="active")

    found = scrape()

    assert value(found, "switchyard_model_loads", tenant="acme", state="ready") == 2
    assert value(found, "switchyard_model_loads", tenant="acme", state="failed") == 1
    gpu = {"tenant": "acme", "device_class": "nvidia-a100-80gb"}
    assert value(found, "switchyard_quota_units", **gpu) == 4
    assert value(found, "switchyard_quota_units_used", **gpu) == 2
    assert value(found, "switchyard_quota_memory_used_bytes", **gpu) == 2 * 81920 * 2**20
    assert value(found, "switchyard_quota_units_used", tenant="globex", device_class="cpu") == 0
    assert value(found, "switchyard_quota_units_borrowed", **gpu) == 0


# --------------------------------------------------------------------------------------------
# deploy/: the Grafana dashboard and Prometheus, against the real thing
# --------------------------------------------------------------------------------------------


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    return found


def test_the_dashboard_shows_every_kind_of_figure_the_issue_names():
    names = " ".join(expr for _, expr in dashboard_queries())
    for metric in ("switchyard_http_requests_total", "switchyard_http_request_duration_seconds",
                   "switchyard_celery_tasks_total", "switchyard_celery_task_duration_seconds",
                   "switchyard_celery_queue_length", "switchyard_reconcile_tick_duration_seconds",
                   "switchyard_model_loads", "switchyard_rollouts",
                   "switchyard_quota_units_used", "switchyard_quota_units_borrowed",
                   "switchyard_scrape_failures_total"):
        assert metric in names, f"no panel shows {metric}"


def test_the_prometheus_config_scrapes_switchyard_with_its_token(tmp_path):
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "switchyard")
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["credentials_file"] == "metrics-token"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install -y prometheus)")
    # As the compose service lays it out: the token written next to a copy of the config
    # and of the rules it loads.
    shutil.copy(PROMETHEUS_CONFIG, tmp_path / "prometheus.yml")
    shutil.copy(PROMETHEUS_CONFIG.with_name("slo-rules.yml"), tmp_path / "slo-rules.yml")
    (tmp_path / "metrics-token").write_text("a-token")
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def declared(text: str) -> set[str]:
    """Every sample name /metrics declares (a family's name and its suffixed samples' names),
    whether or not it has a sample yet."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
        names.update(family.name + s for s in suffixes.get(family.type, ()))
    return names


@pytest.mark.django_db(transaction=True)
def test_prometheus_scrapes_switchyard_and_every_dashboard_query_reads_it(live_server):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (apt-get install -y prometheus)")
    assert httpx.get(f"{live_server.url}/login/", timeout=10).status_code == 200
    prometheus = start_prometheus({"switchyard": f"{live_server.url}/metrics"},
                                  bearer={"switchyard": TOKEN})
    try:
        prometheus.wait_for_target("switchyard", timeout=30)

        def stored() -> set[str]:
            answer = httpx.get(f"{prometheus.url}/api/v1/label/__name__/values", timeout=5)
            return set(answer.json()["data"])

        deadline = time.monotonic() + 20
        while "switchyard_http_requests_total" not in stored() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert {"switchyard_http_requests_total",
                "switchyard_http_request_duration_seconds_bucket"} <= stored()

        exposition = declared(httpx.get(f"{live_server.url}/metrics", timeout=10,
                                        headers={"Authorization": f"Bearer {TOKEN}"}).text)
        for title, expr in dashboard_queries():
            for name in set(re.findall(r"\bswitchyard_[a-z0-9_]+", expr)):
                assert name in exposition, f"panel {title!r} reads {name}, which is not exported"
            # Grafana's variables as Grafana fills them in; Prometheus must accept the query.
            query = expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
            answer = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": query},
                               timeout=10).json()
            assert answer["status"] == "success", (title, expr, answer)
        # The request panel shows data from this scrape, not only a query that parses.
        rate = httpx.get(f"{prometheus.url}/api/v1/query", timeout=10, params={
            "query": 'sum(switchyard_http_requests_total{view="login"})'}).json()
        assert float(rate["data"]["result"][0]["value"][1]) >= 1
    finally:
        prometheus.stop()


def test_the_compose_stack_runs_prometheus_and_grafana_on_these_files():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert "./deploy/prometheus:/etc/switchyard-prometheus:ro" in prometheus["volumes"]
    assert "SWITCHYARD_METRICS_TOKEN" in prometheus["environment"]
    assert "/etc/switchyard-prometheus/prometheus.yml" in prometheus["command"][0]
    # web answers /metrics with the same token the prometheus service sends.
    web_env = compose["x-django-environment"]
    assert web_env["SWITCHYARD_METRICS_TOKEN"] == prometheus["environment"][
        "SWITCHYARD_METRICS_TOKEN"]
    mounts = {m.split(":")[0]: m.split(":")[1] for m in grafana["volumes"]}
    assert mounts["./deploy/grafana/dashboards"] == "/var/lib/grafana/dashboards"
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    source = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = source["datasources"][0]["uid"]
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    board = json.loads(DASHBOARD.read_text())
    assert {t["datasource"]["uid"] for p in board["panels"] for t in p.get("targets", [])} == {uid}
