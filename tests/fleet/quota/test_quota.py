"""Quota admission: the message names the resource, the ask and what is left; concurrent
admissions never overbook."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from console.exceptions import QuotaExceeded
from fleet.models import Placement
from fleet.quota import admission as quota
from tests.factories import (
    GPUFactory,
    InferenceServerFactory,
    ModelVersionFactory,
    NodeFactory,
    QuotaFactory,
    TenantFactory,
)


@pytest.fixture
def cpu_server(db):
    node = NodeFactory(name="cpu-node", memory_mib=4096)
    return InferenceServerFactory(cluster=node.cluster, node=node, name="cpu-server")


def test_it_admits_within_quota_and_is_idempotent(cpu_server):
    tenant = TenantFactory()
    QuotaFactory(tenant=tenant, device_class="cpu", units=2, memory_mib=512)
    version = ModelVersionFactory(model__tenant=tenant)

    first = quota.admit(tenant, cpu_server, version.pk, 1, 256)
    again = quota.admit(tenant, cpu_server, version.pk, 1, 256)

    assert first.pk == again.pk
    assert (first.state, first.device_class, first.units, first.memory_mib) == (
        Placement.State.LOADING, "cpu", 1, 256)


def test_refusals_name_the_resource_the_ask_and_what_is_left(cpu_server):
    tenant = TenantFactory(slug="acme")
    QuotaFactory(tenant=tenant, device_class="cpu", units=2, memory_mib=512)
    quota.admit(tenant, cpu_server, ModelVersionFactory(model__tenant=tenant).pk, 1, 400)

    with pytest.raises(QuotaExceeded) as units:
        quota.admit(tenant, cpu_server, ModelVersionFactory(model__tenant=tenant).pk, 2, 10)
    with pytest.raises(QuotaExceeded) as memory:
        quota.admit(tenant, cpu_server, ModelVersionFactory(model__tenant=tenant).pk, 1, 200)

    assert units.value.field == "quota"
    assert units.value.message == (
        "model instances quota of acme on cpu exceeded: asks 2, 1 left of 2 (short by 1)")
    assert memory.value.message == (
        "host memory quota of acme on cpu exceeded: asks 200 MiB, 112 MiB left of 512 MiB "
        "(short by 88 MiB)")


def test_no_quota_for_the_servers_device_class_is_a_refusal(db):
    node = NodeFactory()
    GPUFactory(node=node, device_class="nvidia-l4", memory_mib=23034)
    server = InferenceServerFactory(cluster=node.cluster, node=node)
    tenant = TenantFactory(slug="acme")
    QuotaFactory(tenant=tenant, device_class="cpu")

    with pytest.raises(QuotaExceeded, match="no quota for device class nvidia-l4"):
        quota.admit(tenant, server, ModelVersionFactory(model__tenant=tenant).pk, 1, 1000)


def test_gpu_memory_of_the_node_is_checked_across_tenants(db):
    node = NodeFactory(name="gpu-node")
    GPUFactory(node=node, device_class="nvidia-l4", memory_mib=1000)
    server = InferenceServerFactory(cluster=node.cluster, node=node)
    a, b = TenantFactory(), TenantFactory()
    for tenant in (a, b):
        QuotaFactory(tenant=tenant, device_class="nvidia-l4", units=4, memory_mib=10_000)
    quota.admit(a, server, ModelVersionFactory(model__tenant=a).pk, 1, 800)

    with pytest.raises(QuotaExceeded, match="node gpu-node has too little free memory: asks 300 MiB, 200 MiB free of 1000 MiB"):
        quota.admit(b, server, ModelVersionFactory(model__tenant=b).pk, 1, 300)


def test_a_gpu_partitioned_into_mig_slices_offers_its_slices_not_itself(db):
    """Of two 80 GB GPUs, one split into two 40 GB slices: the whole-GPU class has one GPU's
    memory on the node, not two."""
    node = NodeFactory(name="gpu-node")
    GPUFactory(node=node, index=0, device_class="nvidia-h100-80gb", memory_mib=80_000)
    split = GPUFactory(node=node, index=1, device_class="nvidia-h100-80gb", memory_mib=80_000)
    for n in range(2):
        GPUFactory(node=node, index=1, parent=split, mig_profile="3g.40gb", memory_mib=40_000,
                   device_class="nvidia-h100-80gb-mig-3g-40gb", uuid=f"MIG-{n}")
    server = InferenceServerFactory(cluster=node.cluster, node=node)
    tenant = TenantFactory()
    for klass in ("nvidia-h100-80gb", "nvidia-h100-80gb-mig-3g-40gb"):
        QuotaFactory(tenant=tenant, device_class=klass, units=8, memory_mib=1_000_000)

    with pytest.raises(QuotaExceeded, match="asks 90000 MiB, 80000 MiB free of 80000 MiB"):
        quota.admit(tenant, server, ModelVersionFactory(model__tenant=tenant).pk, 1, 90_000)
    quota.admit(tenant, server, ModelVersionFactory(model__tenant=tenant).pk, 1, 80_000)


def test_release_gives_the_quota_back_once(cpu_server):
    tenant = TenantFactory()
    limit = QuotaFactory(tenant=tenant, device_class="cpu", units=1, memory_mib=100)
    placement = quota.admit(tenant, cpu_server, ModelVersionFactory(model__tenant=tenant).pk, 1, 100)

    quota.release(placement)
    quota.release(placement)

    assert quota.usage_for([limit])[0].units_used == 0
    quota.admit(tenant, cpu_server, ModelVersionFactory(model__tenant=tenant).pk, 1, 100)


@pytest.mark.django_db(transaction=True)
def test_concurrent_admissions_never_overbook():
    """GIVEN room for 3 instances, WHEN 8 threads admit one each at once, THEN exactly 3 win."""
    node = NodeFactory(memory_mib=1_000_000)
    server = InferenceServerFactory(cluster=node.cluster, node=node)
    tenant = TenantFactory()
    limit = QuotaFactory(tenant=tenant, device_class="cpu", units=3, memory_mib=1_000_000)
    versions = [ModelVersionFactory(model__tenant=tenant).pk for _ in range(8)]
    start = threading.Barrier(len(versions))
    results: list[str] = []

    def admit(version_id: int) -> None:
        start.wait()
        try:
            quota.admit(tenant, server, version_id, 1, 1)
            results.append("admitted")
        except QuotaExceeded:
            results.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=admit, args=(v,)) for v in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(results) == ["admitted"] * 3 + ["refused"] * 5
    assert quota.usage_for([limit])[0].units_used == 3
