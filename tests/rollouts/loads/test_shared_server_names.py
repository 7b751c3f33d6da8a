"""Two tenants' models of the same name on one shared Triton server.

GIVEN acme and globex, each with a model called ``fraud-scorer`` built from its own artifact
(acme's scores ``sigmoid(mean)``, globex's answers a constant), and each a deployment on the
same real Triton server, WHEN both load v1 and send traffic through their own routes, THEN
each client gets its own model's answers under the name it calls, each deployment's latency
counts only its own requests, globex sees none of acme's entries on the server (API and
console pages), and globex's
unload leaves acme's version serving with its files in place.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import httpx
import pytest
from django.test import Client
from rest_framework.test import APIClient

from fleet.models import Cluster, InferenceServer, Membership, Node
from fleet.tenancy.scoping import served_model_name
from local.s3 import DEMO_ACCESS_KEY_ID, DEMO_SECRET_ACCESS_KEY
from local.triton import DEMO_MODELS_DIR
from rollouts.loads import reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, ModelVersion, Route
from rollouts.traffic import latency
from tests.factories import (
    DeploymentFactory,
    MembershipFactory,
    ModelFactory,
    QuotaFactory,
    TenantFactory,
    UserFactory,
)
from tests.rollouts.triton_world import index_state, make_artifact
from tests.rollups import requests_rolled_up

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]

NAME = "fraud-scorer"
INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [0.0, 0.0]}]}
ACME_SCORE = 0.5  # sigmoid(mean([0, 0]))
GLOBEX_SCORE = 7.0
GLOBEX_MODEL_PY = (DEMO_MODELS_DIR / "fraud-scorer" / "1" / "model.py").read_text().replace(
    "np.array([1.0 / (1.0 + np.exp(-mean))], dtype=np.float32)",
    f"np.array([{GLOBEX_SCORE}], dtype=np.float32)",
)


class Team:
    """One tenant's side: its deployer, model, v1, deployment and API client."""

    def __init__(self, slug: str, server: InferenceServer, cluster: Cluster, store, bucket: str,
                 model_py: str | None) -> None:
        self.tenant = TenantFactory(slug=slug)
        self.user = UserFactory(username=f"{slug}-deployer")
        MembershipFactory(user=self.user, tenant=self.tenant, role=Membership.Role.DEPLOYER)
        QuotaFactory(tenant=self.tenant, device_class="cpu", units=4, memory_mib=1024)
        self.model = ModelFactory(tenant=self.tenant, name=NAME)
        self.deployment = DeploymentFactory(tenant=self.tenant, model=self.model, cluster=cluster,
                                            name=f"{NAME}-prod")
        self.deployment.servers.set([server])
        blob = make_artifact(NAME, 1, model_py=model_py)
        uri = f"s3://{bucket}/{slug}/{NAME}/1.tar.gz"
        store.put(uri, blob)
        self.version = ModelVersion.objects.create(
            model=self.model, version=1, artifact_uri=uri, sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=len(blob), runtime="triton", backend="python", estimated_gpu_memory_mib=64,
            status=ModelVersion.Status.APPROVED,
        )
        self.api = APIClient()
        self.api.force_authenticate(self.user)

    def load(self) -> ModelLoad:
        answer = self.api.post("/api/v1/loads/", {"deployment": self.deployment.pk, "version": 1},
                               format="json")
        assert answer.status_code == 202, answer.content
        return reconciler.run_to_end(answer.json()[0]["id"])

    def route(self) -> str:
        answer = self.api.put(f"/api/v1/routes/{self.deployment.pk}/",
                              {"weights": {"1": 100}, "reason": "all on v1"}, format="json")
        assert answer.status_code == 200, answer.content
        return answer.json()["url"]


@pytest.fixture
def shared(settings, tmp_path, moto_s3, make_s3_store, local_triton, use_route_nginx):
    settings.SWITCHYARD_S3_ENDPOINT_URL = moto_s3.endpoint_url
    settings.SWITCHYARD_S3_ACCESS_KEY_ID = DEMO_ACCESS_KEY_ID
    settings.SWITCHYARD_S3_SECRET_ACCESS_KEY = DEMO_SECRET_ACCESS_KEY
    settings.SWITCHYARD_ARTIFACT_CACHE = tmp_path / "cache"
    settings.SWITCHYARD_LOAD_TIMEOUT_S = 45
    cluster = Cluster.objects.create(name=f"local-{uuid.uuid4().hex[:6]}", kind=Cluster.Kind.LOCAL)
    node = Node.objects.create(cluster=cluster, name="localhost", memory_mib=4096)
    server = InferenceServer.objects.create(
        cluster=cluster, node=node, name="triton-local", runtime=InferenceServer.Runtime.TRITON,
        http_url=local_triton.http_url, metrics_url=local_triton.metrics_url,
        model_repository=str(local_triton.model_repository), log_path=str(local_triton.log_path),
    )
    bucket = f"artifacts-{uuid.uuid4().hex[:8]}"
    store = make_s3_store(moto_s3, tmp_path / "upload-cache")
    store.ensure_bucket(bucket)
    acme = Team("acme", server, cluster, store, bucket, model_py=None)
    globex = Team("globex", server, cluster, store, bucket, model_py=GLOBEX_MODEL_PY)
    yield server, acme, globex, local_triton
    Route.objects.filter(deployment__in=[acme.deployment, globex.deployment]).delete()
    for team in (acme, globex):
        for load in ModelLoad.objects.filter(deployment=team.deployment, state=ModelLoad.State.READY):
            loads.request_unload(team.user, team.deployment, load.version)
            reconciler.run_to_end(load.pk)


def scores(url: str, n: int) -> set[float]:
    seen = set()
    with httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(n):
            answer = client.post(f"/v2/models/{NAME}/infer", json=INFER)
            assert answer.status_code == 200, answer.text
            seen.add(round(answer.json()["outputs"][0]["data"][0], 4))
    return seen


def test_two_tenants_models_of_one_name_share_nothing_on_one_triton(shared):
    server, acme, globex, triton = shared
    acme_load = acme.load()
    assert acme_load.state == ModelLoad.State.READY, acme_load.error
    globex_load = globex.load()
    assert globex_load.state == ModelLoad.State.READY, globex_load.error

    # Files and index entries of their own: globex's load overwrote nothing of acme's.
    repository = Path(triton.model_repository)
    assert (repository / "acme.fraud-scorer" / "1" / "model.py").read_text() != (
        repository / "globex.fraud-scorer" / "1" / "model.py").read_text()
    assert index_state(triton, served_model_name("acme", NAME)) == {"1": "READY"}
    assert index_state(triton, served_model_name("globex", NAME)) == {"1": "READY"}

    # Each client calls "fraud-scorer" through its own route and gets its own model.
    latency.tick()  # the first scrape only remembers the counters
    acme_url, globex_url = acme.route(), globex.route()
    assert scores(acme_url, 12) == {ACME_SCORE}
    assert scores(globex_url, 5) == {GLOBEX_SCORE}
    latency.tick()

    # Each deployment's latency counts its own requests only (Triton labels metrics by the
    # name on the server).
    assert requests_rolled_up(acme.deployment, "v1") == 12
    assert requests_rolled_up(globex.deployment, "v1") == 5

    # What globex reads of the shared server: its own entry, none of acme's (nor its bucket).
    detail = globex.api.get(f"/api/v1/servers/{server.pk}/")
    assert detail.status_code == 200, detail.content
    names = {m["name"] for m in detail.json()["reported_models"]}
    assert served_model_name("globex", NAME) in names
    assert served_model_name("acme", NAME) not in names
    assert "acme" not in detail.content.decode()
    console = Client()
    console.force_login(globex.user)
    for page in (f"/fleet/servers/{server.pk}/", f"/fleet/servers/{server.pk}/status/",
                 "/fleet/servers/live/", f"/registry/deployments/{globex.deployment.pk}/"):
        answer = console.get(page)
        assert answer.status_code == 200, page
        assert "acme" not in answer.content.decode(), page

    # globex's unload takes its own version away, not acme's.
    Route.objects.filter(deployment=globex.deployment).delete()
    answer = globex.api.post("/api/v1/loads/", {"deployment": globex.deployment.pk,
                                                "version": 1, "action": "unload"},
                             format="json")
    assert answer.status_code == 202, answer.content
    gone = reconciler.run_to_end(globex_load.pk)
    assert gone.state == ModelLoad.State.UNLOADED, gone.error
    assert index_state(triton, served_model_name("globex", NAME)).get("1") != "READY"
    assert index_state(triton, served_model_name("acme", NAME)) == {"1": "READY"}
    assert (repository / "acme.fraud-scorer" / "1" / "model.py").is_file()
    assert scores(acme_url, 3) == {ACME_SCORE}
