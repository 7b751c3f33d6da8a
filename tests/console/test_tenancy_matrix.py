"""Every console URL, by method and htmx, by persona: the answer tenancy gives each.

Personas: tenant A's viewer (bob), deployer (dave), approver (erin) and admin (alice); the
platform admin (root); charlie, admin of tenant B; a user of no tenant (loner); and an
anonymous browser. What each gets:

- anonymous: a redirect to the login page that comes back here; an htmx request instead gets
  401 with ``HX-Redirect`` to that page, so a polling partial never swaps the login form in;
- too low a role in tenant A: 403 with a page naming the role needed, and nothing changed;
- pages for platform admins only (``role=PLATFORM``: adding, editing, testing and syncing
  clusters): root gets them; every tenant role, tenant B's admin included, gets 403 saying
  only platform admins may change this; the loner gets 404 where the URL names a cluster
  (no cluster is shown to someone of no tenant) and 403 where it names none;
- tenant A's objects seen from tenant B (or from no tenant): 404; lists: 200 without them.
  Fleet objects (servers, clusters) are shared by every member, so charlie sees them;
- enough of a role: 200 (a POST: 302 back to the page) and the action really happened. A
  polling partial with nothing left to follow answers 286 (htmx stops polling) instead; a
  page that does not apply to its object answers 404 to everyone (``ok=(404,)``).

The matrix is checked against the URL resolver, so a console URL without an entry here
fails ``test_the_matrix_covers_every_console_url``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from fleet.adapters.base import ServerProbe
from fleet.inventory import health
from fleet.models import (
    APIToken,
    AuditEvent,
    Cluster,
    InferenceServer,
    Membership,
    Placement,
    QuotaRequest,
    Webhook,
    WebhookDelivery,
)
from rollouts.benchmarks.forms import BenchmarkActionForm
from rollouts.canary.forms import RolloutActionForm
from rollouts.models import (
    BenchmarkJob,
    Deployment,
    Model,
    ModelLoad,
    ModelVersion,
    Rollout,
    Route,
    ServerWorkload,
)
from rollouts.registry import approvals
from rollouts.registry.forms import VersionActionForm
from rollouts.workloads.forms import WorkloadActionForm
from tests.api.test_tenancy_matrix import World as ApiWorld
from tests.api.test_tenancy_matrix import fresh, gone
from tests.factories import ModelVersionFactory
from tests.fixtures import sent_tasks

Role = Membership.Role
ANONYMOUS = "anonymous"
LONER = "loner"  # logged in, member of no tenant
OTHER = "charlie"  # admin of tenant B: the highest role, so every refusal is tenancy's
ROOT = "root"  # platform admin
PLATFORM = "platform"  # a Page's role when only platform admins may call it
TENANT_A = {"bob": Role.VIEWER, "dave": Role.DEPLOYER, "erin": Role.APPROVER, "alice": Role.ADMIN}
PERSONAS = [ANONYMOUS, *TENANT_A, ROOT, OTHER, LONER]
# URLs outside the console: the API has its own matrix (tests/api/test_tenancy_matrix.py);
# /favicon.ico points everyone at the icon, like a static file.
NOT_CONSOLE = ("api/", "admin/", "static/", "metrics", "favicon.ico")


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fake_probes(monkeypatch):
    """The server check probes for real; answer at once instead of touching the network."""

    def probe(http_url: str, timeout: float) -> ServerProbe:
        return ServerProbe(ready=False, live=False, error=f"connection refused at {http_url}")

    monkeypatch.setattr(health, "PROBES", dict.fromkeys(InferenceServer.Runtime, probe))


@pytest.fixture(autouse=True)
def queued(monkeypatch):
    """What would go to the broker: a server workload handed to its reconciler (its id), a
    cluster sync asked for (("sync", cluster id, full))."""
    sent: list[Any] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_workload", sent.append)
    sent_tasks.catch(monkeypatch, "fleet.tasks.sync_kube_cluster",
                     lambda cluster_id, full=False: sent.append(("sync", cluster_id, full)))
    return sent


class World(ApiWorld):
    """The API matrix's two tenants and shared fleet, and a few states the console needs."""

    def browser(self, persona: str) -> Client:
        client = Client()
        if persona != ANONYMOUS:
            client.force_login(self.persona(persona))
        return client

    @cached_property
    def pending_b(self) -> ModelVersion:
        version = ModelVersionFactory(model=self.model_b, version=2)
        return approvals.request_approval(self.persona(OTHER), version)

    @cached_property
    def loading_a(self) -> Deployment:
        """Deployment A with a load in flight, so its live panel keeps polling."""
        assert self.load_a.state == ModelLoad.State.PENDING
        return self.served_a

    @cached_property
    def ready_a(self) -> ModelLoad:
        """Version 1 of model A ready on the server, so it can be unloaded."""
        ModelLoad.objects.filter(pk=self.load_a.pk).update(state=ModelLoad.State.READY)
        return fresh(self.load_a)

    # --- costs: what each tenant held this month (a placement a tenant)
    def _held(self, tenant: Any, version: ModelVersion) -> Placement:
        return Placement.objects.create(
            tenant=tenant, server=self.server, model_version=version, device_class="cpu",
            units=1, memory_mib=1, state=Placement.State.ACTIVE)

    @cached_property
    def held_a(self) -> Placement:
        return self._held(self.tenant_a, self.version_a)

    @cached_property
    def held_b(self) -> Placement:
        return self._held(self.tenant_b, self.version_b)

    # --- rollouts (rows in the state each call needs; requested by dave)
    def _rollout(self, deployment: Deployment, state: str, **fields: Any) -> Rollout:
        version = self.version_a if deployment == self.deployment_a else self.version_b
        candidate = ModelVersionFactory(model=deployment.model, version=4)
        requester = self.persona("dave" if deployment == self.deployment_a else OTHER)
        return Rollout.objects.create(**{
            "tenant": deployment.tenant, "deployment": deployment, "state": state,
            "baseline": version, "candidate": candidate, "servers": [self.server.name],
            "steps": [{"set_weight": 25}, {"pause": {}}], "step_index": 1,
            "weights": {str(version.version): 75, "4": 25}, "requested_by": requester,
            "requested_by_label": requester.username, **fields,
        })

    @cached_property
    def canary_a(self) -> Rollout:
        return self._rollout(self.deployment_a, Rollout.State.PROGRESSING)

    @cached_property
    def canary_b(self) -> Rollout:
        return self._rollout(self.deployment_b, Rollout.State.PROGRESSING)

    @cached_property
    def paused_a(self) -> Rollout:
        return self._rollout(self.deployment_a, Rollout.State.PAUSED)

    @cached_property
    def waiting_a(self) -> Rollout:
        """Waiting for an approver before it starts; dave asked for it."""
        return self._rollout(self.deployment_a, Rollout.State.PENDING_APPROVAL, step_index=0,
                             weights={}, requires_approval=True)

    @cached_property
    def rolled_back_a(self) -> Rollout:
        return self._rollout(self.deployment_a, Rollout.State.ROLLED_BACK, weights={"1": 100})

    @cached_property
    def rolling_a(self) -> Deployment:
        """Deployment A with a rollout in flight (its page shows it)."""
        return self.canary_a.deployment

    @cached_property
    def startable_a(self) -> Deployment:
        """Deployment A with version 1 ready, on a cluster that routes through nginx (nothing
        is routed until the reconciler runs), so a rollout may be asked for."""
        Cluster.objects.filter(pk=self.cluster.pk).update(router_kind=Cluster.RouterKind.NGINX)
        return self.routable_a

    # --- benchmarks (rows as the reconciler leaves them; nothing is run)
    def _bench(self, deployment: Deployment, state: str, **fields: Any) -> BenchmarkJob:
        deployment.servers.add(self.server)
        version = self.version_a if deployment == self.deployment_a else self.version_b
        return BenchmarkJob.objects.create(**{
            "tenant": deployment.tenant, "deployment": deployment, "version": version,
            "server": self.server, "protocol": BenchmarkJob.Protocol.TRITON_HTTP,
            "levels": [1, 2], "slo": {"p99_ms": 50.0, "error_rate": 0.01}, "state": state,
            "requested_by_label": "seed", **fields,
        })

    @cached_property
    def bench_a(self) -> BenchmarkJob:
        """A benchmark of model A running on the shared server."""
        return self._bench(self.deployment_a, BenchmarkJob.State.RUNNING, progress=0.5)

    @cached_property
    def bench_b(self) -> BenchmarkJob:
        return self._bench(self.deployment_b, BenchmarkJob.State.SUCCEEDED)

    @cached_property
    def sweep_a(self) -> BenchmarkJob:
        """A finished config sweep of model A (two instance counts; the second is best)."""
        configs = [{"instance_group": [{"count": n, "kind": "KIND_CPU"}]} for n in (1, 2)]
        summaries = [{"max_load": n * 2, "max_load_rps": n * 100.0} for n in (1, 2)]
        return self._bench(
            self.deployment_a, BenchmarkJob.State.SUCCEEDED, configs=configs,
            results=[{"config": c, "label": f"{n} instance{'s' if n > 1 else ''}", "levels": [],
                      "summary": sm, "error": ""}
                     for n, c, sm in zip((1, 2), configs, summaries, strict=True)],
            summary={"best_config": 1, "best_label": "2 instances", "best": summaries[1]})

    @cached_property
    def benchmarked_a(self) -> Deployment:
        """Deployment A with a benchmark running (its page lists it)."""
        return self.bench_a.deployment

    @cached_property
    def benchable_a(self) -> Deployment:
        """Deployment A on the server with a cpu quota, so a benchmark may be asked for."""
        _ = self.quota_a, self.version_a
        return self.served_a

    # --- servers on Kubernetes
    @cached_property
    def workloads_a(self) -> Deployment:
        """Tenant A's deployment on the Kubernetes cluster with a server ready (nothing in
        flight)."""
        return self.workload_a.deployment

    @cached_property
    def busy_a(self) -> Deployment:
        """The same deployment with a server asked for and not applied yet (in flight)."""
        return self.pending_workload_a.deployment


@pytest.fixture
def world(request, db) -> World:
    return World(request)


@dataclass(frozen=True)
class Page:
    """One console URL, called one way, and what each persona gets from it.

    ``scope``: "tenant" (tenant A's object: 404 from elsewhere), "list" (200 for everyone,
    with only the caller's rows), "fleet" (shared: any member, 404 for the loner) or "login".
    ``role``: the tenant role the call needs (None: any member reads it; PLATFORM: platform
    admins only). ``ok``: what a caller who is allowed gets (the first: what is expected).
    ``rows``: for lists, text only tenant A's and only tenant B's rows show, and the role needed
    to see them.
    """

    name: str
    target: str | None = None  # World attribute whose pk is the URL's <pk>
    label: str = ""  # tells two calls of one URL apart in test ids
    method: str = "GET"
    htmx: bool = False
    scope: str = "tenant"
    role: str | None = None
    kwargs: dict[str, str] = field(default_factory=dict)
    data: Callable[[World], dict[str, Any]] | None = None
    ok: tuple[int, ...] = (200,)
    rows: tuple[str, str] | None = None
    rows_role: str = Role.VIEWER
    done: Callable[[World, str], bool] | None = None  # (world, persona) → the effect is there
    setup: tuple[str, ...] = ()  # World attributes to make before the call
    foreign: str | None = None  # a create naming tenant A in this field: refused from elsewhere
    owned: bool = False  # a platform page on tenant A's object: hidden (404) from elsewhere

    @property
    def id(self) -> str:
        extra = "-".join(self.kwargs.values())
        return "-".join(filter(None, [self.name.replace(":", "-"), extra, self.label,
                                      self.method, "htmx" if self.htmx else ""]))

    def url(self, world: World) -> str:
        kwargs = dict(self.kwargs)
        if self.target:
            kwargs["pk"] = str(getattr(world, self.target).pk)
        return reverse(self.name, kwargs=kwargs)

    def expected(self, persona: str) -> int | str:
        """A status, or "login" for the way anonymous callers are sent to log in."""
        if self.scope == "login":
            return 200 if persona == ANONYMOUS and self.method == "GET" else 302
        if persona == ANONYMOUS:
            return "login"
        if self.role == PLATFORM:
            if persona == ROOT:
                return self.ok[0]
            # The cluster is looked up first: someone of no tenant sees none; a tenant's own
            # object is hidden from every other tenant too.
            if self.owned and persona in (OTHER, LONER):
                return 404
            return 404 if persona == LONER and self.target else 403
        below = persona in TENANT_A and self.role is not None
        if below and Membership.rank(TENANT_A[persona]) < Membership.rank(self.role):
            return 403
        if persona in (OTHER, LONER) and self.foreign:
            return 400
        if persona == OTHER and self.scope == "tenant":
            return 404
        if persona == LONER and self.scope in ("tenant", "fleet"):
            return 404
        return self.ok[0]


def reason(text: str) -> Callable[[World], dict[str, Any]]:
    return lambda w: {"reason": text}


def version_status(target: str, status: str) -> Callable[[World, str], bool]:
    return lambda w, persona: fresh(getattr(w, target)).status == status


PAGES: list[Page] = [
    Page("login", scope="login", method="GET"),
    Page("logout", scope="login", method="POST"),
    # --- console
    Page("console:dashboard", scope="list", rows=("model-a", "model-b"),
         setup=("pending_a", "pending_b")),
    Page("console:fleet-health", scope="list", htmx=True),
    Page("console:audit", scope="list", rows=("tenant-a", "tenant-b"),
         setup=("audit_a", "audit_b")),
    Page("console:audit", scope="list", htmx=True, rows=("tenant-a", "tenant-b"),
         setup=("audit_a", "audit_b")),
    Page("console:audit-export", scope="list", rows=("tenant-a", "tenant-b"),
         setup=("audit_a", "audit_b")),
    # --- fleet: shared servers, tenant quotas and tokens
    Page("fleet:overview", scope="list", setup=("server",)),
    Page("fleet:servers-live", scope="list", htmx=True, setup=("server",)),
    Page("fleet:server", "server", scope="fleet"),
    Page("fleet:server-status", "server", scope="fleet", htmx=True),
    # Probing a server is open to any member: it refreshes observed health, typed in by no one.
    Page("fleet:server-check", "server", scope="fleet", method="POST", htmx=True,
         done=lambda w, p: fresh(w.server).last_checked_at is not None),
    # --- clusters: shared pages any member reads; adding, editing, testing and syncing them
    # is for platform admins. A static cluster has no sync: its live part stops polling (286).
    Page("fleet:cluster", "cluster", scope="fleet"),
    Page("fleet:cluster", "kube_cluster", "kube", scope="fleet"),
    Page("fleet:cluster-live", "cluster", scope="fleet", htmx=True, ok=(286,)),
    Page("fleet:cluster-live", "kube_cluster", "kube", scope="fleet", htmx=True),
    Page("fleet:cluster-create", role=PLATFORM),
    Page("fleet:cluster-create", method="POST", role=PLATFORM, ok=(302,),
         data=lambda w: {"name": "gpu-west", "kind": "static"},
         done=lambda w, p: Cluster.objects.filter(name="gpu-west", kind="static").exists()),
    Page("fleet:cluster-edit", "cluster", role=PLATFORM),
    Page("fleet:cluster-edit", "cluster", method="POST", role=PLATFORM, ok=(302,),
         data=lambda w: {"name": "cluster-1", "kind": "static", "description": "changed"},
         done=lambda w, p: fresh(w.cluster).description == "changed"),
    # In-cluster access outside a pod: the test fails at once, offline, and says so.
    Page("fleet:cluster-test", "kube_cluster", method="POST", role=PLATFORM, ok=(302,),
         done=lambda w, p: fresh(w.kube_cluster).connection_state == "failed"),
    Page("fleet:cluster-sync", "kube_cluster", method="POST", role=PLATFORM, ok=(302,),
         done=lambda w, p: w.request.getfixturevalue("queued")
         == [("sync", w.kube_cluster.pk, True)]),
    Page("fleet:quotas", scope="list", rows=("tenant-a", "tenant-b"), setup=("quota_a", "quota_b")),
    Page("fleet:quotas", scope="list", htmx=True, rows=("tenant-a", "tenant-b"),
         setup=("quota_a", "quota_b")),
    # Quota requests: a tenant's admin asks (naming the tenant: refused from elsewhere as a form
    # error); platform admins decide.
    Page("fleet:quota-request-create", method="POST", role=Role.ADMIN, ok=(302,), foreign="tenant",
         data=lambda w: {"tenant": w.tenant_a.slug, "device_class": "cpu", "units": "16",
                         "memory_mib": "8192", "reason": "black friday"},
         done=lambda w, p: QuotaRequest.objects.filter(tenant=w.tenant_a, units=16).exists()),
    Page("fleet:quota-request-decide", "quota_request_a", method="POST", role=PLATFORM, ok=(302,),
         owned=True,
         data=lambda w: {"decision": "approve", "units": "6", "memory_mib": "4096"},
         done=lambda w, p: fresh(w.quota_request_a).state == "approved"),
    # Tokens are listed to their tenant's admins only.
    Page("fleet:tokens", scope="list", rows=("ci-a", "ci-b"), rows_role=Role.ADMIN,
         setup=("token_a", "token_b")),
    # A create names its tenant in the body: from elsewhere, a form error on that field (as the
    # API answers 400 naming it). The secret is shown in the answer itself (200).
    Page("fleet:token-create", method="POST", role=Role.ADMIN, ok=(200,), foreign="tenant",
         data=lambda w: {"tenant": w.tenant_a.slug, "name": "deploy-bot", "role": "deployer"},
         done=lambda w, p: APIToken.objects.filter(tenant=w.tenant_a, name="deploy-bot").exists()),
    Page("fleet:token-revoke", "token_a", method="POST", role=Role.ADMIN, ok=(302,),
         data=reason("leaked"), done=lambda w, p: fresh(w.token_a).state == "revoked"),
    # Webhooks, like tokens, are their tenant's admins' to see and manage.
    Page("fleet:webhooks", scope="list", rows=("hook-a", "hook-b"), rows_role=Role.ADMIN,
         setup=("webhook_a", "webhook_b")),
    Page("fleet:webhook-create", method="POST", role=Role.ADMIN, ok=(200,), foreign="tenant",
         data=lambda w: {"tenant": w.tenant_a.slug, "name": "ops",
                         "url": "https://hooks.example.com/ops",
                         "format": "json", "events": ["rollout.rolled_back"]},
         done=lambda w, p: Webhook.objects.filter(tenant=w.tenant_a, name="ops").exists()),
    Page("fleet:webhook", "webhook_a", role=Role.ADMIN),
    Page("fleet:webhook-test", "webhook_a", method="POST", role=Role.ADMIN, ok=(302,),
         done=lambda w, p: WebhookDelivery.objects.filter(webhook=w.webhook_a, event="ping").exists()),
    Page("fleet:webhook-toggle", "webhook_a", method="POST", role=Role.ADMIN, ok=(302,),
         done=lambda w, p: fresh(w.webhook_a).active is False),
    Page("fleet:webhook-delete", "webhook_a", method="POST", role=Role.ADMIN, ok=(302,),
         done=lambda w, p: gone(w.webhook_a)),
    # --- registry
    Page("rollouts:models", scope="list", rows=("model-a", "model-b"), setup=("model_a", "model_b")),
    Page("rollouts:models", scope="list", htmx=True, rows=("model-a", "model-b"),
         setup=("model_a", "model_b")),
    Page("rollouts:model", "model_a"),
    Page("rollouts:model", "model_a", htmx=True),
    Page("rollouts:version", "version_a"),
    # Registering and editing: the forms are open to any member (a create names its tenant or
    # model, refused from elsewhere as a form error on that field); the domain asks for the role.
    Page("rollouts:model-create", scope="list"),
    Page("rollouts:model-create", method="POST", role=Role.DEPLOYER, ok=(302,), foreign="tenant",
         data=lambda w: {"tenant": w.tenant_a.slug, "name": "model-new"},
         done=lambda w, p: Model.objects.filter(tenant=w.tenant_a, name="model-new").exists()),
    Page("rollouts:model-edit", "model_a", role=Role.DEPLOYER),
    Page("rollouts:model-edit", "model_a", method="POST", role=Role.DEPLOYER, ok=(302,),
         data=lambda w: {"description": "changed"},
         done=lambda w, p: fresh(w.model_a).description == "changed"),
    Page("rollouts:version-create", "model_a", role=Role.DEPLOYER),
    Page("rollouts:version-create", "model_a", method="POST", role=Role.DEPLOYER, ok=(302,),
         data=lambda w: {"version": "7", "artifact_uri": "s3://models/model-a/7",
                         "sha256": "7" * 64, "size_bytes": "2048", "runtime": "triton",
                         "backend": "python", "gpus": "1", "estimated_gpu_memory_mib": "0",
                         "labels": '{"team": "a"}'},
         done=lambda w, p: w.model_a.versions.filter(version=7, labels={"team": "a"}).exists()),
    Page("rollouts:alias-set", "model_a", method="POST", role=Role.DEPLOYER, ok=(302,),
         data=lambda w: {"name": "staging", "version": w.version_a.pk},
         done=lambda w, p: w.model_a.aliases.filter(name="staging", version=w.version_a).exists()),
    Page("rollouts:approvals", scope="list", rows=("model-a", "model-b"),
         setup=("pending_a", "pending_b")),
    Page("rollouts:version-action", "version_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "request-approval"}, ok=(302,), data=reason("ready for review"),
         done=version_status("version_a", ModelVersion.Status.PENDING_APPROVAL)),
    Page("rollouts:version-action", "pending_a", method="POST", role=Role.APPROVER,
         kwargs={"action": "approve"}, ok=(302,), data=reason("benchmarks are fine"),
         done=version_status("pending_a", ModelVersion.Status.APPROVED)),
    Page("rollouts:version-action", "pending_a", method="POST", role=Role.APPROVER,
         kwargs={"action": "reject"}, ok=(302,), data=reason("p99 regressed"),
         done=version_status("pending_a", ModelVersion.Status.REJECTED)),
    Page("rollouts:version-action", "version_a", method="POST", role=Role.APPROVER,
         kwargs={"action": "archive"}, ok=(302,), data=reason("superseded"),
         done=version_status("version_a", ModelVersion.Status.ARCHIVED)),
    # --- deployments and loads
    Page("rollouts:deployments", scope="list", rows=("dep-a", "dep-b"),
         setup=("deployment_a", "deployment_b")),
    Page("rollouts:deployment", "deployment_a"),
    Page("rollouts:deployment-create", scope="list"),
    Page("rollouts:deployment-create", method="POST", role=Role.DEPLOYER, ok=(302,), foreign="model",
         data=lambda w: {"name": "dep-new", "model": w.model_a.pk, "cluster": w.cluster.pk,
                         "slo_p99_ms": "300", "slo_error_rate": "1.00"},
         done=lambda w, p: Deployment.objects.filter(tenant=w.tenant_a, name="dep-new").exists()),
    Page("rollouts:deployment-edit", "deployment_a", role=Role.DEPLOYER),
    Page("rollouts:deployment-edit", "deployment_a", method="POST", role=Role.DEPLOYER, ok=(302,),
         data=lambda w: {"name": "dep-a", "cluster": w.cluster.pk, "slo_p99_ms": "250",
                         "slo_error_rate": "0.50"},
         done=lambda w, p: fresh(w.deployment_a).slo_p99_ms == 250),
    Page("rollouts:loads", scope="list", rows=("dep-a", "dep-b"), setup=("load_a", "load_b")),
    Page("rollouts:loads", scope="list", htmx=True, rows=("dep-a", "dep-b"),
         setup=("load_a", "load_b")),
    Page("rollouts:deployment-loads", "loading_a", htmx=True),
    Page("rollouts:deployment-call", "deployment_a", htmx=True),
    Page("rollouts:deployment-slo", "deployment_a", htmx=True, setup=("slo_alert_a",)),
    Page("rollouts:slo-summary", scope="list", htmx=True, rows=("dep-a", "dep-b"),
         setup=("slo_alert_a", "slo_alert_b")),
    Page("rollouts:deployment-replicas", "deployment_a", htmx=True),
    Page("rollouts:deployment-replicas", "deployment_a"),
    Page("rollouts:deployment-load", "served_a", "load", method="POST", role=Role.DEPLOYER, ok=(302,),
         data=lambda w: {"action": "load", "version": w.version_a.pk},
         done=lambda w, p: ModelLoad.objects.filter(
             deployment=w.deployment_a, version=w.version_a, state="pending").exists()),
    Page("rollouts:deployment-load", "served_a", "unload", method="POST", role=Role.DEPLOYER,
         ok=(302,), setup=("ready_a",),
         data=lambda w: {"action": "unload", "version": w.version_a.pk},
         done=lambda w, p: fresh(w.ready_a).state == ModelLoad.State.UNLOADING),
    # --- one version everywhere: a deployment whose two servers disagree, and converging it
    Page("rollouts:deployment", "split_a", "split"),
    Page("rollouts:deployment-converge", "split_a", method="POST", role=Role.DEPLOYER, ok=(302,),
         data=lambda w: {"reason": "agree"},
         done=lambda w, p: ModelLoad.objects.filter(
             deployment=w.deployment_a, server__name="server-2", state="pending").exists()),
    # --- servers on Kubernetes: the deployment's panel (polling while a server is in flight,
    # 286 once none is; a deployment on another kind of cluster has none), its create form and
    # a server's actions
    Page("rollouts:deployment", "workloads_a", "kube"),
    Page("rollouts:deployment-workloads", "workloads_a"),
    Page("rollouts:deployment-workloads", "workloads_a", htmx=True, ok=(286,)),
    Page("rollouts:deployment-workloads", "busy_a", "busy", htmx=True),
    Page("rollouts:deployment-workloads", "deployment_a", "static", ok=(404,)),
    Page("rollouts:deployment-workload-create", "kube_deployment_a", method="POST",
         role=Role.DEPLOYER, ok=(302,),
         data=lambda w: {"name": "triton-new", "version": w.kube_deployment_a.model.versions
                         .get(version=1).pk, "replicas": "1", "gpu_resource": "nvidia.com/gpu",
                         "gpu_product": "NVIDIA-A100-SXM4-80GB",
                         "model_repository": "s3://models/x"},
         done=lambda w, p: ServerWorkload.objects.filter(
             deployment=w.kube_deployment_a, name="triton-new", state="pending").exists()),
    Page("rollouts:workload-action", "workload_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "scale"}, ok=(302,), data=lambda w: {"replicas": "2"},
         done=lambda w, p: (fresh(w.workload_a).replicas, fresh(w.workload_a).state)
         == (2, "applying")),
    Page("rollouts:workload-action", "vllm_workload_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "roll"}, ok=(302,),
         data=lambda w: {"version": w.vllm_deployment_a.model.versions.get(version=2).pk},
         done=lambda w, p: (fresh(w.vllm_workload_a).version.version,
                            fresh(w.vllm_workload_a).previous_version.version) == (2, 1)),
    Page("rollouts:workload-action", "workload_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "delete"}, ok=(302,),
         done=lambda w, p: fresh(w.workload_a).state == "deleting"),
    # --- traffic routes: the page with its Traffic panel; changes go to the real nginx
    Page("rollouts:deployment", "route_a", "routed"),
    Page("rollouts:deployment-route-split", "route_a", htmx=True),
    Page("rollouts:deployment-route", "route_a", method="POST", role=Role.DEPLOYER, ok=(302,),
         data=lambda w: w.routed({"weight_1": "100", "policy": "least-pending",
                                  "reason": "fewest in flight"}),
         done=lambda w, p: fresh(w.route_a).policy == "least-pending"),
    Page("rollouts:deployment-route-default", "routable_a", method="POST", role=Role.DEPLOYER,
         ok=(302,), data=lambda w: w.routed({}),
         done=lambda w, p: Route.objects.filter(pk=w.routable_a.pk, state="in_force").exists()),
    Page("rollouts:deployment-route-remove", "route_a", method="POST", role=Role.DEPLOYER,
         ok=(302,), data=lambda w: w.routed({"reason": "retiring"}),
         done=lambda w, p: fresh(w.route_a).state == "removed"),
    Page("rollouts:deployment-delete", "deployment_a", role=Role.ADMIN),
    Page("rollouts:deployment-delete", "deployment_a", method="POST", role=Role.ADMIN, ok=(302,),
         data=reason("replaced by dep-c"), done=lambda w, p: gone(w.deployment_a)),
    Page("rollouts:load", "load_a"),
    Page("rollouts:load", "load_a", htmx=True),
    # --- rollouts: the list, a rollout's page and live parts, its actions, the start form
    Page("rollouts:rollouts", scope="list", rows=("dep-a", "dep-b"),
         setup=("canary_a", "canary_b")),
    Page("rollouts:rollouts", scope="list", htmx=True, rows=("dep-a", "dep-b"),
         setup=("canary_a", "canary_b")),
    Page("rollouts:rollout", "canary_a"),
    Page("rollouts:rollout-status", "canary_a", htmx=True),
    Page("rollouts:rollout-latency", "canary_a"),
    Page("rollouts:rollout-action", "canary_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "pause"}, ok=(302,), data=reason("looking at the logs"),
         done=lambda w, p: fresh(w.canary_a).requested_action == "pause"),
    Page("rollouts:rollout-action", "paused_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "resume"}, ok=(302,), data=reason("logs are fine"),
         done=lambda w, p: fresh(w.paused_a).requested_action == "resume"),
    Page("rollouts:rollout-action", "canary_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "promote"}, ok=(302,), data=reason("hotfix"),
         done=lambda w, p: fresh(w.canary_a).requested_action == "promote"),
    Page("rollouts:rollout-action", "canary_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "abort"}, ok=(302,), data=reason("p99 regressed"),
         done=lambda w, p: fresh(w.canary_a).requested_action == "abort"),
    Page("rollouts:rollout-action", "waiting_a", method="POST", role=Role.APPROVER,
         kwargs={"action": "approve"}, ok=(302,), data=reason("plan reviewed"),
         done=lambda w, p: fresh(w.waiting_a).state == Rollout.State.LOADING),
    Page("rollouts:rollout-action", "rolled_back_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "retry"}, ok=(302,), data=reason("config fixed"),
         done=lambda w, p: fresh(w.rolled_back_a).attempt == 2),
    Page("rollouts:deployment", "rolling_a", "rollout"),
    Page("rollouts:deployment-rollout-start", "startable_a", method="POST", role=Role.DEPLOYER,
         ok=(302,), setup=("spare_a",),
         data=lambda w: {"strategy": "canary", "version": str(w.spare_a.version),
                         "steps": '[{"set_weight": 50}, {"pause": {}}]'},
         done=lambda w, p: Rollout.objects.filter(deployment=w.deployment_a).exists()),
    # --- costs: the chargeback shows only the caller's tenants' rows
    Page("rollouts:costs", scope="list", rows=(":tenant-a:cpu", ":tenant-b:cpu"),
         setup=("held_a", "held_b")),
    # --- benchmarks: the list, a job's page and live part, cancel and register-config, two
    # compared, the start form on the deployment page
    Page("rollouts:benchmarks", scope="list", rows=("dep-a", "dep-b"),
         setup=("bench_a", "bench_b")),
    Page("rollouts:benchmarks", scope="list", htmx=True, rows=("dep-a", "dep-b"),
         setup=("bench_a", "bench_b")),
    Page("rollouts:benchmark", "bench_a"),
    Page("rollouts:benchmark-status", "bench_a", htmx=True),
    Page("rollouts:benchmark-compare", data=lambda w: {"a": w.bench_a.pk, "b": w.sweep_a.pk}),
    Page("rollouts:benchmark-action", "bench_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "cancel"}, ok=(302,),
         done=lambda w, p: bool(fresh(w.bench_a).cancel_requested_by)),
    Page("rollouts:benchmark-action", "sweep_a", method="POST", role=Role.DEPLOYER,
         kwargs={"action": "register-config"}, ok=(302,),
         done=lambda w, p: ModelVersion.objects.filter(
             model=w.model_a, labels__benchmark_job=str(w.sweep_a.pk)).exists()),
    Page("rollouts:deployment", "benchmarked_a", "benchmarked"),
    Page("rollouts:deployment-benchmark-start", "benchable_a", method="POST", role=Role.DEPLOYER,
         ok=(302,), data=lambda w: {"version": "1", "mode": "concurrency", "levels": "1, 2",
                                    "duration_s": "2", "warmup_s": "0"},
         done=lambda w, p: BenchmarkJob.objects.filter(deployment=w.deployment_a).exists()),
]


def console_url_names() -> set[str]:
    """Every named URL the site serves outside the API, the admin and static files."""
    names: set[str] = set()

    def walk(patterns: list[Any], prefix: str, namespace: str | None) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if route.startswith(NOT_CONSOLE):
                continue
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route, pattern.namespace or namespace)
            elif isinstance(pattern, URLPattern):
                assert pattern.name, f"console URL {route} has no name"
                names.add(f"{namespace}:{pattern.name}" if namespace else pattern.name)

    walk(get_resolver().url_patterns, "", None)
    return names


def test_the_matrix_covers_every_console_url():
    covered = {page.name for page in PAGES}
    assert covered == console_url_names()
    actions = {page.kwargs["action"] for page in PAGES if page.name == "rollouts:version-action"}
    assert actions == set(VersionActionForm.ACTIONS)
    actions = {page.kwargs["action"] for page in PAGES if page.name == "rollouts:rollout-action"}
    assert actions == set(RolloutActionForm.ACTIONS)
    actions = {page.kwargs["action"] for page in PAGES if page.name == "rollouts:benchmark-action"}
    assert actions == set(BenchmarkActionForm.ACTIONS)
    actions = {page.kwargs["action"] for page in PAGES if page.name == "rollouts:workload-action"}
    assert actions == set(WorkloadActionForm.ACTIONS)
    ids = [page.id for page in PAGES]
    assert len(ids) == len(set(ids)), "a page is listed twice"


def state(world: World) -> tuple[Any, ...]:
    """What a refused call must leave as it was."""
    return (
        AuditEvent.objects.count(),
        list(ModelVersion.objects.order_by("pk").values_list("pk", "status")),
        list(ModelLoad.objects.order_by("pk").values_list("pk", "state")),
        list(APIToken.objects.order_by("pk").values_list("pk", "revoked_at")),
        list(Deployment.objects.order_by("pk").values_list("pk", "archived_at")),
        list(InferenceServer.objects.order_by("pk").values_list("pk", "last_checked_at")),
        list(Webhook.objects.order_by("pk").values_list("pk", "active")),
        WebhookDelivery.objects.count(),
        list(Rollout.objects.order_by("pk").values_list("pk", "state", "requested_action",
                                                         "attempt")),
        list(BenchmarkJob.objects.order_by("pk").values_list("pk", "state",
                                                              "cancel_requested_by")),
        list(ServerWorkload.objects.order_by("pk").values_list("pk", "state", "replicas",
                                                                "version_id")),
        list(Cluster.objects.order_by("pk").values_list("pk", "name", "description",
                                                         "connection_state")),
        list(world.request.getfixturevalue("queued")),
    )


def cases() -> list[Any]:
    return [
        pytest.param(page, persona, page.expected(persona), id=f"{page.id}-{persona}")
        for page in PAGES
        for persona in PERSONAS
    ]


@pytest.mark.parametrize(("page", "persona", "expected"), cases())
def test_console_tenancy(world, page, persona, expected):
    for name in page.setup:
        getattr(world, name)
    url = page.url(world)
    client = world.browser(persona)
    headers = {"HX-Request": "true", "HX-Current-URL": f"http://testserver{url}"} if page.htmx else {}
    data = page.data(world) if page.data else {}
    before = state(world)

    if page.method == "POST":
        response = client.post(url, data, headers=headers)
    else:
        response = client.get(url, data, headers=headers)
    body = (b"".join(response.streaming_content) if response.streaming else response.content).decode()

    if expected == "login":
        # A GET's data is its query string, which the way back to the page keeps.
        back = f"{url}?{urlencode(data)}" if page.method == "GET" and data else url
        login = f"{reverse('login')}?next={quote(back)}"
        if page.htmx:
            assert response.status_code == 401, body
            assert response["HX-Redirect"] == login
        else:
            assert response.status_code == 302, body
            assert response["Location"] == login
        assert state(world) == before
        return
    if expected in page.ok:
        assert response.status_code in page.ok, body
    else:
        assert response.status_code == expected, body
    if expected == 403:
        needed = ("only platform admins may change this" if page.role == PLATFORM
                  else f"this needs the {page.role} role in the tenant")
        assert needed in body
        assert state(world) == before
    elif expected == 404:
        assert "tenant-a" not in body
        assert state(world) == before
    elif expected == 400:
        assert f'id="{page.foreign}-error"' in body, body
        assert state(world) == before
    elif page.rows is not None:
        mine, theirs = page.rows
        sees_a = persona == ROOT or (
            persona in TENANT_A and Membership.rank(TENANT_A[persona]) >= Membership.rank(page.rows_role)
        )
        sees_b = persona in (ROOT, OTHER)
        assert (mine in body) == sees_a, mine
        assert (theirs in body) == sees_b, theirs
    if page.done is not None and response.status_code in page.ok and page.scope != "login":
        assert page.done(world, persona)
