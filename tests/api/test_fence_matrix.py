"""The fences of issue 20, by persona and hostile target, through the API.

Beside the tenancy matrix (tests/api/test_tenancy_matrix.py, whose World and personas this
reuses): what a tenant may point at outside Switchyard's rows. Each hostile target is refused
with a 4xx naming the field, and nothing is written: no row made or changed, no audit event.

* Webhook targets: loopback, private, link-local, metadata and unspecified addresses in any
  spelling, and credentials in the URL, are a 400 on ``url`` for every persona that may write a
  webhook (alice for tenant A, charlie for tenant B, root acting in A), on create and on PATCH.
* Kubernetes namespaces: a server goes only into a namespace granted to its tenant on that
  cluster (400 on ``namespace``), for platform admins too; the granted one is accepted.
* Secrets and vLLM flags named by a version's labels: a Secret of another namespace, a path, or
  a flag the platform does not allow is a 400 on ``labels`` at registration, and on ``version``
  when a server is asked for with a version that carries one.
* Namespace grants: only platform admins grant (403 for every tenant role, 401 anonymous), and
  another tenant neither lists nor reads tenant A's grants.
"""

# ruff: noqa: F811 (the fixtures imported from test_tenancy_matrix are redefined as arguments)
from __future__ import annotations

from typing import Any

import pytest

from fleet.models import AuditEvent, Placement, TenantNamespace, Webhook
from rollouts.models import ModelVersion, ServerWorkload
from tests.api.test_tenancy_matrix import (  # noqa: F401 (fixtures)
    A100,
    ANONYMOUS,
    LONER,
    World,
    fake_probes,
    fast_passwords,
    fresh,
    no_broker,
    world,
)
from tests.factories import ModelVersionFactory

WEBHOOKS = "/api/v1/webhooks/"
WORKLOADS = "/api/v1/workloads/"
VERSIONS = "/api/v1/versions/"
GRANTS = "/api/v1/tenant-namespaces/"
SHA = "ab" * 32

HOSTILE_URLS = [
    "http://127.0.0.1:5432/",
    "http://localhost/admin",
    "http://[::1]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://0.0.0.0:6379/",
    "http://2130706433/",
    "http://127.1/",
    "http://10.0.0.5/",
    "http://user:pw@hooks.example.com/",
]

#: Who may write webhooks, and in which tenant: (persona, "a" or "b").
WEBHOOK_WRITERS = [("alice", "a"), ("charlie", "b"), ("root", "a")]

HOSTILE_SECRETS = ["other-ns/secret", "../x", "kube-system/token"]
HOSTILE_ARGS = ["--trust-remote-code", "--download-dir /etc"]
HOSTILE_LABELS = [
    *[pytest.param({"vllm.hf_token_secret": s}, id=f"secret={s}") for s in HOSTILE_SECRETS],
    *[pytest.param({"vllm.args": a}, id=f"args={a}") for a in HOSTILE_ARGS],
]


@pytest.fixture(autouse=True)
def no_allowed_hosts(settings) -> None:
    """Whatever the machine's environment says, no host skips the webhook fence here."""
    settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS = []


def written(*tables: type) -> tuple[Any, ...]:
    """Every row of ``tables`` and how many audit events exist: a refusal leaves them as
    they were."""
    rows = tuple(list(table._base_manager.order_by("pk").values()) for table in tables)
    return (*rows, AuditEvent.objects.count())


def assert_refused_on(response: Any, status: int, field: str) -> None:
    assert response.status_code == status, response.content
    assert list(response.json()) == [field], response.json()


# --- webhook targets ------------------------------------------------------------------------


@pytest.mark.parametrize("url", HOSTILE_URLS)
@pytest.mark.parametrize(("caller", "tenant"), WEBHOOK_WRITERS)
def test_a_webhook_to_a_hostile_target_is_not_created(world: World, caller, tenant, url):
    client = world.client(caller)
    slug = (world.tenant_a if tenant == "a" else world.tenant_b).slug
    before = written(Webhook)

    response = client.post(WEBHOOKS, {"tenant": slug, "name": "ops", "url": url,
                                      "events": ["rollout.rolled_back"]}, format="json")

    assert_refused_on(response, 400, "url")
    assert written(Webhook) == before
    assert not Webhook.objects.filter(name="ops").exists()


@pytest.mark.parametrize("url", HOSTILE_URLS)
@pytest.mark.parametrize(("caller", "tenant"), WEBHOOK_WRITERS)
def test_a_webhook_is_not_moved_to_a_hostile_target(world: World, caller, tenant, url):
    webhook = world.webhook_a if tenant == "a" else world.webhook_b
    client = world.client(caller)
    before = written(Webhook)

    response = client.patch(f"{WEBHOOKS}{webhook.pk}/", {"url": url}, format="json")

    assert_refused_on(response, 400, "url")
    assert written(Webhook) == before
    assert fresh(webhook).url == webhook.url


@pytest.mark.parametrize(("caller", "tenant"), WEBHOOK_WRITERS)
def test_a_public_target_is_accepted_by_each_writer(world: World, caller, tenant):
    """The same calls with a public URL pass, so each refusal above is the target's."""
    webhook = world.webhook_a if tenant == "a" else world.webhook_b
    client = world.client(caller)
    slug = webhook.tenant.slug

    created = client.post(WEBHOOKS, {"tenant": slug, "name": "ops",
                                     "url": "https://hooks.example.com/ops"}, format="json")
    patched = client.patch(f"{WEBHOOKS}{webhook.pk}/",
                           {"url": "https://hooks.example.com/moved"}, format="json")

    assert created.status_code == 201, created.content
    assert patched.status_code == 200, patched.content
    assert fresh(webhook).url == "https://hooks.example.com/moved"


# --- Kubernetes namespaces ------------------------------------------------------------------


def workload_body(world: World, tenant: str, namespace: str) -> dict[str, Any]:
    deployment = world.kube_deployment_a if tenant == "a" else world.kube_deployment_b
    return {"deployment": deployment.pk, "version": 1, "name": "triton-fenced",
            "node_selector": A100, "model_repository": "s3://models/x", "namespace": namespace}


#: (caller, tenant whose deployment it asks for, namespace): none granted to that tenant.
#: team-a is granted to tenant A, team-b to tenant B, unclaimed to no one.
HOSTILE_NAMESPACES = [
    *[("dave", "a", ns) for ns in ("kube-system", "default", "team-b", "unclaimed")],
    *[("root", "a", ns) for ns in ("kube-system", "team-b", "unclaimed")],
    *[("charlie", "b", ns) for ns in ("kube-system", "default", "team-a", "unclaimed")],
]


@pytest.mark.parametrize(("caller", "tenant", "namespace"), HOSTILE_NAMESPACES)
def test_a_server_in_a_namespace_not_granted_is_refused(world: World, caller, tenant,
                                                        namespace):
    body = workload_body(world, tenant, namespace)
    _ = world.namespace_a, world.namespace_b  # both tenants hold a grant on the cluster
    client = world.client(caller)
    before = written(ServerWorkload, Placement)

    response = client.post(WORKLOADS, body, format="json")

    assert_refused_on(response, 400, "namespace")
    assert f"namespace {namespace} is not granted" in response.json()["namespace"][0]
    assert written(ServerWorkload, Placement) == before


@pytest.mark.parametrize(("caller", "tenant", "namespace"), [
    ("dave", "a", "team-a"), ("root", "a", "team-a"), ("charlie", "b", "team-b"),
])
def test_a_server_in_its_tenants_granted_namespace_is_accepted(world: World, caller, tenant,
                                                               namespace):
    body = workload_body(world, tenant, namespace)

    response = world.client(caller).post(WORKLOADS, body, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["namespace"] == namespace
    assert ServerWorkload.objects.get(pk=response.json()["id"]).namespace == namespace


# --- Secrets and vLLM flags named by labels -------------------------------------------------


@pytest.mark.parametrize("labels", HOSTILE_LABELS)
@pytest.mark.parametrize(("caller", "tenant"), [("dave", "a"), ("root", "a"), ("charlie", "b")])
def test_a_version_naming_a_hostile_secret_or_flag_is_not_registered(world: World, caller,
                                                                     tenant, labels):
    model = world.model_a if tenant == "a" else world.model_b
    client = world.client(caller)
    before = written(ModelVersion)

    response = client.post(VERSIONS, {
        "model": model.pk, "version": 7, "artifact_uri": "s3://models/llm-chat/7.tar.gz",
        "sha256": SHA, "size_bytes": 2048, "runtime": "vllm",
        "labels": {"vllm.model": "meta-llama/Llama-3.1-8B-Instruct", **labels},
    }, format="json")

    assert_refused_on(response, 400, "labels")
    assert next(iter(labels)) in response.json()["labels"][0]
    assert written(ModelVersion) == before


@pytest.mark.parametrize("labels", HOSTILE_LABELS)
def test_a_server_of_a_version_that_slipped_in_with_such_labels_is_refused(world: World,
                                                                           labels):
    """A version written before the fence (or by hand) carries one: dave's server of it is a
    400 on ``version``, and nothing is written."""
    deployment = world.vllm_deployment_a
    ModelVersionFactory(
        model=deployment.model, version=3, runtime=ModelVersion.Runtime.VLLM, backend="",
        gpus=1, estimated_gpu_memory_mib=20480,
        labels={"vllm.model": "meta-llama/Llama-3.1-8B-Instruct", **labels},
    )
    client = world.client("dave")
    before = written(ServerWorkload, Placement)

    response = client.post(WORKLOADS, {"deployment": deployment.pk, "version": 3,
                                       "name": "vllm-fenced", "node_selector": A100,
                                       "namespace": "team-a"}, format="json")

    assert_refused_on(response, 400, "version")
    assert next(iter(labels)) in response.json()["version"][0]
    assert written(ServerWorkload, Placement) == before


# --- namespace grants -----------------------------------------------------------------------


@pytest.mark.parametrize(("caller", "tenant", "namespace", "status"), [
    *[(persona, "a", "team-a-batch", 403) for persona in ("alice", "erin", "dave", "bob")],
    ("charlie", "b", "team-b-batch", 403), ("charlie", "a", "team-a-batch", 403),
    (LONER, "a", "team-a-batch", 403), (ANONYMOUS, "a", "team-a-batch", 401),
    ("root", "a", "team-a-batch", 201),
    ("root", "a", "kube-system", 400),  # Kubernetes' own namespaces: not even by root
    ("root", "a", "team-b", 400),  # already tenant B's
])
def test_only_a_platform_admin_grants_a_namespace(world: World, caller, tenant, namespace,
                                                  status):
    slug = (world.tenant_a if tenant == "a" else world.tenant_b).slug
    body = {"tenant": slug, "cluster": world.kube_cluster.name, "namespace": namespace}
    _ = world.namespace_a, world.namespace_b
    client = world.client(caller)
    before = written(TenantNamespace)

    response = client.post(GRANTS, body, format="json")

    assert response.status_code == status, response.content
    if status == 201:
        assert TenantNamespace.objects.filter(
            pk=response.json()["id"], tenant__slug=slug, namespace=namespace).exists()
        return
    assert written(TenantNamespace) == before
    if status == 400:
        assert list(response.json()) == ["namespace"]


def test_another_tenant_neither_lists_nor_reads_tenant_as_grants(world: World):
    mine, theirs = world.namespace_b, world.namespace_a
    client = world.client("charlie")

    listed = client.get(GRANTS).json()["results"]
    read = client.get(f"{GRANTS}{theirs.pk}/")
    filtered = client.get(GRANTS, {"tenant__slug": world.tenant_a.slug})

    assert [row["id"] for row in listed] == [mine.pk]
    assert read.status_code == 404
    assert filtered.status_code == 200
    assert filtered.json()["results"] == []
