"""Console forms for deployments: create or change one, delete it. Each calls the domain
function the API calls (``rollouts.deployments.lifecycle``), so the console and the API refuse
the same input with the same message on the same field (``console.forms.DomainForm``)."""

from __future__ import annotations

from typing import Any

from django import forms

from console.forms import DomainForm
from fleet.models import Cluster, InferenceServer, Membership
from fleet.tenancy.scoping import has_role
from rollouts.deployments import consistency
from rollouts.deployments import lifecycle as deployments
from rollouts.deployments.widgets import ServerCheckboxes
from rollouts.models import Deployment, Model
from rollouts.registry.forms import INT_MAX


class DeploymentForm(DomainForm):
    """Create or change a deployment (``deployments.save_deployment``): its model (fixed once
    created), cluster, servers, SLO and production flag. The tenant is the model's.

    Only an approver changes an existing deployment's production flag: for anyone else the
    box is shown as it is and cannot change (the domain refuses it with a 403 all the same)."""

    name = forms.CharField(max_length=64, help_text="Lowercase letters, digits and dashes")
    model = forms.ModelChoiceField(
        queryset=Model.objects.none(),
        error_messages={"required": "choose a model", "invalid_choice": "not one of your models"},
    )
    cluster = forms.ModelChoiceField(
        queryset=Cluster.objects.all(),
        error_messages={"required": "choose a cluster", "invalid_choice": "no such cluster"},
    )
    servers = forms.ModelMultipleChoiceField(
        queryset=InferenceServer.objects.select_related("cluster").order_by("cluster__name", "name"),
        required=False, widget=ServerCheckboxes,
        help_text="The cluster's inference servers that carry it; none chosen on a new "
                  "deployment: all of the cluster's servers",
        error_messages={"invalid_choice": "no such server", "invalid_pk_value": "no such server"},
    )
    production = forms.BooleanField(required=False, help_text="Loads approved versions only")
    guard_servers = forms.BooleanField(
        required=False, label="Keep other tenants' loads off its servers",
        help_text="While production: another tenant's load, unload or benchmark on a shared server cannot "
                  "disturb its latency")
    slo_p99_ms = forms.IntegerField(min_value=1, max_value=INT_MAX, initial=500, label="p99 latency SLO (ms)")
    slo_error_rate = forms.DecimalField(min_value=0, max_value=100, max_digits=5, decimal_places=2,
                                        initial="1.00", label="Error-rate ceiling (%)")
    slo_window_days = forms.IntegerField(
        min_value=1, max_value=30, initial=30, required=False, label="SLO window (days)",
        help_text="The error budget is counted over this many days (1 to 30)")
    request_timeout_s = forms.FloatField(
        min_value=0.1, max_value=3600, required=False, label="Request deadline (s)",
        help_text="A request its server has not answered by then ends with 504 and counts as an "
                  "error and as slow; empty: the router's own limit (300 s)")
    priority = forms.IntegerField(
        min_value=-1000, max_value=1000, initial=0, required=False,
        help_text="When borrowed quota is reclaimed by a tenant of your cohort, the lowest "
                  "priority goes first")
    auto_converge = forms.BooleanField(
        required=False, label="Converge by itself",
        help_text="When its servers disagree (a version missing from one, or run with another "
                  "config), the reconcile tick makes them agree")
    description = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(self, *args: Any, deployment: Deployment | None = None, **kwargs: Any) -> None:
        if deployment is not None:
            kwargs.setdefault("initial", {
                "name": deployment.name, "model": deployment.model_id,
                "cluster": deployment.cluster_id, "servers": list(deployment.servers.all()),
                "production": deployment.production, "guard_servers": deployment.guard_servers,
                "slo_p99_ms": deployment.slo_p99_ms,
                "slo_error_rate": deployment.slo_error_rate, "slo_window_days": deployment.slo_window_days,
                "request_timeout_s": deployment.request_timeout_s, "priority": deployment.priority,
                "auto_converge": deployment.auto_converge, "description": deployment.description,
            })
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        self.fields["model"].queryset = Model.objects.visible_to(self.actor).select_related("tenant")
        self.fields["model"].label_from_instance = lambda m: f"{m.tenant.slug} / {m.name}"
        self.fields["servers"].label_from_instance = lambda s: f"{s.name} ({s.cluster.name})"
        if deployment is not None:
            self.fields["model"].disabled = True
            self.fields["model"].help_text = "A deployment's model cannot change"
            if not has_role(self.actor, deployment.tenant, Membership.Role.APPROVER):
                self.fields["production"].disabled = True
                self.fields["production"].help_text = ("Loads approved versions only; an "
                                                       "approver changes this")

    def clean(self) -> dict[str, Any]:
        """Servers of another cluster than the one chosen: a mistake in the form, on
        ``servers``, naming the cluster's own servers."""
        data = super().clean()
        cluster, servers = data.get("cluster"), data.get("servers") or []
        strangers = [s.name for s in servers if cluster is not None and s.cluster_id != cluster.pk]
        if strangers:
            own = ", ".join(s.name for s in cluster.servers.order_by("name")) or "none yet"
            self.add_error("servers", f"servers {', '.join(strangers)} are not in cluster "
                                      f"{cluster}; its servers: {own}")
        return data

    def perform(self) -> Deployment:
        data = self.cleaned_data
        servers = list(data["servers"])
        if self.deployment is None:
            deployment = Deployment(tenant=data["model"].tenant, model=data["model"])
            servers = servers or list(data["cluster"].servers.all())
        else:
            deployment = Deployment.objects.get(pk=self.deployment.pk)
        for name in ("name", "cluster", "production", "guard_servers", "slo_p99_ms", "slo_error_rate",
                     "request_timeout_s", "auto_converge"):
            setattr(deployment, name, data[name])
        if data["slo_window_days"] is not None:  # left empty: as it was (30 for a new deployment)
            deployment.slo_window_days = data["slo_window_days"]
        if data["priority"] is not None:  # left empty: as it was (0 for a new deployment)
            deployment.priority = data["priority"]
        deployment.name = deployment.name.strip()
        deployment.description = data["description"].strip()
        return deployments.save_deployment(self.actor, deployment, servers)


class ConvergeForm(DomainForm):
    """Make the deployment's servers agree (``consistency.converge``)."""

    reason = forms.CharField(required=False, max_length=2000)
    error_id_prefix = "converge-"

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment

    def perform(self) -> str:
        done = consistency.converge(self.actor, self.deployment,
                                    reason=self.cleaned_data["reason"].strip())
        parts = [f"loading {_count(done.loads, 'missing version')}" if done.loads else "",
                 f"sending the config again on {_count(done.reloads, 'server')}" if done.reloads else ""]
        return f"Converging {self.deployment.name}: {' and '.join(p for p in parts if p)}."


def _count(rows: list[Any], noun: str) -> str:
    return f"{len(rows)} {noun}{'' if len(rows) == 1 else 's'}"


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
