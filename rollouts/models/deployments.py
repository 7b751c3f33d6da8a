"""Deployments: a model served on a cluster, with the SLO it is held to."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from fleet.models import Cluster, InferenceServer, Tenant
from fleet.models.tenancy import slug_validator
from fleet.tenancy import scoped_manager

from .registry import Model


class Deployment(models.Model):
    """A model served on a cluster under an SLO (p99 latency and error-rate ceiling).

    ``servers`` are the cluster's inference servers that carry it. Rollouts (later) change
    which versions it serves and in what traffic split; the deployment itself has no state
    machine.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="deployments")
    name = models.CharField(max_length=64, validators=[slug_validator])
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="deployments")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="deployments")
    servers = models.ManyToManyField(InferenceServer, blank=True, related_name="deployments")
    production = models.BooleanField(default=False)
    slo_p99_ms = models.PositiveIntegerField(
        default=500, validators=[MinValueValidator(1)], help_text="p99 latency ceiling in ms"
    )
    slo_error_rate = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        default=Decimal("1.00"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("100"))],
        help_text="Error-rate ceiling in percent",
    )
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="uniq_deployment_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name}"

    def clean(self) -> None:
        if self.model_id and self.tenant_id and self.model.tenant_id != self.tenant_id:
            raise ValidationError({"model": "the model belongs to another tenant"})
