"""Console forms for loads: load a version of a deployment's model onto its servers, or unload
it, through the domain functions the API calls (``rollouts.loads.requests``), so both faces refuse the
same input with the same message on the same field (``console.forms.DomainForm``)."""

from __future__ import annotations

from typing import Any

from django import forms

from console.forms import DomainForm
from rollouts.loads import requests as loads
from rollouts.models import Deployment, ModelVersion


class DeploymentLoadForm(DomainForm):
    """Load a version of the deployment's model onto its servers, or unload it."""

    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(),
        error_messages={
            "required": "choose a version to load",
            "invalid_choice": "not a version of this deployment's model",
        },
    )
    action = forms.ChoiceField(choices=[("load", "Load"), ("unload", "Unload")], required=False)

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        self.fields["version"].queryset = deployment.model.versions.all()

    def clean_action(self) -> str:
        return self.cleaned_data.get("action") or "load"

    def perform(self) -> str:
        version = self.cleaned_data["version"]
        if self.cleaned_data["action"] == "unload":
            rows = loads.request_unload(self.actor, self.deployment, version)
            if not rows:
                return f"v{version.version} was not loaded."
            return f"Unloading v{version.version} from {_servers(len(rows))}."
        rows, created = loads.request_load(self.actor, self.deployment, version)
        if not created:
            return f"v{version.version} is already ready."
        return f"Loading v{version.version} onto {_servers(len(rows))}."


def _servers(count: int) -> str:
    return f"{count} server{'' if count == 1 else 's'}"


def loads_versions(deployment: Deployment) -> list[int]:
    """Version numbers a rollout of the deployment may bring in (as the load form offers)."""
    versions = deployment.model.versions.exclude(
        status__in=[ModelVersion.Status.REJECTED, ModelVersion.Status.ARCHIVED])
    if deployment.production:
        versions = versions.filter(status=ModelVersion.Status.APPROVED)
    return sorted(versions.values_list("version", flat=True))
