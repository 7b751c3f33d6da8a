"""Console forms for the registry: register a model and its versions, set an alias, and ask for,
give or refuse a version's approval (or archive it). Each calls the domain function the API
calls (``rollouts.registry.versions``, ``rollouts.registry.approvals``), so the console and the API
refuse the same input with the same message on the same field (``console.forms.DomainForm``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms

from console.exceptions import DomainError
from console.forms import DomainForm
from fleet.models import Membership, Tenant
from fleet.tenancy.scoping import has_role
from rollouts.models import Model, ModelVersion
from rollouts.registry import approvals
from rollouts.registry import versions as registry

BIGINT_MAX = 2**63 - 1  # PostgreSQL's bigint, the largest size a version may state
INT_MAX = 2**31 - 1


def _tenant_field() -> forms.ChoiceField:
    return forms.ChoiceField(
        error_messages={"invalid_choice": "not one of your tenants", "required": "choose a tenant"}
    )


def _json_object(text: str, example: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object ("" is {}); a syntax error says where it is."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except RecursionError:
        raise forms.ValidationError("nested too deeply") from None
    if not isinstance(value, dict):
        raise forms.ValidationError(f"must be a JSON object, such as {example}")
    return value


class ModelCreateForm(DomainForm):
    """Register a model in one of the actor's tenants (``registry.create_model``). A name
    already registered there is not an error: the form leads to that model, as the API does."""

    tenant = _tenant_field()
    name = forms.CharField(max_length=64, help_text="Lowercase letters, digits and dashes; permanent")
    description = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(self, *args: Any, actor: Any, **kwargs: Any) -> None:
        super().__init__(*args, actor=actor, **kwargs)
        self.tenants = {t.slug: t for t in Tenant.objects.visible_to(actor)}
        self.fields["tenant"].choices = [(slug, t.name) for slug, t in self.tenants.items()]
        deployable = [s for s, t in self.tenants.items()
                      if has_role(actor, t, Membership.Role.DEPLOYER)]
        if len(deployable) == 1:
            self.fields["tenant"].initial = deployable[0]
        self.created = False

    def perform(self) -> Model:
        data = self.cleaned_data
        model, self.created = registry.create_model(
            self.actor, self.tenants[data["tenant"]], data["name"].strip(), data["description"].strip()
        )
        return model


class ModelEditForm(DomainForm):
    """Change a model's description (``registry.update_model``); names are permanent."""

    description = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 4}))

    def __init__(self, *args: Any, model: Model, **kwargs: Any) -> None:
        kwargs.setdefault("initial", {"description": model.description})
        super().__init__(*args, **kwargs)
        self.model = model

    def perform(self) -> Model:
        return registry.update_model(self.actor, self.model, description=self.cleaned_data["description"])


class VersionForm(DomainForm):
    """Register a version of a model (``registry.register_version``): the artifact and its
    digest, the runtime, Triton's config as JSON (checked as the API checks it, its problems
    shown under it), labels and lineage. The same number and digest again is the version
    already there; the same number with another digest is refused on ``sha256``."""

    version = forms.IntegerField(min_value=1, max_value=INT_MAX)
    artifact_uri = forms.CharField(max_length=1024, label="Artifact URI",
                                   help_text="s3://bucket/key of the model folder or archive")
    sha256 = forms.CharField(max_length=64, label="sha256",
                             help_text="64 lowercase hex characters; loads check the artifact against it")
    size_bytes = forms.IntegerField(min_value=0, max_value=BIGINT_MAX, label="Size (bytes)")
    runtime = forms.ChoiceField(choices=ModelVersion.Runtime.choices)
    backend = forms.CharField(required=False, max_length=32,
                              help_text="Triton versions: python, onnxruntime, tensorrt, …; empty for vLLM")
    triton_config = forms.CharField(
        required=False, label="Triton config (JSON)", widget=forms.Textarea(attrs={"rows": 10, "class": "mono"}),
        help_text='config.pbtxt as JSON, e.g. {"max_batch_size": 8, "input": [...], "output": [...]}; empty for vLLM',
    )
    gpus = forms.IntegerField(min_value=0, max_value=INT_MAX, initial=1, label="GPUs",
                              help_text="GPUs (or CPU model instances) needed")
    estimated_gpu_memory_mib = forms.IntegerField(min_value=0, max_value=INT_MAX, initial=0,
                                                  label="Estimated GPU memory (MiB)")
    labels = forms.CharField(required=False, label="Labels (JSON)", widget=forms.Textarea(attrs={"rows": 2, "class": "mono"}),
                             help_text='string keys and values, e.g. {"team": "fraud", "dataset": "2026-10"}')
    adapter_of = forms.CharField(required=False, max_length=200, label="Adapter of",
                                 help_text="vLLM LoRA adapters: the served name of the base model")
    git_sha = forms.CharField(required=False, max_length=40, label="Git commit")
    training_run = forms.CharField(required=False, max_length=200, label="Training run")
    request_approval = forms.BooleanField(required=False, label="Ask for approval right away")

    def __init__(self, *args: Any, model: Model, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model = model
        latest = model.versions.order_by("-version").first()
        self.fields["version"].initial = latest.version + 1 if latest else 1
        if latest is not None:  # the previous version's shape is the likeliest next one
            for name in ("runtime", "backend", "gpus", "estimated_gpu_memory_mib"):
                self.fields[name].initial = getattr(latest, name)
            if latest.triton_config:
                self.fields["triton_config"].initial = json.dumps(latest.triton_config, indent=2)
        self.created = False

    def clean_triton_config(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data["triton_config"], '{"max_batch_size": 8}')

    def clean_labels(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data["labels"], '{"team": "fraud"}')

    def perform(self) -> ModelVersion:
        data = {k: v.strip() if isinstance(v, str) else v for k, v in self.cleaned_data.items()}
        ask = data.pop("request_approval")
        version, self.created = registry.register_version(self.actor, self.model, data,
                                                          request_approval=ask)
        return version


class AliasForm(DomainForm):
    """Point an alias of a model at one of its versions (``registry.set_alias``).

    The production alias names approved versions only: any other is refused on ``version``
    (``registry.check_alias_target``, as the API refuses it). Moving it to an approved version
    whose last load failed or that runs nowhere is refused until ``confirm`` is ticked, and
    the refusal says why (``registry.alias_concerns``); ``concerns`` holds those reasons for
    the page."""

    name = forms.CharField(max_length=64, initial="production", label="Alias")
    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(),
        error_messages={"required": "choose a version",
                        "invalid_choice": "not a version of this model that an alias may name"},
    )
    reason = forms.CharField(required=False, max_length=2000)
    confirm = forms.BooleanField(required=False, label="Move it anyway")

    def __init__(self, *args: Any, model: Model, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model = model
        self.fields["version"].queryset = model.versions.exclude(
            status__in=[ModelVersion.Status.REJECTED, ModelVersion.Status.ARCHIVED]
        ).order_by("-version")
        self.fields["version"].label_from_instance = (
            lambda v: f"v{v.version} · {v.get_status_display()}"
        )
        self.concerns: list[str] = []

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if "name" in data and "version" in data:
            try:
                registry.check_alias_target(data["name"].strip(), data["version"])
            except DomainError as exc:
                self.add_error(exc.field, exc.message)
                return data
            self.concerns = registry.alias_concerns(data["name"].strip(), data["version"])
            if self.concerns and not data.get("confirm"):
                self.add_error("confirm", f"@{data['name'].strip()} would point at a version "
                               f"that {'; '.join(self.concerns)}. Tick to move it anyway.")
        return data

    def perform(self) -> Any:
        data = self.cleaned_data
        reason = data["reason"].strip()
        if self.concerns:
            reason = f"{reason} (moved despite: {'; '.join(self.concerns)})".strip()
        return registry.set_alias(self.actor, self.model, data["name"].strip(), data["version"], reason)


class VersionActionForm(DomainForm):
    """Request approval, approve, reject or archive a version, with the reason recorded."""

    ACTIONS: dict[str, tuple[Callable[..., ModelVersion], str]] = {
        "request-approval": (approvals.request_approval, "Approval requested for {v}."),
        "approve": (approvals.approve, "{v} approved."),
        "reject": (approvals.reject, "{v} rejected."),
        "archive": (approvals.archive, "{v} archived."),
    }

    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)

    def __init__(self, *args: Any, version: ModelVersion, action: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version = version
        self.action = action

    def perform(self) -> str:
        fn, done = self.ACTIONS[self.action]
        fn(self.actor, self.version, self.cleaned_data["reason"].strip())
        return done.format(v=f"{self.version.model.name} v{self.version.version}")
