"""The console's cluster pages: a kubernetes cluster's connection and sync state, its nodes
with their GPUs and MIG slices and what runs on them (each tenant sees its own placements
named, the others counted), the platform admin's actions (test connection, sync now) and the
form that adds or edits a cluster, its secret never shown back."""

from __future__ import annotations

import datetime

import pytest
from django.test import Client
from django.utils import timezone

from fleet.inventory import kube_connection, kube_sync, secrets
from fleet.inventory.views import gpu_groups
from fleet.models import GPU, AuditEvent, Cluster, ClusterSync, Node, Placement
from tests.factories import (
    ClusterFactory,
    GPUFactory,
    InferenceServerFactory,
    ModelVersionFactory,
    NodeFactory,
    UserFactory,
)
from tests.fixtures import sent_tasks
from tests.kube.replay import RecordedApiServer, exchanges
from tests.kube.test_connection import TOKEN, VERSION, connected, refused_token

H100 = "NVIDIA H100 80GB HBM3"
X = "\N{MULTIPLICATION SIGN}"  # as the page writes "8 x H100"
SECRET_PARTS = (TOKEN, TOKEN[:12], TOKEN[4:-4])


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page_text(response) -> str:
    text = response.content.decode()
    for part in SECRET_PARTS:
        assert part not in text, "the page shows the secret"
    return text


def kube_cluster(**fields) -> Cluster:
    cluster = ClusterFactory(
        name=fields.pop("name", "gpu-east"), kind=Cluster.Kind.KUBERNETES,
        kube_auth=Cluster.KubeAuth.TOKEN,
        api_url=fields.pop("api_url", "https://10.0.0.1:6443"), **fields,
    )
    kube_connection.set_secret(cluster, TOKEN)
    cluster.save()
    return cluster


def h100_node(cluster: Cluster, name: str = "gpu-h100-01", **fields) -> Node:
    """8 x H100 as the recorded node reports them (mig.strategy=mixed): 6 whole GPUs, one cut
    into 2 x 3g.40gb, one into 7 x 1g.10gb."""
    node = NodeFactory(cluster=cluster, name=name, synced=True, ready=True, zone="us-east-1a",
                       taints=["nvidia.com/gpu=present:NoSchedule"], **fields)
    physical = [
        GPUFactory(node=node, index=i, uuid=f"{name}-gpu-{i}", model=H100,
                   device_class="nvidia-h100-80gb", memory_mib=81559)
        for i in range(8)
    ]
    for i in range(2):
        GPUFactory(node=node, index=i, uuid=f"{name}-mig-3g-{i}", model=H100,
                   device_class="nvidia-h100-80gb-mig-3g-40gb", memory_mib=40192,
                   parent=physical[6], mig_profile="3g.40gb")
    for i in range(7):
        GPUFactory(node=node, index=i, uuid=f"{name}-mig-1g-{i}", model=H100,
                   device_class="nvidia-h100-80gb-mig-1g-10gb", memory_mib=9856,
                   parent=physical[7], mig_profile="1g.10gb")
    return node


def place(tenant, server, model_name: str) -> Placement:
    version = ModelVersionFactory(model__tenant=tenant, model__name=model_name)
    return Placement.objects.create(
        tenant=tenant, server=server, model_version=version,
        device_class="nvidia-h100-80gb-mig-3g-40gb", units=1, memory_mib=20480,
        state=Placement.State.ACTIVE,
    )


@pytest.fixture
def cluster(tenant_a, tenant_b) -> Cluster:
    """A synced kubernetes cluster: an H100 node with a server carrying a model of each
    tenant, an L4 node that is NotReady, a cordoned CPU node and a node that is gone."""
    cluster = kube_cluster(
        connection_state="ok", connection_detail=f"connected: Kubernetes {VERSION}, 4 nodes listed",
        kube_server_version=VERSION, sync_state="partial",
        sync_detail="listed 4 nodes; 1 error", last_synced_at=timezone.now(),
    )
    node = h100_node(cluster)
    server = InferenceServerFactory(cluster=cluster, node=node, name="triton-fraud-v1")
    place(tenant_a, server, "fraud-scorer-a")
    place(tenant_b, server, "secret-model-b")
    l4 = NodeFactory(cluster=cluster, name="gpu-l4-01", synced=True, ready=False,
                     ready_detail="KubeletNotReady: PLEG is not healthy", zone="us-east-1b")
    GPUFactory(node=l4, index=0, uuid="l4-0", model="NVIDIA L4", device_class="nvidia-l4",
               memory_mib=23034)
    NodeFactory(cluster=cluster, name="cpu-01", synced=True, ready=True, unschedulable=True)
    NodeFactory(cluster=cluster, name="gpu-a100-01", synced=True, ready=True,
                gone_at=timezone.now() - datetime.timedelta(minutes=3))
    start = timezone.now() - datetime.timedelta(seconds=30)
    ClusterSync.objects.create(cluster=cluster, kind="list", ok=True,
                               added=["gpu-h100-01", "gpu-l4-01"], started_at=start,
                               finished_at=start)
    ClusterSync.objects.create(cluster=cluster, kind="watch", ok=False,
                               gone=["gpu-a100-01"],
                               errors=["watch expired (410 Gone): listing again"],
                               started_at=start + datetime.timedelta(seconds=15),
                               finished_at=start + datetime.timedelta(seconds=16))
    return cluster


@pytest.fixture
def queued(monkeypatch):
    sent: list[tuple[int, bool]] = []
    sent_tasks.catch(monkeypatch, "fleet.tasks.sync_kube_cluster",
                     lambda cluster_id, full=False: sent.append((cluster_id, full)))
    return sent


# --- the page


@pytest.mark.django_db
def test_a_member_sees_sync_state_nodes_gpus_and_mig_slices(bob, cluster):
    response = browser(bob).get(f"/fleet/clusters/{cluster.pk}/")

    assert response.status_code == 200
    html = page_text(response)
    for text in (
        "Kubernetes API", 'data-connection="ok"', f"<dd>{VERSION}</dd>", 'data-sync="partial"',
        # recent syncs, newest first (the errors counted: their text is the platform's)
        "gpu-h100-01, gpu-l4-01",
        # nodes: badges, taints, zone
        'data-badge="ready"', 'data-badge="not-ready"', "KubeletNotReady: PLEG is not healthy",
        'data-badge="cordoned"', 'data-badge="gone"', "nvidia.com/gpu=present:NoSchedule",
        "zone us-east-1a",
        # GPUs grouped, quota classes shown
        f"8 {X} {H100}", "6 whole", "<code>nvidia-h100-80gb</code>",
        f"MIG: 2 {X} 3g.40gb <code>nvidia-h100-80gb-mig-3g-40gb</code>, 7 {X} 1g.10gb",
        f"1 {X} NVIDIA L4",
    ):
        assert text in html, text
    # the watch that saw gpu-a100-01 go is listed before the older list
    assert html.index("gpu-a100-01") < html.index("gpu-h100-01, gpu-l4-01")
    # how the API is reached, and the error texts, are the platform's (test_inventory_visibility)
    for text in ("https://10.0.0.1:6443", "…XYZW", "listed 4 nodes; 1 error", "watch expired"):
        assert text not in html, text
    # the gone node is listed last
    assert html.index('data-node="gpu-a100-01"') > html.index('data-node="gpu-l4-01"')
    # no actions for a member
    for text in ("Test connection", "Sync now", "Edit cluster"):
        assert text not in html


PLACED = {
    # persona: (model names shown, names never shown, "and N placement(s) of other tenants")
    "bob": (["fraud-scorer-a"], ["secret-model-b"], "and 1 placement of other tenants"),
    "charlie": (["secret-model-b"], ["fraud-scorer-a"], "and 1 placement of other tenants"),
    "root": (["fraud-scorer-a", "secret-model-b"], [], None),
}


@pytest.mark.django_db
@pytest.mark.parametrize("persona", sorted(PLACED))
@pytest.mark.parametrize("url", ["/fleet/clusters/{pk}/", "/fleet/clusters/{pk}/live/"])
def test_what_runs_on_a_node_names_only_the_callers_models(request, cluster, persona, url):
    response = browser(request.getfixturevalue(persona)).get(url.format(pk=cluster.pk))

    assert response.status_code == 200
    html = page_text(response)
    shown, hidden, others = PLACED[persona]
    assert "triton-fraud-v1" in html
    for name in shown:
        assert name in html, name
    for name in hidden:
        assert name not in html, name
    if others:
        assert others in html
    else:
        assert "of other tenants" not in html


@pytest.mark.django_db
def test_the_live_part_keeps_polling_a_kubernetes_cluster_and_stops_for_others(bob, cluster):
    static = ClusterFactory(name="edge", kind=Cluster.Kind.STATIC)
    NodeFactory(cluster=static, name="edge-1")
    client = browser(bob)
    headers = {"HX-Request": "true"}

    live = client.get(f"/fleet/clusters/{cluster.pk}/live/", headers=headers)
    still = client.get(f"/fleet/clusters/{static.pk}/live/", headers=headers)
    static_page = client.get(f"/fleet/clusters/{static.pk}/")

    assert live.status_code == 200
    assert 'hx-trigger="every 5s"' in page_text(live)
    assert 'data-sync="partial"' in live.content.decode()
    assert still.status_code == 286
    assert "edge-1" in still.content.decode() and "hx-trigger" not in still.content.decode()
    assert static_page.status_code == 200 and "hx-trigger=\"every 5s\"" not in (
        static_page.content.decode())
    assert "Kubernetes API" not in static_page.content.decode()


@pytest.mark.django_db
def test_someone_of_no_tenant_and_anonymous_callers_see_no_cluster(cluster):
    loner = browser(UserFactory(username="loner"))

    assert loner.get(f"/fleet/clusters/{cluster.pk}/").status_code == 404
    assert loner.get(f"/fleet/clusters/{cluster.pk}/live/").status_code == 404
    anonymous = Client().get(f"/fleet/clusters/{cluster.pk}/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


@pytest.mark.django_db
def test_the_overview_links_each_cluster_and_offers_adding_one_to_platform_admins(
    bob, root, cluster,
):
    as_bob = browser(bob).get("/fleet/").content.decode()
    as_root = browser(root).get("/fleet/").content.decode()

    assert f'href="/fleet/clusters/{cluster.pk}/"' in as_bob
    assert "Synced with errors" in as_bob
    assert "/fleet/clusters/new/" not in as_bob
    assert "/fleet/clusters/new/" in as_root


# --- actions


@pytest.mark.django_db
def test_a_platform_admin_tests_the_connection_and_reads_the_result(root):
    with RecordedApiServer(connected()) as srv:
        cluster = kube_cluster(api_url=srv.url)
        client = browser(root)
        answer = client.post(f"/fleet/clusters/{cluster.pk}/test/", follow=True)
    srv.assert_all_matched()

    assert answer.redirect_chain == [(f"/fleet/clusters/{cluster.pk}/", 302)]
    html = page_text(answer)
    assert f"gpu-east: connected: Kubernetes {VERSION}, 4 nodes listed" in html  # the message
    assert 'data-connection="ok"' in html and f"<dd>{VERSION}</dd>" in html
    assert "Test connection" in html and "Sync now" in html


@pytest.mark.django_db
def test_a_failed_connection_is_shown_readable_not_as_an_error_page(root):
    with RecordedApiServer(refused_token()) as srv:
        cluster = kube_cluster(api_url=srv.url)
        answer = browser(root).post(f"/fleet/clusters/{cluster.pk}/test/", follow=True)
    srv.assert_all_matched()

    assert answer.status_code == 200
    html = page_text(answer)
    assert "gpu-east: connection failed: GET /version: the API server refused the " \
           "credentials (401 Unauthorized)" in html
    assert 'data-connection="failed"' in html
    assert Cluster.objects.get(pk=cluster.pk).connection_state == "failed"


@pytest.mark.django_db
def test_sync_now_queues_a_sync(root, queued):
    cluster = kube_cluster()

    answer = browser(root).post(f"/fleet/clusters/{cluster.pk}/sync/", follow=True)

    assert answer.status_code == 200
    assert "A sync of gpu-east is queued" in answer.content.decode()
    assert queued == [(cluster.pk, True)]  # a full list


@pytest.mark.django_db
def test_a_static_cluster_has_nothing_to_test_or_sync(root, queued):
    static = ClusterFactory(name="edge", kind=Cluster.Kind.STATIC)

    tested = browser(root).post(f"/fleet/clusters/{static.pk}/test/", follow=True)
    synced = browser(root).post(f"/fleet/clusters/{static.pk}/sync/", follow=True)

    assert "only kubernetes clusters have an API to test" in tested.content.decode()
    assert "only kubernetes clusters are synced" in synced.content.decode()
    assert queued == []
    assert Cluster.objects.get(pk=static.pk).connection_state == "unknown"


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["alice", "bob", "charlie"])
def test_only_platform_admins_act_on_clusters(request, persona, queued):
    cluster = kube_cluster()
    client = browser(request.getfixturevalue(persona))

    answers = [
        client.post(f"/fleet/clusters/{cluster.pk}/test/"),
        client.post(f"/fleet/clusters/{cluster.pk}/sync/"),
        client.get("/fleet/clusters/new/"),
        client.post("/fleet/clusters/new/", {"name": "x", "kind": "static"}),
        client.get(f"/fleet/clusters/{cluster.pk}/edit/"),
        client.post(f"/fleet/clusters/{cluster.pk}/edit/", {"name": "renamed", "kind": "static"}),
    ]

    assert [a.status_code for a in answers] == [403] * 6
    assert queued == []
    assert list(Cluster.objects.values_list("name", "connection_state")) == [
        ("gpu-east", "unknown")]


# --- the form


FORM = {
    "name": "gpu-east", "kind": "kubernetes", "description": "", "kube_auth": "token",
    "api_url": "https://10.0.0.1:6443", "kube_ca_bundle": "", "kube_secret": TOKEN,
    "kube_kubeconfig": "", "kube_context": "", "kube_secret_env": "",
    "kube_namespace": "switchyard", "kube_router": "", "kube_gateway": "",
    "kube_route_host": "", "s3_endpoint_url": "", "s3_region": "",
}


@pytest.mark.django_db
def test_a_platform_admin_adds_a_kubernetes_cluster(root):
    client = browser(root)

    blank = client.get("/fleet/clusters/new/")
    added = client.post("/fleet/clusters/new/", FORM, follow=True)

    assert blank.status_code == 200
    assert 'type="password" name="kube_secret"' in blank.content.decode()
    cluster = Cluster.objects.get(name="gpu-east")
    assert added.redirect_chain == [(f"/fleet/clusters/{cluster.pk}/", 302)]
    assert "Cluster gpu-east added." in page_text(added)
    assert TOKEN not in cluster.kube_secret_encrypted
    assert secrets.decrypt(cluster.kube_secret_encrypted) == TOKEN
    event = AuditEvent.objects.get(object_type="fleet.cluster", verb="created")
    assert event.after["kube_auth"] == "token" and event.after["kube_secret"] == "changed"
    assert TOKEN not in str(event.after)


REFUSED = [
    ({"api_url": ""}, "api_url", "token authentication needs the API server URL"),
    ({"kube_secret": ""}, "kube_secret", "token authentication needs the bearer token"),
    ({"kube_router": "gateway-api"}, "kube_gateway", "give it as namespace/name"),
    ({"kube_secret_env": "KUBE_TOKEN"}, "kube_secret", "not both"),
    ({"kube_auth": "kubeconfig", "kube_secret": ""}, "kube_kubeconfig",
     "kubeconfig authentication needs the kubeconfig"),
    ({"kind": "static"}, "kube_auth", "only kubernetes clusters use this"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("change", "field", "words"), REFUSED,
                         ids=[r[1] + "-" + str(i) for i, r in enumerate(REFUSED)])
def test_the_form_refuses_what_the_api_refuses_on_the_same_field(root, change, field, words):
    answer = browser(root).post("/fleet/clusters/new/", {**FORM, **change})

    assert answer.status_code == 400
    html = page_text(answer)
    assert f'<p class="error" id="{field}-error">' in html
    assert words in html
    assert 'type="password" name="kube_secret"' in html
    assert f'value="{TOKEN}"' not in html  # the secret typed is not sent back
    assert not Cluster.objects.exists()


@pytest.mark.django_db
def test_a_static_cluster_needs_only_a_name_and_its_kind(root):
    added = browser(root).post("/fleet/clusters/new/", {"name": "edge", "kind": "static"})

    assert added.status_code == 302
    row = Cluster.objects.get(name="edge")
    assert (row.kind, row.kube_auth, row.kube_namespace) == ("static", "", "switchyard")


@pytest.mark.django_db
def test_editing_keeps_the_secret_when_left_empty_and_never_shows_it(root):
    cluster = kube_cluster(description="old")
    stored = cluster.kube_secret_encrypted
    client = browser(root)

    form = client.get(f"/fleet/clusters/{cluster.pk}/edit/")
    saved = client.post(f"/fleet/clusters/{cluster.pk}/edit/",
                        {**FORM, "kube_secret": "", "description": "lab"}, follow=True)

    assert form.status_code == 200
    assert f"stored, …XYZW ({len(TOKEN)} characters)" in page_text(form)
    assert "Cluster gpu-east saved." in page_text(saved)
    row = Cluster.objects.get(pk=cluster.pk)
    assert (row.description, row.kube_secret_encrypted) == ("lab", stored)
    event = AuditEvent.objects.get(object_type="fleet.cluster", verb="updated")
    assert (event.before, event.after) == ({"description": "old"}, {"description": "lab"})


@pytest.mark.django_db
def test_moving_to_in_cluster_access_removes_the_stored_secret(root):
    cluster = kube_cluster()
    change = {**FORM, "kube_auth": "in-cluster", "kube_secret": "", "api_url": ""}
    client = browser(root)

    kept = client.post(f"/fleet/clusters/{cluster.pk}/edit/", change)
    cleared = client.post(f"/fleet/clusters/{cluster.pk}/edit/",
                          {**change, "clear_kube_secret": "on"})

    assert kept.status_code == 400
    assert "an in-cluster service account takes no token or kubeconfig" in page_text(kept)
    assert cleared.status_code == 302
    row = Cluster.objects.get(pk=cluster.pk)
    assert (row.kube_auth, row.kube_secret_encrypted) == ("in-cluster", "")
    event = AuditEvent.objects.get(object_type="fleet.cluster", verb="updated")
    assert event.after["kube_secret"] == "removed"


# --- end to end


@pytest.mark.django_db
def test_an_added_cluster_shows_its_gpu_nodes_and_mig_slices_once_synced(root, bob):
    """GIVEN a platform admin who adds a kubernetes cluster through the form and tests its
    connection, WHEN a sync runs (as the periodic task does) against answers a real
    kube-apiserver gave, THEN any member sees its nodes, GPUs and MIG slices on its page."""
    recorded = connected() + exchanges("02-nodes", 4) + exchanges("03-deployments", 11)
    with RecordedApiServer(recorded) as srv:
        client = browser(root)
        added = client.post("/fleet/clusters/new/", {**FORM, "api_url": srv.url})
        cluster = Cluster.objects.get(name="gpu-east")
        tested = client.post(f"/fleet/clusters/{cluster.pk}/test/")
        kube_sync.sync_cluster(Cluster.objects.get(pk=cluster.pk), page_size=0)
        page = browser(bob).get(f"/fleet/clusters/{cluster.pk}/")
    srv.assert_all_matched()

    assert (added.status_code, tested.status_code, page.status_code) == (302, 302, 200)
    html = page_text(page)
    for text in (
        'data-connection="ok"', 'data-sync="ok"', "Full list",
        'data-node="cpu-01"', 'data-node="gpu-a100-01"', 'data-node="gpu-h100-01"',
        'data-node="gpu-l4-01"',
        f"8 {X} NVIDIA-A100-SXM4-80GB", "8 whole", "<code>nvidia-a100-80gb</code>",
        f"8 {X} NVIDIA-H100-80GB-HBM3", "6 whole",
        f"MIG: 2 {X} 3g.40gb <code>nvidia-h100-80gb-mig-3g-40gb</code>, "
        f"7 {X} 1g.10gb <code>nvidia-h100-80gb-mig-1g-10gb</code>",
        'data-badge="not-ready"', "KubeletNotReady: container runtime network not ready",
        "nvidia.com/gpu=present:NoSchedule", "zone us-east-1a",
        'data-server="vllm-llama"', 'data-server="triton-fraud-v1"',
    ):
        assert text in html, text
    h100 = html[html.index('data-node="gpu-h100-01"'):html.index('data-node="gpu-l4-01"')]
    assert 'data-server="vllm-llama"' in h100


# --- GPU grouping


@pytest.mark.django_db
def test_gpus_group_by_model_with_their_mig_slices():
    node = h100_node(ClusterFactory(name="c"))

    [group] = gpu_groups(list(GPU.objects.filter(node=node)))

    assert (group.model, group.device_class, group.count, group.whole) == (
        H100, "nvidia-h100-80gb", 8, 6)
    assert [(s.count, s.profile, s.device_class) for s in group.slices] == [
        (2, "3g.40gb", "nvidia-h100-80gb-mig-3g-40gb"),
        (7, "1g.10gb", "nvidia-h100-80gb-mig-1g-10gb"),
    ]


@pytest.mark.django_db
def test_slices_recorded_without_their_gpu_count_under_the_nodes_only_model():
    node = NodeFactory(name="n")
    for i in range(2):
        GPUFactory(node=node, index=i, uuid=f"p{i}", model=H100, device_class="nvidia-h100-80gb")
    GPUFactory(node=node, index=0, uuid="s0", model=H100,
               device_class="nvidia-h100-80gb-mig-1g-10gb", mig_profile="1g.10gb")

    [group] = gpu_groups(list(GPU.objects.filter(node=node)))

    assert (group.count, group.whole) == (2, 2)
    assert [(s.count, s.profile) for s in group.slices] == [(1, "1g.10gb")]


@pytest.mark.django_db
def test_the_admin_names_a_kubernetes_check_it_cannot_show_instead_of_failing(root):
    """The admin form has no Kubernetes access fields: the model's refusal of a kubernetes
    cluster without them is shown above the form, and nothing is saved."""
    client = Client()
    client.force_login(root)
    response = client.post("/admin/fleet/cluster/add/", {
        "name": "kube-admin", "kind": "kubernetes", "description": "", "api_url": "",
        "s3_endpoint_url": "", "s3_region": "", "router_kind": "none", "router_conf_dir": "",
        "router_reload_command": "", "router_public_host": "",
        "nodes-TOTAL_FORMS": "0", "nodes-INITIAL_FORMS": "0",
    })

    assert response.status_code == 200
    assert "kube_auth: a kubernetes cluster needs one of" in response.content.decode()
    assert not Cluster.objects.filter(name="kube-admin").exists()
