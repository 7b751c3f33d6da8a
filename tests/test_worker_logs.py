"""What the worker logs: one INFO line per change of state (a load, a rollout, a benchmark, a
workload, a server's health), and the per-task chatter (each task received and succeeded,
each tick that changed nothing) at DEBUG, shown when the log level asks for it."""

from __future__ import annotations

import logging
import socket
import uuid

import pytest

from console import logs
from fleet import tasks
from fleet.models import InferenceServer
from rollouts import leases
from rollouts.models import ModelLoad
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelVersionFactory,
)
from tests.fixtures.celery_worker import CeleryWorker

State = ModelLoad.State


def leased_load() -> ModelLoad:
    deployment = DeploymentFactory()
    server = InferenceServerFactory(cluster=deployment.cluster)
    deployment.servers.set([server])
    return ModelLoad.objects.create(
        tenant=deployment.tenant, deployment=deployment, server=server,
        version=ModelVersionFactory(model=deployment.model), state=State.ADMITTED,
        requested_by_label="dave", lease_owner="w-1")


@pytest.mark.django_db
def test_a_change_of_state_is_one_info_line_and_a_step_without_one_says_nothing(caplog):
    load = leased_load()
    with caplog.at_level(logging.DEBUG, logger="rollouts.leases"):
        leases.update(load, state=State.FETCHING, said="fetching s3://b/m/1.tar.gz")
        leases.update(load, attempts=2)  # a step that changed no state
        leases.update(load, state=State.FETCHING)  # written again: no change
        leases.update(load, state=State.FAILED, error="checksum mismatch")

    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "rollouts.leases"]
    assert lines == [
        ("INFO", f"load {load.pk}: admitted → fetching: fetching s3://b/m/1.tar.gz"),
        ("INFO", f"load {load.pk}: fetching → failed: checksum mismatch"),
    ]


@pytest.mark.parametrize("message", [
    "Task %(name)s[%(id)s] received",
    "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s",
    "Scheduler: Sending due task %s (%s)",
])
def test_celerys_line_per_task_is_debug(message):
    chatter = logs.TaskChatterAtDebug()
    logger = logging.getLogger("celery.app.trace")

    def record(level: int, msg: str) -> logging.LogRecord:
        return logger.makeRecord(logger.name, level, __file__, 1, msg, (), None)

    before = logger.level
    try:
        logger.setLevel(logging.INFO)
        quiet = record(logging.INFO, message)
        assert chatter.filter(quiet) is False and quiet.levelname == "DEBUG"
        logger.setLevel(logging.DEBUG)
        shown = record(logging.INFO, message)
        assert chatter.filter(shown) is True and shown.levelname == "DEBUG"
        # A failure keeps its level, and so does every other line.
        failed = record(logging.ERROR, "Task %(name)s[%(id)s] raised unexpected: %(exc)s")
        assert chatter.filter(failed) is True and failed.levelname == "ERROR"
    finally:
        logger.setLevel(before)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.worker
def test_a_real_worker_logs_the_change_and_not_the_tasks(celery_worker: CeleryWorker,
                                                         transactional_db: None) -> None:
    """GIVEN a real worker at INFO (as the demo runs it) WHEN it checks a server that does not
    answer, twice THEN its log has one line for the server going unreachable, and none for
    the tasks it received and finished."""
    cluster = ClusterFactory(name=f"logs-{uuid.uuid4().hex[:6]}")
    server = InferenceServerFactory(cluster=cluster, name="triton-gone",
                                    http_url=closed_port_url())
    start = len(celery_worker.log())

    for checks in (1, 2):
        celery_worker.send(tasks.check_server, server.pk)
        celery_worker.wait_for(
            lambda n=checks: InferenceServer.objects.get(pk=server.pk).consecutive_failures >= n,
            timeout=20, what="the worker checking the server")

    written = celery_worker.log()[start:].strip().splitlines()
    assert len(written) == 1, written
    assert f"INFO fleet.inventory.health: server {cluster.name}/triton-gone is now unreachable" \
        in written[0]
