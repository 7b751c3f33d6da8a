"""The console's cluster form (platform admins): the same rules as the API, the secret
write-only, every change audited."""

from __future__ import annotations

from typing import Any

from django import forms

from console.exceptions import DomainError
from fleet import audit
from fleet.inventory import kube_connection, routers
from fleet.models import Cluster

#: What the console's cluster form edits: the fields the API writes.
CLUSTER_FIELDS = [
    "name", "kind", "description", "api_url", "kube_auth", "kube_context", "kube_ca_bundle",
    "kube_secret_env", "kube_namespace", "kube_router", "kube_gateway", "kube_route_host",
    "s3_endpoint_url", "s3_region",
]


class ClusterForm(forms.ModelForm):
    """Add or change a cluster of any kind (platform admins).

    The same rules as the API: the model's ``clean()`` (through the ModelForm's
    ``full_clean``) and ``fleet.inventory.kube_connection.change_secret`` for the secret, so a refusal
    reads the same on the same field. The secret is write-only: a password field for a bearer
    token, a text area for a kubeconfig (a password field would drop its line breaks), both
    always rendered empty; left empty, the stored one is kept. ``save()`` records the change
    in the audit log, the secret as "changed" or "removed", never its value.
    """

    api_url = forms.URLField(
        required=False, max_length=200, assume_scheme="https", label="API server URL",
        widget=forms.TextInput(attrs={"inputmode": "url", "spellcheck": "false"}),
        help_text="The Kubernetes API server, e.g. https://10.0.0.1:6443 (token "
                  "authentication)",
    )
    kube_secret = forms.CharField(
        required=False, max_length=kube_connection.MAX_SECRET, label="Bearer token",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: stored encrypted, never shown again. Leave empty to keep the "
                  "stored one.",
    )
    kube_kubeconfig = forms.CharField(
        required=False, max_length=kube_connection.MAX_SECRET, label="kubeconfig",
        widget=forms.Textarea(attrs={"rows": 6, "autocomplete": "off", "spellcheck": "false"}),
        help_text="Or, for kubeconfig authentication, its text. Write-only as the token: "
                  "leave empty to keep the stored one.",
    )
    clear_kube_secret = forms.BooleanField(
        required=False, label="Remove the stored token or kubeconfig",
    )

    class Meta:
        model = Cluster
        fields = CLUSTER_FIELDS
        widgets = {
            "kube_ca_bundle": forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
            "description": forms.TextInput(),
        }
        labels = {
            "kube_auth": "Authentication", "kube_context": "kubeconfig context",
            "kube_ca_bundle": "CA bundle (PEM)", "kube_secret_env": "Or: environment variable",
            "kube_namespace": "Namespace", "kube_router": "Traffic router",
            "kube_gateway": "Gateway", "kube_route_host": "Route domain",
            "s3_endpoint_url": "S3 endpoint URL", "s3_region": "S3 region",
        }

    def __init__(self, *args: Any, actor: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor = actor
        self.creating = self.instance.pk is None
        for name, empty in (("kube_auth", "choose one (kubernetes clusters)"),
                            ("kube_router", "none")):
            self.fields[name].choices = [("", empty), *Cluster._meta.get_field(name).choices]
        # Left empty (a static cluster has no use for it): the model's default.
        self.fields["kube_namespace"].required = False
        self._before = audit.snapshot(self.instance, CLUSTER_FIELDS)
        self._secret_before = self.instance.kube_secret_encrypted

    def clean_kube_namespace(self) -> str:
        return self.cleaned_data.get("kube_namespace") or Cluster._meta.get_field(
            "kube_namespace").get_default()

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("kube_secret") and data.get("kube_kubeconfig"):
            self.add_error("kube_secret", "give the bearer token or the kubeconfig, not both")
        return data

    def _post_clean(self) -> None:
        # The secret first, so the model's clean() sees whether the cluster will have one.
        data = self.cleaned_data
        secret: str | None = data.get("kube_secret") or data.get("kube_kubeconfig") or ""
        if not secret and data.get("clear_kube_secret"):
            secret = None
        try:
            kube_connection.change_secret(
                self.instance, secret=secret, secret_env=data.get("kube_secret_env")
            )
        except DomainError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        super()._post_clean()
        # The model names the secret kube_secret; for kubeconfig authentication, that is the
        # text area's.
        if data.get("kube_auth") == Cluster.KubeAuth.KUBECONFIG and "kube_secret" in self.errors:
            for message in self.errors.pop("kube_secret"):
                self.add_error("kube_kubeconfig", message)

    def save(self, commit: bool = True) -> Cluster:
        """Save (a change of the router hands the cluster's routes over first: see
        ``fleet.inventory.routers.save_router_change``) and record the change."""
        before = None if self.creating else Cluster.objects.get(pk=self.instance.pk)
        return routers.save_router_change(before, self.instance, lambda: self._save(commit))

    def _save(self, commit: bool) -> Cluster:
        cluster = super().save(commit=commit)
        fields = CLUSTER_FIELDS if self.creating else [
            f for f in CLUSTER_FIELDS if f in self.changed_data]
        after = audit.snapshot(cluster, fields)
        if cluster.kube_secret_encrypted != self._secret_before:
            after["kube_secret"] = "changed" if cluster.kube_secret_encrypted else "removed"
        before = {} if self.creating else {f: self._before[f] for f in fields}
        audit.record(self.actor, "created" if self.creating else "updated", cluster,
                     before=before, after=after)
        return cluster
