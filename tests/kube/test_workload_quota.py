"""Quota for servers on Kubernetes: admission on a named device class, and resizing."""

from __future__ import annotations

import pytest

from console.exceptions import QuotaExceeded
from fleet.models import Placement
from fleet.quota import admission as quota
from tests.factories import (
    ClusterFactory,
    GPUFactory,
    InferenceServerFactory,
    ModelVersionFactory,
    NodeFactory,
    QuotaFactory,
)

A100 = "nvidia-a100-80gb"


@pytest.fixture
def world(tenant_a):
    """A server with no node (the scheduler places its pods), tenant A's quota of 4 A100s
    and 80 GiB, and two versions."""
    server = InferenceServerFactory(cluster=ClusterFactory(name="kube"), name="triton-a")
    QuotaFactory(tenant=tenant_a, device_class=A100, units=4, memory_mib=81920)
    versions = [ModelVersionFactory(model__tenant=tenant_a) for _ in range(2)]
    return server, versions


def test_admission_charges_the_class_it_is_given_not_the_servers_node(tenant_a, world):
    server, (v1, _v2) = world

    placement = quota.admit_on_class(tenant_a, server, v1.pk, A100, 2, 40960)

    assert (placement.device_class, placement.units, placement.memory_mib) == (A100, 2, 40960)
    assert placement.state == Placement.State.LOADING
    assert quota.device_class_of(server) == "cpu"  # what admit() would have charged


def test_admission_is_idempotent_per_server_and_version(tenant_a, world):
    server, (v1, _v2) = world

    first = quota.admit_on_class(tenant_a, server, v1.pk, A100, 2, 40960)
    again = quota.admit_on_class(tenant_a, server, v1.pk, A100, 2, 40960)

    assert again.pk == first.pk
    assert Placement.objects.count() == 1


def test_admission_beyond_the_quota_is_refused_with_the_numbers(tenant_a, world):
    server, (v1, v2) = world
    quota.admit_on_class(tenant_a, server, v1.pk, A100, 3, 20480)

    with pytest.raises(QuotaExceeded) as units:
        quota.admit_on_class(tenant_a, server, v2.pk, A100, 2, 1024)
    with pytest.raises(QuotaExceeded) as memory:
        quota.admit_on_class(tenant_a, server, v2.pk, A100, 1, 61441)

    assert units.value.message == ("GPUs quota of tenant-a on nvidia-a100-80gb exceeded: asks 2, "
                                   "1 left of 4 (short by 1)")
    assert memory.value.message == ("GPU memory quota of tenant-a on nvidia-a100-80gb exceeded: "
                                    "asks 61441 MiB, 61440 MiB left of 81920 MiB (short by 1 MiB)")
    assert Placement.objects.count() == 1


def test_a_class_without_quota_is_refused(tenant_a, world):
    server, (v1, _v2) = world

    with pytest.raises(QuotaExceeded, match="no quota for device class nvidia-h100-80gb"):
        quota.admit_on_class(tenant_a, server, v1.pk, "nvidia-h100-80gb", 1, 1)


def test_a_node_is_not_asked_for_room(tenant_a, world):
    """Admission on a class ignores the node a server may have: the scheduler decides."""
    server, (v1, _v2) = world
    server.node = NodeFactory(cluster=server.cluster)
    server.save()
    GPUFactory(node=server.node, memory_mib=1024)

    placement = quota.admit_on_class(tenant_a, server, v1.pk, A100, 2, 40960)

    assert placement.memory_mib == 40960


def test_growing_a_placement_is_admitted_for_the_difference(tenant_a, world):
    server, (v1, _v2) = world
    placement = quota.admit_on_class(tenant_a, server, v1.pk, A100, 2, 40960)

    quota.resize(placement, 4, 81920)

    assert (placement.units, placement.memory_mib) == (4, 81920)


def test_growing_beyond_the_quota_is_refused_and_changes_nothing(tenant_a, world):
    server, (v1, _v2) = world
    placement = quota.admit_on_class(tenant_a, server, v1.pk, A100, 2, 40960)

    with pytest.raises(QuotaExceeded) as refused:
        quota.resize(placement, 5, 40960)

    assert refused.value.message == ("GPUs quota of tenant-a on nvidia-a100-80gb exceeded: asks 3 "
                                     "more, 2 left of 4 (short by 1)")
    placement.refresh_from_db()
    assert (placement.units, placement.memory_mib) == (2, 40960)


def test_shrinking_always_fits_even_above_a_lowered_quota(tenant_a, world):
    server, (v1, _v2) = world
    placement = quota.admit_on_class(tenant_a, server, v1.pk, A100, 4, 81920)
    tenant_a.quotas.filter(device_class=A100).update(units=1, memory_mib=1)

    quota.resize(placement, 3, 61440)

    assert (placement.units, placement.memory_mib) == (3, 61440)


def test_a_released_placement_cannot_be_resized(tenant_a, world):
    server, (v1, _v2) = world
    placement = quota.admit_on_class(tenant_a, server, v1.pk, A100, 1, 1)
    quota.release(placement)

    with pytest.raises(QuotaExceeded, match="released"):
        quota.resize(placement, 2, 2)
