"""Every routed API endpoint, by method, by caller: the answer tenancy gives each.

Callers: the least persona whose role is enough (2xx), personas whose role is too low (403
naming the role), charlie of tenant B (404 on tenant A's objects, lists without them, creates
that name them refused 400 on the field), a user with no membership (empty lists) and an
anonymous client (401). Fleet objects are shared: any member reads them, only platform
admins write them (403 for a tenant admin). Quotas are read by their own tenant's members
and written by platform admins only.

The matrix is checked against the routers, so a new endpoint or action fails
``test_the_matrix_covers_every_routed_endpoint`` until it is added here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any

import pytest
from django.db import models
from django.urls import get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.adapters import kube_workloads as kw
from fleet.adapters.base import ServerProbe
from fleet.api.urls import router as fleet_router
from fleet.inventory import health
from fleet.models import (
    GPU,
    APIToken,
    AuditEvent,
    Cluster,
    DevicePrice,
    InferenceServer,
    Node,
    Quota,
    QuotaRequest,
    Tenant,
    TenantNamespace,
    Webhook,
    WebhookDelivery,
)
from fleet.quota import requests as quota_requests
from fleet.tenancy import tokens
from fleet.webhooks.requests import create_webhook
from rollouts.api.urls import router as rollouts_router
from rollouts.models import (
    Alias,
    BenchmarkJob,
    Deployment,
    MetricTemplate,
    Model,
    ModelLoad,
    ModelVersion,
    Rollout,
    Route,
    RouteRevision,
    ServerWorkload,
    SloAlert,
)
from rollouts.registry import approvals
from rollouts.workloads import requests as workloads
from rollouts.workloads import specs as workload_specs
from tests.api.benchmark_rows import finished_job, queued_job
from tests.factories import (
    AliasFactory,
    ClusterFactory,
    DeploymentFactory,
    GPUFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
    NodeFactory,
    QuotaFactory,
    UserFactory,
)
from tests.fixtures import sent_tasks
from tests.fixtures.route_nginx import nginx_static_router

A100 = {kw.PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}
A100_CLASS = "nvidia-a100-80gb"  # the device class of a whole GPU of that product
ANONYMOUS = "anonymous"
LONER = "loner"  # authenticated, member of no tenant
OTHER = "charlie"  # admin of tenant B: the highest role, so every refusal is tenancy's


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fake_probes(monkeypatch):
    """servers/check probes for real; answer at once instead of touching the network."""

    def probe(http_url: str, timeout: float) -> ServerProbe:
        return ServerProbe(ready=False, live=False, error=f"connection refused at {http_url}")

    monkeypatch.setattr(health, "PROBES", dict.fromkeys(InferenceServer.Runtime, probe))


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    """What would go to the broker is kept here: a benchmark or a server workload handed to
    its reconciler (by id), a cluster sync asked for (("sync", cluster id, full))."""
    sent: list[Any] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_benchmark", sent.append)
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_workload", sent.append)
    sent_tasks.catch(monkeypatch, "fleet.tasks.sync_kube_cluster",
                     lambda cluster_id, full=False: sent.append(("sync", cluster_id, full)))
    return sent


class World:
    """Tenant A's and tenant B's objects and the shared fleet, each made on first use."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request

    def persona(self, name: str) -> Any:
        if name == LONER:
            return UserFactory(username="loner")
        return self.request.getfixturevalue(name)

    def client(self, caller: str) -> APIClient:
        client = APIClient()
        if caller != ANONYMOUS:
            client.force_authenticate(self.persona(caller))
        return client

    @cached_property
    def tenant_a(self) -> Tenant:
        return self.persona("tenant_a")

    @cached_property
    def tenant_b(self) -> Tenant:
        return self.persona("tenant_b")

    # --- shared fleet
    @cached_property
    def cluster(self) -> Cluster:
        return ClusterFactory(name="cluster-1")

    @cached_property
    def metric_template(self) -> MetricTemplate:
        return MetricTemplate.objects.create(
            name="error-ratio", query='max(errors{model="{{ model }}"})')

    @cached_property
    def kube_cluster(self) -> Cluster:
        # In-cluster access outside a pod: its connection test fails at once, offline.
        return ClusterFactory(name="kube-1", kind=Cluster.Kind.KUBERNETES, kube_auth="in-cluster")

    @cached_property
    def node(self) -> Node:
        return NodeFactory(cluster=self.cluster, name="node-1")

    @cached_property
    def gpu(self) -> GPU:
        return GPUFactory(node=self.node, index=0, uuid="GPU-matrix-0")

    @cached_property
    def server(self) -> InferenceServer:
        return InferenceServerFactory(cluster=self.cluster, name="server-1")

    @cached_property
    def device_price(self) -> DevicePrice:
        return DevicePrice.objects.create(device_class="nvidia-l4", per_unit_hour=Decimal("0.8"))

    # --- tenant-owned
    @cached_property
    def quota_a(self) -> Quota:
        return QuotaFactory(tenant=self.tenant_a, device_class="cpu")

    @cached_property
    def quota_b(self) -> Quota:
        return QuotaFactory(tenant=self.tenant_b, device_class="cpu")

    @cached_property
    def quota_request_a(self) -> QuotaRequest:
        """Alice asks for 8 cpu instances; pending."""
        return quota_requests.ask(self.persona("alice"), self.tenant_a, "cpu", 8, 4096, "launch")

    @cached_property
    def quota_request_b(self) -> QuotaRequest:
        return quota_requests.ask(self.persona(OTHER), self.tenant_b, "cpu", 8, 4096, "launch")

    @cached_property
    def token_a(self) -> APIToken:
        return tokens.issue(self.persona("alice"), self.tenant_a, "ci-a").token

    @cached_property
    def token_b(self) -> APIToken:
        return tokens.issue(self.persona("charlie"), self.tenant_b, "ci-b").token

    def _event(self, tenant: Tenant) -> AuditEvent:
        return AuditEvent.objects.create(
            tenant=tenant, actor_label="seed", verb="noted", object_type="tests.seed",
            object_id=tenant.slug, object_repr=tenant.slug,
        )

    @cached_property
    def audit_a(self) -> AuditEvent:
        return self._event(self.tenant_a)

    @cached_property
    def audit_b(self) -> AuditEvent:
        return self._event(self.tenant_b)

    @cached_property
    def model_a(self) -> Model:
        return ModelFactory(tenant=self.tenant_a, name="model-a")

    @cached_property
    def model_b(self) -> Model:
        return ModelFactory(tenant=self.tenant_b, name="model-b")

    @cached_property
    def version_a(self) -> ModelVersion:
        return ModelVersionFactory(model=self.model_a, version=1)

    @cached_property
    def pending_a(self) -> ModelVersion:
        """Version 2 of model A, approval requested by dave (so erin may decide)."""
        version = ModelVersionFactory(model=self.model_a, version=2)
        return approvals.request_approval(self.persona("dave"), version)

    @cached_property
    def spare_a(self) -> ModelVersion:
        return ModelVersionFactory(model=self.model_a, version=3)

    @cached_property
    def version_b(self) -> ModelVersion:
        return ModelVersionFactory(model=self.model_b, version=1)

    @cached_property
    def alias_a(self) -> Alias:
        return AliasFactory(model=self.model_a, version=self.version_a, name="staging")

    @cached_property
    def alias_b(self) -> Alias:
        return AliasFactory(model=self.model_b, version=self.version_b, name="staging")

    @cached_property
    def deployment_a(self) -> Deployment:
        return DeploymentFactory(model=self.model_a, cluster=self.cluster, name="dep-a")

    @cached_property
    def deployment_b(self) -> Deployment:
        return DeploymentFactory(model=self.model_b, cluster=self.cluster, name="dep-b")

    @cached_property
    def served_a(self) -> Deployment:
        """Deployment A with a server, so a load can be requested."""
        self.deployment_a.servers.set([self.server])
        return self.deployment_a

    @cached_property
    def split_a(self) -> Deployment:
        """Deployment A on two servers with version 1 ready on the first only: they disagree."""
        self._ready(self.deployment_a, self.version_a)
        self.deployment_a.servers.add(InferenceServerFactory(cluster=self.cluster, name="server-2"))
        return self.deployment_a

    @cached_property
    def load_a(self) -> ModelLoad:
        return ModelLoad.objects.create(
            tenant=self.tenant_a, deployment=self.served_a, server=self.server,
            version=self.version_a, requested_by_label="dave",
        )

    @cached_property
    def load_b(self) -> ModelLoad:
        self.deployment_b.servers.set([self.server])
        return ModelLoad.objects.create(
            tenant=self.tenant_b, deployment=self.deployment_b, server=self.server,
            version=self.version_b, requested_by_label="charlie",
        )

    # --- traffic routes
    def routed(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body``, once the cluster routes through the session's real nginx (a change of a
        route is put in force there)."""
        nginx_static_router(self.cluster, self.request.getfixturevalue("use_route_nginx"))
        return body

    def _ready(self, deployment: Deployment, version: ModelVersion) -> Deployment:
        deployment.servers.set([self.server])
        ModelLoad.objects.create(
            tenant=deployment.tenant, deployment=deployment, server=self.server,
            version=version, state=ModelLoad.State.READY, requested_by_label="seed",
        )
        return deployment

    def _route(self, deployment: Deployment, version: ModelVersion) -> Route:
        """A route in force sending everything to ``version`` on the server (as a row)."""
        variant = f"v{version.version}-{self.server.name}"
        route = Route.objects.create(
            deployment=self._ready(deployment, version), name=f"dep-{deployment.pk}",
            protocol="kserve-v2", state=Route.State.IN_FORCE, revision=1,
            url="http://127.0.0.1:9", variants={variant: {
                "version_id": version.pk, "version": version.version,
                "server_id": self.server.pk, "server": self.server.name}},
            spec={"name": f"dep-{deployment.pk}", "protocol": "kserve-v2", "policy": "weighted",
                  "sticky_header": "", "mirror": None, "variants": [{
                      "name": variant, "upstream": self.server.http_url, "weight": 100,
                      "model": deployment.model.name, "version": version.version}]},
        )
        RouteRevision.objects.create(route=route, number=1, spec=route.spec,
                                     variants=route.variants, weights={str(version.version): 100},
                                     actor_label="seed", result=RouteRevision.Result.APPLIED)
        return route

    @cached_property
    def routable_a(self) -> Deployment:
        """Deployment A with version 1 ready on the server, and no route yet."""
        return self._ready(self.deployment_a, self.version_a)

    @cached_property
    def route_a(self) -> Route:
        return self._route(self.deployment_a, self.version_a)

    @cached_property
    def route_b(self) -> Route:
        return self._route(self.deployment_b, self.version_b)

    # --- SLO alerts (as the SLO tick writes them)
    def _slo_alert(self, deployment: Deployment) -> SloAlert:
        now = timezone.now()
        return SloAlert.objects.create(deployment=deployment, rule="fast_burn", sli="errors", summary="burning",
                                       burn_long=20.0, burn_short=30.0, peak_burn=30.0, opened_at=now)

    @cached_property
    def slo_alert_a(self) -> SloAlert:
        return self._slo_alert(self.deployment_a)

    @cached_property
    def slo_alert_b(self) -> SloAlert:
        return self._slo_alert(self.deployment_b)

    # --- webhooks (public names, as a webhook must have: no test here delivers)
    @cached_property
    def webhook_a(self) -> Webhook:
        return create_webhook(self.persona("alice"), self.tenant_a, name="hook-a",
                              url="https://hooks.example.com/hook-a").webhook

    @cached_property
    def webhook_b(self) -> Webhook:
        return create_webhook(self.persona("charlie"), self.tenant_b, name="hook-b",
                              url="https://hooks.example.com/hook-b").webhook

    # --- rollouts (rows as the domain writes them; the reconciler is not run)
    def _rollout(self, deployment: Deployment, baseline: ModelVersion, state: str,
                 candidate: ModelVersion | None = None) -> Rollout:
        requester = self.persona("dave" if deployment.tenant == self.tenant_a else "charlie")
        return Rollout.objects.create(
            tenant=deployment.tenant, deployment=deployment, baseline=baseline,
            candidate=candidate, state=state, steps=[{"set_weight": 10}, {"analysis": {}}],
            requires_approval=state == Rollout.State.PENDING_APPROVAL,
            requested_by=requester, requested_by_label=requester.username,
        )

    @cached_property
    def rollout_a(self) -> Rollout:
        """A canary of version 3 of model A against version 1, progressing."""
        return self._rollout(self.deployment_a, self.version_a, Rollout.State.PROGRESSING,
                             self.spare_a)

    @cached_property
    def rollout_b(self) -> Rollout:
        return self._rollout(self.deployment_b, self.version_b, Rollout.State.PROGRESSING,
                             ModelVersionFactory(model=self.model_b, version=2))

    @cached_property
    def paused_a(self) -> Rollout:
        return self._rollout(self.deployment_a, self.version_a, Rollout.State.PAUSED,
                             self.spare_a)

    @cached_property
    def pending_rollout_a(self) -> Rollout:
        """Asked for by dave, so erin may approve it."""
        return self._rollout(self.deployment_a, self.version_a, Rollout.State.PENDING_APPROVAL,
                             self.spare_a)

    @cached_property
    def aborted_a(self) -> Rollout:
        return self._rollout(self.deployment_a, self.version_a, Rollout.State.ABORTED,
                             self.spare_a)

    # --- benchmark jobs (rows as the reconciler leaves them; no sweep is run)
    @cached_property
    def benchmark_a(self) -> BenchmarkJob:
        """A benchmark of version 1 on deployment A's server, queued."""
        return queued_job(self.served_a, self.version_a, requested_by_label="dave")

    @cached_property
    def benchmark_b(self) -> BenchmarkJob:
        self.deployment_b.servers.set([self.server])
        return finished_job(self.deployment_b, self.version_b, server=self.server)

    @cached_property
    def sweep_a(self) -> BenchmarkJob:
        """A finished config sweep of version 1 over two instance counts."""
        return finished_job(self.served_a, self.version_a, configs=[
            {"instance_group": [{"count": n, "kind": "KIND_CPU"}]} for n in (1, 2)])

    # --- servers on Kubernetes: workloads written by the domain (quota admitted), made ready
    # as the reconciler would leave them; the reconciler is not run, so no request here ever
    # reaches a Kubernetes API
    @cached_property
    def gpu_quota_a(self) -> Quota:
        return QuotaFactory(tenant=self.tenant_a, device_class=A100_CLASS, units=8,
                            memory_mib=8 * 81920)

    @cached_property
    def gpu_quota_b(self) -> Quota:
        return QuotaFactory(tenant=self.tenant_b, device_class=A100_CLASS, units=8,
                            memory_mib=8 * 81920)

    @cached_property
    def namespace_a(self) -> TenantNamespace:
        """Namespace team-a on the Kubernetes cluster, granted to tenant A: its servers go
        there."""
        return TenantNamespace.objects.create(tenant=self.tenant_a, cluster=self.kube_cluster,
                                              namespace="team-a")

    @cached_property
    def namespace_b(self) -> TenantNamespace:
        return TenantNamespace.objects.create(tenant=self.tenant_b, cluster=self.kube_cluster,
                                              namespace="team-b")

    def _kube_deployment(self, tenant: Tenant, name: str, runtime: str) -> Deployment:
        """A deployment of a model of its own (v1 and v2, one GPU each) on the Kubernetes
        cluster, with the tenant's A100 quota and namespace; vLLM versions name their weights
        by label."""
        _ = self.gpu_quota_a if tenant == self.tenant_a else self.gpu_quota_b
        _ = self.namespace_a if tenant == self.tenant_a else self.namespace_b
        model = ModelFactory(tenant=tenant, name=name)
        for number in (1, 2):
            vllm = runtime == ModelVersion.Runtime.VLLM
            ModelVersionFactory(
                model=model, version=number, runtime=runtime, backend="" if vllm else "python",
                gpus=1, estimated_gpu_memory_mib=20480,
                labels={workload_specs.VLLM_MODEL_LABEL: f"meta-llama/Llama-3.{number}-8B-Instruct"}
                if vllm else {},
            )
        return DeploymentFactory(model=model, cluster=self.kube_cluster, name=name)

    @cached_property
    def kube_deployment_a(self) -> Deployment:
        return self._kube_deployment(self.tenant_a, "scorer-a", ModelVersion.Runtime.TRITON)

    @cached_property
    def kube_deployment_b(self) -> Deployment:
        return self._kube_deployment(self.tenant_b, "scorer-b", ModelVersion.Runtime.TRITON)

    @cached_property
    def vllm_deployment_a(self) -> Deployment:
        return self._kube_deployment(self.tenant_a, "chat-a", ModelVersion.Runtime.VLLM)

    def _workload(self, deployment: Deployment, name: str, *, ready: bool = True) -> ServerWorkload:
        """v1 of the deployment's model on one A100, asked for through the domain; ``ready``:
        as the reconciler leaves it once the pods are up (the manifest it applied kept)."""
        actor = self.persona("dave" if deployment.tenant == self.tenant_a else OTHER)
        version = deployment.model.versions.get(version=1)
        triton = version.runtime == ModelVersion.Runtime.TRITON
        workload, _ = workloads.create_workload(
            deployment, version, actor, name=name, node_selector=A100,
            model_repository="s3://models/x" if triton else "",
        )
        if ready:
            ServerWorkload.objects.filter(pk=workload.pk).update(
                state=ServerWorkload.State.READY, detail="seed: every replica available",
                applied_spec=kw.deployment_manifest(workload_specs.server_spec(workload)),
                observed={"replicas": 1, "updated": 1, "ready": 1, "available": 1},
            )
        return fresh(workload)

    @cached_property
    def workload_a(self) -> ServerWorkload:
        return self._workload(self.kube_deployment_a, "triton-a")

    @cached_property
    def workload_b(self) -> ServerWorkload:
        return self._workload(self.kube_deployment_b, "triton-b")

    @cached_property
    def vllm_workload_a(self) -> ServerWorkload:
        """A vLLM server running v1 of chat-a, so it can be rolled to v2."""
        return self._workload(self.vllm_deployment_a, "vllm-a")

    @cached_property
    def pending_workload_a(self) -> ServerWorkload:
        """Asked for and not applied yet: in flight."""
        return self._workload(self.kube_deployment_a, "triton-pending", ready=False)


@pytest.fixture
def world(request, db) -> World:
    return World(request)


def fresh(obj: models.Model) -> Any:
    return type(obj)._base_manager.get(pk=obj.pk)


def gone(obj: models.Model) -> bool:
    return not type(obj)._base_manager.filter(pk=obj.pk).exists()


@dataclass(frozen=True)
class Op:
    """One routed (basename, action, method) and what each caller should get from it.

    ``writer``: None (a read, or an action any member may take), "role" (the tenant ``role``
    is needed) or "platform" (platform admins only). ``scope``: "tenant" or "fleet".
    """

    basename: str
    action: str
    method: str
    path: str  # e.g. "models/" or "versions/{version_a}/approve/"
    model: type[models.Model]
    own: str
    ok: int
    scope: str = "tenant"
    writer: str | None = None
    role: str | None = None
    below: tuple[str, ...] = ()
    payload: Callable[[World], dict[str, Any]] | None = None
    rows: tuple[str, str | None] | None = None  # list: (tenant A's row, tenant B's row)
    field: str | None = None  # a foreign create is refused naming this field
    foreign: int | None = None  # what another tenant and a loner get, where not the default
    done: Callable[[World, Any], bool] | None = None  # the success left this effect

    def target(self, world: World) -> models.Model | None:
        if "{" not in self.path:
            return None
        return getattr(world, self.path.split("{")[1].split("}")[0])

    def url(self, world: World) -> str:
        target = self.target(world)
        name = self.path.split("{")[1].split("}")[0] if target is not None else None
        path = self.path.replace(f"{{{name}}}", str(target.pk)) if target is not None else self.path
        return f"/api/v1/{path}"

    def expectations(self) -> list[tuple[str, int]]:
        """(caller, status) for every caller this endpoint is tried with."""
        denied_writer = self.writer == "platform"
        if denied_writer or self.action == "list":
            other = 403 if denied_writer else 200
            loner = other
        elif self.foreign is not None:
            other = loner = self.foreign
        elif self.scope == "fleet":
            other, loner = 200, 404
        elif self.action == "create":
            other = loner = 400
        else:
            other = loner = 404
        below = self.below or (("alice", "bob") if denied_writer else ())
        return [
            (self.own, self.ok),
            (ANONYMOUS, 401),
            *[(persona, 403) for persona in below],
            (OTHER, other),
            (LONER, loner),
        ]


def read_ops(basename: str, prefix: str, model: type[models.Model], rows: tuple[str, str | None],
             scope: str = "tenant", hidden: frozenset[str] = frozenset()) -> list[Op]:
    """list and retrieve; ``hidden``: fields a member never reads (platform admins only)."""
    done = (lambda w, body: not any(hidden & set(row) for row in body.get("results", [body]))
            ) if hidden else None
    return [
        Op(basename, "list", "GET", f"{prefix}/", model, "bob", 200, scope=scope, rows=rows,
           done=done),
        Op(basename, "retrieve", "GET", f"{prefix}/{{{rows[0]}}}/", model, "bob", 200,
           scope=scope, done=done),
    ]


#: What members never read of shared clusters and servers (tests/api/test_inventory_visibility.py).
CLUSTER_PLATFORM_FIELDS = frozenset({
    "api_url", "s3_endpoint_url", "kube_auth", "kube_context", "kube_ca_bundle",
    "kube_secret_env", "kube_secret_hint", "connection_detail", "sync_detail"})
SERVER_PLATFORM_FIELDS = frozenset({"metrics_url", "model_repository", "log_path"})


def platform_write_ops(basename: str, prefix: str, model: type[models.Model], target: str,
                       create: Callable[[World], dict[str, Any]],
                       update: Callable[[World], dict[str, Any]],
                       patch: dict[str, Any], scope: str = "fleet") -> list[Op]:
    """create / update / partial_update / destroy, for platform admins only."""
    item = f"{prefix}/{{{target}}}/"

    def updated(data: Callable[[World], dict[str, Any]]) -> Callable[[World, Any], bool]:
        def check(world: World, body: Any) -> bool:
            row = fresh(getattr(world, target))
            return all(getattr(row, k) == v for k, v in data(world).items()
                       if not isinstance(getattr(row, k), models.Model))
        return check

    return [
        Op(basename, "create", "POST", f"{prefix}/", model, "root", 201, scope=scope,
           writer="platform", payload=create,
           done=lambda w, body: model._base_manager.filter(pk=body["id"]).exists()),
        Op(basename, "update", "PUT", item, model, "root", 200, scope=scope, writer="platform",
           payload=update, done=updated(update)),
        Op(basename, "partial_update", "PATCH", item, model, "root", 200, scope=scope,
           writer="platform", payload=lambda w: patch, done=updated(lambda w: patch)),
        Op(basename, "destroy", "DELETE", item, model, "root", 204, scope=scope,
           writer="platform", done=lambda w, body: gone(getattr(w, target))),
    ]


VERSION_7 = {
    "version": 7, "artifact_uri": "s3://models/model-a/7.tar.gz", "sha256": "ab" * 32,
    "size_bytes": 10, "runtime": "triton", "backend": "python",
}

OPS: list[Op] = [
    # --- fleet: tenants, tokens, quotas, inventory, audit
    Op("tenant", "list", "GET", "tenants/", Tenant, "bob", 200, rows=("tenant_a", "tenant_b")),
    Op("tenant", "retrieve", "GET", "tenants/{tenant_a}/", Tenant, "bob", 200,
       done=lambda w, body: body["role"] == "viewer"),
    # A viewer may list the tenant's tokens: names, prefixes and states, never secrets.
    Op("token", "list", "GET", "tokens/", APIToken, "bob", 200, rows=("token_a", "token_b"),
       done=lambda w, body: all("token" not in row and "digest" not in row
                                for row in body["results"])),
    Op("token", "retrieve", "GET", "tokens/{token_a}/", APIToken, "bob", 200,
       done=lambda w, body: "token" not in body and "digest" not in body),
    Op("token", "create", "POST", "tokens/", APIToken, "alice", 201, writer="role", role="admin",
       below=("erin", "bob"), field="tenant",
       payload=lambda w: {"tenant": w.tenant_a.slug, "name": "deploy-bot", "role": "deployer"},
       done=lambda w, body: body["token"].startswith("sy_")
       and APIToken.objects.filter(pk=body["id"], tenant=w.tenant_a).exists()),
    Op("token", "destroy", "DELETE", "tokens/{token_a}/", APIToken, "alice", 204, writer="role",
       role="admin", below=("erin", "bob"), done=lambda w, body: fresh(w.token_a).state == "revoked"),
    # Kubernetes namespaces granted to tenants: members read their own, platform admins write.
    *read_ops("tenantnamespace", "tenant-namespaces", TenantNamespace,
              ("namespace_a", "namespace_b")),
    *platform_write_ops(
        "tenantnamespace", "tenant-namespaces", TenantNamespace, "namespace_a", scope="tenant",
        create=lambda w: {"tenant": w.tenant_a.slug, "cluster": w.kube_cluster.name,
                          "namespace": "team-a-batch"},
        update=lambda w: {"tenant": w.tenant_a.slug, "cluster": None, "namespace": "team-a2"},
        patch={"namespace": "team-a3"},
    ),
    *read_ops("quota", "quotas", Quota, ("quota_a", "quota_b")),
    # Admission's explained decision: any member of the quota's tenant may ask.
    Op("quota", "admission", "GET", "quotas/{quota_a}/admission/", Quota, "bob", 200,
       payload=lambda w: {"units": 1, "memory_mib": 64},
       done=lambda w, body: body["admitted"] is True and body["explanation"].startswith("needs 1")),
    # Quota requests: a tenant's admin asks; platform admins decide.
    *read_ops("quotarequest", "quota-requests", QuotaRequest, ("quota_request_a", "quota_request_b")),
    Op("quotarequest", "create", "POST", "quota-requests/", QuotaRequest, "alice", 201,
       writer="role", role="admin", below=("erin", "bob"), field="tenant",
       payload=lambda w: {"tenant": w.tenant_a.slug, "device_class": "cpu", "units": 16,
                          "memory_mib": 8192, "reason": "black friday"},
       done=lambda w, body: QuotaRequest.objects.filter(pk=body["id"], state="pending").exists()),
    Op("quotarequest", "approve", "POST", "quota-requests/{quota_request_a}/approve/", QuotaRequest,
       "root", 200, writer="platform", payload=lambda w: {"units": 6},
       done=lambda w, body: Quota.objects.get(tenant=w.tenant_a, device_class="cpu").units == 6),
    Op("quotarequest", "refuse", "POST", "quota-requests/{quota_request_a}/refuse/", QuotaRequest,
       "root", 200, writer="platform", payload=lambda w: {"reason": "no capacity"},
       done=lambda w, body: fresh(w.quota_request_a).state == "refused"),
    *platform_write_ops(
        "quota", "quotas", Quota, "quota_a", scope="tenant",
        create=lambda w: {"tenant": w.tenant_a.slug, "device_class": "nvidia-l4", "units": 2,
                          "memory_mib": 1024},
        update=lambda w: {"tenant": w.tenant_a.slug, "device_class": "cpu", "units": 99,
                          "memory_mib": 2048},
        patch={"units": 99},
    ),
    *read_ops("cluster", "clusters", Cluster, ("cluster", None), scope="fleet",
              hidden=CLUSTER_PLATFORM_FIELDS),
    # Metric templates: written by platform admins in the admin, read by every member.
    *read_ops("metric-template", "metric-templates", MetricTemplate, ("metric_template", None),
              scope="fleet"),
    *platform_write_ops(
        "cluster", "clusters", Cluster, "cluster",
        create=lambda w: {"name": "gpu-west", "kind": "static"},
        update=lambda w: {"name": "cluster-1", "kind": "static", "description": "changed"},
        patch={"description": "changed"},
    ),
    *read_ops("node", "nodes", Node, ("node", None), scope="fleet"),
    *platform_write_ops(
        "node", "nodes", Node, "node",
        create=lambda w: {"cluster": w.cluster.pk, "name": "node-new", "cpu_cores": 8},
        update=lambda w: {"cluster": w.cluster.pk, "name": "node-1", "hostname": "changed"},
        patch={"hostname": "changed"},
    ),
    *read_ops("gpu", "gpus", GPU, ("gpu", None), scope="fleet"),
    *platform_write_ops(
        "gpu", "gpus", GPU, "gpu",
        create=lambda w: {"node": w.node.pk, "index": 1, "uuid": "GPU-new", "model": "NVIDIA L4",
                          "device_class": "nvidia-l4", "memory_mib": 24576},
        update=lambda w: {"node": w.node.pk, "index": 0, "uuid": "GPU-matrix-0",
                          "model": "NVIDIA A100", "device_class": "nvidia-a100-80gb",
                          "memory_mib": 40960},
        patch={"memory_mib": 40960},
    ),
    *read_ops("server", "servers", InferenceServer, ("server", None), scope="fleet",
              hidden=SERVER_PLATFORM_FIELDS),
    *platform_write_ops(
        "server", "servers", InferenceServer, "server",
        create=lambda w: {"cluster": w.cluster.pk, "name": "server-new", "runtime": "vllm",
                          "http_url": "http://127.0.0.1:8000"},
        update=lambda w: {"cluster": w.cluster.pk, "name": "server-1", "runtime": "triton",
                          "http_url": "http://127.0.0.1:9", "grpc_url": "changed:8001"},
        patch={"grpc_url": "changed:8001"},
    ),
    # Device prices: every member reads them, platform admins set them.
    *read_ops("deviceprice", "device-prices", DevicePrice, ("device_price", None), scope="fleet"),
    *platform_write_ops(
        "deviceprice", "device-prices", DevicePrice, "device_price",
        create=lambda w: {"device_class": "nvidia-h100", "per_unit_hour": 4.5, "currency": "USD"},
        update=lambda w: {"device_class": "nvidia-l4", "per_unit_hour": 1.25, "currency": "EUR"},
        patch={"currency": "EUR"},
    ),
    # Probing a server is open to any member: it refreshes observed health, typed in by no one.
    Op("server", "check", "POST", "servers/{server}/check/", InferenceServer, "bob", 200,
       scope="fleet", done=lambda w, body: body["health"] == "unreachable"
       and fresh(w.server).last_checked_at is not None and not SERVER_PLATFORM_FIELDS & set(body)),
    # Kubernetes clusters: any member reads the sync history; platform admins test and sync.
    Op("cluster", "syncs", "GET", "clusters/{cluster}/syncs/", Cluster, "bob", 200,
       scope="fleet"),
    Op("cluster", "test_connection", "POST", "clusters/{kube_cluster}/test-connection/", Cluster,
       "root", 200, scope="fleet", writer="platform",
       done=lambda w, body: body["ok"] is False
       and fresh(w.kube_cluster).connection_state == "failed"),
    Op("cluster", "sync", "POST", "clusters/{kube_cluster}/sync/", Cluster, "root", 202,
       scope="fleet", writer="platform",
       done=lambda w, body: w.request.getfixturevalue("no_broker")
       == [("sync", w.kube_cluster.pk, True)]),
    *read_ops("auditevent", "audit-events", AuditEvent, ("audit_a", "audit_b")),
    *read_ops("sloalert", "slo-alerts", SloAlert, ("slo_alert_a", "slo_alert_b")),
    # The export streams what the caller may read; other tenants and loners get their own (none
    # of tenant A's).
    Op("auditevent", "export", "GET", "audit-events/export/?as=jsonl", AuditEvent, "bob", 200,
       foreign=200, rows=("audit_a", "audit_b"), done=lambda w, body: {r["id"] for r in body} >= {w.audit_a.pk}
       and w.audit_b.pk not in {r["id"] for r in body}),
    # Webhooks: members read them (never the secret, only its prefix); admins write and test.
    Op("webhook", "list", "GET", "webhooks/", Webhook, "bob", 200, rows=("webhook_a", "webhook_b"),
       done=lambda w, body: all("secret" not in row and row["secret_prefix"].endswith("…")
                                for row in body["results"])),
    Op("webhook", "retrieve", "GET", "webhooks/{webhook_a}/", Webhook, "bob", 200,
       done=lambda w, body: "secret" not in body),
    Op("webhook", "deliveries", "GET", "webhooks/{webhook_a}/deliveries/", Webhook, "bob", 200),
    Op("webhook", "create", "POST", "webhooks/", Webhook, "alice", 201, writer="role",
       role="admin", below=("erin", "bob"), field="tenant",
       payload=lambda w: {"tenant": w.tenant_a.slug, "name": "ops",
                          "url": "https://hooks.example.com/ops",
                          "events": ["rollout.rolled_back"]},
       done=lambda w, body: body["secret"].startswith("whsec_")
       and Webhook.objects.filter(pk=body["id"], tenant=w.tenant_a).exists()),
    Op("webhook", "update", "PUT", "webhooks/{webhook_a}/", Webhook, "alice", 200, writer="role",
       role="admin", below=("erin", "bob"),
       payload=lambda w: {"name": "hook-a", "url": "https://hooks.example.com/changed",
                         "format": "slack"},
       done=lambda w, body: fresh(w.webhook_a).url == "https://hooks.example.com/changed"),
    Op("webhook", "partial_update", "PATCH", "webhooks/{webhook_a}/", Webhook, "alice", 200,
       writer="role", role="admin", below=("erin", "bob"), payload=lambda w: {"active": False},
       done=lambda w, body: fresh(w.webhook_a).active is False),
    Op("webhook", "destroy", "DELETE", "webhooks/{webhook_a}/", Webhook, "alice", 204,
       writer="role", role="admin", below=("erin", "bob"), done=lambda w, body: gone(w.webhook_a)),
    Op("webhook", "test", "POST", "webhooks/{webhook_a}/test/", WebhookDelivery, "alice", 202,
       writer="role", role="admin", below=("erin", "bob"),
       done=lambda w, body: WebhookDelivery.objects.filter(
           pk=body["id"], webhook=w.webhook_a, event="ping", state="pending").exists()),
    # --- registry
    *read_ops("model", "models", Model, ("model_a", "model_b")),
    Op("model", "create", "POST", "models/", Model, "dave", 201, writer="role", role="deployer",
       below=("bob",), field="tenant", payload=lambda w: {"tenant": w.tenant_a.slug, "name": "new-model"},
       done=lambda w, body: Model.objects.filter(pk=body["id"], tenant=w.tenant_a).exists()),
    Op("model", "update", "PUT", "models/{model_a}/", Model, "dave", 200, writer="role",
       role="deployer", below=("bob",),
       payload=lambda w: {"name": "model-a", "description": "changed"},
       done=lambda w, body: fresh(w.model_a).description == "changed"),
    Op("model", "partial_update", "PATCH", "models/{model_a}/", Model, "dave", 200,
       writer="role", role="deployer", below=("bob",), payload=lambda w: {"description": "changed"},
       done=lambda w, body: fresh(w.model_a).description == "changed"),
    *read_ops("version", "versions", ModelVersion, ("version_a", "version_b")),
    Op("version", "create", "POST", "versions/", ModelVersion, "dave", 201, writer="role",
       role="deployer", below=("bob",), field="model",
       payload=lambda w: {"model": w.model_a.pk, **VERSION_7},
       done=lambda w, body: ModelVersion.objects.filter(model=w.model_a, version=7).exists()),
    Op("version", "request_approval", "POST", "versions/{version_a}/request-approval/",
       ModelVersion, "dave", 200, writer="role", role="deployer", below=("bob",),
       payload=lambda w: {}, done=lambda w, body: body["status"] == "pending_approval"),
    Op("version", "approve", "POST", "versions/{pending_a}/approve/", ModelVersion, "erin", 200,
       writer="role", role="approver", below=("dave", "bob"),
       payload=lambda w: {"reason": "benchmarks are fine"},
       done=lambda w, body: fresh(w.pending_a).status == "approved"),
    Op("version", "reject", "POST", "versions/{pending_a}/reject/", ModelVersion, "erin", 200,
       writer="role", role="approver", below=("dave", "bob"),
       payload=lambda w: {"reason": "p99 regressed"},
       done=lambda w, body: fresh(w.pending_a).status == "rejected"),
    Op("version", "archive", "POST", "versions/{version_a}/archive/", ModelVersion, "erin", 200,
       writer="role", role="approver", below=("dave", "bob"), payload=lambda w: {},
       done=lambda w, body: fresh(w.version_a).status == "archived"),
    # What a version costs is read by any member of its tenant.
    Op("version", "cost", "GET", "versions/{version_a}/cost/", ModelVersion, "bob", 200,
       done=lambda w, body: body["version"] == w.version_a.pk),
    *read_ops("alias", "aliases", Alias, ("alias_a", "alias_b")),
    # POST sets an alias: 201 when it creates it (200 when it moves one: test_registry_api).
    Op("alias", "create", "POST", "aliases/", Alias, "dave", 201, writer="role", role="deployer",
       below=("bob",), field="model",
       payload=lambda w: {"model": w.model_a.pk, "name": "canary", "version": w.version_a.version},
       done=lambda w, body: Alias.objects.filter(model=w.model_a, name="canary").exists()),
    Op("alias", "update", "PUT", "aliases/{alias_a}/", Alias, "dave", 200, writer="role",
       role="deployer", below=("bob",),
       payload=lambda w: {"model": w.model_a.pk, "name": "staging", "version": w.spare_a.version},
       done=lambda w, body: fresh(w.alias_a).version_id == w.spare_a.pk),
    Op("alias", "partial_update", "PATCH", "aliases/{alias_a}/", Alias, "dave", 200,
       writer="role", role="deployer", below=("bob",),
       payload=lambda w: {"version": w.spare_a.version},
       done=lambda w, body: fresh(w.alias_a).version_id == w.spare_a.pk),
    Op("alias", "destroy", "DELETE", "aliases/{alias_a}/", Alias, "dave", 204, writer="role",
       role="deployer", below=("bob",), done=lambda w, body: gone(w.alias_a)),
    # --- deployments
    Op("deployment", "list", "GET", "deployments/", Deployment, "bob", 200,
       rows=("deployment_a", "deployment_b")),
    Op("deployment", "retrieve", "GET", "deployments/{deployment_a}/", Deployment, "bob", 200),
    Op("deployment", "create", "POST", "deployments/", Deployment, "dave", 201, writer="role",
       role="deployer", below=("bob",), field="model",
       payload=lambda w: {"model": w.model_a.pk, "name": "new-dep", "cluster": w.cluster.name},
       done=lambda w, body: Deployment.objects.filter(tenant=w.tenant_a, name="new-dep").exists()),
    Op("deployment", "update", "PUT", "deployments/{deployment_a}/", Deployment, "dave", 200,
       writer="role", role="deployer", below=("bob",),
       payload=lambda w: {"model": w.model_a.pk, "name": "dep-a", "cluster": w.cluster.name,
                          "description": "changed"},
       done=lambda w, body: fresh(w.deployment_a).description == "changed"),
    Op("deployment", "partial_update", "PATCH", "deployments/{deployment_a}/", Deployment, "dave",
       200, writer="role", role="deployer", below=("bob",),
       payload=lambda w: {"description": "changed"},
       done=lambda w, body: fresh(w.deployment_a).description == "changed"),
    Op("deployment", "latency", "GET", "deployments/{deployment_a}/latency/", Deployment, "bob", 200),
    Op("deployment", "consistency", "GET", "deployments/{split_a}/consistency/", Deployment, "bob",
       200, done=lambda w, body: body["state"] == "inconsistent"),
    Op("deployment", "converge", "POST", "deployments/{split_a}/converge/", Deployment, "dave", 202,
       writer="role", role="deployer", below=("bob",), payload=lambda w: {"reason": "agree"},
       done=lambda w, body: ModelLoad.objects.filter(
           deployment=w.deployment_a, server__name="server-2", state="pending").exists()),
    # --- model loads
    *read_ops("load", "loads", ModelLoad, ("load_a", "load_b")),
    Op("load", "create", "POST", "loads/", ModelLoad, "dave", 202, writer="role",
       role="deployer", below=("bob",), field="deployment",
       payload=lambda w: {"deployment": w.served_a.pk, "version": w.version_a.version},
       done=lambda w, body: ModelLoad.objects.filter(
           deployment=w.deployment_a, version=w.version_a, state="pending").exists()),
    # --- traffic routes (a route's id is its deployment's)
    *read_ops("route", "routes", Route, ("route_a", "route_b")),
    Op("route", "revisions", "GET", "routes/{route_a}/revisions/", Route, "bob", 200,
       done=lambda w, body: [r["number"] for r in body["results"]] == [1]),
    Op("route", "create", "POST", "routes/", Route, "dave", 201, writer="role", role="deployer",
       below=("bob",), field="deployment",
       payload=lambda w: w.routed({"deployment": w.routable_a.pk}),
       done=lambda w, body: fresh(w.routable_a).route.version_weights == {1: 100}),
    Op("route", "update", "PUT", "routes/{routable_a}/", Route, "dave", 200, writer="role",
       role="deployer", below=("bob",),
       payload=lambda w: w.routed({"weights": {"1": 100}, "reason": "all on v1"}),
       done=lambda w, body: Route.objects.get(pk=w.routable_a.pk).state == "in_force"),
    Op("route", "partial_update", "PATCH", "routes/{route_a}/", Route, "dave", 200,
       writer="role", role="deployer", below=("bob",),
       payload=lambda w: w.routed({"policy": "least-pending"}),
       done=lambda w, body: fresh(w.route_a).policy == "least-pending"
       and fresh(w.route_a).version_weights == {1: 100}),
    Op("route", "destroy", "DELETE", "routes/{route_a}/", Route, "dave", 204, writer="role",
       role="deployer", below=("bob",), payload=lambda w: w.routed({}),
       done=lambda w, body: fresh(w.route_a).state == "removed"),
    # --- rollouts (pause, resume, promote and abort are carried out by the next tick: 202)
    *read_ops("rollout", "rollouts", Rollout, ("rollout_a", "rollout_b")),
    Op("rollout", "create", "POST", "rollouts/", Rollout, "dave", 201, writer="role",
       role="deployer", below=("bob",), field="deployment",
       payload=lambda w: w.routed({"deployment": w.routable_a.pk, "version": w.spare_a.version}),
       done=lambda w, body: Rollout.objects.filter(
           pk=body["id"], deployment=w.deployment_a, state="loading").exists()),
    Op("rollout", "cost", "GET", "rollouts/{rollout_a}/cost/", Rollout, "bob", 200,
       done=lambda w, body: "change_pct" in body),
    Op("rollout", "pause", "POST", "rollouts/{rollout_a}/pause/", Rollout, "dave", 202,
       writer="role", role="deployer", below=("bob",), payload=lambda w: {"reason": "look"},
       done=lambda w, body: fresh(w.rollout_a).requested_action == "pause"),
    Op("rollout", "resume", "POST", "rollouts/{paused_a}/resume/", Rollout, "dave", 202,
       writer="role", role="deployer", below=("bob",), payload=lambda w: {},
       done=lambda w, body: fresh(w.paused_a).requested_action == "resume"),
    Op("rollout", "promote", "POST", "rollouts/{rollout_a}/promote/", Rollout, "dave", 202,
       writer="role", role="deployer", below=("bob",), payload=lambda w: {},
       done=lambda w, body: fresh(w.rollout_a).requested_action == "promote"),
    Op("rollout", "abort", "POST", "rollouts/{rollout_a}/abort/", Rollout, "dave", 202,
       writer="role", role="deployer", below=("bob",), payload=lambda w: {"reason": "p99"},
       done=lambda w, body: fresh(w.rollout_a).requested_action == "abort"),
    Op("rollout", "approve", "POST", "rollouts/{pending_rollout_a}/approve/", Rollout, "erin",
       200, writer="role", role="approver", below=("dave", "bob"), payload=lambda w: {},
       done=lambda w, body: fresh(w.pending_rollout_a).state == "loading"),
    Op("rollout", "retry", "POST", "rollouts/{aborted_a}/retry/", Rollout, "dave", 200,
       writer="role", role="deployer", below=("bob",), payload=lambda w: {},
       done=lambda w, body: (fresh(w.aborted_a).state, fresh(w.aborted_a).attempt)
       == ("loading", 2)),
    # --- benchmark jobs (a cancel is carried out by the next tick: 202)
    *read_ops("benchmark", "benchmarks", BenchmarkJob, ("benchmark_a", "benchmark_b")),
    Op("benchmark", "create", "POST", "benchmarks/", BenchmarkJob, "dave", 201, writer="role",
       role="deployer", below=("bob",), field="deployment",
       payload=lambda w: w.quota_a and {"deployment": w.served_a.pk,
                                        "version": w.version_a.version,
                                        "levels": [1, 2], "duration_s": 1},
       done=lambda w, body: BenchmarkJob.objects.filter(
           pk=body["id"], deployment=w.deployment_a, state="queued", levels=[1, 2]).exists()),
    Op("benchmark", "cancel", "POST", "benchmarks/{benchmark_a}/cancel/", BenchmarkJob, "dave",
       202, writer="role", role="deployer", below=("bob",), payload=lambda w: {},
       done=lambda w, body: fresh(w.benchmark_a).cancel_requested_by == "dave"),
    Op("benchmark", "results", "GET", "benchmarks/{sweep_a}/results/", BenchmarkJob, "bob", 200,
       done=lambda w, body: [c["label"] for c in body["configs"]] == ["1 instance", "2 instances"]),
    Op("benchmark", "register_config", "POST", "benchmarks/{sweep_a}/register-config/",
       ModelVersion, "dave", 201, writer="role", role="deployer", below=("bob",),
       payload=lambda w: {"config": 1},
       done=lambda w, body: ModelVersion.objects.get(model=w.model_a, version=body["version"])
       .labels["benchmark_job"] == str(w.sweep_a.pk)),
    # A job named in a query another tenant cannot see is a 400 naming the parameter.
    Op("benchmark", "compare", "GET", "benchmarks/compare/", BenchmarkJob, "bob", 200,
       field="a", foreign=400,
       payload=lambda w: {"a": w.sweep_a.pk, "b": w.benchmark_a.pk},
       done=lambda w, body: (body["a"]["id"], body["b"]["id"]) == (w.sweep_a.pk,
                                                                   w.benchmark_a.pk)),
    # --- servers on Kubernetes (scale, roll and delete are carried out by the reconciler: 202)
    *read_ops("workload", "workloads", ServerWorkload, ("workload_a", "workload_b")),
    Op("workload", "create", "POST", "workloads/", ServerWorkload, "dave", 201, writer="role",
       role="deployer", below=("bob",), field="deployment",
       payload=lambda w: {"deployment": w.kube_deployment_a.pk, "version": 1,
                          "name": "triton-new", "node_selector": A100,
                          "model_repository": "s3://models/x"},
       done=lambda w, body: ServerWorkload.objects.filter(
           pk=body["id"], deployment=w.kube_deployment_a, state="pending",
           placement__device_class=A100_CLASS).exists()),
    Op("workload", "scale", "POST", "workloads/{workload_a}/scale/", ServerWorkload, "dave", 202,
       writer="role", role="deployer", below=("bob",), payload=lambda w: {"replicas": 2},
       done=lambda w, body: (fresh(w.workload_a).replicas, fresh(w.workload_a).state)
       == (2, "applying")),
    Op("workload", "roll", "POST", "workloads/{vllm_workload_a}/roll/", ServerWorkload, "dave",
       202, writer="role", role="deployer", below=("bob",), payload=lambda w: {"version": 2},
       done=lambda w, body: (body["version"], body["previous_version"], body["state"])
       == (2, 1, "applying")),
    Op("workload", "destroy", "DELETE", "workloads/{workload_a}/", ServerWorkload, "dave", 202,
       writer="role", role="deployer", below=("bob",),
       done=lambda w, body: fresh(w.workload_a).state == "deleting"),
    # Deleting a deployment needs the admin role: deployers create and edit only.
    Op("deployment", "destroy", "DELETE", "deployments/{deployment_a}/", Deployment, "alice", 204,
       writer="role", role="admin", below=("erin", "dave", "bob"),
       done=lambda w, body: gone(w.deployment_a)),
]


def routed_endpoints() -> set[tuple[str, str, str]]:
    """(basename, action, HTTP method) for every route the two API routers serve."""
    found = set()
    for router in (fleet_router, rollouts_router):
        for _prefix, viewset, basename in router.registry:
            for route in router.get_routes(viewset):
                for method, action in route.mapping.items():
                    if hasattr(viewset, action):
                        found.add((basename, action, method.upper()))
    return found


def mounted_endpoints() -> set[tuple[str, str, str]]:
    """The same, read from what the URLconf actually serves under /api/v1/."""
    _prefix, resolver = get_resolver().namespace_dict["api"]
    found = set()
    for pattern in resolver.url_patterns:
        actions = getattr(pattern.callback, "actions", None) or {}
        basename = getattr(pattern.callback, "initkwargs", {}).get("basename")
        # DRF adds "head" (a copy of "get") to this dict once a GET has been served.
        found.update((basename, action, method.upper()) for method, action in actions.items()
                     if method != "head")
    return found


def test_the_matrix_covers_every_routed_endpoint():
    covered = {(op.basename, op.action, op.method) for op in OPS}
    assert covered == routed_endpoints()
    assert covered == mounted_endpoints()
    assert len(covered) == len(OPS), "an endpoint is listed twice"


def cases() -> list[Any]:
    params = []
    for op in OPS:
        for caller, status in op.expectations():
            params.append(pytest.param(op, caller, status,
                                       id=f"{op.basename}-{op.action}-{caller}-{status}"))
    return params


def table_state(op: Op) -> tuple[list[dict[str, Any]], int]:
    """Every row of the endpoint's table, and how many audit events exist."""
    rows = list(op.model._base_manager.order_by("pk").values())
    return rows, AuditEvent.objects.count()


@pytest.mark.parametrize(("op", "caller", "status"), cases())
def test_tenancy(world, op, caller, status):
    url = op.url(world)
    payload = op.payload(world) if op.payload else None
    mine, theirs = (getattr(world, name) if name else None for name in op.rows or (None, None))
    client = world.client(caller)
    before = table_state(op)

    response = getattr(client, op.method.lower())(url, payload, format="json")

    # An export streams JSON Lines: its body is the list of their objects.
    content = b"".join(response.streaming_content) if response.streaming else response.content
    assert response.status_code == status, content
    if response.streaming:
        body = [json.loads(line) for line in content.splitlines()]
    else:
        body = response.json() if content else None
    if status >= 400:
        # A refused call changes nothing, and records nothing.
        assert table_state(op) == before
    if status == 401:
        assert body == {"detail": "Authentication credentials were not provided."}
        assert response["WWW-Authenticate"] == 'Bearer realm="api"'
    elif status == 403:
        expected = (
            "only platform admins may change" if op.writer == "platform"
            else f"this needs the {op.role} role in the tenant"
        )
        assert expected in body["detail"]
    elif status == 404:
        assert body["detail"].startswith("No ")
        assert body["detail"].endswith("matches the given query.")
    elif status == 400:
        assert list(body) == [op.field], body
    elif op.action == "list":
        ids = {row["id"] for row in body["results"]}
        if caller == LONER:
            assert body["results"] == []
        elif op.scope == "fleet":
            assert mine.pk in ids
        elif caller == OTHER:
            assert theirs.pk in ids
            assert mine.pk not in ids
        else:
            assert mine.pk in ids
            assert theirs.pk not in ids
    elif op.action == "retrieve":
        assert body["id"] == op.target(world).pk
    if 200 <= status < 300 and caller == op.own and op.done is not None:
        assert op.done(world, body)
