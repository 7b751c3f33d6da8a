"""A Kubernetes cluster's inventory synced over exchanges recorded from a real kube-apiserver:
full lists (paged), watches applying events in order, 410 Gone on a watch and on a continue
token, and what a sync records (fleet.inventory.kube_sync)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from fleet.inventory import kube_connection, kube_sync
from fleet.models import GPU, Cluster, ClusterSync, InferenceServer, Node
from fleet.quota.admission import device_class_of
from tests.factories import ClusterFactory
from tests.kube.replay import GOOD_TOKEN, RecordedApiServer, exchanges

pytestmark = pytest.mark.django_db

DISCOVERY = ("03-deployments", 11)  # Deployments labelled switchyard.io/deployment, all namespaces


def make_cluster(url: str, **fields) -> Cluster:
    """A kubernetes cluster reached at ``url`` with a bearer token."""
    cluster = ClusterFactory(name=fields.pop("name", "gpu-east"), kind=Cluster.Kind.KUBERNETES,
                             kube_auth=Cluster.KubeAuth.TOKEN, api_url=url, **fields)
    kube_connection.set_secret(cluster, GOOD_TOKEN)
    cluster.full_clean()
    cluster.save()
    return cluster


def recent_list(cluster: Cluster, rv: str) -> None:
    """The cluster was listed a moment ago up to ``rv``: the next sync watches from there."""
    now = timezone.now()
    ClusterSync.objects.create(cluster=cluster, kind=ClusterSync.Kind.LIST, started_at=now,
                               finished_at=now, resource_version=rv)
    Cluster.objects.filter(pk=cluster.pk).update(nodes_resource_version=rv)
    cluster.refresh_from_db()


def gpu_rows(cluster: Cluster, node: str) -> list[tuple[int, str, str, str]]:
    return [(g.index, g.mig_profile, g.device_class, g.parent.uuid if g.parent else "")
            for g in GPU.objects.filter(node__cluster=cluster, node__name=node)
            .select_related("parent").order_by("index", "mig_profile", "uuid")]


def test_a_first_sync_lists_the_nodes_page_by_page_and_records_what_it_added():
    with override_settings(SWITCHYARD_KUBE_PAGE_SIZE=2), \
            RecordedApiServer(exchanges("02-nodes", 10, 11) + exchanges(*DISCOVERY)) as srv:
        cluster = make_cluster(srv.url)
        sync = kube_sync.sync_cluster(cluster)
        srv.assert_all_matched()
        assert srv.unused == []
    assert sync.pk and sync.kind == ClusterSync.Kind.LIST and sync.ok
    assert sync.added[:4] == ["node cpu-01", "node gpu-a100-01", "node gpu-h100-01",
                              "node gpu-l4-01"]
    assert sorted(sync.added[4:]) == ["server triton-fraud-v1", "server triton-fraud-v2",
                                      "server vllm-llama"]
    assert (sync.changed, sync.gone, sync.errors, sync.resource_version) == ([], [], [], "207")
    cluster.refresh_from_db()
    assert cluster.sync_state == Cluster.SyncState.OK
    assert cluster.nodes_resource_version == "207"
    assert cluster.last_synced_at is not None
    assert cluster.connection_state == Cluster.ConnectionState.OK
    assert cluster.sync_detail == (
        "4 nodes (1 not ready); GPUs: nvidia-a100-80gb x8, nvidia-h100-80gb x8, "
        "nvidia-h100-80gb-mig-1g-10gb x7, nvidia-h100-80gb-mig-3g-40gb x2, nvidia-l4-24gb x1; "
        "3 discovered servers"
    )
    l4 = Node.objects.get(cluster=cluster, name="gpu-l4-01")
    assert (l4.synced, l4.ready, l4.unschedulable, l4.zone, l4.resource_version) == (
        True, False, False, "us-east-1b", "206")
    assert l4.ready_detail.startswith("KubeletNotReady: container runtime network not ready")
    assert l4.taints == ["nvidia.com/gpu=present:NoSchedule",
                         "node.kubernetes.io/not-ready:NoSchedule"]
    assert (l4.cpu_cores, l4.memory_mib, l4.allocatable["memory"]) == (16, 65536, "62Gi")
    h100 = gpu_rows(cluster, "gpu-h100-01")
    parent6 = f"k8s-{cluster.pk}-gpu-h100-01-gpu6"
    parent7 = f"k8s-{cluster.pk}-gpu-h100-01-gpu7"
    assert [r for r in h100 if not r[1]] == [(i, "", "nvidia-h100-80gb", "") for i in range(8)]
    assert sorted(r for r in h100 if r[1]) == sorted(
        [(6, "3g.40gb", "nvidia-h100-80gb-mig-3g-40gb", parent6)] * 2
        + [(7, "1g.10gb", "nvidia-h100-80gb-mig-1g-10gb", parent7)] * 7)
    assert GPU.objects.filter(node__name="gpu-h100-01", parent__isnull=True).count() == 8
    assert kube_sync.device_classes(cluster)["nvidia-a100-80gb"] == 8
    assert not GPU.objects.filter(node__name="cpu-01").exists()


def test_an_unpaged_list_then_a_watch_applies_added_modified_and_deleted_in_order():
    """02-nodes #20 lists at resourceVersion 210; the watch from 210 (#21) streams gpu-l4-02
    ADDED (not ready), its labels and then Ready MODIFIED, gpu-h100-01's MIG layout MODIFIED
    (7 whole GPUs, the 1g.10gb slices gone) and gpu-l4-02 DELETED."""
    recorded = exchanges("02-nodes", 20, 21) + exchanges(*DISCOVERY)
    with RecordedApiServer(recorded) as srv:
        cluster = make_cluster(srv.url)
        listed = kube_sync.sync_cluster(cluster, page_size=0)
        uuid_3g = GPU.objects.get(node__name="gpu-h100-01", mig_profile="3g.40gb",
                                  uuid__endswith="mig-3g.40gb-0").pk
        # The watch streams for the sync interval less 2 s: 30 s, as recorded.
        with override_settings(SWITCHYARD_KUBE_SYNC_INTERVAL_S=32.0):
            watched = kube_sync.sync_cluster(cluster)
        srv.assert_all_matched()
        assert srv.unused == []
    assert listed.kind == ClusterSync.Kind.LIST and listed.resource_version == "210"
    assert watched.kind == ClusterSync.Kind.WATCH and watched.ok
    assert watched.added == ["node gpu-l4-02"]
    assert watched.changed == ["node gpu-l4-02", "node gpu-h100-01"]
    assert watched.gone == ["node gpu-l4-02"]
    assert watched.resource_version == "215"
    cluster.refresh_from_db()
    assert cluster.nodes_resource_version == "215"
    gone = Node.objects.get(cluster=cluster, name="gpu-l4-02")
    # The MODIFIED events before the delete were applied: Ready and the new label.
    assert (gone.ready, gone.labels["switchyard.io/pool"]) == (True, "batch")
    assert gone.gone_at is not None and gone.is_gone
    assert not GPU.objects.filter(node=gone).exists()  # no placement: its GPUs are dropped
    h100 = gpu_rows(cluster, "gpu-h100-01")
    parent7 = f"k8s-{cluster.pk}-gpu-h100-01-gpu7"
    assert [r for r in h100 if r[1]] == [(7, "3g.40gb", "nvidia-h100-80gb-mig-3g-40gb",
                                          parent7)] * 2
    assert sum(1 for r in h100 if not r[1]) == 8
    # The slice kept its row (same uuid), now on the GPU that is still partitioned.
    assert GPU.objects.get(pk=uuid_3g).parent.uuid == parent7
    assert cluster.sync_state == Cluster.SyncState.OK
    assert "1 gone" in cluster.sync_detail


def test_a_quiet_watch_with_bookmarks_records_no_row_and_keeps_the_resource_version():
    recorded = exchanges("02-nodes", 27, 28) + exchanges(*DISCOVERY)
    with RecordedApiServer(recorded) as srv:
        cluster = make_cluster(srv.url)
        kube_sync.sync_cluster(cluster, page_size=0)
        before = ClusterSync.objects.count()
        synced_at = Cluster.objects.get(pk=cluster.pk).last_synced_at
        quiet = kube_sync.sync_cluster(cluster, watch_timeout=3, bookmarks=True)
        srv.assert_all_matched()
        assert srv.unused == []
    assert quiet.pk is None and quiet.ok and quiet.kind == ClusterSync.Kind.WATCH
    assert ClusterSync.objects.count() == before
    cluster.refresh_from_db()
    assert cluster.nodes_resource_version == "215"
    assert cluster.last_synced_at > synced_at
    assert cluster.sync_state == Cluster.SyncState.OK


def test_a_watch_answered_410_gone_lists_again_and_the_next_sync_watches_from_there():
    """02b: after an apiserver restart the watch from resourceVersion 1 gets an in-band ERROR
    410 (#3); the sync lists again (#4, resourceVersion 218) and the next one watches from
    218 (#5)."""
    recorded = exchanges("02b-nodes-410-gone", 3, 4, 5) + exchanges(*DISCOVERY)
    with RecordedApiServer(recorded) as srv:
        cluster = make_cluster(srv.url)
        recent_list(cluster, "1")
        relisted = kube_sync.sync_cluster(cluster, watch_timeout=5, page_size=0)
        cluster.refresh_from_db()
        assert cluster.nodes_resource_version == "218"
        assert cluster.sync_state == Cluster.SyncState.OK
        detail = cluster.sync_detail
        assert detail.startswith(
            "the watch from resourceVersion 1 expired (410 Gone): listed again; 4 nodes")
        after = kube_sync.sync_cluster(cluster, watch_timeout=2)
        srv.assert_all_matched()
        assert srv.unused == []
    expired = ClusterSync.objects.filter(cluster=cluster, kind=ClusterSync.Kind.WATCH).get()
    assert not expired.ok and expired.resource_version == "1"
    assert expired.errors == ["watch nodes: too old resource version: 1 (218) (410 Expired)"]
    assert relisted.kind == ClusterSync.Kind.LIST and relisted.ok
    assert relisted.resource_version == "218" and len(relisted.added) == 4 + 3
    assert after.kind == ClusterSync.Kind.WATCH and after.pk is None
    cluster.refresh_from_db()
    assert (cluster.sync_state, cluster.sync_detail) == (Cluster.SyncState.OK, detail)
    assert Node.objects.filter(cluster=cluster, gone_at__isnull=True).count() == 4


def test_an_expired_continue_token_lists_again_from_the_start():
    """02b #0 is page 1 (limit=1); the continue token was compacted away: 410 Expired (#1).
    The nodes are listed again in one request (#4), a consistent snapshot."""
    recorded = exchanges("02b-nodes-410-gone", 0, 1, 4) + exchanges(*DISCOVERY)
    with RecordedApiServer(recorded) as srv:
        cluster = make_cluster(srv.url)
        sync = kube_sync.sync_cluster(cluster, page_size=1)
        srv.assert_all_matched()
        assert srv.unused == []
    assert sync.ok and sync.resource_version == "218"
    assert sorted(n for n in sync.added if n.startswith("node")) == [
        "node cpu-01", "node gpu-a100-01", "node gpu-h100-01", "node gpu-l4-01"]
    cluster.refresh_from_db()
    assert cluster.sync_detail.startswith("a continue token expired (410 Gone)")
    assert Node.objects.filter(cluster=cluster).count() == 4


def test_a_cordon_seen_in_a_later_list_is_a_change():
    """02-nodes #4 lists cpu-01 schedulable; the later full list #27 (after the cordon, #15)
    shows it unschedulable: a change, as are gpu-a100-01's patched labels."""
    recorded = exchanges("02-nodes", 4, 27) + exchanges(*DISCOVERY) + exchanges(*DISCOVERY)
    with override_settings(SWITCHYARD_KUBE_RELIST_INTERVAL_S=0), \
            RecordedApiServer(recorded) as srv:
        cluster = make_cluster(srv.url)
        kube_sync.sync_cluster(cluster, page_size=0)
        assert not Node.objects.get(cluster=cluster, name="cpu-01").unschedulable
        second = kube_sync.sync_cluster(cluster, page_size=0)
        srv.assert_all_matched()
    assert second.kind == ClusterSync.Kind.LIST
    assert "node cpu-01" in second.changed and "node gpu-a100-01" in second.changed
    cpu = Node.objects.get(cluster=cluster, name="cpu-01")
    assert cpu.unschedulable is True and cpu.resource_version != "207"
    cluster.refresh_from_db()
    assert "1 cordoned" in cluster.sync_detail
    # The labels patched onto gpu-a100-01 (#13), one removed again with a merge patch (#14).
    a100 = Node.objects.get(cluster=cluster, name="gpu-a100-01")
    assert a100.labels["switchyard.io/pool"] == "serving"
    assert "switchyard.io/cordon-reason" not in a100.labels


def test_discovered_servers_get_their_urls_and_the_node_their_selector_picks():
    with RecordedApiServer(exchanges("02-nodes", 4) + exchanges(*DISCOVERY)) as srv:
        cluster = make_cluster(srv.url)
        kube_sync.sync_cluster(cluster, page_size=0)
        srv.assert_all_matched()
    triton = InferenceServer.objects.get(cluster=cluster, name="triton-fraud-v1")
    assert (triton.source, triton.runtime, triton.kube_namespace, triton.kube_name) == (
        InferenceServer.Source.DISCOVERED, "triton", "serving", "triton-fraud-v1")
    assert triton.http_url == "http://triton-fraud-v1.serving.svc:8000"
    assert triton.grpc_url == "triton-fraud-v1.serving.svc:8001"
    assert triton.metrics_url == "http://triton-fraud-v1.serving.svc:8002/metrics"
    assert triton.node.name == "gpu-a100-01"
    # The device class quotas count against comes from the synced GPUs.
    assert device_class_of(triton) == "nvidia-a100-80gb"
    vllm = InferenceServer.objects.get(cluster=cluster, name="vllm-llama")
    assert (vllm.runtime, vllm.node.name, vllm.metrics_url) == (
        "vllm", "gpu-h100-01", "http://vllm-llama.serving.svc:8000/metrics")
    assert device_class_of(vllm) == "nvidia-h100-80gb"


def test_the_newest_syncs_are_kept():
    cluster = make_cluster("http://127.0.0.1:9")
    start = timezone.now() - timedelta(hours=2)
    for i in range(kube_sync.KEEP_SYNCS + 5):
        at = start + timedelta(seconds=i)
        ClusterSync.objects.create(cluster=cluster, kind=ClusterSync.Kind.LIST,
                                   started_at=at, finished_at=at)
    oldest_kept = start + timedelta(seconds=6)
    with RecordedApiServer(exchanges("02-nodes", 4) + exchanges(*DISCOVERY)) as srv:
        cluster.api_url = srv.url
        cluster.save()
        newest = kube_sync.sync_cluster(cluster, page_size=0)
    rows = ClusterSync.objects.filter(cluster=cluster)
    assert rows.count() == kube_sync.KEEP_SYNCS
    assert rows.first() == newest
    assert min(r.started_at for r in rows) == oldest_kept


@pytest.mark.parametrize(("interval", "timeout"), [(15.0, 13), (32.0, 30), (2.5, 1), (1.0, 1)])
def test_a_watch_is_bounded_by_the_sync_interval(interval, timeout):
    with override_settings(SWITCHYARD_KUBE_SYNC_INTERVAL_S=interval):
        assert kube_sync.watch_timeout_s() == timeout
        assert kube_sync.watch_timeout_s() <= interval
