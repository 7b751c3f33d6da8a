"""The console's API-token form: it shapes its input, then ``save()`` calls the domain
function the API calls (``fleet.tenancy.tokens.issue``), so both faces refuse the same input
with the same message on the same field."""

from __future__ import annotations

from typing import Any

from django import forms

from console.forms import DomainForm
from fleet.models import Membership, Tenant
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
