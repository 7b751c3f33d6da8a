"""What the server-workload tests share: a Kubernetes cluster, a deployment on it, quota,
and an in-memory stand-in for the workload adapter's API calls.

The adapter's calls are proven against recorded exchanges with a real API server
(test_workload_adapter.py); the domain tests put :class:`FakeKube` in their place so the
reconciler can be driven through every state, including pods becoming ready, which no
recording holds. It keeps what was applied, counts generations as the API server does (a
change to the spec or to ``metadata.annotations`` is a new generation, one to the labels
alone is not: ``09-deployment-generation``), and answers each read with a status the test
sets.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from fleet.adapters import kube_workloads as kw
from fleet.adapters.kubernetes import KubeError
from fleet.inventory import kube_connection
from fleet.models import Cluster, Tenant, TenantNamespace
from rollouts.models import ModelVersion
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    ModelFactory,
    ModelVersionFactory,
    QuotaFactory,
)
from tests.fixtures import sent_tasks

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
A100_CLASS = "nvidia-a100-80gb"
H100_CLASS = "nvidia-h100-80gb"


def new_generation(before: dict[str, Any] | None, manifest: dict[str, Any]) -> bool:
    """Whether applying ``manifest`` over ``before`` bumps a Deployment's generation, as the
    real API server does (09): on creation, a spec change, or a change of
    ``metadata.annotations``; not for a change of ``metadata.labels`` alone."""
    if before is None:
        return True
    def annotations(obj: dict[str, Any]) -> dict[str, str]:
        return obj["metadata"].get("annotations") or {}
    return before["spec"] != manifest["spec"] or annotations(before) != annotations(manifest)


@dataclass
class FakeKube:
    """The workload adapter's API calls, kept in memory (see the module docstring)."""

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    generations: dict[tuple[str, str], int] = field(default_factory=dict)
    statuses: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    failures: dict[str, list[Exception]] = field(default_factory=dict)
    hooks: dict[str, Any] = field(default_factory=dict)

    def fail(self, op: str, *errors: Exception) -> None:
        """The next calls of ``op`` (apply-Deployment, apply-Service, scale, read,
        delete-Deployment, delete-Service) raise ``errors``, one each."""
        self.failures.setdefault(op, []).extend(errors)

    def _call(self, op: str, namespace: str, name: str) -> None:
        self.calls.append((op, namespace, name))
        if op in self.hooks:
            self.hooks.pop(op)()
        queued = self.failures.get(op)
        if queued:
            raise queued.pop(0)

    def ops(self, *names: str) -> list[str]:
        return [op for op, _ns, _name in self.calls if not names or op in names]

    # -- the adapter's functions --------------------------------------------------------

    def apply(self, access: Any, manifest: dict[str, Any]) -> dict[str, Any]:
        kind, meta = manifest["kind"], manifest["metadata"]
        key = (meta["namespace"], meta["name"])
        self._call(f"apply-{kind}", *key)
        before = self.objects.get((kind, *key))
        self.objects[(kind, *key)] = copy.deepcopy(manifest)
        if kind == "Deployment" and new_generation(before, manifest):
            self.generations[key] = self.generations.get(key, 0) + 1
        return self._object(kind, key)

    def scale(self, access: Any, namespace: str, name: str, replicas: int) -> dict[str, Any]:
        self._call("scale", namespace, name)
        found = self.objects.get(("Deployment", namespace, name))
        if found is None:
            raise KubeError("not found (404 NotFound)", kind="not_found", status=404)
        if found["spec"]["replicas"] != replicas:
            found["spec"]["replicas"] = replicas
            self.generations[(namespace, name)] += 1
        return {"kind": "Scale", "spec": {"replicas": replicas}}

    def read(self, access: Any, namespace: str, name: str) -> dict[str, Any]:
        self._call("read", namespace, name)
        if ("Deployment", namespace, name) not in self.objects:
            raise KubeError(f'deployments.apps "{name}" not found (404 NotFound)',
                            kind="not_found", status=404)
        return self._object("Deployment", (namespace, name))

    def delete_deployment(self, access: Any, namespace: str, name: str) -> bool:
        self._call("delete-Deployment", namespace, name)
        return self.objects.pop(("Deployment", namespace, name), None) is not None

    def delete_service(self, access: Any, namespace: str, name: str) -> bool:
        self._call("delete-Service", namespace, name)
        return self.objects.pop(("Service", namespace, name), None) is not None

    def _object(self, kind: str, key: tuple[str, str]) -> dict[str, Any]:
        found = copy.deepcopy(self.objects[(kind, *key)])
        if kind == "Deployment":
            found["metadata"]["generation"] = self.generations[key]
            found["status"] = copy.deepcopy(self.statuses.get(key, {}))
        return found

    # -- what controllers would do -------------------------------------------------------

    def deployment(self, namespace: str, name: str) -> dict[str, Any]:
        return self.objects[("Deployment", namespace, name)]

    def pods_ready(self, namespace: str, name: str) -> None:
        """The controller rolled the current generation out: every replica available."""
        replicas = self.deployment(namespace, name)["spec"]["replicas"]
        counts = {"replicas": replicas, "updatedReplicas": replicas,
                  "readyReplicas": replicas, "availableReplicas": replicas}
        self.statuses[(namespace, name)] = {
            "observedGeneration": self.generations[(namespace, name)],
            **{k: v for k, v in counts.items() if v},
        }

    def pods_stuck(self, namespace: str, name: str) -> None:
        """The controller gave up on the current generation: ProgressDeadlineExceeded."""
        self.statuses[(namespace, name)] = {
            "observedGeneration": self.generations[(namespace, name)],
            "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1,
            "unavailableReplicas": 1,
            "conditions": [{"type": "Progressing", "status": "False",
                            "reason": "ProgressDeadlineExceeded",
                            "message": f'ReplicaSet "{name}-5d8f" has timed out progressing.'}],
        }


@pytest.fixture
def fake_kube(monkeypatch) -> FakeKube:
    fake = FakeKube()
    for name in ("apply", "scale", "read", "delete_deployment", "delete_service"):
        monkeypatch.setattr(kw, name, getattr(fake, name))
    return fake


@pytest.fixture(autouse=True)
def enqueued_workloads(monkeypatch) -> list[int]:
    """Tests advance workloads by calling the reconciler; what would go to the broker is
    kept here."""
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_workload", sent.append)
    return sent


def make_kube_cluster(name: str = "gpu-cluster", url: str = "https://kube.example:6443",
                      token: str = "switchyard-test-token") -> Cluster:
    cluster = ClusterFactory(name=name, kind=Cluster.Kind.KUBERNETES,
                             kube_auth=Cluster.KubeAuth.TOKEN, api_url=url,
                             kube_namespace="serving", s3_region="us-east-1")
    kube_connection.set_secret(cluster, token)
    cluster.save()
    return cluster


@pytest.fixture
def kube_cluster(db) -> Cluster:
    return make_kube_cluster()


def grant(tenant: Tenant, cluster: Cluster | None, namespace: str = "serving") -> None:
    """A platform admin's grant of ``namespace`` on ``cluster`` (None: every cluster)."""
    TenantNamespace.objects.get_or_create(tenant=tenant, cluster=cluster, namespace=namespace)


@pytest.fixture
def fraud(tenant_a, kube_cluster):
    """Tenant A's Triton model fraud-scorer (v1 and v2, 1 GPU and 20 GiB each), deployed on
    the Kubernetes cluster (namespace serving granted), with quota for 4 A100s (80 GiB) and 2
    MIG 3g.40gb slices."""
    grant(tenant_a, kube_cluster)
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    versions = [ModelVersionFactory(model=model, version=n, gpus=1,
                                    estimated_gpu_memory_mib=20480) for n in (1, 2)]
    deployment = DeploymentFactory(model=model, tenant=tenant_a, cluster=kube_cluster,
                                   name="fraud-scorer")
    QuotaFactory(tenant=tenant_a, device_class=A100_CLASS, units=4, memory_mib=81920)
    QuotaFactory(tenant=tenant_a, device_class=f"{H100_CLASS}-mig-3g-40gb", units=2,
                 memory_mib=81920)
    return deployment, versions


@pytest.fixture
def chat(tenant_a, kube_cluster):
    """Tenant A's vLLM model llm-chat: base versions v1 (8B, 1 GPU) and v2 (8B, 1 GPU) with
    their weights named by label, deployed on the cluster (namespace serving granted), with
    quota for 4 H100s."""
    grant(tenant_a, kube_cluster)
    model = ModelFactory(tenant=tenant_a, name="llm-chat")
    versions = [
        ModelVersionFactory(
            model=model, version=n, runtime=ModelVersion.Runtime.VLLM, backend="", gpus=1,
            estimated_gpu_memory_mib=40960,
            labels={"vllm.model": f"meta-llama/Llama-3.{n}-8B-Instruct",
                    "vllm.args": "--enable-lora --max-loras 4 --gpu-memory-utilization 0.90",
                    "vllm.hf_token_secret": "hf-token"},
        )
        for n in (1, 2)
    ]
    deployment = DeploymentFactory(model=model, tenant=tenant_a, cluster=kube_cluster,
                                   name="llm-chat")
    QuotaFactory(tenant=tenant_a, device_class=H100_CLASS, units=4, memory_mib=4 * 81920)
    return deployment, versions


TRITON_REQUEST = {"name": "triton-fraud-v1", "replicas": 2, "node_selector": A100,
                  "model_repository": "s3://switchyard-models/fraud-scorer"}
VLLM_REQUEST = {"name": "vllm-llama", "replicas": 1, "node_selector": H100}
