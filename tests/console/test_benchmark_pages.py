"""The benchmark pages: the list, a job's page and its live part, cancel and register-config
through their forms, two jobs compared, the start form on the deployment page and the figures
on the version page; each by persona (deployer and viewer of the job's tenant, another
tenant's admin, anonymous).

Jobs are rows in the state a test needs, their results in the shape the runner writes; the
start form goes through ``requests.create_job`` (nothing is run: the reconciler's task is
kept).
The run itself, on the real Triton, is tests/console/test_browser_benchmarks.py.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from rollouts.models import BenchmarkJob, ModelLoad, ModelVersion
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
    QuotaFactory,
)
from tests.fixtures import sent_tasks

State = BenchmarkJob.State
ANONYMOUS = "anonymous"
PERSONAS = ("dave", "bob", "charlie", ANONYMOUS)  # deployer A, viewer A, admin B, nobody


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def enqueued(monkeypatch) -> list[int]:
    """What ``create_job`` and ``cancel`` would send to the broker."""
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_benchmark", sent.append)
    return sent


def client_of(request, persona: str) -> Client:
    client = Client()
    if persona != ANONYMOUS:
        client.force_login(request.getfixturevalue(persona))
    return client


@pytest.fixture
def setup(tenant_a, dave, bob, charlie):
    """fraud-scorer of tenant A on one Triton server, v1 and v2 registered, a cpu quota."""
    cluster = ClusterFactory(name="local")
    server = InferenceServerFactory(cluster=cluster, name="triton")
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    deployment = DeploymentFactory(model=model, cluster=cluster, name="fraud", slo_p99_ms=40)
    deployment.servers.set([server])
    versions = {n: ModelVersionFactory(model=model, version=n) for n in (1, 2)}
    QuotaFactory(tenant=tenant_a, device_class="cpu")
    return {"deployment": deployment, "server": server, "model": model, "versions": versions}


def level(value: float, rps: float, p99: float, *, errors: dict[str, int] | None = None,
          refinement: bool = False, slo_p99: float = 40.0) -> dict[str, Any]:
    """One level as the runner records it (client figures, the server's view, the verdict)."""
    verdict = [f"p99 {p99:.1f} ms > {slo_p99:g} ms"] if p99 > slo_p99 else []
    requests = int(rps * 2)
    failed = sum((errors or {}).values())
    return {
        "mode": "concurrency", "value": value, "requests": requests, "ok": requests - failed,
        "errors": errors or {}, "error_rate": failed / requests if requests else 0.0,
        "first_error": "HTTP 503: busy" if errors else "", "window_s": 2.0,
        "throughput_rps": rps, "offered_rps": None,
        "latency_ms": {"p50": p99 / 3, "p90": p99 / 2, "p95": p99 / 1.5, "p99": p99,
                       "mean": p99 / 2.5, "max": p99 * 1.2},
        "cancelled": False, "goodput_rps": rps * 0.98,
        "server": {"available": True, "requests": requests, "failures": 0,
                   "request_ms": p99 / 2.5 - 0.4, "queue_ms": 0.1, "compute_ms": p99 / 2.5 - 0.6},
        "refinement": refinement, "verdict": verdict,
    }


def sweep_summary(levels: list[dict[str, Any]]) -> dict[str, Any]:
    passing = [x for x in levels if not x["verdict"]]
    failing = [x for x in levels if x["verdict"]]
    best = max(passing, key=lambda x: x["value"]) if passing else None
    first = min(failing, key=lambda x: x["value"]) if failing else None
    return {
        "mode": "concurrency", "max_load": best["value"] if best else None,
        "max_load_rps": best["throughput_rps"] if best else None,
        "max_load_p99_ms": best["latency_ms"]["p99"] if best else None,
        "first_failing": first["value"] if first else None,
        "first_failing_why": first["verdict"] if first else [],
        "peak_rps": max(x["throughput_rps"] for x in levels), "goodput_rps": 700.0,
        "stopped_early": "saturated: 800 req/s at concurrency 16, no more than 790 req/s before"
        if first else "", "levels_run": len(levels), "client_overhead_ms": 0.21,
    }


FAST = [level(1, 200, 8), level(2, 390, 9), level(4, 700, 14), level(8, 790, 52),
        level(6, 760, 33, refinement=True)]
TWO = [level(1, 210, 7), level(2, 420, 8), level(4, 810, 12), level(8, 990, 30),
       level(16, 1000, 70, errors={"http_503": 3})]


def make_job(setup, state: str = State.SUCCEEDED, *, version: int = 1,
             results: list[tuple[dict | None, list[dict]]] | None = None, **fields: Any
             ) -> BenchmarkJob:
    """A job row; ``results`` lists (config override, levels) measured so far."""
    results = [(None, FAST)] if results is None else results
    configs = [c for c, _ in results if c is not None] if any(c for c, _ in results) else []
    entries = []
    for config, levels in results:
        label = "default" if not config else \
            f"{config['instance_group'][0]['count']} instance" + \
            ("s" if config["instance_group"][0]["count"] != 1 else "")
        entries.append({"config": config, "label": label, "levels": levels,
                        "summary": sweep_summary(levels), "error": "", "load_id": None})
    summary: dict[str, Any] = {}
    if state == State.SUCCEEDED and entries:
        best = max(range(len(entries)), key=lambda i: entries[i]["summary"]["max_load_rps"] or 0)
        summary = {"best_config": best, "best_label": entries[best]["label"],
                   "best": entries[best]["summary"],
                   "configs": [{"label": e["label"], "max_load": e["summary"]["max_load"],
                                "max_load_rps": e["summary"]["max_load_rps"], "error": ""}
                               for e in entries]}
    final = state in BenchmarkJob.FINAL
    defaults = {
        "tenant": setup["deployment"].tenant, "deployment": setup["deployment"],
        "version": setup["versions"][version], "server": setup["server"],
        "protocol": BenchmarkJob.Protocol.TRITON_HTTP, "levels": [1, 2, 4, 8, 16],
        "duration_s": 2, "warmup_s": 0.5, "slo": {"p99_ms": 40.0, "error_rate": 0.01},
        "configs": configs, "state": state, "results": entries, "summary": summary,
        "progress": 1.0 if final else 0.4, "phase": "done" if final else
        "sweeping default: level 4: concurrency 8", "requested_by_label": "dave",
        "started_at": timezone.now(), "finished_at": timezone.now() if final else None,
    }
    return BenchmarkJob.objects.create(**{**defaults, **fields})


def url(name: str, job: BenchmarkJob, *args: str) -> str:
    return reverse(f"rollouts:{name}", args=[job.pk, *args])


def expect_for(persona: str, ok: int, *, role_needed: bool = False) -> int | str:
    if persona == ANONYMOUS:
        return "login"
    if persona == "charlie":
        return 404
    if persona == "bob" and role_needed:
        return 403
    return ok


def check(response, expected: int | str, path: str, htmx: bool = False) -> str:
    body = response.content.decode()
    if expected == "login":
        login = f"{reverse('login')}?next={quote(path)}"
        if htmx:
            assert response.status_code == 401 and response["HX-Redirect"] == login
        else:
            assert response.status_code == 302 and response["Location"] == login
    else:
        assert response.status_code == expected, body[:2000]
    if expected == 404:
        assert "fraud-scorer" not in body
    if expected == 403:
        assert "this needs the deployer role in the tenant" in body
    return body


# --------------------------------------------------------------------------------------------
# Every page and partial, by persona
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_list_shows_only_the_callers_tenants_benchmarks(request, setup, persona):
    job = make_job(setup)
    path = reverse("rollouts:benchmarks")
    for htmx in (False, True):
        headers = {"HX-Request": "true"} if htmx else {}
        response = client_of(request, persona).get(path, headers=headers)
        if persona == ANONYMOUS:
            check(response, "login", path, htmx)
            continue
        body = check(response, 200, path)
        assert (f'data-benchmark="{job.pk}"' in body) == (persona in ("dave", "bob"))
        if htmx:
            assert body.lstrip().startswith('<div id="results">')
        if persona != "charlie" and not htmx:
            assert "concurrency 6" in body and "760 req/s" in body


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_job_page_by_persona(request, setup, persona):
    job = make_job(setup)
    path = url("benchmark", job)
    body = check(client_of(request, persona).get(path), expect_for(persona, 200), path)
    if persona in ("dave", "bob"):
        assert 'id="benchmark-state"' in body and "Succeeded" in body
        assert 'id="benchmark-curve-data"' in body


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_live_part_by_persona(request, setup, persona):
    job = make_job(setup, State.RUNNING)
    path = url("benchmark-status", job)
    response = client_of(request, persona).get(path, headers={"HX-Request": "true"})
    body = check(response, expect_for(persona, 200), path, htmx=True)
    if persona in ("dave", "bob"):
        assert 'hx-trigger="every 1s"' in body


@pytest.mark.parametrize("persona", PERSONAS)
def test_cancel_by_persona(request, setup, persona, enqueued,
                           django_capture_on_commit_callbacks):
    job = make_job(setup, State.RUNNING)
    path = url("benchmark-action", job, "cancel")
    with django_capture_on_commit_callbacks(execute=True):
        response = client_of(request, persona).post(path)
    check(response, expect_for(persona, 302, role_needed=True), path)
    job.refresh_from_db()
    assert bool(job.cancel_requested_by) == (persona == "dave")
    if persona == "dave":
        assert response["Location"] == url("benchmark", job)
        assert enqueued == [job.pk]


@pytest.mark.parametrize("persona", PERSONAS)
def test_register_config_by_persona(request, setup, persona):
    one = {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    two = {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    job = make_job(setup, results=[(one, FAST), (two, TWO)])
    path = url("benchmark-action", job, "register-config")
    response = client_of(request, persona).post(path, {"expected": "3"})
    check(response, expect_for(persona, 302, role_needed=True), path)
    made = ModelVersion.objects.filter(model=setup["model"], version=3).first()
    assert (made is not None) == (persona == "dave")
    if made is not None:
        assert response["Location"] == reverse("rollouts:version", args=[made.pk])
        assert made.triton_config["instance_group"][0]["count"] == 2
        assert made.labels["benchmark_job"] == str(job.pk)


@pytest.mark.parametrize("persona", PERSONAS)
def test_compare_by_persona(request, setup, persona):
    a = make_job(setup, version=1)
    b = make_job(setup, version=2, results=[(None, TWO)])
    path = reverse("rollouts:benchmark-compare")
    response = client_of(request, persona).get(path, {"a": a.pk, "b": b.pk})
    body = check(response, expect_for(persona, 200), f"{path}?a={a.pk}&b={b.pk}")
    if persona in ("dave", "bob"):
        # 990 req/s (concurrency 8) against 760 (concurrency 6): 30.3% more
        assert "B carries 30.3% more" in body
        assert 'id="compare-curve-data"' in body


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_start_form_by_persona(request, setup, persona):
    path = reverse("rollouts:deployment-benchmark-start", args=[setup["deployment"].pk])
    response = client_of(request, persona).post(path, {
        "version": "2", "server": "triton", "mode": "concurrency", "levels": "1, 2, 4",
        "duration_s": "3", "warmup_s": "1", "slo_p99_ms": "", "instance_counts": ""})
    check(response, expect_for(persona, 302, role_needed=True), path)
    made = BenchmarkJob.objects.filter(deployment=setup["deployment"]).first()
    assert (made is not None) == (persona == "dave")
    if made is not None:
        assert response["Location"] == url("benchmark", made)
        assert made.levels == [1, 2, 4] and made.duration_s == 3 and made.warmup_s == 1
        assert made.slo["p99_ms"] == 40.0 and made.configs == []


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_deployment_and_version_pages_by_persona(request, setup, persona):
    job = make_job(setup)
    client = client_of(request, persona)
    for path in (reverse("rollouts:deployment", args=[setup["deployment"].pk]),
                 reverse("rollouts:version", args=[setup["versions"][1].pk])):
        body = check(client.get(path), expect_for(persona, 200), path)
        if persona in ("dave", "bob"):
            assert url("benchmark", job) in body
    if persona in ("dave", "bob"):
        deployment_page = client.get(reverse("rollouts:deployment",
                                             args=[setup["deployment"].pk])).content.decode()
        assert ('id="benchmark-form"' in deployment_page) == (persona == "dave")


# --------------------------------------------------------------------------------------------
# What the pages show
# --------------------------------------------------------------------------------------------


def test_the_job_page_shows_levels_summary_server_view_and_compare_link(setup, dave):
    earlier = make_job(setup, version=1)
    job = make_job(setup, version=2, results=[(None, TWO)])
    client = Client()
    client.force_login(dave)
    body = client.get(url("benchmark", job)).content.decode()
    # summary: max load within SLO, its req/s, why the first failing level failed
    assert "concurrency 8" in body and "990 req/s" in body
    assert "concurrency 8: p99" not in body  # 8 passes at 30 ms
    assert "concurrency 16: p99 70.0 ms &gt; 40 ms" in body
    assert "saturated: 800 req/s" in body
    # every level, with errors by kind and the server's own view
    for value in (1, 2, 4, 8, 16):
        assert f'data-level="{value}"' in body
        # each level named as its phase and the CLI's `benchmark wait` name it
        assert re.search(rf'data-level="{value}"[^>]*>\s*<td>concurrency {value}\b', body)
    assert "http_503 3" in body and "HTTP 503: busy" in body
    assert "4.40 / 0.10 / 4.20" in body  # Triton request / queue / compute at level 4
    # not a config sweep: no register button; final: no cancel, no polling
    assert 'id="action-register"' not in body and 'id="action-cancel"' not in body
    assert 'hx-trigger="every 1s"' not in body
    # the previous benchmark of the same model
    compare = reverse("rollouts:benchmark-compare")
    assert f'{compare}?a={earlier.pk}&amp;b={job.pk}' in body


def test_a_job_beside_production_traffic_is_flagged(setup, dave):
    quiet = make_job(setup)
    busy = make_job(setup, shares_production=True)
    client = Client()
    client.force_login(dave)
    assert 'id="shares-production"' not in client.get(url("benchmark", quiet)).content.decode()
    body = client.get(url("benchmark", busy)).content.decode()
    assert 'id="shares-production"' in body and "Runs beside production traffic" in body


def test_the_live_part_polls_while_active_and_answers_286_once_final(setup, dave):
    job = make_job(setup, State.RUNNING)
    client = Client()
    client.force_login(dave)
    headers = {"HX-Request": "true"}
    live = client.get(url("benchmark-status", job), {"seen": "active"}, headers=headers)
    assert live.status_code == 200
    body = live.content.decode()
    assert 'hx-trigger="every 1s"' in body and 'aria-valuenow="40.0"' in body
    assert "sweeping default: level 4: concurrency 8" in body
    assert "HX-Refresh" not in live
    page = client.get(url("benchmark", job)).content.decode()
    assert 'id="action-cancel"' in page

    BenchmarkJob.objects.filter(pk=job.pk).update(state=State.SUCCEEDED, progress=1.0)
    done = client.get(url("benchmark-status", job), {"seen": "active"}, headers=headers)
    assert done.status_code == 286
    assert 'hx-trigger' not in done.content.decode()
    # the page was drawn while it ran: reloaded, so the buttons follow
    assert done["HX-Refresh"] == "true"
    again = client.get(url("benchmark-status", job), {"seen": "final"}, headers=headers)
    assert again.status_code == 286 and "HX-Refresh" not in again


def test_a_config_sweep_marks_the_best_and_offers_the_next_version(setup, dave, bob):
    one = {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    two = {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    job = make_job(setup, results=[(one, FAST), (two, TWO)])
    client = Client()
    client.force_login(dave)
    body = client.get(url("benchmark", job)).content.decode()
    assert 'data-config="1" class="best" data-best="true"' in body
    assert "Register this config as version 3" in body
    viewer = Client()
    viewer.force_login(bob)
    assert "Register this config" not in viewer.get(url("benchmark", job)).content.decode()


def test_register_config_twice_is_refused_in_place(setup, dave):
    one = {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    two = {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    job = make_job(setup, results=[(one, FAST), (two, TWO)])
    client = Client()
    client.force_login(dave)
    first = client.post(url("benchmark-action", job, "register-config"), {"expected": "3"})
    assert first.status_code == 302
    second = client.post(url("benchmark-action", job, "register-config"), {"expected": "3"})
    assert second.status_code == 409
    assert "is registered already, as v3" in second.content.decode()
    assert ModelVersion.objects.filter(model=setup["model"]).count() == 3
    page = client.get(url("benchmark", job)).content.decode()
    assert 'id="registered-versions"' in page


def test_register_config_of_a_plain_sweep_is_a_409_on_the_page(setup, dave):
    job = make_job(setup)
    client = Client()
    client.force_login(dave)
    response = client.post(url("benchmark-action", job, "register-config"))
    assert response.status_code == 409
    assert "only a finished config sweep has a config to register" in response.content.decode()


def test_cancelling_an_ended_job_is_named_in_place(setup, dave):
    job = make_job(setup, State.SUCCEEDED)
    client = Client()
    client.force_login(dave)
    response = client.post(url("benchmark-action", job, "cancel"))
    assert response.status_code == 409
    assert f"benchmark {job.pk} is succeeded already" in response.content.decode()


def test_an_unknown_action_is_a_404(setup, dave):
    job = make_job(setup, State.RUNNING)
    client = Client()
    client.force_login(dave)
    assert client.post(url("benchmark-action", job, "explode")).status_code == 404


def test_compare_with_no_ids_offers_the_finished_benchmarks_to_pick(setup, dave):
    mine = make_job(setup, version=1)
    client = Client()
    client.force_login(dave)
    response = client.get(reverse("rollouts:benchmark-compare"))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'id="compare-choose"' in body and f'<option value="{mine.pk}"' in body


@pytest.mark.parametrize("query", [{"a": "1"}, {"a": "x", "b": "2"}, {"b": "x"}])
def test_compare_without_two_ids_is_a_400_naming_the_parameter(setup, dave, query):
    client = Client()
    client.force_login(dave)
    response = client.get(reverse("rollouts:benchmark-compare"), query)
    assert response.status_code == 400
    body = response.content.decode()
    missing = [n for n in ("a", "b") if not str(query.get(n, "")).isdigit()]
    for name in missing:
        assert f'id="{name}-error"' in body


def test_the_version_page_shows_its_latest_figures(setup, bob):
    one = {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    two = {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    make_job(setup, results=[(None, FAST)])
    newest = make_job(setup, results=[(one, FAST), (two, TWO)])
    client = Client()
    client.force_login(bob)
    body = client.get(reverse("rollouts:version", args=[setup["versions"][1].pk])).content.decode()
    assert 'id="version-benchmark"' in body
    assert "concurrency 8" in body and "990 req/s" in body and "30.0 ms" in body
    assert "2 instances" in body and url("benchmark", newest) in body
    other = client.get(reverse("rollouts:version", args=[setup["versions"][2].pk])).content.decode()
    assert 'id="version-no-benchmark"' in other


def test_the_nav_highlights_benchmarks(setup, bob):
    job = make_job(setup)
    client = Client()
    client.force_login(bob)
    for path in (reverse("rollouts:benchmarks"), url("benchmark", job)):
        body = client.get(path).content.decode()
        assert (f'<a href="{reverse("rollouts:benchmarks")}" class="active" aria-current="page">'
                'Benchmarks</a>') in body
        assert body.count('class="active"') == 1


# --------------------------------------------------------------------------------------------
# The start form's refusals, on their fields
# --------------------------------------------------------------------------------------------


GOOD = {"version": "1", "server": "triton", "mode": "concurrency", "levels": "1, 2, 4",
        "duration_s": "3", "warmup_s": "1", "slo_p99_ms": "", "instance_counts": ""}


@pytest.mark.parametrize(("fields", "field", "message"), [
    ({"levels": "1, two, 4"}, "levels", "&#x27;two&#x27; is not a number"),
    ({"levels": "1, 2.5"}, "levels", "2.5 is not a whole number"),
    ({"levels": ""}, "levels", "give at least one level"),
    ({"levels": "1, 1000"}, "levels", "from 1 to 512, got 1000"),
    ({"duration_s": "0"}, "duration_s", "from 0 to 600, got 0"),
    ({"duration_s": "abc"}, "duration_s", "a number of seconds"),
    ({"warmup_s": "-1"}, "warmup_s", "from 0 to 120"),
    ({"slo_p99_ms": "-5"}, "slo_p99_ms", "slo.p99_ms: from 0 to"),
    ({"instance_counts": "1, x"}, "instance_counts", "&#x27;x&#x27; is not a number"),
    ({"instance_counts": "1, 40"}, "instance_counts", "configs[1].instance_group: from 1 to 16"),
    ({"version": "9"}, "version", "not a version of this deployment&#x27;s model"),
    ({"server": "elsewhere"}, "server", "not one of this deployment&#x27;s servers"),
    ({"mode": "burst"}, "mode", "Select a valid choice"),
])
def test_a_refused_start_names_the_field_in_place(setup, dave, fields, field, message):
    client = Client()
    client.force_login(dave)
    response = client.post(
        reverse("rollouts:deployment-benchmark-start", args=[setup["deployment"].pk]),
        {**GOOD, **fields})
    assert response.status_code == 400
    body = response.content.decode()
    assert f'id="bench-{field}-error"' in body, body[body.find('id="benchmarks"'):][:3000]
    error = body[body.find(f'id="bench-{field}-error"'):][:300]
    assert message in error, error
    assert '<details id="start-benchmark" open>' in body
    assert not BenchmarkJob.objects.exists()


def test_a_second_job_on_the_busy_server_is_refused_on_the_server_field(setup, dave):
    running = make_job(setup, State.RUNNING)
    client = Client()
    client.force_login(dave)
    response = client.post(
        reverse("rollouts:deployment-benchmark-start", args=[setup["deployment"].pk]), GOOD)
    assert response.status_code == 409
    body = response.content.decode()
    assert f"benchmark {running.pk} is running on triton" in body
    assert 'id="bench-server-error"' in body


def test_a_config_sweep_where_the_model_is_loaded_is_refused_on_the_counts(setup, dave):
    ModelLoad.objects.create(tenant=setup["deployment"].tenant, deployment=setup["deployment"],
                             server=setup["server"], version=setup["versions"][1],
                             state=ModelLoad.State.READY, requested_by_label="dave")
    client = Client()
    client.force_login(dave)
    response = client.post(
        reverse("rollouts:deployment-benchmark-start", args=[setup["deployment"].pk]),
        {**GOOD, "instance_counts": "1, 2"})
    assert response.status_code == 409
    error = response.content.decode()
    error = error[error.find('id="bench-instance_counts-error"'):][:400]
    assert "unload it there first" in error


def test_instance_counts_become_config_overrides(setup, dave):
    client = Client()
    client.force_login(dave)
    response = client.post(
        reverse("rollouts:deployment-benchmark-start", args=[setup["deployment"].pk]),
        {**GOOD, "instance_counts": "1,2", "slo_p99_ms": "25", "mode": "rate",
         "levels": "50, 100.5"})
    job = BenchmarkJob.objects.get()
    assert response.status_code == 302
    assert [c["instance_group"][0]["count"] for c in job.configs] == [1, 2]
    assert job.slo["p99_ms"] == 25 and job.mode == "rate" and job.levels == [50, 100.5]
