"""Console forms for quota requests: each shapes its input, then ``save()`` calls the domain
function the API calls (``fleet.quota.requests``), so both faces refuse the same input with the
same message on the same field."""

from __future__ import annotations

from typing import Any

from django import forms

from console.forms import DomainForm
from fleet.models import Tenant
from fleet.quota import requests as quota_requests


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
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="Empty: for good",
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
