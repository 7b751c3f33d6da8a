"""/api/v1/clusters/ for kubernetes clusters: how to reach the API (the secret write-only and
stored encrypted), test-connection against answers a real kube-apiserver gave, sync and the
syncs list; and the nodes and GPUs a sync owns, read-only by hand."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from fleet.inventory import kube_connection, secrets
from fleet.models import GPU, AuditEvent, Cluster, ClusterSync, Node
from tests.factories import ClusterFactory, GPUFactory, NodeFactory
from tests.fixtures import sent_tasks
from tests.kube.replay import RecordedApiServer
from tests.kube.test_connection import TOKEN, VERSION, connected, refused_token

SECRET_PARTS = (TOKEN, TOKEN[:12], TOKEN[4:-4])


def kube_body(**fields) -> dict:
    return {"name": "gpu-east", "kind": "kubernetes", "kube_auth": "token",
            "api_url": "https://10.0.0.1:6443", "kube_secret": TOKEN, **fields}


def assert_no_secret(*responses) -> None:
    for response in responses:
        text = response.content.decode()
        for part in SECRET_PARTS:
            assert part not in text, f"{response.request['PATH_INFO']} shows the secret"


def kube_cluster(**fields) -> Cluster:
    cluster = ClusterFactory(
        name=fields.pop("name", "gpu-east"), kind=Cluster.Kind.KUBERNETES,
        kube_auth=fields.pop("kube_auth", Cluster.KubeAuth.TOKEN),
        api_url=fields.pop("api_url", "https://10.0.0.1:6443"), **fields,
    )
    if cluster.kube_auth != Cluster.KubeAuth.IN_CLUSTER:
        kube_connection.set_secret(cluster, TOKEN)
        cluster.save()
    return cluster


@pytest.fixture
def queued(monkeypatch):
    """What ``POST .../sync/`` hands to the broker (``fleet.tasks.sync_kube_cluster``)."""
    sent: list[tuple[int, bool]] = []
    sent_tasks.catch(monkeypatch, "fleet.tasks.sync_kube_cluster",
                     lambda cluster_id, full=False: sent.append((cluster_id, full)))
    return sent


# --- create, read, update: the secret


@pytest.mark.django_db
def test_a_platform_admin_adds_a_cluster_whose_token_is_stored_encrypted(root, bob, client_for):
    created = client_for(root).post("/api/v1/clusters/", kube_body(), format="json")

    assert created.status_code == 201, created.json()
    body = created.json()
    assert "kube_secret" not in body
    assert body["kube_secret_hint"] == f"stored, …XYZW ({len(TOKEN)} characters)"
    assert (body["kube_auth"], body["kube_namespace"], body["connection_state"],
            body["sync_state"]) == ("token", "switchyard", "unknown", "never")
    stored = Cluster.objects.get(pk=body["id"]).kube_secret_encrypted
    assert TOKEN not in stored and secrets.decrypt(stored) == TOKEN
    # Platform admins read the hint back, never the secret; members read neither (see
    # tests/api/test_inventory_visibility.py); the audit log holds no secret.
    read = client_for(root).get(f"/api/v1/clusters/{body['id']}/")
    listed = client_for(bob).get("/api/v1/clusters/")
    assert read.status_code == listed.status_code == 200
    assert read.json()["kube_secret_hint"] == body["kube_secret_hint"]
    assert "kube_secret_hint" not in listed.json()["results"][0]
    assert_no_secret(created, read, listed)
    events = AuditEvent.objects.filter(object_type="fleet.cluster")
    assert events.count() == 1
    assert TOKEN not in str(list(events.values("before", "after")))


@pytest.mark.django_db
def test_an_empty_secret_on_update_keeps_the_stored_one_and_null_removes_it(root, client_for):
    cluster = kube_cluster()
    stored = cluster.kube_secret_encrypted
    client = client_for(root)

    kept = client.patch(f"/api/v1/clusters/{cluster.pk}/",
                        {"kube_secret": "", "description": "lab"}, format="json")
    assert kept.status_code == 200, kept.json()
    assert Cluster.objects.get(pk=cluster.pk).kube_secret_encrypted == stored

    needed = client.patch(f"/api/v1/clusters/{cluster.pk}/", {"kube_secret": None},
                          format="json")
    assert needed.status_code == 400
    assert "needs the bearer token" in needed.json()["kube_secret"][0]
    assert Cluster.objects.get(pk=cluster.pk).kube_secret_encrypted == stored

    moved = client.patch(f"/api/v1/clusters/{cluster.pk}/",
                         {"kube_auth": "in-cluster", "kube_secret": None}, format="json")
    assert moved.status_code == 200, moved.json()
    assert moved.json()["kube_secret_hint"] == ""
    assert Cluster.objects.get(pk=cluster.pk).kube_secret_encrypted == ""
    assert_no_secret(kept, needed, moved)


@pytest.mark.django_db
def test_a_new_secret_is_audited_as_changed_with_the_values_before(root, client_for):
    cluster = kube_cluster(description="old")

    changed = client_for(root).patch(
        f"/api/v1/clusters/{cluster.pk}/",
        {"kube_secret": "another-token-value-1234", "description": "new"}, format="json",
    )

    assert changed.status_code == 200, changed.json()
    assert changed.json()["kube_secret_hint"] == "stored, …1234 (24 characters)"
    event = AuditEvent.objects.get(object_type="fleet.cluster", verb="updated")
    assert event.before == {"description": "old"}
    assert event.after == {"description": "new", "kube_secret": "changed"}
    assert "kube_secret_encrypted" not in str(event.after)


@pytest.mark.django_db
def test_an_environment_variable_replaces_the_stored_secret(root, client_for, settings):
    settings.SWITCHYARD_KUBE_SECRET_ENV_ALLOWED = ["KUBE_TOKEN"]
    cluster = kube_cluster()
    client = client_for(root)

    both = client.patch(f"/api/v1/clusters/{cluster.pk}/",
                        {"kube_secret": TOKEN, "kube_secret_env": "KUBE_TOKEN"}, format="json")
    moved = client.patch(f"/api/v1/clusters/{cluster.pk}/", {"kube_secret_env": "KUBE_TOKEN"},
                         format="json")

    assert both.status_code == 400 and "not both" in both.json()["kube_secret"][0]
    assert moved.status_code == 200, moved.json()
    assert moved.json()["kube_secret_hint"] == "from $KUBE_TOKEN"
    row = Cluster.objects.get(pk=cluster.pk)
    assert (row.kube_secret_encrypted, row.kube_secret_env) == ("", "KUBE_TOKEN")
    assert_no_secret(both, moved)


REFUSED = [
    # (body, field named, words of the message)
    (kube_body(api_url=""), "api_url", "needs the API server URL"),
    (kube_body(kube_secret=""), "kube_secret", "needs the bearer token"),
    (kube_body(kube_auth=""), "kube_auth", "needs one of in-cluster, kubeconfig or token"),
    (kube_body(kube_auth="kubeconfig", kube_secret=""), "kube_secret", "needs the kubeconfig"),
    (kube_body(kube_auth="in-cluster"), "kube_secret", "takes no token or kubeconfig"),
    (kube_body(kube_auth="oidc"), "kube_auth", "not a valid choice"),
    (kube_body(kube_router="gateway-api"), "kube_gateway", "namespace/name"),
    (kube_body(kube_router="gateway-api", kube_gateway="no-slash"), "kube_gateway",
     "namespace/name"),
    (kube_body(kube_gateway="infra/edge"), "kube_gateway", "router uses a gateway"),
    (kube_body(kube_route_host="not a host"), "kube_route_host", "DNS host name"),
    (kube_body(kube_secret="", kube_secret_env="1-BAD"), "kube_secret_env",
     "environment variable name"),
    (kube_body(kube_secret_env="KUBE_TOKEN"), "kube_secret", "not both"),
    (kube_body(kube_namespace="Not_A_Namespace"), "kube_namespace", ""),
    (kube_body(api_url="not a url"), "api_url", "valid URL"),
    ({"name": "static-2", "kind": "static", "kube_auth": "token"}, "kube_auth",
     "only kubernetes clusters"),
    ({"name": "static-2", "kind": "static", "kube_secret": TOKEN}, "kube_secret",
     "only kubernetes clusters"),
    ({"name": "static-2", "kind": "static", "kube_router": "istio"}, "kube_router",
     "only kubernetes clusters"),
    (kube_body(connection_state="ok"), "connection_state", "read-only"),
    (kube_body(kube_secret_hint="x"), "kube_secret_hint", "read-only"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "field", "words"), REFUSED,
                         ids=[f"{i}-{r[1]}" for i, r in enumerate(REFUSED)])
def test_bad_connection_settings_are_a_400_naming_the_field(root, client_for, body, field,
                                                            words):
    answer = client_for(root).post("/api/v1/clusters/", body, format="json")

    assert answer.status_code == 400, answer.json()
    assert field in answer.json(), answer.json()
    assert words in " ".join(answer.json()[field])
    assert not Cluster.objects.exists()
    assert_no_secret(answer)


@pytest.mark.django_db
def test_a_static_cluster_is_still_added_with_its_own_fields_only(root, client_for):
    answer = client_for(root).post("/api/v1/clusters/", {"name": "edge", "kind": "static"},
                                   format="json")

    assert answer.status_code == 201, answer.json()
    assert (answer.json()["kube_auth"], answer.json()["kube_secret_hint"]) == ("", "")


@pytest.mark.django_db
def test_only_platform_admins_write_clusters(alice, bob, client_for, queued):
    cluster = kube_cluster()

    answers = [
        client_for(alice).post("/api/v1/clusters/", kube_body(name="other"), format="json"),
        client_for(alice).patch(f"/api/v1/clusters/{cluster.pk}/", {"kube_secret": "x"},
                                format="json"),
        client_for(alice).post(f"/api/v1/clusters/{cluster.pk}/test-connection/"),
        client_for(alice).post(f"/api/v1/clusters/{cluster.pk}/sync/"),
        client_for(bob).post(f"/api/v1/clusters/{cluster.pk}/sync/"),
    ]

    assert [a.status_code for a in answers] == [403] * 5
    assert queued == []
    row = Cluster.objects.get(pk=cluster.pk)
    assert (row.connection_state, kube_connection.secret_of(row)) == ("unknown", TOKEN)


# --- actions


@pytest.mark.django_db
def test_test_connection_reports_the_server_version(root, client_for):
    with RecordedApiServer(connected()) as srv:
        cluster = kube_cluster(api_url=srv.url)
        answer = client_for(root).post(f"/api/v1/clusters/{cluster.pk}/test-connection/")
    srv.assert_all_matched()

    assert answer.status_code == 200
    assert answer.json() == {"ok": True, "server_version": VERSION,
                             "detail": f"connected: Kubernetes {VERSION}, 4 nodes listed"}
    read = client_for(root).get(f"/api/v1/clusters/{cluster.pk}/").json()
    assert (read["connection_state"], read["kube_server_version"]) == ("ok", VERSION)
    assert read["connection_checked_at"] is not None
    assert_no_secret(answer)


@pytest.mark.django_db
def test_a_failed_connection_is_a_200_result_recorded_on_the_cluster(root, bob, client_for):
    with RecordedApiServer(refused_token()) as srv:
        cluster = kube_cluster(api_url=srv.url)
        answer = client_for(root).post(f"/api/v1/clusters/{cluster.pk}/test-connection/")
    srv.assert_all_matched()

    assert answer.status_code == 200
    assert answer.json()["ok"] is False and answer.json()["server_version"] == ""
    assert "401 Unauthorized" in answer.json()["detail"]
    read = client_for(root).get(f"/api/v1/clusters/{cluster.pk}/")
    assert read.json()["connection_state"] == "failed"
    assert read.json()["connection_detail"] == answer.json()["detail"]
    # A member reads the state, not the text (which names the API server).
    seen = client_for(bob).get(f"/api/v1/clusters/{cluster.pk}/").json()
    assert seen["connection_state"] == "failed" and "connection_detail" not in seen
    assert_no_secret(answer, read)


@pytest.mark.django_db
def test_a_cluster_that_is_not_kubernetes_has_no_connection_to_test_or_sync(root, client_for,
                                                                              queued):
    static = ClusterFactory(name="edge", kind=Cluster.Kind.STATIC)

    tested = client_for(root).post(f"/api/v1/clusters/{static.pk}/test-connection/")
    synced = client_for(root).post(f"/api/v1/clusters/{static.pk}/sync/")

    assert tested.status_code == synced.status_code == 400
    assert "only kubernetes clusters" in tested.json()["kind"][0]
    assert "only kubernetes clusters" in synced.json()["kind"][0]
    assert queued == []


@pytest.mark.django_db
def test_sync_now_queues_the_clusters_sync(root, client_for, queued):
    cluster = kube_cluster()

    answer = client_for(root).post(f"/api/v1/clusters/{cluster.pk}/sync/")

    assert answer.status_code == 202
    assert answer.json() == {"queued": True, "detail": "a sync of gpu-east is queued"}
    assert queued == [(cluster.pk, True)]  # a full list


@pytest.mark.django_db
def test_members_read_a_clusters_recent_syncs_newest_first(bob, root, client_for):
    cluster = kube_cluster()
    other = kube_cluster(name="gpu-west")
    start = timezone.now() - datetime.timedelta(minutes=5)
    for minute, (kind, ok) in enumerate([("list", True), ("watch", True), ("watch", False)]):
        ClusterSync.objects.create(
            cluster=cluster, kind=kind, ok=ok, added=["gpu-h100-01"] if minute == 0 else [],
            errors=[] if ok else ["GET /api/v1/nodes: API server unreachable: timed out"],
            started_at=start + datetime.timedelta(minutes=minute),
            finished_at=start + datetime.timedelta(minutes=minute, seconds=1),
        )
    ClusterSync.objects.create(cluster=other, kind="list", started_at=start, finished_at=start)

    answer = client_for(bob).get(f"/api/v1/clusters/{cluster.pk}/syncs/")

    assert answer.status_code == 200
    body = answer.json()
    assert body["count"] == 3
    assert [(r["kind"], r["ok"]) for r in body["results"]] == [
        ("watch", False), ("watch", True), ("list", True)]
    # The errors can name the API server: platform admins read them, members only "ok".
    assert all("errors" not in row for row in body["results"])
    as_root = client_for(root).get(f"/api/v1/clusters/{cluster.pk}/syncs/").json()
    assert as_root["results"][0]["errors"] == [
        "GET /api/v1/nodes: API server unreachable: timed out"]
    assert body["results"][2]["added"] == ["gpu-h100-01"]


@pytest.mark.django_db
def test_anonymous_callers_and_strangers_read_nothing(api, client_for, root):
    from tests.factories import UserFactory

    cluster = kube_cluster()
    loner = UserFactory(username="loner")

    assert api.get(f"/api/v1/clusters/{cluster.pk}/syncs/").status_code == 401
    assert api.post(f"/api/v1/clusters/{cluster.pk}/test-connection/").status_code == 401
    assert client_for(loner).get(f"/api/v1/clusters/{cluster.pk}/syncs/").status_code == 404


# --- nodes and GPUs a sync owns


@pytest.fixture
def synced_node() -> Node:
    cluster = kube_cluster()
    return NodeFactory(
        cluster=cluster, name="gpu-h100-01", synced=True, ready=False,
        ready_detail="KubeletNotReady: container runtime is down", unschedulable=True,
        taints=["nvidia.com/gpu=present:NoSchedule"],
        capacity={"cpu": "96", "nvidia.com/gpu": "8"},
        allocatable={"cpu": "95", "nvidia.com/gpu": "6", "nvidia.com/mig-3g.40gb": "2"},
        zone="us-east-1a",
    )


@pytest.mark.django_db
def test_nodes_show_what_the_kubernetes_api_says(bob, client_for, synced_node):
    answer = client_for(bob).get(f"/api/v1/nodes/{synced_node.pk}/")

    assert answer.status_code == 200
    body = answer.json()
    assert {k: body[k] for k in ("synced", "ready", "unschedulable", "zone", "gone_at")} == {
        "synced": True, "ready": False, "unschedulable": True, "zone": "us-east-1a",
        "gone_at": None}
    assert body["ready_detail"] == "KubeletNotReady: container runtime is down"
    assert body["taints"] == ["nvidia.com/gpu=present:NoSchedule"]
    assert body["allocatable"]["nvidia.com/mig-3g.40gb"] == "2"
    assert body["capacity"]["nvidia.com/gpu"] == "8"


@pytest.mark.django_db
def test_a_synced_node_and_its_gpus_are_not_changed_by_hand(root, client_for, synced_node):
    gpu = GPUFactory(node=synced_node, index=0, uuid="GPU-synced-0",
                     device_class="nvidia-h100-80gb")
    client = client_for(root)

    answers = {
        "patch node": client.patch(f"/api/v1/nodes/{synced_node.pk}/", {"hostname": "x"},
                                   format="json"),
        "put node": client.put(f"/api/v1/nodes/{synced_node.pk}/",
                               {"cluster": synced_node.cluster_id, "name": "gpu-h100-01"},
                               format="json"),
        "delete node": client.delete(f"/api/v1/nodes/{synced_node.pk}/"),
        "patch gpu": client.patch(f"/api/v1/gpus/{gpu.pk}/", {"memory_mib": 1}, format="json"),
        "delete gpu": client.delete(f"/api/v1/gpus/{gpu.pk}/"),
    }

    for what, answer in answers.items():
        assert answer.status_code == 409, what
        assert "comes from the Kubernetes API of cluster gpu-east" in answer.json()["detail"]
    assert Node.objects.get(pk=synced_node.pk).hostname == ""
    assert GPU.objects.get(pk=gpu.pk).memory_mib == 81920
    assert client.get(f"/api/v1/gpus/{gpu.pk}/").json()["synced"] is True


@pytest.mark.django_db
def test_nodes_and_gpus_are_not_added_by_hand_to_a_kubernetes_cluster(root, client_for,
                                                                      synced_node):
    client = client_for(root)

    node = client.post("/api/v1/nodes/", {"cluster": "gpu-east", "name": "by-hand"},
                       format="json")
    gpu = client.post("/api/v1/gpus/", {
        "node": synced_node.pk, "index": 1, "uuid": "GPU-by-hand", "model": "NVIDIA H100",
        "device_class": "nvidia-h100-80gb", "memory_mib": 81920}, format="json")

    assert node.status_code == 400 and "come from its Kubernetes API" in node.json()["cluster"][0]
    assert gpu.status_code == 400 and "observed there" in gpu.json()["node"][0]
    assert not Node.objects.filter(name="by-hand").exists()
    assert not GPU.objects.filter(uuid="GPU-by-hand").exists()


@pytest.mark.django_db
def test_observed_fields_of_a_hand_made_node_are_read_only(root, client_for):
    node = NodeFactory(name="static-node")

    answer = client_for(root).patch(f"/api/v1/nodes/{node.pk}/", {"ready": True, "zone": "z"},
                                    format="json")
    edited = client_for(root).patch(f"/api/v1/nodes/{node.pk}/", {"hostname": "h1"},
                                    format="json")

    assert answer.status_code == 400
    assert answer.json() == {"ready": ["read-only; leave it out"],
                             "zone": ["read-only; leave it out"]}
    assert edited.status_code == 200 and edited.json()["hostname"] == "h1"
    assert edited.json()["synced"] is False
