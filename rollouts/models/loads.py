"""Model loads: putting one version onto one server, and taking it off again."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from fleet.models import InferenceServer, Placement, Tenant
from fleet.tenancy.scoping import scoped_manager

from .deployments import Deployment
from .jobs import IdempotentJob
from .registry import ModelVersion


class ModelLoad(IdempotentJob):
    """One version on one server of a deployment, advanced by idempotent reconcilers.

    Load:   pending → admitted → fetching → placing → loading → ready, or failed.
    Unload: ready → unloading → unloaded (or failed, with the placement kept while the
    server may still hold the model).
    Drift:  ready → lost, when the server no longer reports the version as ready (it was
    restarted, or changed outside Switchyard); the placement is released.

    ``admitted`` means quota is held (a Placement in state loading); ``fetching`` streams the
    artifact from S3 and verifies it; ``placing`` writes it into the server's model
    repository; ``loading`` asks the server to load it and waits for READY. A failure at any
    phase unloads, removes the files and releases the quota before the row says failed.
    Workers claim the row with a short lease, so a killed worker's load is picked up by the
    next tick once the lease runs out.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        ADMITTED = "admitted", "Admitted"
        FETCHING = "fetching", "Fetching artifact"
        PLACING = "placing", "Placing files"
        LOADING = "loading", "Loading"
        READY = "ready", "Ready"
        UNLOADING = "unloading", "Unloading"
        UNLOADED = "unloaded", "Unloaded"
        FAILED = "failed", "Failed"
        LOST = "lost", "Lost from server"

    TERMINAL: ClassVar[set[str]] = {State.READY, State.UNLOADED, State.FAILED, State.LOST}
    IN_FLIGHT: ClassVar[list[str]] = [
        State.PENDING, State.ADMITTED, State.FETCHING, State.PLACING, State.LOADING,
        State.UNLOADING,
    ]
    LOAD_PHASES: ClassVar[list[str]] = [
        State.PENDING, State.ADMITTED, State.FETCHING, State.PLACING, State.LOADING, State.READY,
    ]

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="model_loads")
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="loads")
    server = models.ForeignKey(InferenceServer, on_delete=models.PROTECT, related_name="model_loads")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="loads")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    placement = models.ForeignKey(
        Placement, null=True, blank=True, on_delete=models.SET_NULL, related_name="loads"
    )
    request_id = models.CharField(
        max_length=64, blank=True,
        help_text="The id of the request that asked for it: its steps log under it (console.logs)",
    )
    unload_requested_by_label = models.CharField(max_length=200, blank=True)
    drained_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the router had nothing left in flight to it, before its unload",
    )
    bytes_total = models.PositiveBigIntegerField(default=0)
    bytes_done = models.PositiveBigIntegerField(default=0)
    config_hash = models.CharField(max_length=64, blank=True)
    config_override = models.JSONField(
        null=True, blank=True,
        help_text="The full Triton config to load with instead of the version's (benchmark config sweeps)",
    )
    error = models.TextField(blank=True)
    error_trace = models.TextField(
        blank=True, help_text="Traceback of an unexpected error in a step, for operators"
    )
    server_log = models.TextField(blank=True, help_text="Server log lines that explain a failure")
    attempts = models.PositiveIntegerField(default=0, help_text="Transient failures in a row")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    phase_started_at = models.DateTimeField(auto_now_add=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key", "server"],
                condition=~models.Q(idempotency_key=""),
                name="uniq_load_idempotency_key",
            )
        ]
        indexes = [
            models.Index(fields=["state"], name="load_state"),
            # A tenant's loads, newest first (the API's list): a page is read in index order
            # instead of joining and sorting all of the tenant's loads.
            models.Index(fields=["tenant", "-created_at", "-id"], name="load_tenant_newest"),
            # Every tenant's loads, newest first (a platform admin's list), read the same way.
            models.Index(fields=["-created_at", "-id"], name="load_newest"),
            # The servers a tenant's loads ran on (the loads page's server choices), from
            # the index alone.
            models.Index(fields=["tenant", "server"], name="load_tenant_server"),
        ]

    def __str__(self) -> str:
        # No state here: the audit log keeps this name, where a state would read as today's.
        return f"{self.version} on {self.server}"

    @property
    def is_terminal(self) -> bool:
        return self.state in self.TERMINAL

    @property
    def is_unload(self) -> bool:
        return self.state in (self.State.UNLOADING, self.State.UNLOADED) or bool(
            self.unload_requested_by_label
        )

    @property
    def duration_s(self) -> float:
        """Seconds from the request until it settled (or until now, while in flight)."""
        from django.utils import timezone

        end = self.finished_at or (self.ready_at if self.state == self.State.READY else None)
        return ((end or timezone.now()) - self.created_at).total_seconds()

    @property
    def progress_percent(self) -> int:
        """Share of the way done: phases in order, the download counted by its bytes."""
        if self.state in (self.State.READY, self.State.UNLOADED, self.State.LOST):
            return 100
        if self.state == self.State.UNLOADING:
            return 50
        steps = {self.State.PENDING: 0, self.State.ADMITTED: 10, self.State.FETCHING: 10,
                 self.State.PLACING: 60, self.State.LOADING: 75}
        if self.state == self.State.FETCHING and self.bytes_total:
            return 10 + min(round(50 * self.bytes_done / self.bytes_total), 50)
        return steps.get(self.state, 0)


class ModelLoadEvent(models.Model):
    """One step of a load's history: what the reconciler saw and did."""

    load = models.ForeignKey(ModelLoad, on_delete=models.CASCADE, related_name="events")
    state = models.CharField(max_length=16, choices=ModelLoad.State.choices)
    message = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("load__tenant")

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.load_id} {self.state}: {self.message[:60]}"
