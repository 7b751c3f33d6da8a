"""Console forms for a deployment's traffic: change its split, routing policy and mirror, give it
its default route, take the route off the router. Each calls the domain function the API calls
(``rollouts.traffic.routes``), so both faces refuse the same input with the same message on the
same field (``console.forms.DomainForm``)."""

from __future__ import annotations

from typing import Any

from django import forms

from console.forms import DomainForm
from rollouts.models import Deployment, Route
from rollouts.traffic import routes, specs


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
            mirror = specs.MirrorTarget(data["mirror_version"], data["mirror_percent"] or 0)
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
