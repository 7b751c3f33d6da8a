"""Latency history: one row per deployment, version and minute."""

from __future__ import annotations

from django.db import models

from fleet.tenancy.scoping import scoped_manager

from .deployments import Deployment


class LatencyRollup(models.Model):
    """One minute of one version's traffic on one deployment, rolled up from the live window.

    The scraper keeps full resolution (a point every tick) in Redis for 15 minutes and
    upserts the current minute here on every tick; rows older than 30 days are pruned.
    ``last_sample_at`` is the time of the newest scrape in the row, so that a minute whose
    scraping stopped half-way reads as old as its data.
    ``label`` is ``v<N>`` for Triton versions, the served model name for vLLM.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="latency")
    label = models.CharField(max_length=200)
    minute = models.DateTimeField()
    requests = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveBigIntegerField(default=0)
    slow = models.PositiveBigIntegerField(
        default=0, help_text="answered requests slower than the deployment's latency SLO (estimated "
                             "from the servers' latency distribution)",
    )
    rps = models.FloatField(default=0.0)
    error_rate = models.FloatField(default=0.0, help_text="percent")
    avg_ms = models.FloatField(null=True, blank=True)
    p50_ms = models.FloatField(null=True, blank=True)
    p95_ms = models.FloatField(null=True, blank=True)
    p99_ms = models.FloatField(null=True, blank=True)
    ttft_p50_ms = models.FloatField(null=True, blank=True)
    itl_p50_ms = models.FloatField(null=True, blank=True)
    last_sample_at = models.DateTimeField(
        null=True, blank=True,
        help_text="when the newest scrape rolled into this minute was taken: the data's age",
    )

    objects = scoped_manager("deployment__tenant")

    class Meta:
        ordering = ["deployment", "label", "minute"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "label", "minute"], name="uniq_rollup_minute"
            )
        ]
        indexes = [models.Index(fields=["minute"], name="rollup_minute")]

    def __str__(self) -> str:
        return f"{self.deployment} {self.label} {self.minute:%Y-%m-%d %H:%M}"
