"""Nodes that vanish from a cluster and servers discovered in it: what a sync keeps, marks,
changes and leaves alone (fleet.inventory.kube_sync)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from fleet.inventory import kube_sync
from fleet.models import GPU, ClusterSync, InferenceServer, Node, Placement
from tests.factories import (
    GPUFactory,
    InferenceServerFactory,
    ModelVersionFactory,
    NodeFactory,
    TenantFactory,
)
from tests.kube.replay import RecordedApiServer, exchanges
from tests.kube.test_kube_sync import DISCOVERY, make_cluster

pytestmark = pytest.mark.django_db

LISTED = ("02-nodes", 4)  # cpu-01, gpu-a100-01, gpu-h100-01, gpu-l4-01 at resourceVersion 207


def _synced_node(cluster, name: str, *, gpus: int = 2, **fields) -> Node:
    node = NodeFactory(cluster=cluster, name=name, synced=True, **fields)
    for i in range(gpus):
        GPUFactory(node=node, index=i, uuid=f"k8s-{cluster.pk}-{name}-gpu{i}")
    return node


def _placement(node: Node, state: str = Placement.State.ACTIVE) -> Placement:
    server = InferenceServerFactory(cluster=node.cluster, node=node)
    tenant = TenantFactory()
    return Placement.objects.create(
        tenant=tenant, server=server, model_version=ModelVersionFactory(model__tenant=tenant),
        device_class="nvidia-a100-80gb", units=1, memory_mib=1024, state=state,
    )


def test_vanished_nodes_are_marked_gone_and_gpus_a_placement_needs_are_kept():
    cluster = make_cluster("http://127.0.0.1:9")
    held = _synced_node(cluster, "gpu-a100-02")
    placement = _placement(held)
    idle = _synced_node(cluster, "gpu-a100-03")
    returning = _synced_node(cluster, "gpu-l4-01", gpus=0, gone_at=timezone.now())
    typed = NodeFactory(cluster=cluster, name="typed-by-hand")  # not synced: not ours
    recorded = exchanges(*LISTED) + exchanges(*DISCOVERY) + exchanges(*LISTED) + \
        exchanges(*DISCOVERY)
    with override_settings(SWITCHYARD_KUBE_RELIST_INTERVAL_S=0), \
            RecordedApiServer(recorded) as srv:
        cluster.api_url = srv.url
        cluster.save()
        first = kube_sync.sync_cluster(cluster, page_size=0)
        held.refresh_from_db()
        idle.refresh_from_db()
        assert held.gone_at is not None and idle.gone_at is not None
        assert GPU.objects.filter(node=held).count() == 2  # a placement holds a server on it
        assert not GPU.objects.filter(node=idle).exists()
        placement.state = Placement.State.RELEASED
        placement.save()
        second = kube_sync.sync_cluster(cluster, page_size=0)
        srv.assert_all_matched()
        assert srv.unused == []
    assert sorted(first.gone) == ["node gpu-a100-02", "node gpu-a100-03"]
    assert "node gpu-l4-01" in first.added  # it came back
    returning.refresh_from_db()
    assert returning.gone_at is None and GPU.objects.filter(node=returning).count() == 1
    # Gone nodes are reported once; released, the GPUs of the held node are dropped too.
    assert second.gone == [] and second.kind == ClusterSync.Kind.LIST
    assert not GPU.objects.filter(node=held).exists()
    assert Node.objects.filter(pk__in=[held.pk, idle.pk], gone_at__isnull=False).count() == 2
    typed.refresh_from_db()
    assert typed.gone_at is None and not typed.synced
    assert "2 gone" in cluster.sync_detail


def test_nodes_gone_for_a_day_are_deleted_unless_a_placement_holds_them():
    cluster = make_cluster("http://127.0.0.1:9")
    long_ago = timezone.now() - timedelta(days=2)
    old = _synced_node(cluster, "gpu-old", gone_at=long_ago)
    old_held = _synced_node(cluster, "gpu-old-held", gone_at=long_ago)
    _placement(old_held)
    recent = _synced_node(cluster, "gpu-recent", gone_at=timezone.now() - timedelta(hours=1))
    with RecordedApiServer(exchanges(*LISTED) + exchanges(*DISCOVERY)) as srv:
        cluster.api_url = srv.url
        cluster.save()
        sync = kube_sync.sync_cluster(cluster, page_size=0)
        srv.assert_all_matched()
    assert sync.gone == []
    assert not Node.objects.filter(pk=old.pk).exists()
    assert Node.objects.filter(pk__in=[old_held.pk, recent.pk]).count() == 2
    assert GPU.objects.filter(node=old_held).count() == 2


def test_discovery_leaves_other_servers_alone_and_reports_vanished_ones():
    cluster = make_cluster("http://127.0.0.1:9")
    managed = InferenceServerFactory(
        cluster=cluster, name="fraud-v1", source=InferenceServer.Source.MANAGED,
        kube_namespace="serving", kube_name="triton-fraud-v1", http_url="http://managed:8000",
    )
    manual = InferenceServerFactory(cluster=cluster, name="triton-fraud-v2",
                                    http_url="http://by-hand:8000")
    stale = InferenceServerFactory(
        cluster=cluster, name="vllm-llama", source=InferenceServer.Source.DISCOVERED,
        kube_namespace="serving", kube_name="vllm-llama", runtime="vllm",
        http_url="http://vllm-llama.serving.svc:8080",
    )
    vanished = InferenceServerFactory(
        cluster=cluster, name="old-triton", source=InferenceServer.Source.DISCOVERED,
        kube_namespace="serving", kube_name="old-triton",
    )
    with RecordedApiServer(exchanges(*LISTED) + exchanges(*DISCOVERY)) as srv:
        cluster.api_url = srv.url
        cluster.save()
        sync = kube_sync.sync_cluster(cluster, page_size=0)
        srv.assert_all_matched()
    assert [n for n in sync.added if n.startswith("server")] == ["server serving-triton-fraud-v2"]
    assert sync.changed == ["server vllm-llama"]
    assert sync.gone == ["server old-triton"]
    managed.refresh_from_db()
    manual.refresh_from_db()
    stale.refresh_from_db()
    assert managed.http_url == "http://managed:8000" and managed.node is None
    assert manual.http_url == "http://by-hand:8000" and manual.source == "manual"
    assert stale.http_url == "http://vllm-llama.serving.svc:8000"
    assert stale.node.name == "gpu-h100-01"
    assert InferenceServer.objects.filter(pk=vanished.pk).exists()  # not deleted
    discovered = InferenceServer.objects.get(cluster=cluster, name="serving-triton-fraud-v2")
    assert (discovered.kube_namespace, discovered.kube_name, discovered.source) == (
        "serving", "triton-fraud-v2", InferenceServer.Source.DISCOVERED)
    assert discovered.http_url == "http://triton-fraud-v2.serving.svc:8000"
