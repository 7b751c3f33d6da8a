"""/api/v1/servers/ (and nodes, GPUs, clusters): what a shared server shows each tenant, and
every writable field stored or refused, with clusters and nodes named by id or by name.
"""

from __future__ import annotations

import pytest

from fleet.adapters.base import ModelState, ServerProbe
from fleet.inventory import health
from fleet.models import GPU, Cluster, InferenceServer, Node
from fleet.tenancy.visibility import reported_models_of
from tests.factories import (
    ClusterFactory,
    GPUFactory,
    InferenceServerFactory,
    ModelFactory,
    NodeFactory,
    UserFactory,
)

PRIVATE = "failed to load: s3://tenant-b-private/model-b/1.tar.gz: access denied"
INDEX = [
    {"name": "model-a", "version": "1", "state": "READY", "reason": ""},
    {"name": "model-b", "version": "1", "state": "UNAVAILABLE", "reason": PRIVATE},
    {"name": "model-b", "version": "2", "state": "READY", "reason": ""},
    {"name": "stray", "version": "1", "state": "READY", "reason": ""},
]


@pytest.fixture
def shared(tenant_a, tenant_b):
    """A Triton shared by tenant A (model-a) and tenant B (model-b), plus a model nobody owns."""
    ModelFactory(tenant=tenant_a, name="model-a")
    ModelFactory(tenant=tenant_b, name="model-b")
    return InferenceServerFactory(name="shared", reported_models=INDEX)


@pytest.fixture
def probe_reports_index(monkeypatch):
    def probe(http_url: str, timeout: float) -> ServerProbe:
        models = [ModelState(m["name"], m["version"], m["state"], m["reason"]) for m in INDEX]
        return ServerProbe(ready=True, live=True, version="2.51.0", models=models)

    monkeypatch.setattr(health, "PROBES", dict.fromkeys(InferenceServer.Runtime, probe))


def _names(entries):
    return sorted({(m["name"], m["version"]) for m in entries})


VISIBLE = {
    # persona: (names it sees, how many other models it is told about)
    "bob": ([("model-a", "1")], 2),
    "charlie": ([("model-b", "1"), ("model-b", "2")], 2),
    "root": ([("model-a", "1"), ("model-b", "1"), ("model-b", "2"), ("stray", "1")], 0),
}


@pytest.mark.parametrize("persona", sorted(VISIBLE))
@pytest.mark.parametrize("how", ["list", "retrieve", "check"])
def test_a_shared_server_shows_each_tenant_its_own_models_and_counts_the_rest(
    request, client_for, shared, probe_reports_index, persona, how
):
    client = client_for(request.getfixturevalue(persona))
    if how == "list":
        [body] = client.get("/api/v1/servers/").json()["results"]
    elif how == "retrieve":
        body = client.get(f"/api/v1/servers/{shared.pk}/").json()
    else:
        response = client.post(f"/api/v1/servers/{shared.pk}/check/")
        assert response.status_code == 200, response.content
        body = response.json()

    names, others = VISIBLE[persona]
    assert _names(body["reported_models"]) == names
    assert body["other_models"] == others
    if persona == "bob":
        assert PRIVATE not in str(body)


def test_a_tenant_token_sees_what_its_tenant_owns(token_client, tenant_a, shared):
    body = token_client(tenant_a, "viewer").get(f"/api/v1/servers/{shared.pk}/").json()

    assert _names(body["reported_models"]) == [("model-a", "1")]
    assert body["other_models"] == 2
    assert PRIVATE not in str(body)


def test_a_name_two_tenants_use_belongs_on_a_server_to_the_one_placed_there(
    tenant_a, tenant_b, bob, charlie, shared
):
    """GIVEN both tenants have a model named model-b and only tenant B placed it on the server
    THEN tenant A is not shown tenant B's entries (with their failure reasons)."""
    from fleet.models import Placement
    from rollouts.models import Model
    from tests.factories import ModelVersionFactory

    ModelFactory(tenant=tenant_a, name="model-b")
    version_b = ModelVersionFactory(model=Model.objects.get(tenant=tenant_b, name="model-b"),
                                    version=2)
    Placement.objects.create(tenant=tenant_b, server=shared, model_version=version_b,
                             device_class="cpu", units=1, memory_mib=1,
                             state=Placement.State.ACTIVE)

    assert _names(reported_models_of(bob, shared).models) == [("model-a", "1")]
    assert _names(reported_models_of(charlie, shared).models) == [("model-b", "1"), ("model-b", "2")]


def test_a_user_of_no_tenant_is_shown_no_model(shared):
    loner = UserFactory(username="loner")

    seen = reported_models_of(loner, shared)

    assert (seen.models, seen.others) == ([], 3)


# --- writes: every writable field stored or refused; ids and names alike


@pytest.fixture
def fleet(db):
    cluster = ClusterFactory(name="gpu-east")
    node = NodeFactory(cluster=cluster, name="node-1")
    return cluster, node


def test_creating_a_server_stores_every_field_sent_and_takes_the_cluster_by_name(
    client_for, root, fleet
):
    cluster, node = fleet
    body = {
        "cluster": "gpu-east", "node": "node-1", "name": "triton-9", "runtime": "triton",
        "http_url": "http://triton-9:8000", "grpc_url": "triton-9:8001",
        "metrics_url": "http://triton-9:8002/metrics", "model_repository": "/models",
        "log_path": "/var/log/triton-9.log",
    }

    response = client_for(root).post("/api/v1/servers/", body)

    assert response.status_code == 201, response.content
    server = InferenceServer.objects.get(pk=response.json()["id"])
    assert server.log_path == "/var/log/triton-9.log"
    assert (server.cluster, server.node) == (cluster, node)
    stored = response.json()
    assert {k: stored[k] for k in body if k not in ("cluster", "node")} == {
        k: v for k, v in body.items() if k not in ("cluster", "node")
    }
    assert (stored["cluster"], stored["node"]) == (cluster.pk, node.pk)


@pytest.mark.parametrize("ref", ["id", "name", "id-as-string"])
def test_a_cluster_is_taken_by_id_or_name_in_writes_and_in_filters(client_for, root, fleet, ref):
    cluster, _node = fleet
    ClusterFactory(name="other")
    given = {"id": cluster.pk, "name": "gpu-east", "id-as-string": str(cluster.pk)}[ref]
    client = client_for(root)

    created = client.post("/api/v1/servers/", {"cluster": given, "name": "s", "runtime": "vllm",
                                               "http_url": "http://s:8000"})
    node = client.post("/api/v1/nodes/", {"cluster": given, "name": "node-2"})
    listed = client.get("/api/v1/servers/", {"cluster": given}).json()
    nodes = client.get("/api/v1/nodes/", {"cluster": given}).json()

    assert (created.status_code, node.status_code) == (201, 201), (created.content, node.content)
    assert [s["name"] for s in listed["results"]] == ["s"]
    assert sorted(n["name"] for n in nodes["results"]) == ["node-1", "node-2"]


def test_a_gpu_takes_its_node_as_id_or_cluster_slash_name_and_its_parent_by_uuid(
    client_for, root, fleet
):
    _cluster, node = fleet
    NodeFactory(cluster=ClusterFactory(name="gpu-west"), name="node-1")
    physical = GPUFactory(node=node, uuid="GPU-phys")
    client = client_for(root)

    ambiguous = client.post("/api/v1/gpus/", {
        "node": "node-1", "index": 0, "uuid": "GPU-x", "model": "A100", "device_class": "a100",
        "memory_mib": 1})
    sliced = client.post("/api/v1/gpus/", {
        "node": "gpu-east/node-1", "index": 0, "uuid": "MIG-1", "model": "A100",
        "device_class": "a100-3g", "memory_mib": 1, "parent": "GPU-phys",
        "mig_profile": "3g.40gb"})

    assert ambiguous.status_code == 400
    assert "give cluster/node-1" in ambiguous.json()["node"][0]
    assert sliced.status_code == 201, sliced.content
    assert GPU.objects.get(uuid="MIG-1").parent == physical
    assert client.get("/api/v1/gpus/", {"node": "gpu-east/node-1"}).json()["count"] == 2


def test_a_cluster_keeps_its_s3_settings(client_for, root, db):
    response = client_for(root).post("/api/v1/clusters/", {
        "name": "s3-west", "kind": "static", "s3_endpoint_url": "http://minio:9000",
        "s3_region": "eu-west-1"})

    assert response.status_code == 201, response.content
    cluster = Cluster.objects.get(name="s3-west")
    assert (cluster.s3_endpoint_url, cluster.s3_region) == ("http://minio:9000", "eu-west-1")


@pytest.mark.parametrize(
    ("path", "body", "refused"),
    [
        ("servers/", {"cluster": "gpu-east", "name": "s", "runtime": "vllm",
                      "http_url": "http://s:8000", "logpath": "/x"}, {"logpath": "unknown field"}),
        ("servers/", {"cluster": "gpu-east", "name": "s", "runtime": "vllm",
                      "http_url": "http://s:8000", "health": "healthy"},
         {"health": "read-only; leave it out"}),
        ("nodes/", {"cluster": "gpu-east", "name": "n", "gpus": 8}, {"gpus": "unknown field"}),
        ("clusters/", {"name": "c", "kind": "static", "id": 5}, {"id": "read-only; leave it out"}),
    ],
)
def test_fields_that_would_be_dropped_are_refused_by_name(client_for, root, fleet, path, body,
                                                          refused):
    before = (InferenceServer.objects.count(), Node.objects.count(), Cluster.objects.count())

    response = client_for(root).post(f"/api/v1/{path}", body)

    assert response.status_code == 400
    assert response.json() == {k: [v] for k, v in refused.items()}
    assert (InferenceServer.objects.count(), Node.objects.count(),
            Cluster.objects.count()) == before


def test_a_server_node_named_in_another_cluster_is_refused(client_for, root, fleet):
    NodeFactory(cluster=ClusterFactory(name="gpu-west"), name="node-w")

    response = client_for(root).post("/api/v1/servers/", {
        "cluster": "gpu-east", "node": "node-w", "name": "s", "runtime": "vllm",
        "http_url": "http://s:8000"})

    assert response.status_code == 400
    assert response.json() == {"node": ["no node named 'node-w' in cluster gpu-east"]}


def test_an_unknown_cluster_is_refused_naming_it(client_for, root, fleet):
    response = client_for(root).post("/api/v1/servers/", {
        "cluster": "nope", "name": "s", "runtime": "vllm", "http_url": "http://s:8000"})

    assert response.status_code == 400
    assert response.json() == {"cluster": ["no cluster with name 'nope'"]}
