"""``GET /slo-alerts/``: the burn-rate alerts opened on the deployments a caller may see,
with their timelines (``rollouts.slo.alerts`` opens and resolves them). Read only."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import serializers, viewsets

from console.filters import FilterSet
from fleet.api.base import TenantScopedViewSetMixin
from fleet.api.refs import IdOrNameFilter
from rollouts.models import Deployment, SloAlert


class SloAlertSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="deployment.tenant.slug", read_only=True)
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)

    class Meta:
        model = SloAlert
        fields = ["id", "tenant", "deployment", "deployment_name", "rule", "sli", "state", "summary",
                  "burn_long", "burn_short", "peak_burn", "opened_at", "resolved_at", "events"]
        read_only_fields = fields


def _deployments(request: Any) -> QuerySet:
    return Deployment.objects.visible_to(request.user if request is not None else None)


class SloAlertFilter(FilterSet):
    deployment = IdOrNameFilter(queryset=_deployments, help_text="deployment id or name")

    class Meta:
        model = SloAlert
        fields = {"state": ["exact"], "rule": ["exact"], "sli": ["exact"], "deployment__tenant__slug": ["exact"]}


class SloAlertViewSet(TenantScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """SLO burn-rate alerts, newest first: fast burn (1 h and 5 min both over 14.4 times the
    budget's rate) and slow burn (6 h and 30 min over 6), per objective (errors, latency).
    ``?state=firing`` lists the open ones."""

    queryset = SloAlert.objects.select_related("deployment__tenant")
    serializer_class = SloAlertSerializer
    filterset_class = SloAlertFilter
