"""Deployments: a model served on a cluster, with the SLO it is held to."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from fleet.models import Cluster, InferenceServer, Tenant
from fleet.models.tenancy import slug_validator
from fleet.tenancy.scoping import scoped_manager

from .registry import Model

UNIQUE_NAME = "uniq_deployment_per_tenant"


class Deployment(models.Model):
    """A model served on a cluster under an SLO (p99 latency and error-rate ceiling).

    ``servers`` are the cluster's inference servers that carry it. Rollouts (later) change
    which versions it serves and in what traffic split.

    Deleting a deployment that has had loads archives it (``archived_at``): the row stays as
    the history its loads point to, read-only, hidden from lists, its name free for reuse.
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
    guard_servers = models.BooleanField(
        default=False,
        help_text="While production: other tenants' loads are kept off its servers (a load, an "
                  "unload or a benchmark of another tenant there can raise its latency)")
    slo_window_days = models.PositiveSmallIntegerField(
        default=30, validators=[MinValueValidator(1), MaxValueValidator(30)],
        help_text="1 to 30: the days over which the SLO's error budget is counted",
    )
    request_timeout_s = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.1), MaxValueValidator(3600)],
        help_text="0.1 to 3600, or empty: the route's request deadline in seconds. A request "
                  "its server has not answered by then ends with 504 from the router and "
                  "counts as an error, and as slow, in SLOs and rollout analysis. Empty: the "
                  "router's own limit (nginx waits 300 s)",
    )
    priority = models.IntegerField(
        default=0, validators=[MinValueValidator(-1000), MaxValueValidator(1000)],
        help_text="-1000 to 1000: when a cohort lender reclaims borrowed quota, the versions "
                  "of the lowest priority deployments are reclaimed first",
    )
    auto_converge = models.BooleanField(
        default=False,
        help_text="When its servers disagree (a version missing from one, or run with another "
                  "config), the reconcile tick converges it by itself: the missing version "
                  "loaded, the version's config sent again (rollouts.deployments.consistency)")
    converged_at = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="When it was last asked to converge (by someone, or by the tick)")
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"],
                condition=models.Q(archived_at__isnull=True),
                name=UNIQUE_NAME,
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def slo_or_none(self) -> models.Model | None:
        """Its SLO status (``rollouts.slo``), None before the first evaluation."""
        try:
            return self.slo  # type: ignore[attr-defined]
        except models.ObjectDoesNotExist:
            return None

    @property
    def is_archived(self) -> bool:
        return self.archived_at is not None

    def get_constraints(self) -> list[tuple[type[models.Model], list[models.BaseConstraint]]]:
        # The name constraint is checked in validate_constraints() below, which names the field.
        return [(cls, [c for c in found if c.name != UNIQUE_NAME]) for cls, found in super().get_constraints()]

    def validate_constraints(self, exclude: set[str] | None = None) -> None:
        """Names are unique among the tenant's deployments in use (archived ones keep theirs),
        reported as a plain unique (tenant, name) is, so the API names ``name``."""
        super().validate_constraints(exclude)
        if self.archived_at is not None or {"tenant", "name"} & set(exclude or ()):
            return
        clash = Deployment._default_manager.filter(
            tenant_id=self.tenant_id, name=self.name, archived_at__isnull=True
        )
        if self.pk is not None:
            clash = clash.exclude(pk=self.pk)
        if clash.exists():
            error = self.unique_error_message(Deployment, ("tenant", "name"))
            raise ValidationError({NON_FIELD_ERRORS: [error]})

    def clean(self) -> None:
        if self.model_id and self.tenant_id and self.model.tenant_id != self.tenant_id:
            raise ValidationError({"model": "the model belongs to another tenant"})
