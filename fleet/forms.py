"""Console forms for fleet pages. Each shapes its input, then ``save()`` calls the domain
function the API calls, so both faces refuse the same input with the same message on the same
field."""

from __future__ import annotations

from typing import Any

from django import forms

from console.exceptions import DomainError
from console.forms import DomainForm
from fleet import audit, webhooks
from fleet.inventory import kube_connection
from fleet.models import Cluster, Membership, Tenant, Webhook
from fleet.quota import requests as quota_requests
from fleet.tenancy import tokens


class TokenForm(DomainForm):
    """Issue an API token in one of the actor's tenants (``fleet.tenancy.tokens.issue``).

    The tenant is one of those the actor can see, named by slug; the role check (admin) is the
    domain's. Expiry is a date and time in UTC, as the datetime-local input sends it.
    """

    tenant = forms.ChoiceField(
        error_messages={"invalid_choice": "not one of your tenants", "required": "choose a tenant"}
    )
    name = forms.CharField(
        max_length=100,
        error_messages={"required": "give the token a name, e.g. the pipeline that will use it"},
    )
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.DEPLOYER)
    expires_at = forms.DateTimeField(
        required=False,
        error_messages={"invalid": "enter a date and time such as 2030-01-31T18:00 (UTC)"},
    )

    def __init__(self, *args: Any, actor: Any, **kwargs: Any) -> None:
        super().__init__(*args, actor=actor, **kwargs)
        self.tenants = {t.slug: t for t in Tenant.objects.visible_to(actor)}
        self.fields["tenant"].choices = [(slug, t.name) for slug, t in self.tenants.items()]

    def perform(self) -> tokens.IssuedToken:
        data = self.cleaned_data
        return tokens.issue(
            self.actor, self.tenants[data["tenant"]], data["name"], data["role"], data["expires_at"]
        )


class QuotaRequestForm(DomainForm):
    """Ask for more quota in one of the actor's tenants (``fleet.quota.requests.ask``): the
    totals wanted of a device class, why, and until when (UTC; empty: for good)."""

    tenant = forms.ChoiceField(
        error_messages={"invalid_choice": "not one of your tenants", "required": "choose a tenant"}
    )
    device_class = forms.ChoiceField(
        error_messages={"invalid_choice": "not a device class of the fleet"})
    units = forms.IntegerField(min_value=0, max_value=quota_requests.MAX_UNITS, label="Units in all",
                               help_text="GPUs, or model instances for cpu")
    memory_mib = forms.IntegerField(min_value=0, max_value=quota_requests.MAX_MEMORY_MIB, label="Memory in all (MiB)")
    until = forms.DateTimeField(
        required=False, label="Until (UTC)",
        error_messages={"invalid": "enter a date and time such as 2030-01-31T18:00 (UTC)"})
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}),
                             error_messages={"required": "say why the tenant needs it"})

    def __init__(self, *args: Any, actor: Any, **kwargs: Any) -> None:
        super().__init__(*args, actor=actor, **kwargs)
        self.tenants = {t.slug: t for t in Tenant.objects.visible_to(actor)}
        self.fields["tenant"].choices = [(slug, t.name) for slug, t in self.tenants.items()]
        self.fields["device_class"].choices = [(c, c) for c in quota_requests.known_device_classes()]

    def perform(self) -> Any:
        data = self.cleaned_data
        return quota_requests.ask(self.actor, self.tenants[data["tenant"]], data["device_class"],
                                  data["units"], data["memory_mib"], data["reason"], data["until"])


class QuotaDecisionForm(DomainForm):
    """A platform admin's answer to a quota request: approve (as asked, or other totals) or
    refuse with a reason."""

    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("refuse", "Refuse")])
    units = forms.IntegerField(required=False, min_value=0, max_value=quota_requests.MAX_UNITS)
    memory_mib = forms.IntegerField(required=False, min_value=0, max_value=quota_requests.MAX_MEMORY_MIB)
    reason = forms.CharField(required=False, max_length=2000)

    def __init__(self, *args: Any, request: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request = request

    def perform(self) -> Any:
        data = self.cleaned_data
        if data["decision"] == "refuse":
            return quota_requests.refuse(self.actor, self.request, data["reason"])
        return quota_requests.approve(self.actor, self.request, data["reason"],
                                      units=data["units"], memory_mib=data["memory_mib"])


class WebhookForm(DomainForm):
    """Make a webhook in one of the actor's tenants (``fleet.webhooks.create_webhook``)."""

    tenant = forms.ChoiceField(
        error_messages={"invalid_choice": "not one of your tenants", "required": "choose a tenant"}
    )
    name = forms.CharField(
        max_length=100, error_messages={"required": "give the webhook a name, e.g. ops-slack"}
    )
    url = forms.CharField(max_length=2000, error_messages={"required": "give the URL to POST to"})
    events = forms.MultipleChoiceField(
        choices=list(webhooks.EVENTS.items()), required=False,
        error_messages={"invalid_choice": "unknown event %(value)s"},
    )
    format = forms.ChoiceField(choices=Webhook.Format.choices, initial=Webhook.Format.JSON)

    def __init__(self, *args: Any, actor: Any, **kwargs: Any) -> None:
        super().__init__(*args, actor=actor, **kwargs)
        self.tenants = {t.slug: t for t in Tenant.objects.visible_to(actor)}
        self.fields["tenant"].choices = [(slug, t.name) for slug, t in self.tenants.items()]

    def perform(self) -> webhooks.CreatedWebhook:
        data = self.cleaned_data
        return webhooks.create_webhook(
            self.actor, self.tenants[data["tenant"]], name=data["name"], url=data["url"],
            events=data["events"], format=data["format"],
        )


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
