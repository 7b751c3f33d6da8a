"""Pages of the API's lists: ``?page=N`` from 1; anything else is a 400 naming ``page``.

DRF reads an empty ``?page=`` as page 1 and answers ``page=abc`` with a 404; here a page
number is a whole number from 1, as the schema says, and a page past the end is a 404.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.paginator import Paginator
from django.db.models import QuerySet
from rest_framework import pagination, serializers
from rest_framework.request import Request

from console.filters import MAX_INTEGER, parse_integer


class PageNumberPagination(pagination.PageNumberPagination):
    last_page_strings = ()

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        # Pages of an unordered query may repeat or skip rows: an endpoint (or an aggregate,
        # whose GROUP BY drops the model's ordering) without an order is paged by primary key.
        if isinstance(queryset, QuerySet) and not queryset.ordered:
            queryset = queryset.order_by("pk")
        return super().paginate_queryset(queryset, request, view)

    def get_page_number(self, request: Request, paginator: Paginator) -> int:
        raw = request.query_params.get(self.page_query_param)
        if raw is None:
            return 1
        try:
            return parse_integer(raw, minimum=1)
        except DjangoValidationError as exc:
            raise serializers.ValidationError({self.page_query_param: exc.messages}) from None

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": MAX_INTEGER}
        return parameters
