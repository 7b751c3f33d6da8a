"""Console forms for fleet pages. Each shapes its input, then ``save()`` calls the domain
function the API calls, so both faces refuse the same input with the same message on the same
field."""

from __future__ import annotations

from typing import Any

from django import forms

from fleet import tokens, webhooks
from fleet.errors import DomainError
from fleet.models import Membership, Tenant, Webhook


class DomainForm(forms.Form):
    """A form whose ``save()`` runs one domain call on behalf of ``actor``.

    A ``DomainError`` lands on the field it names (or on the form when it names none of its
    fields) and ``status_code`` becomes the error's (400, 409); PermissionDenied propagates,
    so the view answers 403 with its message.
    """

    status_code = 400

    def __init__(self, *args: Any, actor: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor = actor

    def perform(self) -> Any:
        raise NotImplementedError

    def save(self) -> Any:
        """What the domain call returned, or None with the refusal on the form."""
        if not self.is_valid():
            return None
        try:
            return self.perform()
        except DomainError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
            self.status_code = exc.status_code
            return None


class TokenForm(DomainForm):
    """Issue an API token in one of the actor's tenants (``fleet.tokens.issue``).

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
