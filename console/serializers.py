"""What holds for every serializer of the API: unknown fields are refused, by name; a body
refused on some fields still has the rest checked by the domain (:func:`refused_and_valid`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers
from rest_framework.fields import SkipField
from rest_framework.utils import html


class StrictFieldsMixin:
    """Refuses request keys the serializer does not write, naming each one, so nothing sent
    is silently dropped: an unknown key and a read-only one are both a 400 on that key.

    In a form-encoded body, DRF reads an optional field sent empty (``tenant=``) as left out;
    it is refused here instead, unless the field takes empty text or null (a form's way of
    saying null). JSON bodies need no such rule: ``""`` is a value there, checked as any other.
    """

    fields: dict[str, serializers.Field]

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            refused = {
                str(key): ["read-only; leave it out" if key in self.fields else "unknown field"]
                for key in data
                if key not in FORM_KEYS
                and (key not in self.fields or self.fields[key].read_only)
            }
            if html.is_html_input(data):
                refused.update({
                    key: ["blank: give a value, or leave the field out"]
                    for key in data
                    if key not in refused and key in self.fields and _blank_in_form(data, key, self.fields[key])
                })
            if refused:
                raise serializers.ValidationError(refused)
        return super().to_internal_value(data)  # type: ignore[misc]


# Sent by the browsable API's HTML forms along with the fields.
FORM_KEYS = frozenset({"csrfmiddlewaretoken"})


def _blank_in_form(data: Any, key: str, field: serializers.Field) -> bool:
    """Whether a form sends ``key`` empty where DRF would take that as leaving it out."""
    return (
        data.get(key) == ""
        and not field.required
        and not field.allow_null
        and not getattr(field, "allow_blank", False)
    )


class JSONInput(serializers.Field):
    """A JSON value handed to the domain as sent, once it is of the right kind (``kind``;
    ``kind_message`` otherwise): the domain's checks name the path at fault."""

    kind: type | tuple[type, ...] = object
    kind_message = ""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, self.kind):
            raise serializers.ValidationError(self.kind_message)
        return data

    def to_representation(self, value: Any) -> Any:
        return value


def refused_and_valid(body: serializers.Serializer, needed: tuple[str, ...] = ()
                      ) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """After ``body.is_valid()`` failed: its refusals by field, and the fields that pass their
    own checks (defaults included), so that the domain checks those too and one answer names
    every field at fault (``console.exceptions.FieldErrors``). Raises the body's own refusal
    when it is not one list of messages per field (a nested one) or refuses a field in
    ``needed``, without which the domain can check nothing (the deployment)."""
    errors = dict(body.errors)
    if not isinstance(body.initial_data, Mapping) or set(needed) & set(errors):
        raise serializers.ValidationError(errors)
    valid: dict[str, Any] = {}
    # Each field on its own (an unknown key, refused first, leaves the others unchecked).
    for name, field in body.fields.items():
        if field.read_only or name in errors:
            continue
        try:
            valid[field.source] = field.run_validation(field.get_value(body.initial_data))
        except serializers.ValidationError as exc:
            errors[name] = exc.detail
        except SkipField:
            continue
    flat = all(isinstance(messages, list) and all(isinstance(m, str) for m in messages)
               for messages in errors.values())
    if not flat or set(needed) - set(valid):
        raise serializers.ValidationError(errors)
    return {name: [str(m) for m in messages] for name, messages in errors.items()}, valid


class BoundedFloatField(serializers.FloatField):
    """A number within bounds; ``above`` is an exclusive lower bound. JSON true and false
    are no numbers here."""

    def __init__(self, *, above: float | None = None, **kwargs: Any) -> None:
        self.above = above
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if self.above is not None and value <= self.above:
            raise serializers.ValidationError(f"Ensure this value is greater than {self.above:g}.")
        return value


class BoundedFloatFieldSchema(OpenApiSerializerFieldExtension):
    target_class = "console.serializers.BoundedFloatField"

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        field = self.target
        schema: dict[str, Any] = {"type": "number"}
        if field.above is not None:
            schema["exclusiveMinimum"] = field.above
        if field.min_value is not None:
            schema["minimum"] = field.min_value
        if field.max_value is not None:
            schema["maximum"] = field.max_value
        return schema
