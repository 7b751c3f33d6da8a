"""The model registry: models, their immutable versions, and aliases."""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from fleet.models import APIToken, InferenceServer, Tenant
from fleet.models.tenancy import slug_validator
from fleet.tenancy.scoping import scoped_manager, served_model_name
from rollouts.registry import vllm_labels
from rollouts.registry.triton_config import problems as triton_config_problems

sha256_validator = RegexValidator(r"^[0-9a-f]{64}$", "must be 64 lowercase hex characters")
s3_uri_validator = RegexValidator(
    r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]/.+$", "must be an s3://bucket/key URI (bucket: 3-63 lowercase letters, digits, dots, dashes)"
)


class Model(models.Model):
    """A named model owned by one tenant; its versions are what get deployed."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="models")
    name = models.CharField(max_length=64, validators=[slug_validator])
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="uniq_model_per_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name}"

    def name_on(self, server: InferenceServer) -> str:
        """The name this model has on ``server``.

        On a shared Triton server the tenant's slug qualifies it (``acme.fraud-scorer``): the
        server's repository, index and metrics are shared by every tenant loading onto it,
        and the deployment's route rewrites the client's ``/v2/models/fraud-scorer`` to it.
        vLLM clients name the model in the request body, which routes pass through
        untouched, so there it keeps its own name and a server carries one tenant's model of
        a name (``rollouts.loads.requests`` refuses a second). A server Switchyard runs as one
        deployment's Kubernetes workload is that deployment's alone, and loads the model
        under its own name.
        """
        return name_on(self.tenant.slug, self.name, server.runtime, server.source)


def name_on(tenant_slug: str, model_name: str, runtime: str, source: str) -> str:
    """:meth:`Model.name_on` from the values it reads (a tick over many servers has them
    without the rows)."""
    if runtime == InferenceServer.Runtime.TRITON and source != InferenceServer.Source.MANAGED:
        return served_model_name(tenant_slug, model_name)
    return model_name


class ModelVersion(models.Model):
    """One immutable version of a model: what was built, where its artifact is, what it needs.

    Status: registered → pending_approval → approved | rejected; approved or rejected →
    archived. A version may also be archived straight from registered. Everything but the
    status fields is frozen once the row exists: a new build is a new version.
    """

    class Status(models.TextChoices):
        REGISTERED = "registered", "Registered"
        PENDING_APPROVAL = "pending_approval", "Pending approval"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        ARCHIVED = "archived", "Archived"

    class Runtime(models.TextChoices):
        TRITON = "triton", "Triton"
        VLLM = "vllm", "vLLM"

    TRANSITIONS: ClassVar[dict[str, set[str]]] = {
        Status.REGISTERED: {Status.PENDING_APPROVAL, Status.ARCHIVED},
        Status.PENDING_APPROVAL: {Status.APPROVED, Status.REJECTED},
        Status.APPROVED: {Status.ARCHIVED},
        Status.REJECTED: {Status.ARCHIVED},
        Status.ARCHIVED: set(),
    }
    MUTABLE_FIELDS: ClassVar[set[str]] = {
        "status",
        "status_reason",
        "status_changed_at",
        "approval_requested_by",
        "approval_requested_by_token",
        "decided_by",
    }

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="versions")
    version = models.PositiveIntegerField(help_text="Numeric, as Triton's model repository needs")
    artifact_uri = models.CharField(max_length=1024, validators=[s3_uri_validator])
    sha256 = models.CharField(max_length=64, validators=[sha256_validator])
    size_bytes = models.PositiveBigIntegerField()
    runtime = models.CharField(max_length=16, choices=Runtime.choices)
    backend = models.CharField(
        max_length=32, blank=True, help_text="Triton backend (python, onnxruntime, tensorrt, …)"
    )
    triton_config = models.JSONField(default=dict, blank=True)
    gpus = models.PositiveIntegerField(default=1, help_text="GPUs (or CPU model instances) needed")
    estimated_gpu_memory_mib = models.PositiveIntegerField(default=0)
    labels = models.JSONField(default=dict, blank=True)
    adapter_of = models.CharField(
        max_length=200, blank=True,
        help_text="vLLM LoRA adapters: the served name of the base model they apply to",
    )
    git_sha = models.CharField(max_length=40, blank=True)
    training_run = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.REGISTERED)
    status_reason = models.TextField(blank=True)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    registered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    registered_by_token = models.ForeignKey(
        APIToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approval_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approval_requested_by_token = models.ForeignKey(
        APIToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("model__tenant")

    class Meta:
        ordering = ["model__tenant__slug", "model__name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["model", "version"], name="uniq_version_per_model")
        ]

    def __str__(self) -> str:
        return f"{self.model} v{self.version}"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None:
            frozen = [f.attname for f in self._meta.concrete_fields if f.name not in self.MUTABLE_FIELDS]
            stored = type(self).objects.filter(pk=self.pk).values(*frozen).first()
            if stored is not None:
                changed = [name for name in frozen if stored[name] != getattr(self, name)]
                if changed:
                    raise ValidationError(
                        {name: "model versions are immutable once registered" for name in changed}
                    )
        super().save(*args, **kwargs)

    @property
    def tenant(self) -> Tenant:
        return self.model.tenant

    def name_on(self, server: InferenceServer) -> str:
        """The model's name on ``server`` (see :meth:`Model.name_on`)."""
        return self.model.name_on(server)

    def can_become(self, status: str) -> bool:
        return status in self.TRANSITIONS[self.Status(self.status)]

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        if self.runtime == self.Runtime.TRITON and not self.backend:
            errors["backend"] = ["a Triton version names its backend, e.g. python"]
        if self.runtime == self.Runtime.VLLM and self.backend:
            errors["backend"] = ["vLLM versions have no Triton backend"]
        if self.runtime == self.Runtime.TRITON and self.adapter_of:
            errors["adapter_of"] = ["only vLLM LoRA adapter versions name a base model"]
        if problems := label_problems(self.labels):
            errors["labels"] = problems
        elif self.runtime == self.Runtime.VLLM and (problems := vllm_labels.problems(self.labels)):
            errors["labels"] = problems  # flags the platform allows, a Secret of its namespace
        if self.runtime == self.Runtime.VLLM:
            if self.triton_config != {}:
                errors["triton_config"] = ["vLLM versions have no Triton config: leave it out"]
        elif problems := triton_config_problems(
            self.triton_config,
            model_name=self.model.name if self.model_id else None,
            backend=self.backend,
        ):
            errors["triton_config"] = problems
        if errors:
            raise ValidationError(errors)


def label_problems(labels: object) -> list[str]:
    """What is wrong with a version's labels: they are an object of string keys and values."""
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        return ["must be an object of string keys and string values"]
    for key, value in labels.items():
        if not key:
            return ["label names cannot be empty"]
        if "\x00" in key or "\x00" in value:
            return [f"labels.{key.replace(chr(0), '')}: NUL characters are not allowed"]
    return []


class Alias(models.Model):
    """A movable name for one version of a model, such as ``production`` or ``staging``."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="aliases")
    name = models.CharField(max_length=64, validators=[slug_validator])
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="aliases")
    updated_at = models.DateTimeField(auto_now=True)

    objects = scoped_manager("model__tenant")

    class Meta:
        ordering = ["model__name", "name"]
        constraints = [models.UniqueConstraint(fields=["model", "name"], name="uniq_alias_per_model")]
        verbose_name_plural = "aliases"

    def __str__(self) -> str:
        return f"{self.model}@{self.name}"

    def clean(self) -> None:
        if self.version_id and self.model_id and self.version.model_id != self.model_id:
            raise ValidationError({"version": "the version belongs to another model"})
        if self.version_id and self.version.status in (
            ModelVersion.Status.REJECTED,
            ModelVersion.Status.ARCHIVED,
        ):
            raise ValidationError({"version": f"version is {self.version.status}; alias it elsewhere"})
