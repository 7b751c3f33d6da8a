"""Load requests while the Celery broker is down: accepted, answered as usual, picked up later.

GIVEN a real redis-server as this process's Celery broker, killed (connections refused) or
replaced by a socket that accepts and never answers,
WHEN a deployer asks for a load through the API or the console,
THEN the request is answered as usual (202, the console's redirect) within a bounded time, the
row is committed ``pending``, the reconcile tick's ``due_loads()`` returns it, and once the
broker is back the next request's task reaches the queue again.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import redis

from rollouts.loads import reconciler
from rollouts.models import ModelLoad, ModelVersion
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)
from tests.fault.conftest import RedisServer, celery_broker

# What a publish may cost with the broker down (console/settings.py): one retry 0.1 s after
# the first attempt; a refused connection fails at once.
REFUSED_PUBLISH_S = 0.1
# A broker that accepts and never answers: both attempts run into the 2 s socket timeout.
HUNG_PUBLISH_S = 2 * 2.0 + 0.1
# Slack for a busy machine on top of what the same request measured with the broker up.
SLACK_S = 1.5


@pytest.fixture
def world(transactional_db, tenant_a, dave):
    cluster = ClusterFactory(name="c-outage")
    server = InferenceServerFactory(cluster=cluster, name="triton-1")
    made = {}
    for name in ("scorer", "ranker", "tagger", "parser"):
        model = ModelFactory(tenant=tenant_a, name=name)
        ModelVersionFactory(model=model, version=1, status=ModelVersion.Status.APPROVED)
        deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=cluster,
                                       name=f"{name}-prod")
        deployment.servers.set([server])
        made[name] = deployment
    return made


@pytest.fixture
def hung_broker() -> Iterator[str]:
    """A Redis URL whose server accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


def queued(server: RedisServer) -> int:
    with redis.Redis(port=server.port) as client:
        return client.llen("celery")


def timed_post(client, deployment) -> tuple[float, object]:
    start = time.monotonic()
    response = client.post("/api/v1/loads/", {"deployment": deployment.pk, "version": 1})
    return time.monotonic() - start, response


def test_a_load_request_with_the_broker_down_is_accepted_and_left_to_the_reconcile_tick(
    client_for, dave, world, redis_server
):
    client = client_for(dave)
    with celery_broker(redis_server.url):
        healthy_s, healthy = timed_post(client, world["scorer"])
        assert healthy.status_code == 202, healthy.content
        assert queued(redis_server) == 1

        redis_server.kill()
        down_s, response = timed_post(client, world["ranker"])

        assert response.status_code == 202, response.content
        assert response["Content-Type"] == "application/json"
        [body] = response.json()
        assert body["state"] == "pending"
        assert down_s < healthy_s + REFUSED_PUBLISH_S + SLACK_S, (down_s, healthy_s)
        assert body["id"] in reconciler.due_loads()

        # The broker returns (empty: it kept nothing): the next request reaches the queue again.
        redis_server.start()
        _, again = timed_post(client, world["tagger"])
        assert again.status_code == 202, again.content
        assert queued(redis_server) == 1


def test_a_load_request_with_a_hung_broker_is_answered_within_the_publish_timeout(
    client_for, dave, world, redis_server, hung_broker
):
    client = client_for(dave)
    with celery_broker(redis_server.url):
        healthy_s, healthy = timed_post(client, world["scorer"])
    assert healthy.status_code == 202, healthy.content

    with celery_broker(hung_broker):
        hung_s, response = timed_post(client, world["ranker"])

    assert response.status_code == 202, response.content
    [body] = response.json()
    assert ModelLoad.objects.get(pk=body["id"]).state == "pending"
    assert body["id"] in reconciler.due_loads()
    assert hung_s < healthy_s + HUNG_PUBLISH_S + SLACK_S, (hung_s, healthy_s)


def test_console_load_and_unload_forms_with_the_broker_down_redirect_as_usual(
    client, dave, world, redis_server
):
    client.force_login(dave)
    deployment = world["parser"]
    version = deployment.model.versions.get()
    url = f"/registry/deployments/{deployment.pk}/load/"
    with celery_broker(redis_server.url):
        redis_server.kill()
        loaded = client.post(url, {"version": version.pk, "action": "load"})
        load = ModelLoad.objects.get(deployment=deployment)
        ModelLoad.objects.filter(pk=load.pk).update(state=ModelLoad.State.READY)
        unloaded = client.post(url, {"version": version.pk, "action": "unload"})

    assert (loaded.status_code, unloaded.status_code) == (302, 302)
    load.refresh_from_db()
    assert load.state == ModelLoad.State.UNLOADING
    assert load.pk in reconciler.due_loads()
