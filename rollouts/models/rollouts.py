"""Rollouts: a new version brought in by evidence (canary), or versions compared (A/B)."""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.db import models

from fleet.models import Tenant
from fleet.tenancy.scoping import scoped_manager

from .deployments import Deployment
from .jobs import IdempotentJob
from .registry import ModelVersion


class Rollout(IdempotentJob):
    """One rollout of a deployment, advanced by idempotent reconcilers (``rollouts.rollouts``).

    Canary: ``candidate`` is brought in beside ``baseline`` (the stable version) through the
    ``steps`` (set a weight, pause, analysis, approval); when every step passed it is promoted
    (all traffic, the alias moved, the baseline unloaded when ``unload_previous``).
    A/B: the versions of ``variants`` share the traffic at fixed weights for ``duration_s`` or
    until each has ``sample_size`` requests, and the rollout ends in a ``verdict``.

    States: pending_approval (before it starts, or at an approval step) → loading (the
    versions it needs loaded through model loads) → progressing (the steps) ⇄ paused →
    promoting → succeeded. A failed analysis, an unhealthy candidate server or a failed load
    rolls back (traffic back on the baseline in the same tick): rolling_back while the router
    has not taken it yet → rolled_back. ``aborted``: a person sent it back to the baseline.
    ``failed``: it could not go on and could not be made safe by itself (``reason`` says why).

    Actions of people (pause, resume, promote, abort, retry) are recorded on the row
    (``requested_action``) and carried out by the reconciler at its next tick, under the same
    lease as every step, so an action never races a step.
    """

    class State(models.TextChoices):
        PENDING_APPROVAL = "pending_approval", "Pending approval"
        LOADING = "loading", "Loading"
        PROGRESSING = "progressing", "Progressing"
        PAUSED = "paused", "Paused"
        PROMOTING = "promoting", "Promoting"
        BAKING = "baking", "Baking"
        SUCCEEDED = "succeeded", "Succeeded"
        ROLLING_BACK = "rolling_back", "Rolling back"
        ROLLED_BACK = "rolled_back", "Rolled back"
        FAILED = "failed", "Failed"
        ABORTED = "aborted", "Aborted"

    class Strategy(models.TextChoices):
        CANARY = "canary", "Canary"
        AB = "ab", "A/B split"

    class Action(models.TextChoices):
        PAUSE = "pause", "Pause"
        RESUME = "resume", "Resume"
        PROMOTE = "promote", "Promote now"
        ABORT = "abort", "Abort"

    ACTIVE: ClassVar[list[str]] = [
        State.PENDING_APPROVAL, State.LOADING, State.PROGRESSING, State.PAUSED, State.PROMOTING,
        State.BAKING, State.ROLLING_BACK,
    ]
    FINAL: ClassVar[list[str]] = [State.SUCCEEDED, State.ROLLED_BACK, State.FAILED, State.ABORTED]
    RETRYABLE: ClassVar[list[str]] = [State.ROLLED_BACK, State.FAILED, State.ABORTED]

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="rollouts")
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="rollouts")
    strategy = models.CharField(max_length=8, choices=Strategy.choices, default=Strategy.CANARY)
    state = models.CharField(max_length=20, choices=State.choices, default=State.LOADING)
    baseline = models.ForeignKey(
        ModelVersion, on_delete=models.PROTECT, related_name="+",
        help_text="The stable version traffic goes back to (A/B: the reference variant)",
    )
    candidate = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="Canary: the version brought in",
    )
    variants = models.JSONField(
        default=list, blank=True,
        help_text="A/B: [{version, weight}], the reference (the baseline) first",
    )
    steps = models.JSONField(default=list, blank=True, help_text="Canary: the step list")
    step_index = models.PositiveIntegerField(default=0, help_text="The step being carried out")
    step_started_at = models.DateTimeField(null=True, blank=True)
    weights = models.JSONField(default=dict, blank=True, help_text="Traffic asked for, by version")
    analysis = models.JSONField(default=dict, blank=True, help_text="How analyses judge")
    servers = models.JSONField(default=list, blank=True, help_text="Servers the versions load on")
    sticky_header = models.CharField(max_length=64, blank=True)
    duration_s = models.PositiveIntegerField(null=True, blank=True)
    sample_size = models.PositiveIntegerField(null=True, blank=True)
    promote = models.BooleanField(
        default=True, help_text="Canary: always. A/B: promote a clear winner at the end",
    )
    alias = models.CharField(
        max_length=64, blank=True, help_text="The alias promotion moves (empty: none)"
    )
    unload_previous = models.BooleanField(default=True)
    step_state = models.JSONField(
        default=dict, blank=True,
        help_text="What the current step keeps between ticks (a confirm step's last ask)")
    dry_run = models.BooleanField(
        default=False, help_text="Canary: each weight is copies of that share of the requests, "
        "judged against the baseline's answers; no traffic moves and nothing is promoted")
    requires_approval = models.BooleanField(default=False)
    requested_action = models.CharField(max_length=8, choices=Action.choices, blank=True)
    requested_action_by = models.CharField(max_length=200, blank=True)
    requested_action_reason = models.TextField(blank=True)
    waiting_for = models.CharField(
        max_length=200, blank=True, help_text="What a paused or pending rollout waits for"
    )
    reason = models.TextField(blank=True, help_text="Why it is in its state")
    verdict = models.JSONField(default=dict, blank=True, help_text="A/B: the verdict")
    failures = models.PositiveIntegerField(default=0, help_text="Failed looks in this analysis")
    attempt = models.PositiveIntegerField(default=1)
    load_ids = models.JSONField(default=list, blank=True)
    request_id = models.CharField(
        max_length=64, blank=True,
        help_text="The id of the request that asked for it: its steps log under it (console.logs)",
    )
    next_tick_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment"],
                condition=models.Q(state__in=[
                    "pending_approval", "loading", "progressing", "paused", "promoting",
                    "baking", "rolling_back",
                ]),
                name="one_active_rollout_per_deployment",
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="uniq_rollout_idempotency_key",
            ),
        ]
        indexes = [models.Index(fields=["state"], name="rollout_state")]

    def __str__(self) -> str:
        return f"rollout {self.pk} of {self.deployment}"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE

    @property
    def versions(self) -> list[int]:
        """The version numbers the rollout routes to, the baseline first."""
        if self.strategy == self.Strategy.AB:
            return [int(v["version"]) for v in self.variants]
        return [self.baseline.version] + ([self.candidate.version] if self.candidate_id else [])

    @property
    def current_step(self) -> dict | None:
        if self.strategy == self.Strategy.CANARY and self.step_index < len(self.steps):
            return self.steps[self.step_index]
        return None

    @property
    def candidate_weight(self) -> int:
        if self.candidate_id is None:
            return 0
        return int(self.weights.get(str(self.candidate.version), 0))


class RolloutEvent(models.Model):
    """One entry of a rollout's timeline: what the reconciler (or a person) saw and did, why,
    and the evidence (``data``)."""

    class Kind(models.TextChoices):
        REQUEST = "request", "Request"
        STATE = "state", "State change"
        STEP = "step", "Step"
        LOAD = "load", "Load"
        ANALYSIS = "analysis", "Analysis"
        ACTION = "action", "Action"
        APPROVAL = "approval", "Approval"
        ROLLBACK = "rollback", "Rollback"
        ERROR = "error", "Error"

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    state = models.CharField(max_length=20, choices=Rollout.State.choices)
    step_index = models.PositiveIntegerField(null=True, blank=True)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    actor_label = models.CharField(max_length=200, default="system")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("rollout__tenant")

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.rollout_id} {self.kind}: {self.message[:60]}"


class RolloutAnalysis(models.Model):
    """One analysis of a canary step: judged every tick on the same window of requests of
    the candidate and the baseline (from ``window_start`` on), each look kept in ``last``
    (the judge's numbers and the SLO gates) until it ends in a verdict."""

    class Verdict(models.TextChoices):
        RUNNING = "running", "Running"
        PASS = "pass", "Pass"
        FAIL = "fail", "Fail"
        INCONCLUSIVE = "inconclusive", "Inconclusive"

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="analyses")
    step_index = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(default=1)
    weight = models.PositiveSmallIntegerField(default=0, help_text="Candidate weight judged at")
    verdict = models.CharField(max_length=12, choices=Verdict.choices, default=Verdict.RUNNING)
    reasons = models.JSONField(default=list, blank=True)
    config = models.JSONField(default=dict, blank=True)
    window_start = models.FloatField(help_text="Unix time the window of requests starts")
    looks = models.PositiveIntegerField(default=0)
    spent = models.FloatField(default=0.0, help_text="The error budget this analysis may spend")
    failed_looks = models.PositiveIntegerField(default=0)
    inconclusive_ends = models.PositiveIntegerField(
        default=0, help_text="Times it ended inconclusive and started again (inconclusive_limit)")
    judgement = models.JSONField(default=dict, blank=True, help_text="The last look's judge")
    slo = models.JSONField(default=dict, blank=True, help_text="The last look's SLO gates")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = scoped_manager("rollout__tenant")

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "rollout analyses"
        constraints = [
            models.UniqueConstraint(
                fields=["rollout", "attempt", "step_index"], name="uniq_analysis_per_step"
            )
        ]

    def __str__(self) -> str:
        return f"analysis of {self.rollout} step {self.step_index} ({self.verdict})"


class RolloutApproval(models.Model):
    """A person's approval of a rollout: to start (``step_index`` null) or at a step."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="approvals")
    step_index = models.PositiveIntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_by_label = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("rollout__tenant")

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"approval of {self.rollout} by {self.approved_by_label}"
