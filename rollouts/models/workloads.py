"""Server workloads: Triton and vLLM servers that Switchyard runs as Kubernetes Deployments."""

from __future__ import annotations

from typing import ClassVar

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from fleet.models import Cluster, InferenceServer, Placement, Tenant
from fleet.tenancy.scoping import scoped_manager

from .deployments import Deployment
from .jobs import LeasedJob
from .registry import ModelVersion


class ServerWorkload(LeasedJob):
    """A Triton or vLLM server of one deployment, run as an apps/v1 Deployment and a Service
    in the cluster's namespace, owned by Switchyard (server-side apply, field manager
    ``switchyard``), advanced by an idempotent reconciler (``rollouts.workloads.requests``).

    ``pending`` (quota admitted for ``replicas`` x the version's GPUs) → ``applying`` (the
    Deployment and Service are applied) → ``progressing`` (waiting, through the API, for the
    new pods to be updated and available) → ``ready``. A change (a new base-model version, a
    replica count) goes back through ``applying``. When the new pods do not come up before
    the deadline, ``rolling_back`` re-applies ``previous_spec`` and the row ends ``failed``
    with the reason. ``deleting`` → ``deleted`` takes it away and releases the quota.

    **Autoscaled** (``min_replicas`` and ``max_replicas`` both set): an ``autoscaling/v2``
    HorizontalPodAutoscaler of the same name owns the replica count. Switchyard's Deployment
    manifest leaves ``spec.replicas`` out (so the HPA's writes are never overruled by the next
    apply) and Switchyard applies the HPA beside it; the quota is held for ``max_replicas`` x
    the version's GPUs and memory from the start, since the HPA may scale up to it at any
    time. The mode is chosen at creation and never switched: ``spec.replicas`` would have to
    change server-side-apply managers, and a manager that stops applying a field it owns
    removes it, so the Deployment falls back to 1 replica (and taking it back from the HPA
    controller's writes resets it to Switchyard's count) while pods are serving.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        APPLYING = "applying", "Applying"
        PROGRESSING = "progressing", "Waiting for pods"
        READY = "ready", "Ready"
        ROLLING_BACK = "rolling_back", "Rolling back"
        FAILED = "failed", "Failed"
        DELETING = "deleting", "Deleting"
        DELETED = "deleted", "Deleted"

    ACTIVE: ClassVar[list[str]] = [
        State.PENDING, State.APPLYING, State.PROGRESSING, State.READY, State.ROLLING_BACK,
        State.FAILED, State.DELETING,
    ]
    IN_FLIGHT: ClassVar[list[str]] = [
        State.PENDING, State.APPLYING, State.PROGRESSING, State.ROLLING_BACK, State.DELETING,
    ]

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="server_workloads")
    deployment = models.ForeignKey(
        Deployment, on_delete=models.PROTECT, related_name="workloads"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="workloads")
    version = models.ForeignKey(
        ModelVersion, on_delete=models.PROTECT, related_name="workloads",
        help_text="The version the server is started with (a vLLM server's base model; the "
                  "model a Triton server loads at start)",
    )
    previous_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="The version before the change in progress (what a roll-back returns to)",
    )
    server = models.OneToOneField(
        InferenceServer, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="workload",
    )
    placement = models.ForeignKey(
        Placement, null=True, blank=True, on_delete=models.SET_NULL, related_name="workloads"
    )
    name = models.CharField(max_length=63, help_text="Kubernetes Deployment and Service name")
    namespace = models.CharField(max_length=63)
    runtime = models.CharField(max_length=16, choices=InferenceServer.Runtime.choices)
    image = models.CharField(max_length=300)
    model_repository = models.CharField(
        max_length=500, blank=True,
        help_text="Triton's --model-repository: s3://bucket/prefix, or a path on a volume",
    )
    volume_claim = models.CharField(
        max_length=253, blank=True,
        help_text="PersistentVolumeClaim mounted at the model repository path (volume repos)",
    )
    gpu_resource = models.CharField(
        max_length=100, default="nvidia.com/gpu",
        help_text="nvidia.com/gpu, or a MIG resource such as nvidia.com/mig-3g.40gb",
    )
    gpus_per_replica = models.PositiveIntegerField(default=1)
    replicas = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="The servers (pods) Switchyard runs; for an autoscaled workload, what its "
                  "HPA set on the Deployment, as last read",
    )
    min_replicas = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Autoscaled: the fewest replicas its HorizontalPodAutoscaler keeps",
    )
    max_replicas = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Autoscaled: the most replicas its HorizontalPodAutoscaler may run (the quota "
                  "is held for these)",
    )
    node_selector = models.JSONField(default=dict, blank=True)
    applied_spec = models.JSONField(
        default=dict, blank=True, help_text="The manifest last applied (server-side apply)"
    )
    previous_spec = models.JSONField(
        default=dict, blank=True, help_text="The manifest that was in force before the change"
    )
    generation = models.PositiveBigIntegerField(
        default=0, help_text="metadata.generation the last apply produced"
    )
    observed = models.JSONField(
        default=dict, blank=True,
        help_text="The Deployment's status as last read: replicas, updated, ready, available, "
                  "conditions",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    detail = models.TextField(blank=True, help_text="What the last step said, readable")
    error = models.TextField(blank=True)
    deadline_at = models.DateTimeField(
        null=True, blank=True, help_text="When waiting for the new pods gives up"
    )
    attempts = models.PositiveIntegerField(default=0, help_text="Transient failures in a row")
    forbidden_since = models.DateTimeField(
        null=True, blank=True,
        help_text="Since when the API server has refused (403) every call of this workload: "
                  "one that has just started refuses for a moment, so a refusal counts as "
                  "final only after SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S of them in a row",
    )
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    phase_started_at = models.DateTimeField(auto_now_add=True)
    ready_at = models.DateTimeField(null=True, blank=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "namespace", "name"],
                condition=~models.Q(state="deleted"),
                name="uniq_live_workload_name",
            ),
            models.CheckConstraint(
                condition=models.Q(min_replicas__isnull=True, max_replicas__isnull=True)
                | models.Q(min_replicas__isnull=False, max_replicas__isnull=False,
                           min_replicas__lte=models.F("max_replicas")),
                name="workload_replica_range",
            ),
        ]
        indexes = [models.Index(fields=["state"], name="workload_state")]

    def __str__(self) -> str:
        # No state here: the audit log keeps this name, where a state would read as today's.
        return f"{self.namespace}/{self.name} on {self.cluster}"

    @property
    def units(self) -> int:
        """GPUs (or MIG slices) the workload runs on: replicas x GPUs per replica."""
        return self.replicas * self.gpus_per_replica

    @property
    def autoscaled(self) -> bool:
        """Whether a HorizontalPodAutoscaler owns the replica count (chosen at creation)."""
        return self.min_replicas is not None and self.max_replicas is not None

    @property
    def quota_replicas(self) -> int:
        """The replicas the quota is held for: ``max_replicas`` when autoscaled (the HPA may
        scale up to it at any time), else ``replicas``."""
        return self.max_replicas if self.autoscaled else self.replicas
