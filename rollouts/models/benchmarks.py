"""Benchmark jobs: measured capacity of a model version on a fleet server."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from fleet.models import InferenceServer, Tenant
from fleet.tenancy.scoping import scoped_manager

from .deployments import Deployment
from .jobs import IdempotentJob
from .registry import ModelVersion


class BenchmarkJob(IdempotentJob):
    """A load sweep against one version on one server of a deployment, advanced by an
    idempotent reconciler (``rollouts.benchmarks.reconciler``).

    States: queued → loading (the version, with the config being measured, loaded through
    the load path when it is not ready there) → running (a runner process drives the levels;
    ``progress`` 0..1) → unloading (what the job loaded is taken off again) → the next
    config, or succeeded. ``failed``: it could not go on (``error`` says why); ``cancelled``:
    a person stopped it (the runner stops within a second).

    ``configs`` lists Triton config overrides to compare (empty: the version's own config);
    ``results`` holds one entry per config measured: its levels, its sweep summary, and the
    load that served it. ``summary`` names the best config and its max load within the SLO.
    """

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        LOADING = "loading", "Loading"
        RUNNING = "running", "Running"
        UNLOADING = "unloading", "Unloading"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    class Protocol(models.TextChoices):
        TRITON_HTTP = "triton_http", "Triton KServe v2 (HTTP)"
        TRITON_GRPC = "triton_grpc", "Triton KServe v2 (gRPC)"
        OPENAI_COMPLETIONS = "openai_completions", "OpenAI completions (streamed)"
        OPENAI_CHAT = "openai_chat", "OpenAI chat completions (streamed)"

    class Mode(models.TextChoices):
        CONCURRENCY = "concurrency", "Concurrency (closed loop)"
        RATE = "rate", "Request rate (open loop, Poisson)"

    ACTIVE: ClassVar[list[str]] = [State.QUEUED, State.LOADING, State.RUNNING, State.UNLOADING]
    FINAL: ClassVar[list[str]] = [State.SUCCEEDED, State.FAILED, State.CANCELLED]

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="benchmark_jobs")
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="benchmark_jobs")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="benchmark_jobs")
    server = models.ForeignKey(InferenceServer, on_delete=models.PROTECT, related_name="benchmark_jobs")
    protocol = models.CharField(max_length=24, choices=Protocol.choices)
    mode = models.CharField(max_length=12, choices=Mode.choices, default=Mode.CONCURRENCY)
    levels = models.JSONField(help_text="Concurrencies or request rates, ascending")
    duration_s = models.FloatField(default=10.0, help_text="Measured seconds per level")
    warmup_s = models.FloatField(default=2.0, help_text="Unmeasured seconds before each level")
    max_requests = models.PositiveIntegerField(default=0, help_text="0: no limit per level")
    refine_steps = models.PositiveSmallIntegerField(default=2)
    error_limit = models.FloatField(default=0.5, help_text="Stop when a level's error rate passes this")
    slo = models.JSONField(default=dict, help_text="p99_ms, error_rate (fraction), ttft_p99_ms, itl_p99_ms")
    request = models.JSONField(
        default=dict, blank=True,
        help_text="Triton: the inputs (else made from the model's metadata); "
                  "LLM: prompt and output token distributions",
    )
    configs = models.JSONField(default=list, blank=True, help_text="Triton config overrides to compare")
    state = models.CharField(max_length=12, choices=State.choices, default=State.QUEUED)
    phase = models.CharField(max_length=300, blank=True, help_text="What it is doing now")
    progress = models.FloatField(default=0.0)
    config_index = models.PositiveIntegerField(default=0, help_text="The config being measured")
    results = models.JSONField(default=list, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    shares_production = models.BooleanField(
        default=False, help_text="The server also serves a production deployment"
    )
    run_id = models.CharField(max_length=64, blank=True, help_text="The runner process's run")
    runner_pid = models.PositiveIntegerField(null=True, blank=True)
    runner_started_at = models.DateTimeField(null=True, blank=True)
    load_id = models.PositiveIntegerField(null=True, blank=True, help_text="The load serving the config")
    loaded_by_job = models.BooleanField(default=False)
    cancel_requested_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["server"],
                condition=models.Q(state__in=["queued", "loading", "running", "unloading"]),
                name="one_active_benchmark_per_server",
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="uniq_benchmark_idempotency_key",
            ),
        ]
        indexes = [
            models.Index(fields=["state"], name="benchmark_state"),
            models.Index(fields=["version", "state"], name="benchmark_version_state"),
        ]

    def __str__(self) -> str:
        return f"benchmark {self.pk} of {self.version}"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE

    @property
    def is_llm(self) -> bool:
        return self.protocol in (self.Protocol.OPENAI_COMPLETIONS, self.Protocol.OPENAI_CHAT)

    @property
    def best(self) -> dict | None:
        """The result entry of the best config (None before any finished)."""
        index = (self.summary or {}).get("best_config")
        if index is None or index >= len(self.results):
            return None
        return self.results[index]
