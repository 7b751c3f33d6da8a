"""The API's filters and ordering, for every app: strict values (a bad one is a 400 naming the parameter), UTC datetimes, and ordering only by fields that exist."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import django_filters
from django import forms
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models
from django.db.models import QuerySet
from django_filters.fields import IsoDateTimeField
from django_filters.filterset import FILTER_FOR_DBFIELD_DEFAULTS
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.contrib.django_filters import DjangoFilterExtension
from rest_framework import filters, serializers
from rest_framework.request import Request

# The widest offsets real time zones use (UTC-12:00 to UTC+14:00), with room to spare on the west.
MAX_UTC_OFFSET = timedelta(hours=14)


# Whole numbers in query parameters: what a 64-bit column compares against. A lookup beyond a
# narrower column's range matches nothing (or everything), as it should.
MIN_INTEGER = -(2**63)


MAX_INTEGER = 2**63 - 1


# A whole number as JSON writes one: 7, or 7.0 (the same number; the schema's integers admit it).
_INTEGER = re.compile(r"(-?[0-9]{1,19})(?:\.0+)?")


BLANK = "give a value, or leave the parameter out"


def parse_integer(value: str, minimum: int = MIN_INTEGER, maximum: int = MAX_INTEGER) -> int:
    """A whole number written plainly (``-12`` or ``-12.0``; not ``1_000``, `` 7`` or ``3.5``)
    within ``minimum`` and ``maximum``, or ValidationError saying what is wrong."""
    match = _INTEGER.fullmatch(value)
    if match is None:
        # The value goes in as a parameter: DRF formats every message with its params, and a
        # "%" written into the message itself would break that formatting (a 500).
        raise ValidationError("must be a whole number, got %(value)s", code="invalid",
                              params={"value": _shown(value)})
    number = int(match.group(1))
    if not minimum <= number <= maximum:
        raise ValidationError(f"must be between {minimum} and {maximum}, got {number}", code="range")
    return number


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else f"{value[:40]}…")


def _offset_text(offset: timedelta) -> str:
    sign = "-" if offset < timedelta(0) else "+"
    minutes = int(abs(offset).total_seconds()) // 60
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


class UTCDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, returned in UTC; one without an offset is read as UTC.

    Refuses an offset no time zone uses (PostgreSQL cannot store ``+20:00``) and a moment that
    falls outside the calendar once in UTC (``0001-01-01T00:00+05:00``), so that neither
    reaches a query.
    """

    default_error_messages = {
        "offset": "the time-zone offset %(offset)s is out of range (-14:00 to +14:00)",
        "range": "%(value)s is out of range: it falls outside years 1 to 9999 in UTC",
    }

    def to_python(self, value: Any) -> datetime | None:
        result = super().to_python(value)
        if result is None:
            return None
        offset = result.utcoffset()
        if offset is not None and abs(offset) > MAX_UTC_OFFSET:
            raise ValidationError(
                self.error_messages["offset"], code="offset", params={"offset": _offset_text(offset)}
            )
        try:
            return result.astimezone(UTC)
        except OverflowError:
            raise ValidationError(
                self.error_messages["range"], code="range", params={"value": value}
            ) from None


class UTCDateTimeFilter(django_filters.IsoDateTimeFilter):
    """A date-time filter parsed by :class:`UTCDateTimeField`."""

    field_class = UTCDateTimeField


class StrictBooleanField(forms.Field):
    """``true`` or ``false``; anything else is refused (django-filter reads it as "no filter")."""

    widget = forms.Select(choices=[("", "---------"), ("true", "true"), ("false", "false")])

    def to_python(self, value: Any) -> bool | None:
        if value in self.empty_values:
            return None
        if value in (True, "true"):
            return True
        if value in (False, "false"):
            return False
        raise ValidationError("must be true or false, got %(value)s", code="invalid",
                              params={"value": _shown(str(value))})


class BooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


class StrictIntegerField(forms.Field):
    """A whole number written plainly, within 64 bits (see :func:`parse_integer`)."""

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None
        return parse_integer(str(value))


class IntegerFilter(django_filters.NumberFilter):
    field_class = StrictIntegerField


class ChoiceInFilter(django_filters.BaseInFilter, django_filters.ChoiceFilter):
    """Comma-separated choices (``state__in=ready,failed``), each one checked."""


def _strict_defaults() -> dict[type[models.Field], dict[str, Any]]:
    defaults = {field: dict(options) for field, options in FILTER_FOR_DBFIELD_DEFAULTS.items()}
    for field, options in defaults.items():
        if issubclass(field, models.IntegerField | models.AutoField):
            options["filter_class"] = IntegerFilter
        elif issubclass(field, models.BooleanField):
            options["filter_class"] = BooleanFilter
        elif issubclass(field, models.DateTimeField):
            options["filter_class"] = UTCDateTimeFilter
    return defaults


def takes_text(filter_: django_filters.Filter) -> bool:
    """Whether any text, the empty text included, is a value of the filter's parameter."""
    return (
        isinstance(filter_, django_filters.CharFilter)
        and not isinstance(filter_, django_filters.BaseCSVFilter)
        and "choices" not in filter_.extra
    )


class FilterSet(django_filters.FilterSet):
    """The base of every filter set: values are read strictly, and refused with a message
    naming the parameter.

    With ``refuse_blank`` (the API's lists), a parameter sent empty (``?since=``) is refused
    unless the parameter is plain text, since no boolean, number, date-time, choice or list is
    empty. Without it (the console's GET forms, which send every field, filled or not), an
    empty parameter means "no filter".
    """

    FILTER_DEFAULTS = _strict_defaults()

    def __init__(self, data: Any = None, queryset: QuerySet | None = None, *,
                 request: Any = None, prefix: str | None = None, refuse_blank: bool = False) -> None:
        self.refuse_blank = refuse_blank
        super().__init__(data, queryset, request=request, prefix=prefix)

    @classmethod
    def filter_for_lookup(cls, field: models.Field, lookup_type: str) -> tuple[type, dict[str, Any]]:
        if lookup_type == "in" and getattr(field, "choices", None):
            return ChoiceInFilter, {"choices": field.choices}
        return super().filter_for_lookup(field, lookup_type)

    def get_form_class(self) -> type[forms.Form]:
        filterset = self
        base = super().get_form_class()

        class Form(base):  # type: ignore[valid-type,misc]
            def clean(self) -> dict[str, Any]:
                cleaned = super().clean()
                for name, problem in filterset._blank_problems(self):
                    self.add_error(name, problem)
                return cleaned

        Form.__name__ = base.__name__
        return Form

    def _blank_problems(self, form: forms.Form) -> Iterable[tuple[str, str]]:
        for name, filter_ in self.filters.items():
            raw = form.data.get(form.add_prefix(name))
            if not isinstance(raw, str):
                continue
            if raw == "":
                if self.refuse_blank and not takes_text(filter_):
                    yield name, BLANK
            elif isinstance(filter_, django_filters.BaseCSVFilter) and "" in raw.split(","):
                yield name, "an empty item: separate the values with single commas"


class FilterBackend(DjangoFilterBackend):
    """django-filter for the API: filter sets built from ``filterset_fields`` use
    :class:`FilterSet`, and every filter set refuses empty values that are not text."""

    filterset_base = FilterSet

    def filter_queryset(self, request: Request, queryset: QuerySet, view: Any) -> QuerySet:
        # A single row read without query parameters: no filter applies (DeploymentFilter's
        # default hides archived rows from lists only), and building the filter set and its
        # form for nothing costs a good share of a short request.
        if getattr(view, "detail", False) and not request.query_params:
            return queryset
        return super().filter_queryset(request, queryset, view)

    def get_filterset(self, request: Request, queryset: QuerySet, view: Any) -> Any:
        filterset_class = self.get_filterset_class(view, queryset)
        if filterset_class is None:
            return None
        kwargs = self.get_filterset_kwargs(request, queryset, view)
        if issubclass(filterset_class, FilterSet):
            kwargs["refuse_blank"] = True
        return filterset_class(**kwargs)


class FilterBackendSchema(DjangoFilterExtension):
    """The schema of :class:`FilterBackend`'s parameters: django-filter's, with the bounds
    the filters enforce."""

    target_class = "console.filters.FilterBackend"
    priority = 1

    def resolve_filter_field(self, auto_schema: Any, model: Any, filterset_class: Any,
                             field_name: str, filter_field: Any) -> list[dict[str, Any]]:
        parameters = super().resolve_filter_field(
            auto_schema, model, filterset_class, field_name, filter_field
        )
        for parameter in parameters:
            schema = parameter["schema"]
            if isinstance(filter_field, django_filters.BaseCSVFilter):
                schema["minItems"] = 1
            if isinstance(filter_field, IntegerFilter):
                schema.update(type="integer", minimum=MIN_INTEGER, maximum=MAX_INTEGER)
                schema.pop("format", None)
        return parameters


def _orderable(queryset: QuerySet, path: str) -> bool:
    """Whether the database can sort ``queryset`` by ``path`` (``model__name``): a column of
    the model or of a row it points to, or an annotation; not a list of related rows."""
    parts = path.split("__")
    if parts[0] in queryset.query.annotations:
        return len(parts) == 1
    opts = queryset.model._meta
    for index, part in enumerate(parts):
        try:
            field = opts.get_field(part)
        except FieldDoesNotExist:
            return False
        if not getattr(field, "concrete", False) or field.many_to_many:
            return False
        last = index == len(parts) - 1
        if not last:
            if not field.is_relation:
                return False
            opts = field.related_model._meta
    return True


class OrderingFilter(filters.OrderingFilter):
    """``?ordering=name,-created_at``: fields of the answer the database can sort by, each
    optionally prefixed with ``-`` for descending. An unknown field is a 400 naming
    ``ordering`` (DRF ignores it), and the schema lists the fields."""

    def orderable_fields(self, queryset: QuerySet, view: Any, context: dict[str, Any]) -> list[str]:
        return [
            name for name, _ in self.get_valid_fields(queryset, view, context)
            if _orderable(queryset, name)
        ]

    def get_ordering(self, request: Request, queryset: QuerySet, view: Any) -> Any:
        raw = request.query_params.get(self.ordering_param)
        if raw is None:
            return self.get_default_ordering(view)
        fields = self.orderable_fields(queryset, view, {"request": request, "view": view})
        allowed = {*fields, *(f"-{name}" for name in fields)}
        for term in raw.split(","):
            if term not in allowed:
                problem = BLANK if raw == "" else (
                    f"cannot order by {_shown(term)}: give fields among {', '.join(fields)} "
                    "(comma-separated; -field for descending)"
                )
                raise serializers.ValidationError({self.ordering_param: [problem]})
        return raw.split(",")

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        queryset = getattr(view, "queryset", None)
        if queryset is None:
            return super().get_schema_operation_parameters(view)
        context = {"request": getattr(view, "request", None), "view": view}
        fields = self.orderable_fields(queryset, view, context)
        terms = [term for name in fields for term in (name, f"-{name}")]
        return [{
            "name": self.ordering_param,
            "required": False,
            "in": "query",
            "description": "Sort by these fields, in this order (comma-separated); "
                           "-field sorts descending",
            "schema": {"type": "array", "items": {"type": "string", "enum": terms}, "minItems": 1},
            "style": "form",
            "explode": False,
        }]
