"""Clusters, nodes, GPUs and the inference servers that run on them."""

from __future__ import annotations

import re
import shlex

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from fleet.tenancy.scoping import FleetQuerySet

from .tenancy import slug_validator

# Service URLs inside a cluster often use single-label host names (http://triton:8000 in
# compose, http://svc.ns:8000 in Kubernetes), which Django's URLValidator refuses.
service_url_validator = RegexValidator(
    r"^https?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:\d{1,5})?(/\S*)?$",
    "must be an http:// or https:// URL such as http://triton:8000",
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$|^[0-9A-Fa-f:.]+$")


class Cluster(models.Model):
    """A group of nodes that Switchyard can place models on.

    ``local`` clusters are run by Switchyard itself on this machine (the demo and the tests);
    ``static`` clusters are servers reached at fixed endpoints; ``kubernetes`` clusters are
    synced through the Kubernetes API. Clusters are shared infrastructure: every tenant member
    can see them, only platform admins change them.

    Traffic router (``fleet.inventory.routers.router_for``): a local cluster's routes are served by the
    local nginx. A static cluster names its own with ``router_kind`` ``nginx``: the directory
    of route files Switchyard writes (the router's nginx includes ``<dir>/switchyard.conf``
    in its ``http`` block), the command that reloads it, and the host name clients use.
    """

    class Kind(models.TextChoices):
        LOCAL = "local", "Local"
        STATIC = "static", "Static endpoints"
        KUBERNETES = "kubernetes", "Kubernetes"

    class RouterKind(models.TextChoices):
        NONE = "none", "No traffic router"
        NGINX = "nginx", "nginx"

    class KubeAuth(models.TextChoices):
        IN_CLUSTER = "in-cluster", "In-cluster service account"
        KUBECONFIG = "kubeconfig", "kubeconfig and context"
        TOKEN = "token", "API URL, bearer token and CA bundle"

    class KubeRouter(models.TextChoices):
        GATEWAY_API = "gateway-api", "Gateway API HTTPRoute"
        ISTIO = "istio", "Istio VirtualService"

    class ConnectionState(models.TextChoices):
        UNKNOWN = "unknown", "Not tested yet"
        OK = "ok", "Connected"
        FAILED = "failed", "Failed"

    class SyncState(models.TextChoices):
        NEVER = "never", "Never synced"
        SYNCING = "syncing", "Syncing"
        OK = "ok", "In sync"
        PARTIAL = "partial", "Synced with errors"
        FAILED = "failed", "Failed"

    class RouterState(models.TextChoices):
        UNKNOWN = "unknown", "Not checked yet"
        UP = "up", "Up"
        DEGRADED = "degraded", "Degraded"
        DOWN = "down", "Down"

    name = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    kind = models.CharField(max_length=16, choices=Kind.choices)
    description = models.CharField(max_length=300, blank=True)
    api_url = models.URLField(blank=True, help_text="Kubernetes API server (kubernetes clusters)")
    s3_endpoint_url = models.CharField(
        max_length=300, blank=True, validators=[service_url_validator],
        help_text="S3-compatible endpoint for this cluster's artifacts (empty: the default)",
    )
    s3_region = models.CharField(max_length=40, blank=True)
    router_kind = models.CharField(
        max_length=16, choices=RouterKind.choices, default=RouterKind.NONE,
        help_text="The traffic router of a static cluster (local clusters use the local nginx)",
    )
    router_conf_dir = models.CharField(
        max_length=500, blank=True,
        help_text="Directory of the router's route files, writable by Switchyard; its nginx "
                  "includes <dir>/switchyard.conf in the http block",
    )
    router_reload_command = models.CharField(
        max_length=500, blank=True,
        help_text="Command that reloads the router, e.g. ssh router sudo nginx -s reload",
    )
    router_public_host = models.CharField(
        max_length=255, blank=True,
        help_text="Host name or address clients use in route URLs (the router's host)",
    )
    # The traffic router as last probed (fleet.inventory.health.check_routers), never typed in.
    router_state = models.CharField(
        max_length=16, choices=RouterState.choices, default=RouterState.UNKNOWN,
        help_text="The traffic router as last probed: up (answers, every route in force), "
                  "degraded (answers, a route not in force) or down (no answer)",
    )
    router_detail = models.CharField(max_length=500, blank=True)
    router_routes = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="Routes the router holds")
    router_connections = models.PositiveIntegerField(
        null=True, blank=True, help_text="Client connections open at the router"
    )
    router_checked_at = models.DateTimeField(null=True, blank=True)
    router_state_changed_at = models.DateTimeField(null=True, blank=True)
    # Kubernetes clusters: how to reach the API (fleet.inventory.kube_connection) and what it said.
    kube_auth = models.CharField(
        max_length=16, choices=KubeAuth.choices, blank=True,
        help_text="How Switchyard authenticates to the Kubernetes API",
    )
    kube_context = models.CharField(
        max_length=253, blank=True, help_text="kubeconfig context (empty: the current one)"
    )
    kube_ca_bundle = models.TextField(
        blank=True, help_text="PEM CA bundle that signs the API server's certificate (token auth)"
    )
    kube_secret_encrypted = models.TextField(
        blank=True, editable=False,
        help_text="The bearer token or kubeconfig, encrypted with SWITCHYARD_SECRET_KEY",
    )
    kube_secret_env = models.CharField(
        max_length=128, blank=True,
        help_text="Or: the environment variable that holds the bearer token or kubeconfig",
    )
    kube_namespace = models.CharField(
        max_length=63, default="switchyard", validators=[slug_validator],
        help_text="Namespace of the servers and routes Switchyard creates",
    )
    kube_router = models.CharField(
        max_length=16, choices=KubeRouter.choices, blank=True,
        help_text="How traffic is split on this cluster: Gateway API HTTPRoutes or Istio "
                  "VirtualServices",
    )
    kube_gateway = models.CharField(
        max_length=253, blank=True,
        help_text="The Gateway routes attach to, as namespace/name (Gateway API; for Istio "
                  "optional, namespace/name or name, empty: the mesh only)",
    )
    kube_route_host = models.CharField(
        max_length=253, blank=True,
        help_text="Domain routes answer under: a deployment's route is <route>.<domain> "
                  "(HTTPRoute hostnames, VirtualService hosts)",
    )
    connection_state = models.CharField(
        max_length=16, choices=ConnectionState.choices, default=ConnectionState.UNKNOWN
    )
    connection_detail = models.CharField(max_length=500, blank=True)
    connection_checked_at = models.DateTimeField(null=True, blank=True)
    kube_server_version = models.CharField(max_length=100, blank=True)
    sync_state = models.CharField(max_length=16, choices=SyncState.choices,
                                  default=SyncState.NEVER)
    sync_detail = models.CharField(max_length=500, blank=True)
    nodes_resource_version = models.CharField(
        max_length=64, blank=True, editable=False,
        help_text="Where the node watch resumes (the last resourceVersion seen)",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_synced_at = models.DateTimeField(null=True, blank=True)

    objects = FleetQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_kubernetes(self) -> bool:
        return self.kind == self.Kind.KUBERNETES

    @property
    def has_kube_secret(self) -> bool:
        return bool(self.kube_secret_encrypted or self.kube_secret_env)

    def clean(self) -> None:
        self._clean_kubernetes()
        if self.router_kind != self.RouterKind.NGINX:
            return
        errors: dict[str, str] = {}
        if self.kind != self.Kind.STATIC:
            errors["router_kind"] = (
                "only static clusters name their router (local clusters use the local nginx)"
            )
        if not self.router_conf_dir.startswith("/"):
            errors["router_conf_dir"] = "an absolute directory path is required for an nginx router"
        try:
            command = shlex.split(self.router_reload_command)
        except ValueError as exc:
            errors["router_reload_command"] = f"cannot be split into words: {exc}"
        else:
            if not command:
                errors["router_reload_command"] = "a reload command is required for an nginx router"
        host = self.router_public_host
        if not host:
            errors["router_public_host"] = "the host clients reach the router at is required"
        elif not _HOST.match(host):
            errors["router_public_host"] = f"must be a host name or an IP address, got {host!r}"
        if errors:
            raise ValidationError(errors)

    def _clean_kubernetes(self) -> None:
        errors: dict[str, str] = {}
        if not self.is_kubernetes:
            for name in ("kube_auth", "kube_router", "kube_secret_env", "kube_context"):
                if getattr(self, name):
                    errors[name] = "only kubernetes clusters use this"
            if self.kube_secret_encrypted:
                errors["kube_secret"] = "only kubernetes clusters use this"
            if errors:
                raise ValidationError(errors)
            return
        if not self.kube_auth:
            errors["kube_auth"] = (
                "a kubernetes cluster needs one of in-cluster, kubeconfig or token"
            )
        elif self.kube_auth == self.KubeAuth.TOKEN:
            if not self.api_url:
                errors["api_url"] = "token authentication needs the API server URL"
            if not self.has_kube_secret:
                errors["kube_secret"] = (
                    "token authentication needs the bearer token (or kube_secret_env naming "
                    "the environment variable that holds it)"
                )
        elif self.kube_auth == self.KubeAuth.KUBECONFIG:
            if not self.has_kube_secret:
                errors["kube_secret"] = (
                    "kubeconfig authentication needs the kubeconfig (or kube_secret_env naming "
                    "the environment variable that holds it)"
                )
        elif self.has_kube_secret:
            errors["kube_secret"] = "an in-cluster service account takes no token or kubeconfig"
        if self.kube_secret_env and not _ENV_NAME.match(self.kube_secret_env):
            errors["kube_secret_env"] = (
                "must be an environment variable name (letters, digits, underscores)"
            )
        namespace, _, name = self.kube_gateway.rpartition("/")
        gateway_ok = bool(name) and _DNS_SUBDOMAIN.match(name) and (
            not namespace or _DNS_LABEL.match(namespace)
        )
        if self.kube_router == self.KubeRouter.GATEWAY_API:
            if not (namespace and gateway_ok):
                errors["kube_gateway"] = (
                    "Gateway API routes attach to a Gateway: give it as namespace/name, got "
                    f"{self.kube_gateway!r}"
                )
        elif self.kube_router == self.KubeRouter.ISTIO:
            if self.kube_gateway and not gateway_ok:
                errors["kube_gateway"] = (
                    "an Istio gateway is namespace/name or name (empty: the mesh only), got "
                    f"{self.kube_gateway!r}"
                )
        elif self.kube_gateway:
            errors["kube_gateway"] = "only a gateway-api or istio router uses a gateway"
        if self.kube_route_host and not _DNS_SUBDOMAIN.match(self.kube_route_host):
            errors["kube_route_host"] = (
                f"must be a DNS host name, got {self.kube_route_host!r}"
            )
        if errors:
            raise ValidationError(errors)


class Node(models.Model):
    """A host in a cluster. ``device_class`` is ``cpu`` for CPU-only nodes (the local demo)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=128)
    hostname = models.CharField(max_length=255, blank=True)
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    labels = models.JSONField(default=dict, blank=True)
    # Observed from the Kubernetes API (fleet.inventory.kube_sync); typed in for other clusters.
    synced = models.BooleanField(default=False, help_text="Kept in step with a Node object")
    ready = models.BooleanField(null=True, blank=True, help_text="The Ready condition")
    ready_detail = models.CharField(max_length=500, blank=True)
    unschedulable = models.BooleanField(default=False, help_text="Cordoned")
    taints = models.JSONField(default=list, blank=True)
    capacity = models.JSONField(default=dict, blank=True)
    allocatable = models.JSONField(default=dict, blank=True)
    zone = models.CharField(max_length=100, blank=True)
    resource_version = models.CharField(max_length=64, blank=True)
    gone_at = models.DateTimeField(
        null=True, blank=True, help_text="When the Node object disappeared from the cluster"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = FleetQuerySet.as_manager()

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="uniq_node_per_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name}"

    @property
    def is_gone(self) -> bool:
        return self.gone_at is not None

class GPU(models.Model):
    """One GPU on a node, or one MIG slice of one (``parent`` set, ``mig_profile`` named).

    ``device_class`` is the slug quotas are written against, e.g. ``nvidia-a100-80gb``.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    model = models.CharField(max_length=100, help_text="Product name, e.g. NVIDIA A100-SXM4-80GB")
    device_class = models.CharField(max_length=64, validators=[slug_validator])
    memory_mib = models.PositiveIntegerField()
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="mig_slices"
    )
    mig_profile = models.CharField(max_length=32, blank=True, help_text="e.g. 3g.40gb")

    objects = FleetQuerySet.as_manager()

    class Meta:
        ordering = ["node__cluster__name", "node__name", "index", "mig_profile"]
        verbose_name = "GPU"

    def __str__(self) -> str:
        suffix = f" {self.mig_profile}" if self.mig_profile else ""
        return f"{self.node} gpu{self.index}{suffix}"

class InferenceServer(models.Model):
    """A Triton or vLLM endpoint. Its health is observed, never typed in.

    The health task probes every server every few seconds: unknown (never checked) →
    healthy (ready) | unhealthy (answers but not ready) | unreachable (no answer in time).
    ``last_seen_at`` is the last time it answered at all; ``reported_models`` is what the
    server itself says it has loaded (the repository index for Triton, /v1/models for vLLM).
    """

    class Runtime(models.TextChoices):
        TRITON = "triton", "Triton"
        VLLM = "vllm", "vLLM"

    class Source(models.TextChoices):
        MANUAL = "manual", "Added by hand"
        DISCOVERED = "discovered", "Discovered in Kubernetes"
        MANAGED = "managed", "Created by Switchyard"

    class Health(models.TextChoices):
        UNKNOWN = "unknown", "Unknown"
        HEALTHY = "healthy", "Healthy"
        UNHEALTHY = "unhealthy", "Unhealthy"
        UNREACHABLE = "unreachable", "Unreachable"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="servers")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="servers")
    name = models.CharField(max_length=64, validators=[slug_validator])
    runtime = models.CharField(max_length=16, choices=Runtime.choices)
    http_url = models.CharField(max_length=300, validators=[service_url_validator])
    grpc_url = models.CharField(max_length=255, blank=True, help_text="host:port")
    metrics_url = models.CharField(max_length=300, blank=True, validators=[service_url_validator])
    model_repository = models.CharField(
        max_length=500, blank=True, help_text="Model repository folder (local and static clusters)"
    )
    log_path = models.CharField(
        max_length=500, blank=True, help_text="Server log file, read to explain load failures"
    )
    source = models.CharField(
        max_length=16, choices=Source.choices, default=Source.MANUAL,
        help_text="Added by hand, discovered from labelled Kubernetes Services, or created and "
                  "owned by Switchyard",
    )
    kube_namespace = models.CharField(max_length=63, blank=True)
    kube_name = models.CharField(
        max_length=253, blank=True, help_text="The Kubernetes Service (and Deployment) name"
    )
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    health_detail = models.TextField(blank=True)
    server_version = models.CharField(max_length=64, blank=True)
    reported_models = models.JSONField(default=list, blank=True)
    probe_latency_ms = models.FloatField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    last_checked_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = FleetQuerySet.as_manager()

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="uniq_server_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name}"

    @property
    def is_healthy(self) -> bool:
        return self.health == self.Health.HEALTHY


class ClusterSync(models.Model):
    """One sync of a Kubernetes cluster's inventory: what it found and what went wrong.

    ``kind`` is ``list`` (a full list of Nodes and labelled Services) or ``watch`` (the events
    of one watch from the last resourceVersion). The newest rows are kept
    (``fleet.inventory.kube_sync.KEEP_SYNCS`` per cluster).
    """

    class Kind(models.TextChoices):
        LIST = "list", "Full list"
        WATCH = "watch", "Watch"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="syncs")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    ok = models.BooleanField(default=True)
    added = models.JSONField(default=list, blank=True, help_text="Names of nodes/servers added")
    changed = models.JSONField(default=list, blank=True)
    gone = models.JSONField(default=list, blank=True)
    errors = models.JSONField(default=list, blank=True, help_text="Readable error messages")
    resource_version = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    objects = FleetQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["cluster", "-started_at"], name="clustersync_recent")]

    def __str__(self) -> str:
        return f"{self.cluster} {self.kind} sync at {self.started_at:%Y-%m-%d %H:%M:%S}"
