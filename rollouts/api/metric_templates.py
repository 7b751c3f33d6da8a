"""``GET /metric-templates/``: the PromQL queries platform admins wrote for analyses' metric
gates (``analysis.metrics``), so a team can see what each measures before naming it. Read
only: platform admins write them in the admin (rollouts/admin.py)."""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import serializers, viewsets

from fleet.tenancy.scoping import is_platform_admin, tenant_roles
from rollouts.canary.metrics import ERROR_LIMIT, EVERY_S, FAILURES
from rollouts.models import MetricTemplate
from rollouts.models.metrics import VARIABLES


class MetricTemplateSerializer(serializers.ModelSerializer):
    class Meta:
        model = MetricTemplate
        fields = ["id", "name", "query", "unit", "description", "created_at", "updated_at"]
        read_only_fields = fields


class MetricTemplateViewSet(viewsets.ReadOnlyModelViewSet):
    __doc__ = (
        "Metric templates an analysis may name as gates: "
        '``{"template": NAME, "min": X, "max": Y}`` in ``analysis.metrics``. Each query '
        f"has placeholders for the rollout's names ({', '.join(VARIABLES)}); a gate is "
        f"measured every {EVERY_S:g} s, fails the analysis beyond its range {FAILURES} "
        f"measurements in a row, or unmeasurable {ERROR_LIMIT} in a row."
    )

    queryset = MetricTemplate.objects.all()
    serializer_class = MetricTemplateSerializer
    filterset_fields = ["name"]

    def get_queryset(self) -> QuerySet:
        # Shared by the platform, as the fleet is: any member reads them, a user in no
        # tenant sees none.
        user = self.request.user
        return self.queryset if is_platform_admin(user) or tenant_roles(user) else self.queryset.none()
