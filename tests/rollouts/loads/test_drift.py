"""Truth drift on a real Triton: what the database says a server serves, held against what
the server says, and the faults that make them part.

GIVEN the load-test world (tests/rollouts/triton_world.py) on a Triton of this module's own
(so it may be killed and restarted without touching the session's one),
WHEN the server loses what Switchyard loaded onto it (restarted with an empty repository,
changed by hand), or a worker dies in the middle of a load, or a step hits a bug,
THEN the rows follow the truth: a lost load says so and frees its quota, a taken-over load
asks the server first, a bug fails at once with its traceback, a changed config is recorded;
and the console shows drift to the tenant it concerns only.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import gevent
import httpx
import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone

from fleet.adapters.triton_model_config import config_hash
from fleet.inventory import health
from fleet.models import AuditEvent, InferenceServer, Placement
from local.triton import TritonProcess, TritonRuntime, start_triton
from rollouts import tasks
from rollouts.loads import drift, reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad
from tests.factories import (
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
    UserFactory,
)
from tests.rollouts.triton_world import held, index_state, load_once

State = ModelLoad.State


# --------------------------------------------------------------------------------------------
# A Triton of this module's own, which a test may kill and start again
# --------------------------------------------------------------------------------------------


class RestartableTriton:
    """A tritonserver on fixed ports and one repository folder, that can crash and come back.

    Quacks like :class:`TritonProcess` for ``make_world`` (``http_url``, ``model_repository``,
    ``log_path``); the server record made from it stays right across restarts.
    """

    def __init__(self, runtime: TritonRuntime, base: Path) -> None:
        self.runtime = runtime
        self.model_repository = base / "models"
        self.model_repository.mkdir(parents=True)
        self.log_path = base / "tritonserver.log"
        self.proc: TritonProcess = start_triton(runtime, self.model_repository, log_path=self.log_path)
        self.http_url = self.proc.http_url
        self.ports = (
            urlsplit(self.proc.http_url).port,
            int(self.proc.grpc_url.rsplit(":", 1)[1]),
            urlsplit(self.proc.metrics_url).port,
        )

    def kill(self) -> None:
        """Crash: SIGKILL the server and its backend stubs, no unloading, no goodbye."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.stop()  # reaps it and removes the shared memory its stubs left

    def start_empty(self) -> None:
        """Start again on the same ports, with the repository emptied (a fresh container)."""
        for entry in self.model_repository.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        last: Exception | None = None
        for _ in range(10):  # the old sockets may take a moment to let go of the ports
            try:
                http, grpc, metrics = self.ports
                self.proc = start_triton(
                    self.runtime, self.model_repository, http_port=http, grpc_port=grpc,
                    metrics_port=metrics, log_path=self.log_path,
                )
                return
            except RuntimeError as exc:
                last = exc
                time.sleep(0.5)
        raise AssertionError(f"Triton did not start again on its ports: {last}")

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture(scope="module")
def local_triton(triton_runtime, tmp_path_factory) -> Iterator[RestartableTriton]:
    """This module's Triton (``make_world`` puts the world's server on it), empty at start."""
    server = RestartableTriton(triton_runtime, tmp_path_factory.mktemp("drift-triton"))
    try:
        yield server
    finally:
        server.stop()


def probe(world) -> InferenceServer:
    server = health.check_server(world.server.pk)
    assert server is not None
    return server


def triton_log_count(world, text: str) -> int:
    return Path(world.triton.log_path).read_text(errors="replace").count(text)


# --------------------------------------------------------------------------------------------
# Defect 13: a Triton restarted with an empty repository
# --------------------------------------------------------------------------------------------


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_a_triton_restarted_empty_loses_its_loads_and_a_new_request_loads_again(world):
    """GIVEN v1 loaded through Switchyard and the probe seeing it READY,
    WHEN Triton is killed (the probe cannot reach it) and then comes back with an empty
    repository on the same ports,
    THEN nothing is judged while the server is unreachable; once the probe reads the empty
    index, the reconcile tick marks the load lost with its reason, releases its placement
    and quota, audits it, and a new request loads v1 again for real."""
    v1 = world.version(1)
    load = load_once(world, v1)
    assert load.state == State.READY, load.error
    assert probe(world).health == InferenceServer.Health.HEALTHY
    assert tasks.reconcile_loads() == 0 and ModelLoad.objects.get(pk=load.pk).state == State.READY
    # An index is held only against loads ready before the probe read it (give or take the
    # clocks' skew): wait until this one is, so that each probe below judges it.
    time.sleep(max(0.0, drift.CLOCK_SKEW_S + 0.2 - (timezone.now() - load.ready_at).total_seconds()))

    world.triton.kill()
    down = probe(world)
    assert down.health == InferenceServer.Health.UNREACHABLE and down.reported_models == []
    # An unreachable server's empty list means "unknown": nothing is lost, nothing freed.
    assert drift.reconcile_all()["lost"] == 0
    assert ModelLoad.objects.get(pk=load.pk).state == State.READY
    assert held(world) == (1, 64)

    world.triton.start_empty()
    assert index_state(world.triton, world.served) == {}
    back = probe(world)
    assert back.health == InferenceServer.Health.HEALTHY and drift.index_known(back)
    tasks.reconcile_loads()  # the beat tick that follows the probe

    lost = ModelLoad.objects.get(pk=load.pk)
    assert lost.state == State.LOST
    assert "triton no longer reports v1 (restarted?)" in lost.error
    assert lost.finished_at is not None
    assert Placement.objects.get(pk=load.placement_id).state == Placement.State.RELEASED
    assert held(world) == (0, 0)
    last = lost.events.last()
    assert last.state == State.LOST and "quota released" in last.message
    audit = AuditEvent.objects.get(verb="lost", object_id=str(load.pk))
    assert "no longer reports v1" in audit.reason and audit.tenant_id == world.tenant.pk
    # The next tick changes nothing: the load is lost once.
    tasks.reconcile_loads()
    assert AuditEvent.objects.filter(verb="lost", object_id=str(load.pk)).count() == 1

    rows, created = loads.request_load(world.user, world.deployment, v1)
    assert created and [r.pk for r in rows] != [load.pk]
    again = reconciler.run_to_end(rows[0].pk)
    assert again.state == State.READY, again.error
    assert index_state(world.triton, world.served) == {"1": "READY"}
    assert held(world) == (1, 64)
    # The index the probe reads now agrees: the new load stays ready.
    probe(world)
    assert drift.reconcile_all()["lost"] == 0
    assert ModelLoad.objects.get(pk=again.pk).state == State.READY


# --------------------------------------------------------------------------------------------
# Defect 14: a worker killed while a load is `loading`
# --------------------------------------------------------------------------------------------


def _worker_dies_once_the_load_is_sent(load_id: int) -> None:
    """Run the loading step the way a worker does, and die right after Triton got the load
    request (the server goes on and makes the version READY)."""
    from fleet.adapters.triton_runtime import TritonServerRuntime

    def die(self, *args, **kwargs):
        os._exit(17)  # no cleanup, no finally: a SIGKILLed worker

    # The Triton client runs on gevent, whose event loop a forked child shares with its
    # parent until it makes its own (what gevent's own fork does).
    gevent.reinit()
    TritonServerRuntime._wait_ready = die
    reconciler.advance(load_id)


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_a_load_whose_worker_died_is_taken_over_within_a_lease_and_a_tick(world, settings,
                                                                           enqueued_loads):
    """GIVEN a worker that sent Triton the load of v1 and died (the row says loading, its
    lease held by the dead worker, the version READY on the server),
    WHEN beat ticks every RECONCILE_INTERVAL_S,
    THEN the first tick after the lease runs out takes the load over, asks the server first
    and records it ready without loading it again."""
    settings.SWITCHYARD_RECONCILE_INTERVAL_S = tick = 0.5
    lease = settings.SWITCHYARD_LOAD_LEASE_S
    v1 = world.version(1)
    rows, _ = loads.request_load(world.user, world.deployment, v1)
    load_id = rows[0].pk
    while ModelLoad.objects.get(pk=load_id).state != State.LOADING:  # admit, fetch, place
        assert reconciler.advance(load_id) is not None

    connections.close_all()  # the child opens its own connection
    child = multiprocessing.get_context("fork").Process(
        target=_worker_dies_once_the_load_is_sent, args=(load_id,)
    )
    child.start()
    child.join(60)
    died = timezone.now()
    assert child.exitcode == 17

    stuck = ModelLoad.objects.get(pk=load_id)
    assert stuck.state == State.LOADING and stuck.lease_owner
    assert index_state(world.triton, world.served) == {"1": "READY"}
    loaded_once = triton_log_count(world, "successfully loaded")
    assert loaded_once >= 1
    # The dead worker's lease is a short one: it runs out a lease after its last renewal.
    assert stuck.lease_expires_at <= died + timedelta(seconds=lease)

    # Beat: a tick every `tick` seconds, each advancing (as a worker would) what it sent.
    ticks_before, longest_tick = 0, 0.0
    deadline = time.monotonic() + lease + 10 * tick
    while True:
        assert time.monotonic() < deadline, "the load was not taken over"
        started, began = timezone.now(), time.monotonic()
        enqueued_loads.clear()
        tasks.reconcile_loads()
        for due in enqueued_loads:
            reconciler.advance(due)
        state = ModelLoad.objects.get(pk=load_id).state
        if started < stuck.lease_expires_at:
            assert state == State.LOADING  # nobody steps in while the dead worker's lease holds
            ticks_before += 1
            longest_tick = max(longest_tick, time.monotonic() - began)
            time.sleep(tick)
            continue
        # The first tick that starts after the lease ran out settles it.
        assert state == State.READY
        break

    load = ModelLoad.objects.get(pk=load_id)
    assert ticks_before >= 1
    # That tick came within one interval (plus the longest idle tick measured before it) of
    # the lease's end, which was within a lease of the death.
    took_over = load.events.get(message__contains="took over")
    assert started <= took_over.created_at <= load.ready_at
    assert (started - stuck.lease_expires_at).total_seconds() <= tick + longest_tick
    assert load.events.filter(message__contains="reports v1 READY").exists()
    # Not loaded again: Triton's log has no second load, and the quota is held once.
    assert triton_log_count(world, "successfully loaded") == loaded_once
    assert len(load.config_hash) == 64
    assert Placement.objects.get(pk=load.placement_id).state == Placement.State.ACTIVE
    assert held(world) == (1, 64)


# --------------------------------------------------------------------------------------------
# Sweep: a bug inside a step fails at once
# --------------------------------------------------------------------------------------------


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_an_unexpected_error_in_a_step_fails_the_load_at_once_with_its_traceback(world, monkeypatch):
    """GIVEN an artifact store with a bug (a KeyError, not a server's answer),
    WHEN the fetch step runs,
    THEN the load fails at once (no retry, no backoff), quota released, with a readable
    error for users and the traceback kept for operators, shown to platform admins only."""
    from fleet.adapters import s3

    def fetch_with_a_bug(self, uri, *, sha256, size, progress=None):
        return {}["etag"]

    monkeypatch.setattr(s3.S3ArtifactStore, "fetch", fetch_with_a_bug)
    rows, _ = loads.request_load(world.user, world.deployment, world.version(1))
    assert reconciler.advance(rows[0].pk) == State.ADMITTED

    assert reconciler.advance(rows[0].pk) == State.FAILED

    load = ModelLoad.objects.get(pk=rows[0].pk)
    assert load.attempts == 0 and load.next_attempt_at is None
    assert "KeyError: 'etag'" in load.error and "retrying cannot help" in load.error
    assert "Traceback" not in load.error
    assert load.error_trace.startswith("Traceback (most recent call last)")
    assert "fetch_with_a_bug" in load.error_trace and "KeyError: 'etag'" in load.error_trace
    assert not load.events.filter(message__regex=r"retry \d+/\d+ in").exists()  # no backoff
    assert held(world) == (0, 0)
    assert reconciler.advance(load.pk) is None  # settled: a tick leaves it alone

    tenant_page = _get(world.user, f"/registry/loads/{load.pk}/")
    assert "retrying cannot help" in tenant_page and "fetch_with_a_bug" not in tenant_page
    admin = UserFactory(username="platform-admin", is_superuser=True, is_staff=True)
    admin_page = _get(admin, f"/registry/loads/{load.pk}/")
    assert "fetch_with_a_bug" in admin_page and 'id="load-trace"' in admin_page


# --------------------------------------------------------------------------------------------
# Sweep: a config changed on the server by hand
# --------------------------------------------------------------------------------------------


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_a_version_reloaded_by_hand_with_another_config_is_recorded_as_drifted(world):
    """GIVEN v1 ready with one instance,
    WHEN someone reloads it through Triton's repository API with two instances,
    THEN the config check records the config it runs with now, audits the drift and holds
    the quota two instances need; a second check changes nothing."""
    load = load_once(world, world.version(1))
    assert load.state == State.READY, load.error
    name, url = world.served, world.triton.http_url
    config = httpx.get(f"{url}/v2/models/{name}/versions/1/config", timeout=5).json()
    assert config["instance_group"][0]["count"] == 1
    config["instance_group"][0]["count"] = 2
    answer = httpx.post(f"{url}/v2/repository/models/{name}/load",
                        json={"parameters": {"config": json.dumps(config)}}, timeout=60)
    assert answer.status_code == 200, answer.text
    served = httpx.get(f"{url}/v2/models/{name}/versions/1/config", timeout=5).json()
    assert served["instance_group"][0]["count"] == 2

    server = probe(world)
    changed = drift.check_configs(server)

    assert [c.pk for c in changed] == [load.pk]
    load = ModelLoad.objects.get(pk=load.pk)
    assert load.state == State.READY and load.config_hash == config_hash(served)
    placement = Placement.objects.get(pk=load.placement_id)
    assert (placement.config_hash, placement.units, placement.memory_mib) == (
        load.config_hash, 2, 128)
    assert held(world) == (2, 128)
    audit = AuditEvent.objects.get(verb="drifted", object_id=str(load.pk))
    assert audit.after["units"] == 2 and audit.before["units"] == 1
    assert "changed outside Switchyard" in audit.reason
    assert "holds 2 model instances" in load.events.last().message

    assert drift.check_configs(server) == []
    assert AuditEvent.objects.filter(verb="drifted", object_id=str(load.pk)).count() == 1


# --------------------------------------------------------------------------------------------
# The console shows drift, to the tenant it concerns only
# --------------------------------------------------------------------------------------------


def _get(user, url: str, status: int = 200) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == status, url
    return response.content.decode()


@pytest.fixture
def drifted_server(tenant_a, tenant_b):
    """A shared server whose last probe read an empty index: tenant A's v1 was marked lost
    (by the reconciler), its v2 is recorded ready but not reported (not reconciled yet);
    tenant B has a deployment of its own on the server."""
    now = timezone.now()
    server = InferenceServerFactory(
        name="triton-a", health=InferenceServer.Health.HEALTHY, last_checked_at=now,
        probe_latency_ms=3.0, reported_models=[],
    )
    deployment = DeploymentFactory(model=ModelFactory(tenant=tenant_a, name="scorer"),
                                   cluster=server.cluster, name="scorer-prod")
    deployment.servers.set([server])
    other = DeploymentFactory(model=ModelFactory(tenant=tenant_b, name="ranker"),
                              cluster=server.cluster, name="ranker-prod")
    other.servers.set([server])

    def ready_load(version: int) -> ModelLoad:
        return ModelLoad.objects.create(
            tenant=tenant_a, deployment=deployment, server=server, state=State.READY,
            version=ModelVersionFactory(model=deployment.model, version=version),
            requested_by_label="alice", ready_at=now - timedelta(minutes=5),
        )

    lost = ready_load(1)
    assert [x.pk for x in drift.reconcile_server(server)] == [lost.pk]
    unreported = ready_load(2)
    return {"server": server, "deployment": deployment, "other": other,
            "lost": ModelLoad.objects.get(pk=lost.pk), "unreported": unreported}


@pytest.mark.django_db
def test_the_pages_show_drift_and_lost_loads_to_their_tenant_only(drifted_server, bob, charlie):
    """GIVEN tenant A's v1 lost from a shared server and its v2 recorded ready but not
    reported, THEN tenant A's viewer sees both badges on the server page (and its htmx
    partial), the deployment's servers panel and the load page, which says why v1 was lost;
    tenant B sees the shared server and its own deployment without them, and A's pages not at all."""
    d = drifted_server
    lost, unreported, server = d["lost"], d["unreported"], d["server"]
    lost_badge = f'data-lost="{lost.pk}"'
    drift_badge = f'data-drift="{unreported.pk}"'
    pages = {
        "server": f"/fleet/servers/{server.pk}/",
        "status": f"/fleet/servers/{server.pk}/status/",
        "deployment": f"/registry/deployments/{d['deployment'].pk}/",
    }

    for page, url in pages.items():
        html = _get(bob, url)
        assert lost_badge in html and drift_badge in html, page
        assert "DRIFT: " in html and "v2 not on server" in html and "lost" in html
    load_page = _get(bob, f"/registry/loads/{lost.pk}/")
    assert 'data-state="lost"' in load_page and "Lost from server" in load_page
    assert "Why it was lost" in load_page and "no longer reports v1" in load_page
    assert "retrying" not in load_page.lower()
    assert drift_badge in _get(bob, f"/registry/loads/{unreported.pk}/")

    for url in (pages["server"], pages["status"], f"/registry/deployments/{d['other'].pk}/"):
        html = _get(charlie, url)
        assert "data-lost" not in html and "data-drift" not in html and "DRIFT" not in html, url
    _get(charlie, pages["deployment"], status=404)
    _get(charlie, f"/registry/loads/{lost.pk}/", status=404)


@pytest.mark.django_db
def test_a_platform_admin_sees_drift_of_every_tenant_on_the_server_page(drifted_server, root):
    html = _get(root, f"/fleet/servers/{drifted_server['server'].pk}/")
    assert f'data-lost="{drifted_server["lost"].pk}"' in html
    assert f'data-drift="{drifted_server["unreported"].pk}"' in html


@pytest.mark.django_db
def test_an_unreachable_servers_empty_index_shows_no_drift(drifted_server, bob):
    server = drifted_server["server"]
    InferenceServer.objects.filter(pk=server.pk).update(
        health=InferenceServer.Health.UNREACHABLE, health_detail="connection refused")

    html = _get(bob, f"/fleet/servers/{server.pk}/")

    assert "data-drift" not in html  # unknown is not empty
    assert f'data-lost="{drifted_server["lost"].pk}"' in html  # what happened stays shown
    assert drift.reconcile_server(InferenceServer.objects.get(pk=server.pk)) == []
    assert ModelLoad.objects.get(pk=drifted_server["unreported"].pk).state == State.READY
