"""Related rows named by id or by name, the same way in request bodies and in filters.

A JSON number is an id; a string is a name, or an id when it is all digits and names
nothing (form-encoded bodies and query strings carry only strings). A node's name is unique
only within its cluster: a node is its id, ``cluster/node``, or a plain name that the
context makes unique (the server's cluster, or a name only one cluster has).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import django_filters
from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Model, QuerySet
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import build_basic_type
from drf_spectacular.types import OpenApiTypes
from rest_framework import serializers

from fleet.models import Cluster, Node

# Up to 18 digits: every such number fits a 64-bit id column.
_ID = re.compile(r"[0-9]{1,18}")


def is_id(text: str) -> bool:
    """Whether ``text`` is an id as a query string or a form carries one: ASCII digits only,
    few enough for a 64-bit column. (``str.isdigit()`` is true of ``³`` and ``٣`` too, which
    ``int()`` refuses or reads as another number.)"""
    return _ID.fullmatch(text) is not None


class NotFound(Exception):
    """The value names no row (the message says what was looked for)."""


def lookup(queryset: QuerySet, value: Any, name_field: str = "name") -> Model:
    """The row of ``queryset`` that ``value`` names, by id or by ``name_field``."""
    label = queryset.model._meta.verbose_name
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 7.0 is the whole number 7 in JSON (and in the schema)
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        raise NotFound(f"give the {label}'s id (a number) or its {name_field} (a string)")
    if isinstance(value, str):
        if "\x00" in value:
            raise NotFound(f"a {label} {name_field} cannot contain NUL characters")
        named = list(queryset.filter(**{name_field: value})[:2])
        if len(named) > 1:
            raise NotFound(f"several {label}s you can see have {name_field} {value!r}: give the id")
        if named:
            return named[0]
        if not is_id(value):
            raise NotFound(f"no {label} with {name_field} {value!r}")
    pk = int(value)
    found = queryset.filter(pk=pk).first() if 0 < pk < 2**63 else None
    if found is None:
        raise NotFound(f"no {label} with id {pk}" if isinstance(value, int)
                       else f"no {label} with {name_field} or id {value!r}")
    return found


def lookup_node(value: Any, cluster: Cluster | None = None) -> Node:
    """A node by id, by ``cluster/node``, or by a name unique in ``cluster`` (or everywhere)."""
    nodes = Node.objects.select_related("cluster")
    if isinstance(value, str) and "/" in value:
        cluster_name, _, name = value.partition("/")
        found = nodes.filter(cluster__name=cluster_name, name=name).first()
        if found is None:
            raise NotFound(f"no node {name!r} in cluster {cluster_name!r}")
        return found
    if isinstance(value, str) and not is_id(value):
        named = nodes.filter(name=value) if "\x00" not in value else nodes.none()
        if cluster is not None:
            named = named.filter(cluster=cluster)
        found_many = list(named[:2])
        if len(found_many) == 1:
            return found_many[0]
        if found_many:
            raise NotFound(f"several clusters have a node named {value!r}: give cluster/{value}")
        where = f" in cluster {cluster.name}" if cluster is not None else ""
        raise NotFound(f"no node named {value!r}{where}")
    node = lookup(nodes, value)
    if cluster is not None and node.cluster_id != cluster.pk:
        raise NotFound("the node belongs to another cluster")
    return node


class IdOrNameField(serializers.RelatedField):
    """A related row written as its id or its name; read back as its id (or, with
    ``read_as_name``, as its name)."""

    def __init__(self, name_field: str = "name", read_as_name: bool = False, **kwargs: Any) -> None:
        self.name_field = name_field
        self.read_as_name = read_as_name
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Model:
        try:
            return lookup(self.get_queryset(), data, self.name_field)
        except NotFound as exc:
            raise serializers.ValidationError(str(exc)) from None

    def to_representation(self, value: Model) -> int | str:
        return getattr(value, self.name_field) if self.read_as_name else value.pk


class NodeField(IdOrNameField):
    """A node written as its id, ``cluster/node`` or a plain name; read back as its id.

    A plain name is kept as is here and resolved by the serializer, which knows the cluster.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("queryset", Node.objects.all())
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and data and "/" not in data and not is_id(data):
            return data
        try:
            return lookup_node(data)
        except NotFound as exc:
            raise serializers.ValidationError(str(exc)) from None


class IdOrNameFieldSchema(OpenApiSerializerFieldExtension):
    target_class = "fleet.api.refs.IdOrNameField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        integer = build_basic_type(OpenApiTypes.INT)
        if direction == "response":
            return build_basic_type(OpenApiTypes.STR) if self.target.read_as_name else integer
        return {"oneOf": [integer, {"type": "string", "minLength": 1}],
                "description": "The id (a number) or the name (a string)"}


class IdOrNameFilter(django_filters.CharFilter):
    """Rows whose ``field_name`` relation is the row named by id or by name. ``queryset`` may
    be a function of the request (the rows the caller can see)."""

    def __init__(self, *args: Any, queryset: QuerySet | Callable[[Any], QuerySet],
                 name_field: str = "name", **kwargs: Any) -> None:
        self.related = queryset
        self.name_field = name_field
        kwargs.setdefault("help_text", "id or name")
        super().__init__(*args, **kwargs)

    def filter(self, qs: QuerySet, value: Any) -> QuerySet:
        if value in (None, ""):
            return qs
        related = self.related
        if callable(related):
            related = related(getattr(self.parent, "request", None))
        try:
            row = lookup(related, value, self.name_field)
        except (NotFound, ObjectDoesNotExist):
            return qs.none()
        return qs.filter(**{self.field_name: row})


class NodeFilter(django_filters.CharFilter):
    """Rows on the node named by id or ``cluster/node`` (or a name only one cluster has)."""

    def filter(self, qs: QuerySet, value: Any) -> QuerySet:
        if value in (None, ""):
            return qs
        try:
            node = lookup_node(value)
        except NotFound:
            return qs.none()
        return qs.filter(**{self.field_name: node})
