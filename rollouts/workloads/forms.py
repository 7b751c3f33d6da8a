"""Console forms for servers on Kubernetes: ask for one, scale it (or its HPA range), roll it to
another version, delete it. Each calls the domain function the API calls
(``rollouts.workloads.requests``), so both faces refuse the same input with the same message on
the same field (``console.forms.DomainForm``)."""

from __future__ import annotations

from typing import Any

from django import forms

from console.exceptions import DomainError
from console.forms import DomainForm
from fleet.tenancy import namespaces
from rollouts.models import Deployment, ModelVersion
from rollouts.workloads import checks
from rollouts.workloads import requests as workloads


class WorkloadCreateForm(DomainForm):
    """Run a version of the deployment's model on its Kubernetes cluster
    (``workloads.create_workload``): the GPU product and resource say whose quota it uses."""

    name = forms.CharField(max_length=63, help_text="Deployment, Service and server name")
    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(),
        error_messages={"required": "choose a version",
                        "invalid_choice": "not a version of this deployment's model"},
    )
    replicas = forms.IntegerField(
        required=False, min_value=1, max_value=checks.MAX_REPLICAS,
        help_text="a fixed count (empty: 1); leave it empty for an autoscaled server",
    )
    min_replicas = forms.IntegerField(
        required=False, min_value=1, max_value=checks.MAX_REPLICAS, label="Min replicas (HPA)",
        help_text="with a max: autoscaled by an HPA, chosen now for good",
    )
    max_replicas = forms.IntegerField(
        required=False, min_value=1, max_value=checks.MAX_REPLICAS, label="Max replicas (HPA)",
        help_text="the quota is held for this many",
    )
    gpu_resource = forms.CharField(max_length=100, initial="nvidia.com/gpu", label="GPU resource",
                                   help_text="nvidia.com/gpu, or a MIG slice such as "
                                             "nvidia.com/mig-3g.40gb")
    gpu_product = forms.CharField(max_length=63, label="GPU product",
                                  help_text="the nodes' nvidia.com/gpu.product label, e.g. "
                                            "NVIDIA-A100-SXM4-80GB")
    node_labels = forms.CharField(required=False, label="More node labels",
                                  widget=forms.Textarea(attrs={"rows": 2}),
                                  help_text="key=value, one a line")
    namespace = forms.CharField(required=False, max_length=63)
    model_repository = forms.CharField(required=False, max_length=500,
                                       help_text="s3://bucket/prefix, or a volume's mount path")
    volume_claim = forms.CharField(required=False, max_length=253,
                                   label="PersistentVolumeClaim")
    image = forms.CharField(required=False, max_length=300,
                            help_text="empty: the site's Triton or vLLM image")

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        versions = deployment.model.versions.exclude(
            status__in=[ModelVersion.Status.REJECTED, ModelVersion.Status.ARCHIVED])
        if deployment.production:
            versions = versions.filter(status=ModelVersion.Status.APPROVED)
        self.fields["version"].queryset = versions.exclude(adapter_of__gt="")
        granted = namespaces.granted(deployment.tenant, deployment.cluster)
        self.fields["namespace"].widget.attrs["placeholder"] = granted[0] if granted else ""
        self.fields["namespace"].help_text = (
            f"granted: {', '.join(granted)}" if granted
            else "none granted yet: a platform admin grants namespaces")

    def clean_node_labels(self) -> dict[str, str]:
        labels: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["node_labels"].splitlines(), start=1):
            if not line.strip():
                continue
            key, sep, value = line.strip().partition("=")
            if not sep or not key.strip():
                raise forms.ValidationError(f"line {number}: write key=value")
            labels[key.strip()] = value.strip()
        return labels

    def perform(self) -> str:
        data = self.cleaned_data
        selector = {**data["node_labels"], "nvidia.com/gpu.product": data["gpu_product"].strip()}
        try:
            made, _ = workloads.create_workload(
                self.deployment, data["version"], self.actor, name=data["name"].strip(),
                replicas=data["replicas"], min_replicas=data["min_replicas"],
                max_replicas=data["max_replicas"], namespace=data["namespace"].strip(),
                gpu_resource=data["gpu_resource"].strip(), node_selector=selector,
                model_repository=data["model_repository"].strip(),
                volume_claim=data["volume_claim"].strip(), image=data["image"].strip(),
            )
        except DomainError as exc:
            if exc.field == "node_selector":  # the product and the labels are typed in here
                raise type(exc)(exc.message, field="node_labels") from exc
            raise
        if made.autoscaled:
            return (f"Server {made.name} asked for, autoscaled {made.min_replicas}-"
                    f"{made.max_replicas} by an HPA: quota admitted for {made.max_replicas} "
                    "replicas, applying it to the cluster.")
        return f"Server {made.name} asked for: quota admitted, applying it to the cluster."


class WorkloadActionForm(DomainForm):
    """Scale a server on Kubernetes (``workloads.scale``; an autoscaled one's HPA range,
    ``workloads.set_replica_range``), roll a vLLM server to another base-model version
    (``workloads.roll_version``), or delete it (``workloads.delete_workload``)."""

    ACTIONS = ("scale", "roll", "delete")

    replicas = forms.IntegerField(required=False, min_value=0, max_value=checks.MAX_REPLICAS)
    min_replicas = forms.IntegerField(required=False, min_value=1,
                                      max_value=checks.MAX_REPLICAS)
    max_replicas = forms.IntegerField(required=False, min_value=1,
                                      max_value=checks.MAX_REPLICAS)
    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(), required=False,
        error_messages={"invalid_choice": "not a version of this deployment's model"},
    )
    # Where refusals about the workload itself (its state, the route's traffic) are shown.
    state = forms.Field(required=False, widget=forms.HiddenInput, label="Server")

    def __init__(self, *args: Any, workload: workloads.ServerWorkload, action: str,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.workload = workload
        self.action = action
        self.fields["version"].queryset = workload.deployment.model.versions.all()

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        ranged = data.get("min_replicas") is not None or data.get("max_replicas") is not None
        if (self.action == "scale" and data.get("replicas") is None and not ranged
                and not {"replicas", "min_replicas", "max_replicas"} & set(self.errors)):
            self.add_error("replicas", "give the number of replicas")
        if self.action == "scale" and data.get("replicas") is not None and ranged:
            self.add_error("replicas", "give replicas (a fixed count), or min and max replicas "
                                       "(an autoscaled server), not both")
        if self.action == "roll" and data.get("version") is None and "version" not in self.errors:
            self.add_error("version", "choose a version")
        return data

    def perform(self) -> str:
        name = self.workload.name
        if self.action == "scale" and self.cleaned_data["replicas"] is None:
            low, high = self.cleaned_data["min_replicas"], self.cleaned_data["max_replicas"]
            _, changed = workloads.set_replica_range(self.workload, low, high, self.actor)
            return (f"Changing {name}'s HPA range to {low}-{high} replicas." if changed
                    else f"{name}'s HPA scales within {low}-{high} replicas already.")
        if self.action == "scale":
            replicas = self.cleaned_data["replicas"]
            _, changed = workloads.scale(self.workload, replicas, self.actor)
            return (f"Scaling {name} to {replicas} replicas." if changed
                    else f"{name} runs {replicas} replicas already.")
        if self.action == "roll":
            version = self.cleaned_data["version"]
            _, changed = workloads.roll_version(self.workload, version, self.actor)
            return (f"Rolling {name} to v{version.version}." if changed
                    else f"{name} runs v{version.version} already.")
        _, started = workloads.delete_workload(self.workload, self.actor)
        return f"Deleting {name}." if started else f"{name} is being deleted already."
