"""One request id from the API through a real Celery worker: the load a CI pipeline asks for
with ``X-Request-Id: ci-run-42`` keeps that id, and every line the worker logs while it
fetches and loads the version names it, with the load and the server."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from rollouts.models import ModelLoad
from tests.console.test_browser_loads import s3_worker  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_request_id_follows_a_load_into_the_worker(world, s3_worker):  # noqa: F811
    version = world.version(1)
    api = APIClient()
    api.force_authenticate(world.user)

    answer = api.post("/api/v1/loads/", {"deployment": world.deployment.pk, "version": 1},
                      format="json", headers={"X-Request-Id": "ci-run-42"})

    assert answer.status_code == 202, answer.content
    assert answer["X-Request-Id"] == "ci-run-42"
    load = ModelLoad.objects.get(version=version)
    assert load.request_id == "ci-run-42" and answer.json()[0]["request_id"] == "ci-run-42"
    s3_worker.wait_for(lambda: ModelLoad.objects.get(pk=load.pk).state == ModelLoad.State.READY,
                       timeout=60, what="the load to be ready")
    moves = [line for line in s3_worker.log().splitlines() if " → " in line]
    # One INFO line per state change, from where the row is written (rollouts.leases).
    assert [re.search(rf"INFO rollouts\.leases: load {load.pk}: (\w+) → (\w+): ", line).groups()
            for line in moves] == [
        ("pending", "admitted"), ("admitted", "fetching"), ("fetching", "placing"),
        ("placing", "loading"), ("loading", "ready")]
    for line in moves:
        assert line.endswith(f"[request_id=ci-run-42 task=rollouts.tasks.advance_load "
                             f"task_id={line.split('task_id=')[1].split(' ')[0]} "
                             f"load={load.pk} server={world.server.name}]"), line
