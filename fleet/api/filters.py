"""Query parameters of the API's lists, and the filter sets shared with the console.

Every list parameter is read strictly: a value the schema does not allow is a 400 naming the
parameter, never silently ignored. django-filter and DRF read leniently by default (a boolean
``null`` or an unknown ``ordering`` field means "no filter", ``1_000`` is a number, an empty
``?since=`` is left out), so the API uses the classes here instead:

* :class:`FilterSet`, the base of every filter set, maps model fields to filters that refuse
  what they cannot read (booleans, whole numbers, ISO 8601 date-times, choices), and through
  :class:`FilterBackend` refuses an empty value of any parameter that is not plain text;
* :class:`OrderingFilter` accepts only the fields it can sort by, and its schema lists them.

The schema of each parameter (``FilterBackendSchema``) states the same rules.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Q

from console.filters import FilterSet, UTCDateTimeFilter
from fleet.models import AuditEvent, InferenceServer


class AuditEventFilter(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    actor = django_filters.CharFilter(field_name="actor_label", lookup_expr="icontains")
    verb = django_filters.CharFilter()
    object_type = django_filters.CharFilter()
    object = django_filters.CharFilter(method="filter_object",
                                       help_text="the object's id, or part of its name")
    since = UTCDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UTCDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["tenant", "actor", "verb", "object_type", "object", "since", "until"]

    def filter_object(self, queryset: Any, name: str, value: str) -> Any:
        return queryset.filter(Q(object_id=value) | Q(object_repr__icontains=value))


class InferenceServerFilter(FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name")

    class Meta:
        model = InferenceServer
        fields = ["cluster", "runtime", "health"]
