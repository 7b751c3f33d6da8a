"""django-filter sets for the registry and deployment API."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Q, QuerySet

from console.filters import FilterSet
from rollouts.models import Deployment, SloStatus


class DeploymentFilter(FilterSet):
    """Lists show the deployments in use; ``?archived=true`` the archived ones instead. A
    deployment is always reachable by its id, archived or not."""

    archived = django_filters.ChoiceFilter(
        choices=[("true", "true"), ("false", "false")],
        method="filter_archived",
        help_text="true: archived deployments only; false (the default for lists): those in use",
    )

    slo_status = django_filters.MultipleChoiceFilter(
        field_name="slo__state", choices=SloStatus.State.choices,
        help_text="the SLO status (repeat for several: ?slo_status=breaching&slo_status=at_risk); "
                  "a deployment not yet evaluated reads as no_traffic",
        method="filter_slo_status",
    )

    class Meta:
        model = Deployment
        fields = {"tenant__slug": ["exact"], "model": ["exact"], "production": ["exact"]}

    def filter_slo_status(self, queryset: QuerySet[Deployment], name: str, value: list[str]) -> QuerySet[Deployment]:
        if not value:
            return queryset
        wanted = Q(slo__state__in=value)
        if SloStatus.State.NO_TRAFFIC in value:
            wanted |= Q(slo__isnull=True)
        return queryset.filter(wanted)

    def filter_archived(self, queryset: QuerySet[Deployment], name: str, value: str) -> QuerySet[Deployment]:
        return queryset.filter(archived_at__isnull=value != "true")

    def filter_queryset(self, queryset: QuerySet[Deployment]) -> QuerySet[Deployment]:
        queryset = super().filter_queryset(queryset)
        if not self.form.cleaned_data.get("archived") and not self._detail():
            queryset = queryset.filter(archived_at__isnull=True)
        return queryset

    def _detail(self) -> bool:
        view: Any = (getattr(self.request, "parser_context", None) or {}).get("view")
        return bool(getattr(view, "detail", False))
