"""django-filter sets for the fleet API and the console's audit log."""

from __future__ import annotations

import django_filters

from fleet.models import AuditEvent, InferenceServer


class AuditEventFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    actor = django_filters.CharFilter(field_name="actor_label", lookup_expr="icontains")
    verb = django_filters.CharFilter()
    object_type = django_filters.CharFilter()
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["tenant", "actor", "verb", "object_type", "since", "until"]


class InferenceServerFilter(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name")

    class Meta:
        model = InferenceServer
        fields = ["cluster", "runtime", "health"]
