"""The base of every console form: it shapes its input, then ``perform()`` calls the domain function the API calls, so both faces refuse the same input with the same message on the same field."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme

from console.exceptions import DomainError, messages_by_field


class DomainForm(forms.Form):
    """A form whose ``save()`` runs one domain call on behalf of ``actor``.

    A ``DomainError`` lands on the field it names (or on the form when it names none of its
    fields) and ``status_code`` becomes the error's (400, 409); a model's ``ValidationError``
    (``full_clean`` in the domain call) lands the same way, field by field, as the API answers
    it; PermissionDenied propagates, so the view answers 403 with its message.
    """

    status_code = 400
    # What the ids of its fields' messages start with (``<prefix><name>-error``), where a
    # page shows another form with fields of the same names.
    error_id_prefix = ""

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
            for name, messages in exc.by_field().items():
                self.add_error(name if name in self.fields else None, messages)
            self.status_code = exc.status_code
            return None
        except ValidationError as exc:
            for name, messages in messages_by_field(exc).items():
                if name in self.fields:
                    self.add_error(name, messages)
                elif name == NON_FIELD_ERRORS:
                    self.add_error(None, messages)
                else:
                    self.add_error(None, [f"{name}: {m}" for m in messages])
            self.status_code = 400
            return None


@dataclass(frozen=True)
class FormAlert:
    """What the top of a page says about a form that came back refused: how many of its
    fields need a change and where the first one is (``#<name>-error``, the id every field's
    message carries), or the refusal itself when it names no field."""

    fields: int
    first_label: str
    anchor: str
    refusals: list[str]


def form_alert(values: Iterable[Any]) -> FormAlert | None:
    """The alert for the first bound form with errors among ``values`` (a page's context)."""
    for value in values:
        if not (isinstance(value, forms.BaseForm) and value.is_bound and value.errors):
            continue
        named = [bf for bf in value if bf.errors]
        refusals = [str(e) for e in value.non_field_errors()]
        refusals += [f"{bf.label}: {e}" for bf in named if bf.is_hidden for e in bf.errors]
        visible = [bf for bf in named if not bf.is_hidden]
        if not visible:
            return FormAlert(fields=0, first_label="", anchor="", refusals=refusals)
        prefix = getattr(value, "error_id_prefix", "")
        return FormAlert(fields=len(visible), first_label=str(visible[0].label),
                         anchor=f"{prefix}{visible[0].name}-error", refusals=refusals)
    return None


def next_or(request: HttpRequest, fallback: str) -> str:
    """Where a form sent from a list (the approvals queue) goes back to: its ``next`` when
    that is a path of this site, else ``fallback``."""
    target = request.POST.get("next", "")
    if target.startswith("/") and url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return target
    return fallback
