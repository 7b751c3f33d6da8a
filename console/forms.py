"""The base of every console form: it shapes its input, then ``perform()`` calls the domain function the API calls, so both faces refuse the same input with the same message on the same field."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from console.exceptions import DomainError, messages_by_field


class DomainForm(forms.Form):
    """A form whose ``save()`` runs one domain call on behalf of ``actor``.

    A ``DomainError`` lands on the field it names (or on the form when it names none of its
    fields) and ``status_code`` becomes the error's (400, 409); a model's ``ValidationError``
    (``full_clean`` in the domain call) lands the same way, field by field, as the API answers
    it; PermissionDenied propagates, so the view answers 403 with its message.
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
