"""A new team goes from an empty tenant to a served model without the API, in Chromium.

dave (deployer) registers a model and its first version and asks for approval; erin (approver)
grants it from the approvals queue; dave creates a deployment, loads the version (a real Celery
worker fetches it from S3 and loads it into the session's Triton), copies the curl example from
the deployment page, runs it, and sees the requests on the live chart.
"""

from __future__ import annotations

import hashlib
import subprocess
import uuid

import pytest
from playwright.sync_api import expect

from fleet.adapters.triton_runtime import TritonServerRuntime
from fleet.models import Cluster, InferenceServer, Membership, Node
from rollouts.models import Deployment, ModelLoad, ModelVersion
from rollouts.traffic import latency
from tests.console.conftest import SCREENSHOTS
from tests.console.test_browser_loads import s3_worker  # noqa: F401 (a fixture)
from tests.factories import MembershipFactory, QuotaFactory, TenantFactory, UserFactory
from tests.rollouts.triton_world import make_artifact

pytestmark = [pytest.mark.browser, pytest.mark.triton, pytest.mark.worker]


def test_a_new_team_serves_a_model_from_the_console_alone(
    open_page, live_server, s3_worker, local_triton, moto_s3, make_s3_store, tmp_path  # noqa: F811
):
    tenant = TenantFactory(slug=f"team-{uuid.uuid4().hex[:4]}")
    MembershipFactory(user=UserFactory(username="dave"), tenant=tenant, role=Membership.Role.DEPLOYER)
    MembershipFactory(user=UserFactory(username="erin"), tenant=tenant, role=Membership.Role.APPROVER)
    QuotaFactory(tenant=tenant, device_class="cpu", units=4, memory_mib=1024)
    cluster = Cluster.objects.create(name="local-team", kind=Cluster.Kind.LOCAL)
    node = Node.objects.create(cluster=cluster, name="localhost", memory_mib=4096)
    InferenceServer.objects.create(
        cluster=cluster, node=node, name="triton", runtime="triton", http_url=local_triton.http_url,
        metrics_url=local_triton.metrics_url, model_repository=str(local_triton.model_repository),
        log_path=str(local_triton.log_path),
    )
    name = f"scorer-{uuid.uuid4().hex[:6]}"
    blob = make_artifact(name, 1)
    uri = f"s3://team-{uuid.uuid4().hex[:6]}/{name}/1.tar.gz"
    store = make_s3_store(moto_s3, tmp_path / "upload")
    store.ensure_bucket(uri.split("/")[2])
    store.put(uri, blob)

    try:
        walk(open_page, live_server, s3_worker, tenant, name, blob, uri)
    finally:
        # Leave the session's Triton as the other tests expect it: the model gone from it.
        runtime = TritonServerRuntime(local_triton.http_url, local_triton.model_repository, timeout=60)
        if (local_triton.model_repository / name).exists():
            runtime.unload(name, 1, 60)
            runtime.remove(name, 1)


def walk(open_page, live_server, s3_worker, tenant, name: str, blob: bytes, uri: str) -> None:  # noqa: F811
    # dave registers the model and its first version, asking for approval.
    dave = open_page("dave")
    dave.goto(f"{live_server.url}/registry/")
    dave.click("#register-model")
    dave.fill("#id_name", name)
    dave.click("button:has-text('Register model')")
    expect(dave.locator("h1")).to_have_text(f"Register a version of {name}")
    dave.fill("#id_artifact_uri", uri)
    dave.fill("#id_sha256", hashlib.sha256(blob).hexdigest())
    dave.fill("#id_size_bytes", str(len(blob)))
    dave.fill("#id_backend", "python")
    dave.check("#id_request_approval")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    dave.screenshot(path=str(SCREENSHOTS / "new-team-version-form.png"), full_page=True)
    dave.click("button:has-text('Register version')")
    expect(dave.locator(".messages")).to_contain_text("registered and approval asked for")
    version = ModelVersion.objects.get(model__name=name, version=1)
    assert version.status == ModelVersion.Status.PENDING_APPROVAL

    # erin approves it from the queue, seeing who asked.
    erin = open_page("erin")
    erin.goto(f"{live_server.url}/registry/approvals/")
    item = erin.locator(f'article[data-version="{version.pk}"]')
    expect(item).to_contain_text("Asked by dave")
    erin.screenshot(path=str(SCREENSHOTS / "new-team-approvals.png"), full_page=True)
    item.locator("button:has-text('Approve')").click()
    expect(erin.locator(".messages")).to_contain_text("approved")
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.APPROVED

    # dave deploys it and loads it.
    dave.goto(f"{live_server.url}/registry/models/{version.model_id}/")
    dave.click("#new-deployment")
    dave.fill("#id_name", "scorer")
    dave.select_option("#id_cluster", label="local-team")
    dave.fill("#id_slo_p99_ms", "200")
    dave.click("button:has-text('Create deployment')")
    expect(dave.locator("h1")).to_contain_text("scorer")
    deployment = Deployment.objects.get(tenant=tenant, name="scorer")
    dave.click("text=Load onto 1 server")
    try:
        expect(dave.locator("#load-panel [data-state]").first).to_have_attribute(
            "data-state", "ready", timeout=60_000)
    except AssertionError:
        events = [e.message for e in ModelLoad.objects.get(version=version).events.all()]
        raise AssertionError(f"{events}\n{s3_worker.log_tail()}") from None

    # The page says how to call it; the copied example, run in a shell, is answered.
    guide = dave.locator("#how-to-call")
    expect(guide.locator("#call-inputs")).to_contain_text("INPUT0")
    expect(guide.locator("#call-outputs")).to_contain_text("SCORE")
    dave.context.grant_permissions(["clipboard-read", "clipboard-write"])
    guide.locator("button:has-text('Copy curl example')").click()
    expect(guide.locator("button:has-text('Copied')")).to_be_visible()
    example = dave.evaluate("navigator.clipboard.readText()")
    assert example == guide.locator("#call-example").inner_text().strip()
    latency.tick()
    for _ in range(20):
        ran = subprocess.run(["bash", "-c", example], capture_output=True, text=True, timeout=30)
        assert ran.returncode == 0 and '"name":"SCORE"' in ran.stdout, ran.stdout + ran.stderr
    latency.tick()

    # ... and the live chart (it polls while on screen) shows them, without a reload.
    dave.locator("#latency").scroll_into_view_if_needed()
    row = dave.locator("table.latency-latest tr", has_text="v1")
    expect(row).to_be_visible(timeout=15_000)
    expect(row.locator("td").nth(1)).not_to_have_text("0.0 req/s", timeout=15_000)
    assert deployment.loads.get().state == ModelLoad.State.READY
    dave.screenshot(path=str(SCREENSHOTS / "new-team-served.png"), full_page=True)
