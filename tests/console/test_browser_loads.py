"""A deployer loads a version from the console and watches it become ready, then unloads it.

Real parts all the way: Chromium, the live server, a real Celery worker consuming from Redis,
S3 (moto's server mode) and the session's Triton.
"""

from __future__ import annotations

import hashlib
import uuid

import httpx
import pytest
from django.conf import settings
from django.db import connection
from playwright.sync_api import expect

from fleet.models import Cluster, InferenceServer, Membership, Node
from local.s3 import DEMO_ACCESS_KEY_ID, DEMO_REGION, DEMO_SECRET_ACCESS_KEY
from rollouts.models import ModelLoad, ModelVersion
from tests.console.conftest import SCREENSHOTS
from tests.factories import (
    DeploymentFactory,
    MembershipFactory,
    ModelFactory,
    QuotaFactory,
    UserFactory,
)
from tests.fixtures import sent_tasks
from tests.fixtures.celery_worker import database_url, forget_queue, start_worker
from tests.rollouts.loads.test_loads import make_artifact

pytestmark = [pytest.mark.browser, pytest.mark.triton, pytest.mark.worker]


@pytest.fixture
def s3_worker(moto_s3, tmp_path, monkeypatch, transactional_db):
    """A real worker that fetches from the session's S3 endpoint, on a queue of its own."""
    monkeypatch.setenv("SWITCHYARD_S3_ENDPOINT_URL", moto_s3.endpoint_url)
    monkeypatch.setenv("SWITCHYARD_S3_ACCESS_KEY_ID", DEMO_ACCESS_KEY_ID)
    monkeypatch.setenv("SWITCHYARD_S3_SECRET_ACCESS_KEY", DEMO_SECRET_ACCESS_KEY)
    monkeypatch.setenv("SWITCHYARD_S3_REGION", DEMO_REGION)
    monkeypatch.setenv("SWITCHYARD_DATA_DIR", str(tmp_path / "worker-data"))
    worker = start_worker(tmp_path / "worker.log", database_url(connection.settings_dict),
                          settings.REDIS_URL)
    from rollouts.tasks import advance_load

    sent_tasks.catch(
        monkeypatch, advance_load, lambda load_id: advance_load.apply_async((load_id,), queue=worker.queue)
    )
    yield worker
    worker.stop()
    forget_queue(settings.REDIS_URL, worker.queue)


def test_a_deployer_loads_and_unloads_a_version_from_the_console(
    open_page, s3_worker, local_triton, moto_s3, make_s3_store, tmp_path
):
    dave = UserFactory(username="dave")
    tenant = MembershipFactory(user=dave, role=Membership.Role.DEPLOYER).tenant
    QuotaFactory(tenant=tenant, device_class="cpu", units=4, memory_mib=1024)
    cluster = Cluster.objects.create(name="local-browser", kind=Cluster.Kind.LOCAL)
    node = Node.objects.create(cluster=cluster, name="localhost", memory_mib=4096)
    server = InferenceServer.objects.create(
        cluster=cluster, node=node, name="triton", runtime="triton", http_url=local_triton.http_url,
        model_repository=str(local_triton.model_repository), log_path=str(local_triton.log_path),
    )
    model = ModelFactory(tenant=tenant, name=f"browser-{uuid.uuid4().hex[:6]}")
    blob = make_artifact(model.name, 1)
    uri = f"s3://browser-{uuid.uuid4().hex[:6]}/{model.name}/1.tar.gz"
    store = make_s3_store(moto_s3, tmp_path / "upload")
    store.ensure_bucket(uri.split("/")[2])
    store.put(uri, blob)
    ModelVersion.objects.create(
        model=model, version=1, artifact_uri=uri, sha256=hashlib.sha256(blob).hexdigest(),
        size_bytes=len(blob), runtime="triton", backend="python", estimated_gpu_memory_mib=64,
        status=ModelVersion.Status.APPROVED,
    )
    deployment = DeploymentFactory(tenant=tenant, model=model, cluster=cluster, name="scorer")
    deployment.servers.set([server])

    page = open_page("dave")
    page.goto(f"{page.url.split('/registry')[0].rstrip('/')}/registry/deployments/{deployment.pk}/")
    page.click("text=Load onto 1 server")

    # The panel polls while the worker advances the load, then the page refreshes itself.
    try:
        expect(page.locator("#load-panel [data-state]").first).to_have_attribute(
            "data-state", "ready", timeout=60_000
        )
    except AssertionError:
        events = [e.message for e in ModelLoad.objects.get(version__model=model).events.all()]
        raise AssertionError(f"{events}\n{s3_worker.log_tail()}") from None
    expect(page.get_by_text("v1 on triton")).to_be_visible()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "load-ready.png"), full_page=True)
    index = httpx.post(f"{local_triton.http_url}/v2/repository/index", timeout=5).json()
    assert {"name": model.name_on(server), "version": "1", "state": "READY"} in index

    page.on("dialog", lambda dialog: dialog.accept())
    page.click("form:has-text('v1 on triton') button:has-text('Unload')")
    expect(page.locator("#load-panel [data-state]").first).to_have_attribute(
        "data-state", "unloaded", timeout=60_000
    )
    load = ModelLoad.objects.get(version__model=model)
    assert load.state == ModelLoad.State.UNLOADED
    assert [e.state for e in load.events.all()][-1] == "unloaded"
