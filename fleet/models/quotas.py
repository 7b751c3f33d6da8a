"""Tenant quotas per device class, and the placements that use them."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

from fleet.tenancy.scoping import FleetQuerySet, scoped_manager

from .inventory import InferenceServer
from .tenancy import Tenant, slug_validator

CPU_CLASS = "cpu"


class Quota(models.Model):
    """How much of one device class a tenant may hold at once.

    For a GPU class (e.g. ``nvidia-a100-80gb``) ``units`` counts GPUs and ``memory_mib`` GPU
    memory. For the ``cpu`` class (CPU-only nodes such as the local demo cluster) ``units``
    counts model instances and ``memory_mib`` host memory. Usage is the sum of the tenant's
    active placements on that class.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    device_class = models.CharField(max_length=64, validators=[slug_validator])
    units = models.PositiveIntegerField(help_text="GPUs, or model instances for the cpu class")
    memory_mib = models.PositiveBigIntegerField(help_text="GPU memory, or host memory for cpu")
    borrowing_limit_units = models.PositiveIntegerField(
        default=0, help_text="Units the tenant may borrow from its cohort above its quota")
    borrowing_limit_memory_mib = models.PositiveBigIntegerField(
        default=0, help_text="Memory the tenant may borrow from its cohort above its quota")
    updated_at = models.DateTimeField(auto_now=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["tenant__slug", "device_class"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "device_class"], name="uniq_quota_per_class")
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.device_class}"

    @property
    def is_cpu(self) -> bool:
        return self.device_class == CPU_CLASS

    @property
    def unit_label(self) -> str:
        return "model instances" if self.is_cpu else "GPUs"

    @property
    def memory_label(self) -> str:
        return "host memory" if self.is_cpu else "GPU memory"

class Placement(models.Model):
    """One model version loaded on one server, holding quota while it is active.

    States: loading → active → released. Only ``loading`` and ``active`` placements count
    against quota. ``borrowed_*``: how much of it the tenant holds above its own quota,
    borrowed from its cohort (fleet.quota.admission keeps these marks on the tenant's newest, lowest
    priority placements). ``priority`` comes from the deployment: when a lender reclaims,
    the lowest priority goes first.
    """

    class State(models.TextChoices):
        LOADING = "loading", "Loading"
        ACTIVE = "active", "Active"
        RELEASED = "released", "Released"

    HOLDING = (State.LOADING, State.ACTIVE)

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="placements")
    server = models.ForeignKey(InferenceServer, on_delete=models.PROTECT, related_name="placements")
    model_version = models.ForeignKey(
        "rollouts.ModelVersion", on_delete=models.PROTECT, related_name="placements"
    )
    device_class = models.CharField(max_length=64, validators=[slug_validator])
    units = models.PositiveIntegerField()
    memory_mib = models.PositiveBigIntegerField()
    borrowed_units = models.PositiveIntegerField(default=0)
    borrowed_memory_mib = models.PositiveBigIntegerField(default=0)
    priority = models.IntegerField(default=0)
    config_hash = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.LOADING)
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["server", "model_version"],
                condition=models.Q(state__in=["loading", "active"]),
                name="uniq_active_placement",
            )
        ]

    def __str__(self) -> str:
        # No state here: the audit log keeps this name, where a state would read as today's.
        return f"{self.model_version} on {self.server}"

    def clean(self) -> None:
        if self.units == 0:
            raise ValidationError({"units": "a placement holds at least one unit"})


class QuotaRequest(models.Model):
    """A tenant admin's request for more of one device class, and a platform admin's answer.

    ``units`` and ``memory_mib`` are the totals asked for (not an increment). Approved, the
    tenant's quota becomes what was granted (``granted_*``: as asked, or changed by the
    approver); with ``until`` the grant ends then and the quota returns to what it was before
    (``previous_*``; none when the tenant had no quota of that class).
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        APPROVED = "approved", "Approved"
        REFUSED = "refused", "Refused"
        ENDED = "ended", "Ended"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quota_requests")
    device_class = models.CharField(max_length=64, validators=[slug_validator])
    units = models.PositiveIntegerField(help_text="GPUs (model instances for cpu) asked for in all")
    memory_mib = models.PositiveBigIntegerField(help_text="Memory asked for in all")
    reason = models.TextField()
    until = models.DateTimeField(null=True, blank=True, help_text="When the grant ends; empty: it stays")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    requested_by_label = models.CharField(max_length=200)
    decided_by_label = models.CharField(max_length=200, blank=True)
    decision_reason = models.TextField(blank=True)
    granted_units = models.PositiveIntegerField(null=True, blank=True)
    granted_memory_mib = models.PositiveBigIntegerField(null=True, blank=True)
    previous_units = models.PositiveIntegerField(null=True, blank=True)
    previous_memory_mib = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "until"], name="quota_request_due")]

    def __str__(self) -> str:
        return f"{self.tenant} {self.device_class}: {self.units} units, {self.memory_mib} MiB"


class DevicePrice(models.Model):
    """What an hour of one unit of a device class costs (a GPU of ``nvidia-a100-80gb``, a model
    instance of ``cpu``), set by platform admins: it turns the GPU-seconds a version holds and
    uses into money (``rollouts.registry.costs``). Readable by every tenant member."""

    device_class = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    per_unit_hour = models.DecimalField(
        max_digits=12, decimal_places=4, validators=[MinValueValidator(Decimal(0))],
        help_text="Price of one unit for one hour, in ``currency``")
    currency = models.CharField(
        max_length=3, default="USD", validators=[RegexValidator(r"^[A-Z]{3}$", "three capital "
                                                                "letters, e.g. USD")],
        help_text="ISO 4217 code, e.g. USD or EUR")
    updated_at = models.DateTimeField(auto_now=True)

    objects = FleetQuerySet.as_manager()

    class Meta:
        ordering = ["device_class"]

    def __str__(self) -> str:
        return f"{self.device_class}: {self.per_unit_hour} {self.currency}/unit-hour"
