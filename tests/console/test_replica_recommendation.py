"""The deployment page's Replicas panel: it loads itself, refreshes every 10 s, shows the
recommendation and its reason to the tenant's members, and nothing to anyone else."""

from __future__ import annotations

import time

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.rollouts.workloads.test_autoscaling import (
    benchmark,
    make_deployment,
    record,
    route_lines,
    workload,
)

pytestmark = pytest.mark.django_db
HTMX = {"HX-Request": "true"}


def browser(user=None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def panel_url(dep) -> str:
    return reverse("rollouts:deployment-replicas", args=[dep.pk])


def test_the_deployment_page_loads_the_panel_and_it_refreshes_itself(tenant_a, bob):
    dep = make_deployment(tenant_a, slo_p99_ms=250)
    job = benchmark(dep, max_load_rps=1.0)
    workload(dep, "triton-fraud-v1", 3)
    now = time.time()
    record(route_lines(dep, "v1-a", [20.0] * 150, end=now - 1), now)
    client = browser(bob)

    page = client.get(reverse("rollouts:deployment", args=[dep.pk])).content.decode()
    panel = client.get(panel_url(dep), headers=HTMX)
    body = panel.content.decode()

    assert f'hx-get="{panel_url(dep)}" hx-trigger="load, every 10s"' in page
    assert 'id="replicas" data-state="loading"' in page
    assert panel.status_code == 200
    assert f'hx-get="{panel_url(dep)}" hx-trigger="every 10s" hx-swap="outerHTML"' in body
    assert 'data-state="ok"' in body
    assert '<span class="badge pending" id="replicas-recommended">4 recommended</span>' in body
    assert '<div class="value" id="replicas-current">3</div>' in body
    assert "Deployment serving/triton-fraud-v1" in body
    assert '<div class="value" id="replicas-rate">2.5 req/s</div>' in body
    assert "p99 20.0 ms (SLO 250 ms)" in body
    assert '<div class="value" id="replicas-capacity">1.0 req/s</div>' in body
    assert f'href="{reverse("rollouts:benchmark", args=[job.pk])}">benchmark #{job.pk}</a>' in body
    assert "= 3.57 → 4 replicas" in body
    assert "at 70% of each replica's capacity · now 83%" in body


def test_without_a_benchmark_the_panel_says_to_run_one(tenant_a, bob):
    dep = make_deployment(tenant_a)

    body = browser(bob).get(panel_url(dep), headers=HTMX).content.decode()

    assert 'data-state="no_benchmark"' in body
    assert "No benchmark of v1 yet" in body
    assert '<a href="#benchmarks">Start a benchmark</a>' in body
    assert 'id="replicas-recommended"' not in body
    assert "No traffic measured in the last 60 s" in body


def test_an_archived_deployment_stops_polling(tenant_a, bob):
    dep = make_deployment(tenant_a)
    dep.archived_at = timezone.now()
    dep.save(update_fields=["archived_at"])

    answer = browser(bob).get(panel_url(dep), headers=HTMX)

    assert answer.status_code == 286
    assert "hx-get" not in answer.content.decode()
    assert 'id="replicas-archived"' in answer.content.decode()


def test_other_tenants_and_strangers_get_nothing(tenant_a, charlie):
    dep = make_deployment(tenant_a)
    benchmark(dep)

    other = browser(charlie).get(panel_url(dep), headers=HTMX)
    anonymous = browser().get(panel_url(dep), headers=HTMX)
    anonymous_page = browser().get(panel_url(dep))

    assert other.status_code == 404
    assert tenant_a.slug not in other.content.decode()
    assert anonymous.status_code == 401 and "HX-Redirect" in anonymous
    assert anonymous_page.status_code == 302
    assert anonymous_page["Location"].startswith(reverse("login"))
