"""Clusters, nodes, GPUs and the inference servers that run on them."""

from __future__ import annotations

import re
import shlex

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from fleet.tenancy import FleetQuerySet

from .tenancy import slug_validator

# Service URLs inside a cluster often use single-label host names (http://triton:8000 in
# compose, http://svc.ns:8000 in Kubernetes), which Django's URLValidator refuses.
service_url_validator = RegexValidator(
    r"^https?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:\d{1,5})?(/\S*)?$",
    "must be an http:// or https:// URL such as http://triton:8000",
)
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$|^[0-9A-Fa-f:.]+$")


class Cluster(models.Model):
    """A group of nodes that Switchyard can place models on.

    ``local`` clusters are run by Switchyard itself on this machine (the demo and the tests);
    ``static`` clusters are servers reached at fixed endpoints; ``kubernetes`` clusters are
    synced through the Kubernetes API. Clusters are shared infrastructure: every tenant member
    can see them, only platform admins change them.

    Traffic router (``fleet.routers.router_for``): a local cluster's routes are served by the
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
    # The traffic router as last probed (fleet.health.check_routers), never typed in.
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
    created_at = models.DateTimeField(auto_now_add=True)
    last_synced_at = models.DateTimeField(null=True, blank=True)

    objects = FleetQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
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

class Node(models.Model):
    """A host in a cluster. ``device_class`` is ``cpu`` for CPU-only nodes (the local demo)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=128)
    hostname = models.CharField(max_length=255, blank=True)
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    labels = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = FleetQuerySet.as_manager()

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="uniq_node_per_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name}"

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
