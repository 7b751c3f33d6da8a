"""The beat tick that syncs every Kubernetes cluster, one task each (fleet.tasks)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from fleet import tasks
from fleet.inventory import kube_connection, kube_sync
from fleet.models import Cluster, ClusterSync, Node
from tests.factories import ClusterFactory
from tests.kube.replay import RecordedApiServer, exchanges
from tests.kube.test_kube_sync import DISCOVERY, make_cluster, recent_list

pytestmark = pytest.mark.django_db


def test_only_kubernetes_clusters_with_their_connection_details_are_synced():
    ready = make_cluster("http://127.0.0.1:9", name="token-ready")
    in_cluster = ClusterFactory(name="in-cluster", kind=Cluster.Kind.KUBERNETES,
                                kube_auth=Cluster.KubeAuth.IN_CLUSTER)
    kubeconfig = ClusterFactory(name="kubeconfig", kind=Cluster.Kind.KUBERNETES,
                                kube_auth=Cluster.KubeAuth.KUBECONFIG)
    kube_connection.set_secret(kubeconfig, "apiVersion: v1\nkind: Config\n")
    kubeconfig.save()
    # Rows saved without their details (as a half-edited row could be): skipped.
    ClusterFactory(name="no-token", kind=Cluster.Kind.KUBERNETES,
                   kube_auth=Cluster.KubeAuth.TOKEN, api_url="http://127.0.0.1:9")
    ClusterFactory(name="no-auth", kind=Cluster.Kind.KUBERNETES)
    ClusterFactory(name="static", kind=Cluster.Kind.STATIC)
    assert sorted(kube_sync.clusters_to_sync()) == sorted(
        [ready.pk, in_cluster.pk, kubeconfig.pk])


def test_the_tick_runs_one_sync_per_cluster_and_a_failing_one_stops_none(monkeypatch):
    sent = []

    def run_now(task, *args):  # the worker, in-line
        sent.append((task.name, args))
        task(*args)
        return True

    monkeypatch.setattr("fleet.tasks.send_now", run_now)
    # The first cluster's API refuses the token; the second answers.
    with RecordedApiServer(exchanges("06-auth-errors", 0)) as refusing, \
            RecordedApiServer(exchanges("02-nodes", 4) + exchanges(*DISCOVERY)) as answering, \
            override_settings(SWITCHYARD_KUBE_PAGE_SIZE=0):
        bad = make_cluster(refusing.url, name="a-refusing")
        good = make_cluster(answering.url, name="b-answering")
        assert tasks.sync_kube_clusters() == 2
        refusing.assert_all_matched()
        answering.assert_all_matched()
    assert sent == [("fleet.tasks.sync_kube_cluster", (bad.pk,)),
                    ("fleet.tasks.sync_kube_cluster", (good.pk,))]
    bad.refresh_from_db()
    good.refresh_from_db()
    assert bad.sync_state == Cluster.SyncState.FAILED
    assert good.sync_state == Cluster.SyncState.OK
    assert Node.objects.filter(cluster=good).count() == 4
    assert ClusterSync.objects.filter(cluster=bad, ok=False).count() == 1


def test_the_task_for_a_cluster_that_is_no_longer_kubernetes_does_nothing():
    static = ClusterFactory(name="static", kind=Cluster.Kind.STATIC)
    tasks.sync_kube_cluster(static.pk)
    tasks.sync_kube_cluster(static.pk + 1000)
    assert not ClusterSync.objects.exists()


def test_a_full_sync_lists_even_when_a_watch_would_do():
    """"Sync now": the cluster was listed a moment ago, yet the task lists again."""
    with override_settings(SWITCHYARD_KUBE_PAGE_SIZE=0), \
            RecordedApiServer(exchanges("02-nodes", 4) + exchanges(*DISCOVERY)) as srv:
        cluster = make_cluster(srv.url)
        recent_list(cluster, "200")
        tasks.sync_kube_cluster(cluster.pk, full=True)
        srv.assert_all_matched()
        assert srv.unused == []
    newest = ClusterSync.objects.filter(cluster=cluster).first()
    assert newest.kind == ClusterSync.Kind.LIST and newest.resource_version == "207"
