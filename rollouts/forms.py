"""Console forms. Each shapes its input, then ``save()`` calls the domain function the API calls,
so both faces refuse the same input with the same message on the same field. Their
``perform()`` returns the message to show the user (``fleet.forms.DomainForm``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms

from fleet.forms import DomainForm
from rollouts import approvals, deployments, loads, routes
from rollouts.models import Deployment, ModelVersion, Route


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
            return f"Unloading v{version.version} from {len(rows)} server(s)."
        rows, created = loads.request_load(self.actor, self.deployment, version)
        if not created:
            return f"v{version.version} is already ready."
        return f"Loading v{version.version} onto {len(rows)} server(s)."


class DeploymentDeleteForm(DomainForm):
    """Delete a deployment: archived when it has load history, deleted when it has none."""

    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment

    def perform(self) -> str:
        outcome = deployments.delete_deployment(
            self.actor, self.deployment, self.cleaned_data["reason"].strip()
        )
        return f"Deployment {self.deployment.name} {outcome}."


class RouteForm(DomainForm):
    """Change a deployment's traffic split, routing policy and mirror (``routes.set_route``).

    One weight field per version ready on the deployment's servers (``weight_<n>``; left
    empty it is 0). The domain's refusals of the split as a whole land on ``weights``, those
    of the mirror on ``mirror``, and the router's on the form itself.
    """

    policy = forms.ChoiceField(choices=Route.Policy.choices, initial=Route.Policy.WEIGHTED)
    sticky_header = forms.CharField(
        required=False, max_length=64, label="Sticky header",
        help_text="The request header whose value keeps a client on its variant (sticky policy)",
    )
    mirror_version = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="Mirror to",
        error_messages={"invalid_choice": "not a version ready on the deployment's servers"},
    )
    mirror_percent = forms.IntegerField(required=False, min_value=0, max_value=100,
                                        label="Mirrored share (%)")
    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)
    # Where the domain's refusals of the split and of the mirror are shown.
    weights = forms.Field(required=False, widget=forms.HiddenInput, label="Weights")
    mirror = forms.Field(required=False, widget=forms.HiddenInput, label="Mirror")

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        route = Route.objects.filter(pk=deployment.pk).first()
        self.versions = sorted({load.version.version for load in routes.ready_loads(deployment)})
        in_force = route.version_weights if route is not None else {}
        for number in self.versions:
            self.fields[f"weight_{number}"] = forms.IntegerField(
                required=False, min_value=0, max_value=100, label=f"v{number}",
                initial=in_force.get(number, 0),
            )
        self.fields["mirror_version"].choices = [("", "no mirror")] + [
            (n, f"v{n}") for n in self.versions
        ]
        if route is not None and route.spec:
            self.fields["policy"].initial = route.policy
            self.fields["sticky_header"].initial = route.sticky_header
            target = route.variants.get(route.mirror_variant) or {}
            self.fields["mirror_version"].initial = target.get("version")
            self.fields["mirror_percent"].initial = route.mirror_percent or None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("mirror_percent") and data.get("mirror_version") is None:
            self.add_error("mirror_version", "choose the version to mirror to")
        return data

    def weight_fields(self) -> list[forms.BoundField]:
        return [self[f"weight_{n}"] for n in self.versions]

    def perform(self) -> str:
        data = self.cleaned_data
        weights = {n: data.get(f"weight_{n}") or 0 for n in self.versions}
        mirror = None
        if data["mirror_version"] is not None:
            mirror = routes.MirrorTarget(data["mirror_version"], data["mirror_percent"] or 0)
        route = routes.set_route(
            self.actor, self.deployment, weights, policy=data["policy"],
            # The header field keeps the sticky header in force; it means nothing to the others.
            sticky_header=data["sticky_header"].strip() if data["policy"] == Route.Policy.STICKY
            else "",
            mirror=mirror,
            reason=data["reason"].strip(),
        )
        split = ", ".join(f"v{n} {w}%" for n, w in route.version_weights.items() if w)
        return f"Traffic of {self.deployment.name}: {split} ({route.get_policy_display().lower()})."


class RouteDefaultForm(DomainForm):
    """Give a deployment its default route (``routes.ensure_route``)."""

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment

    def perform(self) -> str:
        route, made = routes.ensure_route(self.actor, self.deployment)
        if not made:
            return f"{self.deployment.name} already has a route."
        shares = route.version_weights
        return f"{self.deployment.name} routes all traffic to v{max(shares, key=shares.get)}."


class RouteRemoveForm(DomainForm):
    """Take a deployment's route off the router (``routes.remove_route``)."""

    reason = forms.CharField(required=False, max_length=2000)

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment

    def perform(self) -> str:
        routes.remove_route(self.actor, self.deployment, self.cleaned_data["reason"].strip())
        return f"{self.deployment.name}'s route is removed: its URL no longer answers."
