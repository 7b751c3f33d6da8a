"""A Kubernetes cluster end to end, as its users meet it, over a real kube-apiserver's answers.

A platform admin adds the cluster through the API and tests its connection; the sync (what
the worker runs) brings its GPU nodes and MIG slices, and a watch keeps them in step; the
admin gives a tenant quota; a deployer runs a Triton server on the cluster, admitted against
that quota, and the cluster's Gateway API router moves a route's weights.

Every request goes to one RecordedApiServer holding, in order, the exchanges recorded from a
real kube-apiserver (tests/kube/recorded): each request must be one the real server received.
One request was never recorded: the server-side apply of the workload's Service (only
Services created by POST were). It is validated against the official client's V1Service
model and answered with the recorded answer to a Service's creation; the test says so where
it happens.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client, override_settings
from kubernetes import client as k8s
from rest_framework.test import APIClient

from fleet import tasks as fleet_tasks
from fleet.adapters import kube_workloads as kw
from fleet.adapters.routers.base import KSERVE_V2, RouteSpec, Variant
from fleet.inventory.routers import router_for
from fleet.models import GPU, Cluster, InferenceServer, Node, Placement
from rollouts.models import ModelVersion, ServerWorkload
from rollouts.workloads import reconciler as workload_reconciler
from tests.factories import DeploymentFactory, ModelFactory, ModelVersionFactory
from tests.fixtures import sent_tasks
from tests.kube.replay import GOOD_TOKEN, RecordedApiServer, by_switchyard, exchanges
from tests.kube.schemas import HTTPROUTE_V1BETA1, validate_builtin, validate_custom

pytestmark = pytest.mark.django_db

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def service_apply(spec: kw.ServerSpec) -> dict[str, Any]:
    """The one unrecorded request: the Service's server-side apply, validated against the
    client's model, answered as the real server answered a Service's creation (03 #4)."""
    body = kw.service_manifest(spec)
    validate_builtin(body, k8s.V1Service)
    created = exchanges("03-deployments", 4)[0]
    deployment_apply = exchanges("03-deployments", 34)[0]
    return {
        "note": "server-side apply of the workload's Service / answered as 03 #4",
        "method": "PATCH",
        "path": f"/api/v1/namespaces/{spec.namespace}/services/{spec.name}",
        "query": deployment_apply["query"],
        "request_headers": deployment_apply["request_headers"],
        "request_body": body,
        "status": 201,
        "response_headers": created["response_headers"],
        "response_body": created["response_body"],
    }


def api(user) -> APIClient:
    caller = APIClient()
    caller.force_authenticate(user)
    return caller


def test_an_admin_adds_a_cluster_its_gpus_sync_a_deployer_runs_triton_and_weights_move(
    root, dave, tenant_a, monkeypatch
):
    # The sync and the workload's steps run here, as the worker runs them.
    sent_tasks.catch(monkeypatch, fleet_tasks.sync_kube_cluster, lambda *args: None)
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_workload", lambda *args: None)
    model = ModelFactory(tenant=tenant_a, name="fraud_scorer")
    ModelVersionFactory(model=model, version=3, gpus=1, estimated_gpu_memory_mib=20480,
                        status=ModelVersion.Status.APPROVED)
    spec_v3 = kw.ServerSpec(
        name="triton-fraud-v3", namespace="serving", runtime=kw.TRITON,
        deployment="fraud-scorer", version=3, image="nvcr.io/nvidia/tritonserver:24.08-py3",
        replicas=1, node_selector=A100, gpu_resource="nvidia.com/gpu", gpus=1,
        model_repository="s3://switchyard-models/fraud-scorer/v3",
        env=[{"name": "AWS_REGION", "value": "us-east-1"}], load_models=["fraud_scorer"],
    )
    script = (
        exchanges("01-server-discovery", 0) + exchanges("02-nodes", 4)  # test connection
        + exchanges("02-nodes", 20) + exchanges("03-deployments", 11)  # sync: list
        + exchanges("02-nodes", 21)  # sync: watch
        + exchanges("03-deployments", 34) + [service_apply(spec_v3)]  # the Triton server
        + [by_switchyard(e) for e in exchanges("04-gateway-api", 0, 1, 27, 28)]  # weights
    )
    with RecordedApiServer(script) as srv:
        # 1. A platform admin adds the cluster; the token is stored, never shown back.
        added = api(root).post("/api/v1/clusters/", {
            "name": "gpu-east", "kind": "kubernetes", "kube_auth": "token",
            "api_url": srv.url, "kube_secret": GOOD_TOKEN, "kube_namespace": "serving",
            "kube_router": "gateway-api", "kube_gateway": "serving/inference-gw",
            "kube_route_host": "example", "s3_region": "us-east-1",
        }, format="json")
        assert added.status_code == 201, added.json()
        assert GOOD_TOKEN not in json.dumps(added.json())
        cluster = Cluster.objects.get(pk=added.json()["id"])

        tested = api(root).post(f"/api/v1/clusters/{cluster.pk}/test-connection/")
        assert tested.status_code == 200
        assert tested.json()["ok"] is True
        assert tested.json()["server_version"] == "v1.24.0-alpha.1+ab451280a0ea81"

        # 2. "Sync now" queues a full sync; the worker lists the nodes and the servers.
        assert api(root).post(f"/api/v1/clusters/{cluster.pk}/sync/").status_code == 202
        with override_settings(SWITCHYARD_KUBE_PAGE_SIZE=0):
            fleet_tasks.sync_kube_cluster(cluster.pk, True)
        nodes = api(dave).get("/api/v1/nodes/", {"cluster": cluster.pk}).json()["results"]
        assert sorted(n["name"] for n in nodes) == ["cpu-01", "gpu-a100-01", "gpu-h100-01",
                                                    "gpu-l4-01"]
        l4 = next(n for n in nodes if n["name"] == "gpu-l4-01")
        assert l4["ready"] is False and l4["zone"] == "us-east-1b"
        h100 = Node.objects.get(cluster=cluster, name="gpu-h100-01")
        assert GPU.objects.filter(node=h100, parent__isnull=True).count() == 8
        assert GPU.objects.filter(node=h100, mig_profile="3g.40gb").count() == 2
        assert GPU.objects.filter(node=h100, mig_profile="1g.10gb").count() == 7
        page = Client()
        page.force_login(dave)
        html = page.get(f"/fleet/clusters/{cluster.pk}/").content.decode()
        times = "\N{MULTIPLICATION SIGN}"
        assert f"8 {times} NVIDIA-H100-80GB-HBM3" in html and "6 whole" in html
        assert (f"MIG: 2 {times} 3g.40gb <code>nvidia-h100-80gb-mig-3g-40gb</code>, "
                f"7 {times} 1g.10gb") in html

        # 3. The next tick watches from where the list ended: a node comes and goes, the
        #    H100's MIG layout changes, and the inventory follows.
        with override_settings(SWITCHYARD_KUBE_SYNC_INTERVAL_S=32.0):
            fleet_tasks.sync_kube_cluster(cluster.pk)
        cluster.refresh_from_db()
        assert cluster.nodes_resource_version == "215"
        assert Node.objects.get(cluster=cluster, name="gpu-l4-02").is_gone
        assert not GPU.objects.filter(node=h100, mig_profile="1g.10gb").exists()
        syncs = api(dave).get(f"/api/v1/clusters/{cluster.pk}/syncs/").json()["results"]
        assert [s["kind"] for s in syncs] == ["watch", "list"]
        assert syncs[0]["added"] == ["node gpu-l4-02"] and syncs[0]["gone"] == ["node gpu-l4-02"]

        # 4. The admin gives tenant A two A100s; a deployer asks for a Triton server of v3.
        quota = api(root).post("/api/v1/quotas/", {
            "tenant": tenant_a.slug, "device_class": "nvidia-a100-80gb", "units": 2,
            "memory_mib": 40960}, format="json")
        assert quota.status_code == 201, quota.json()
        deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=cluster,
                                       name="fraud-scorer")
        request = {"deployment": deployment.pk, "version": 3, "name": "triton-fraud-v3",
                   "node_selector": A100,
                   "model_repository": "s3://switchyard-models/fraud-scorer/v3"}
        # Servers run only in the namespaces a platform admin granted the tenant: none yet.
        ungranted = api(dave).post("/api/v1/workloads/", {**request, "replicas": 1},
                                   format="json")
        assert ungranted.status_code == 400
        assert "has no Kubernetes namespace on cluster gpu-east" in ungranted.json()[
            "namespace"][0]
        granted = api(root).post("/api/v1/tenant-namespaces/", {
            "tenant": tenant_a.slug, "cluster": cluster.name, "namespace": "serving"},
            format="json")
        assert granted.status_code == 201, granted.json()
        too_many = api(dave).post("/api/v1/workloads/", {**request, "replicas": 3},
                                  format="json")
        assert too_many.status_code == 409
        assert "asks 3, 2 left of 2 (short by 1)" in too_many.json()["quota"][0]
        created = api(dave).post("/api/v1/workloads/", {**request, "replicas": 1},
                                 format="json")
        assert created.status_code == 201, created.json()
        workload = ServerWorkload.objects.get(pk=created.json()["id"])
        assert (workload.placement.units, workload.placement.device_class) == (
            1, "nvidia-a100-80gb")

        # 5. The worker applies it (server-side apply, field manager switchyard).
        workload = workload_reconciler.run_to_end(workload.pk, max_steps=2)
        assert workload.state == ServerWorkload.State.PROGRESSING, workload.error
        assert workload.applied_spec == exchanges("03-deployments", 34)[0]["request_body"]

        # 6. The cluster's router moves the route between the discovered servers of v1 and
        #    v2 (one write of the HTTPRoute, carrying the resourceVersion it read).
        router = router_for(cluster)
        servers = {s.kube_name: s.http_url
                   for s in InferenceServer.objects.filter(cluster=cluster,
                                                           source="discovered")}
        result = router.apply(RouteSpec("fraud-scorer", KSERVE_V2, (
            Variant("v1-triton-fraud-v1", servers["triton-fraud-v1"], 100, model="fraud",
                    version=1),
            Variant("v2-triton-fraud-v2", servers["triton-fraud-v2"], 0, model="fraud",
                    version=2),
        )))
        assert result.changed
        assert "weights in force triton-fraud-v1 100, triton-fraud-v2 0" in result.message

        srv.assert_all_matched()
        assert srv.unused == []
    [route_write] = [r.body for r in srv.received if r.method == "PUT"]
    validate_custom(route_write, HTTPROUTE_V1BETA1)
    validate_builtin(workload.applied_spec, k8s.V1Deployment)
    assert Placement.objects.filter(server=workload.server, state="loading").count() == 1
