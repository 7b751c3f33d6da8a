"""SLO status per deployment and the burn-rate alerts opened on it (``rollouts.slo``)."""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from fleet.models import InferenceServer
from fleet.tenancy.scoping import scoped_manager

from .deployments import Deployment


class SloStatus(models.Model):
    """Where a deployment stands against its SLO, as the last evaluation found it.

    ``state``: ok; at_risk (the last hour spent the budget faster than the window allows, or
    less than a quarter of it is left); breaching (the last five minutes are over the SLO as
    written, the window's budget is spent, or a burn-rate alert is open); no_traffic (no
    request in the last five minutes). ``budget_left`` is the share of the window's error
    budget left (negative: overspent), the lower of the two objectives'. Burn rates are the
    higher of the two objectives' (1.0 spends the budget exactly over the window).
    ``detail`` has each objective's numbers per window.
    """

    class State(models.TextChoices):
        OK = "ok", "OK"
        AT_RISK = "at_risk", "At risk"
        BREACHING = "breaching", "Breaching"
        NO_TRAFFIC = "no_traffic", "No traffic"

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, primary_key=True,
                                      related_name="slo")
    state = models.CharField(max_length=16, choices=State.choices, default=State.NO_TRAFFIC)
    since = models.DateTimeField(help_text="when the deployment entered this state")
    reason = models.CharField(max_length=300, blank=True)
    budget_left = models.FloatField(null=True, blank=True)
    burn_5m = models.FloatField(null=True, blank=True)
    burn_30m = models.FloatField(null=True, blank=True)
    burn_1h = models.FloatField(null=True, blank=True)
    burn_6h = models.FloatField(null=True, blank=True)
    detail = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    evaluated_at = models.DateTimeField()

    objects = scoped_manager("deployment__tenant")

    class Meta:
        indexes = [models.Index(fields=["state"], name="slo_status_state")]
        verbose_name_plural = "SLO statuses"

    def __str__(self) -> str:
        return f"{self.deployment}: {self.state}"

    @property
    def budget_left_pct(self) -> float | None:
        return None if self.budget_left is None else self.budget_left * 100


class SloAlert(models.Model):
    """One burn-rate alert on one deployment's objective, from opened to resolved.

    ``rule`` is fast_burn (1 h and 5 min both burning over 14.4 times the budget's rate) or
    slow_burn (6 h and 30 min over 6); ``sli`` the objective (errors or latency). It opens
    when both windows burn over the rule's factor and resolves when the short window no
    longer does. ``events`` is its timeline: [{"at", "text"}].
    """

    class Rule(models.TextChoices):
        FAST_BURN = "fast_burn", "Fast burn"
        SLOW_BURN = "slow_burn", "Slow burn"

    class Sli(models.TextChoices):
        ERRORS = "errors", "Errors"
        LATENCY = "latency", "Latency"

    class State(models.TextChoices):
        FIRING = "firing", "Firing"
        RESOLVED = "resolved", "Resolved"

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="slo_alerts")
    rule = models.CharField(max_length=16, choices=Rule.choices)
    sli = models.CharField(max_length=16, choices=Sli.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.FIRING)
    summary = models.CharField(max_length=300)
    burn_long = models.FloatField(help_text="the long window's burn rate when it opened")
    burn_short = models.FloatField(help_text="the short window's burn rate when it opened")
    peak_burn = models.FloatField(help_text="the highest short-window burn rate while it fired")
    opened_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    events = models.JSONField(default=list, encoder=DjangoJSONEncoder)

    objects = scoped_manager("deployment__tenant")

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "rule", "sli"], condition=models.Q(state="firing"),
                                    name="uniq_firing_slo_alert"),
        ]
        indexes = [models.Index(fields=["state", "-opened_at"], name="slo_alert_state")]

    def __str__(self) -> str:
        return f"{self.deployment} {self.rule} {self.sli} ({self.state})"


class RoutedMinute(models.Model):
    """One minute of a deployment's requests as its router saw them, for its SLO: every
    request (4xx included), the failed ones (5xx, no answer, timeouts) and the answered ones
    slower than the latency SLO. Written by the SLO tick from the router's per-request
    samples; where a window has these, the SLO counts them instead of the servers' own
    metrics (which miss failures a backend answers, and have no exact latencies)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="routed_minutes")
    minute = models.DateTimeField()
    requests = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveBigIntegerField(default=0)
    slow = models.PositiveBigIntegerField(default=0)

    objects = scoped_manager("deployment__tenant")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["deployment", "minute"], name="uniq_routed_minute")]
        indexes = [models.Index(fields=["minute"], name="routed_minute")]

    def __str__(self) -> str:
        return f"{self.deployment} {self.minute:%Y-%m-%d %H:%M}"


class SloDisturbance(models.Model):
    """A change on a shared server (a load, an unload, a benchmark) by one deployment that
    coincided with another deployment on that server going over or near its SLO: its noisy
    neighbour. Both deployments' pages show it; to another tenant the change is "a change on
    this server" and the deployment it touched "another deployment on this server", never a
    name. ``cause_key`` names the change (``load:<id>:<state>``, ``benchmark:<id>``), so
    each is recorded once per affected deployment."""

    class Kind(models.TextChoices):
        LOAD = "load", "Load"
        UNLOAD = "unload", "Unload"
        BENCHMARK = "benchmark", "Benchmark"

    affected = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="disturbances")
    cause = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="disturbed")
    server = models.ForeignKey(InferenceServer, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    cause_key = models.CharField(max_length=64)
    cause_label = models.CharField(max_length=200, help_text="what changed, for those who may see the cause")
    changed_at = models.DateTimeField()
    detected_at = models.DateTimeField()
    affected_state = models.CharField(max_length=16, choices=SloStatus.State.choices)
    affected_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-detected_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["affected", "cause_key"], name="uniq_slo_disturbance")]

    def __str__(self) -> str:
        return f"{self.cause_key} on {self.server_id} near {self.affected}"
