"""The API of what versions cost (``rollouts.registry.costs``): a version's readings and how it
compares with what it would replace, a rollout's candidate against its baseline, and the
chargeback of what each tenant's placements held per day or month, as JSON or CSV."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.exceptions import DomainError
from fleet.tenancy.scoping import tenant_roles
from rollouts.registry import costs

CHARGEBACK_FIELDS = ["period", "tenant", "device_class", "unit_seconds", "unit_hours", "cost",
                     "currency"]
MAX_CHARGEBACK_DAYS = 400


class ChargebackCSVRenderer(BaseRenderer):
    """The chargeback's rows as CSV (``?format=csv``), one line a period, tenant and class."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: dict[str, Any] | None = None) -> bytes:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=CHARGEBACK_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(data["rows"])
        return out.getvalue().encode()


class ChargebackRowSerializer(serializers.Serializer):
    period = serializers.CharField(help_text="the day (YYYY-MM-DD) or month (YYYY-MM)")
    tenant = serializers.CharField(help_text="the tenant's slug")
    tenant_id = serializers.IntegerField()
    device_class = serializers.CharField()
    unit_seconds = serializers.FloatField(help_text="GPU-seconds (instance-seconds on CPU nodes)")
    unit_hours = serializers.FloatField()
    cost = serializers.FloatField(allow_null=True, help_text="null where the class has no price")
    currency = serializers.CharField(allow_blank=True, help_text="blank where the class has no price")


class ChargebackSerializer(serializers.Serializer):
    """What the chargeback answers in JSON (documentation only)."""

    period = serializers.ChoiceField(choices=["day", "month"])
    from_ = serializers.DateField()
    to = serializers.DateField()
    rows = ChargebackRowSerializer(many=True)

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields


def _date(raw: str | None, field: str, default: datetime) -> datetime:
    if raw in (None, ""):
        return default
    try:
        day = datetime.strptime(raw, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise DomainError(f"must be a date, YYYY-MM-DD, got {raw[:40]!r}", field=field) from None
    if not 2000 <= day.year <= 2200:
        raise DomainError("must be a date between the years 2000 and 2200", field=field)
    return day


class ChargebackView(APIView):
    """What each tenant's placements held, per day or month (UTC): unit-seconds and
    unit-hours by device class (GPUs, or model instances on CPU nodes), and the cost where a
    platform admin has priced the class. A member sees the tenants they belong to; a
    platform admin every tenant. ``?format=csv`` answers CSV."""

    permission_classes = (IsAuthenticated,)
    renderer_classes = (JSONRenderer, ChargebackCSVRenderer)

    def finalize_response(self, request: Request, response: Any, *args: Any,
                          **kwargs: Any) -> Any:
        # Only the rows are CSV: a refusal naming the parameter, or what OPTIONS describes,
        # is JSON whatever format was asked for.
        response = super().finalize_response(request, response, *args, **kwargs)
        data = getattr(response, "data", None)
        if not (isinstance(data, dict) and "rows" in data):
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = JSONRenderer.media_type
        return response

    @extend_schema(
        parameters=[
            OpenApiParameter("period", str, enum=["day", "month"],
                             description="day (default) or month"),
            OpenApiParameter("from", str, description="first day, YYYY-MM-DD (default: 30 days "
                             "ago, or the first of the month 11 months ago for months)"),
            OpenApiParameter("to", str, description="last day, YYYY-MM-DD (default: today)"),
            OpenApiParameter("tenant", str, description="a tenant's slug (default: every tenant "
                             "visible)"),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses={
            (200, "application/json"): OpenApiResponse(response=ChargebackSerializer, description=(
                "the period, the days covered and one row a period, tenant and device class")),
            (200, "text/csv"): OpenApiResponse(response=OpenApiTypes.STR,
                                               description="the rows, with a header line"),
            (400, "application/json"): OpenApiResponse(description="the parameter at fault"),
        },
    )
    def get(self, request: Request) -> Response:
        period = request.query_params.get("period", "day")
        if period not in ("day", "month"):
            raise DomainError("must be day or month", field="period")
        today = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        default_start = today - timedelta(days=30) if period == "day" else (
            today.replace(day=1) - timedelta(days=330)).replace(day=1)
        start = _date(request.query_params.get("from"), "from", default_start)
        end = _date(request.query_params.get("to"), "to", today) + timedelta(days=1)
        if end <= start:
            raise DomainError("must not be before from", field="to")
        if (end - start).days > MAX_CHARGEBACK_DAYS:
            raise DomainError(f"at most {MAX_CHARGEBACK_DAYS} days from from", field="to")
        roles = tenant_roles(request.user)  # None: a platform admin
        tenant_ids = None if roles is None else sorted(roles)
        slug = request.query_params.get("tenant")
        rows = costs.chargeback(tenant_ids, start, min(end, timezone.now()), period)
        if slug:
            rows = [r for r in rows if r["tenant"] == slug]
        headers = {}
        if request.accepted_renderer.format == "csv":
            headers["Content-Disposition"] = (
                f'attachment; filename="switchyard-chargeback-{period}.csv"')
        return Response({"period": period, "from": start.date().isoformat(),
                         "to": (end - timedelta(days=1)).date().isoformat(), "rows": rows},
                        headers=headers)
