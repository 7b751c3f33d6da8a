"""Pages of the API's lists: ``?page=N`` from 1; anything else is a 400 naming ``page``.

DRF reads an empty ``?page=`` as page 1 and answers ``page=abc`` with a 404; here a page
number is a whole number from 1, as the schema says, and a page past the end is a 404.

The lists that grow without bound (the audit log, model loads) page by cursor instead
(:class:`NewestFirstCursorPagination`): each page is read from an index where the last one
ended, so the millionth page costs what the first does and no ``COUNT(*)`` scans the table.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.paginator import Paginator
from django.db.models import QuerySet
from rest_framework import pagination, serializers
from rest_framework.exceptions import NotFound
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


class NewestFirstCursorPagination(pagination.CursorPagination):
    """Keyset pages, newest first, by ``(created_at, id)``: follow ``next`` (older rows) and
    ``previous`` (newer). There is no ``count``: counting a table of millions of rows is the
    scan this avoids.

    ``?page=1`` (a link from before) answers the first page; another page number is a 400
    naming ``page`` (page numbers of a list that grows at the top would skip or repeat rows).
    A cursor this list did not give is a 400 naming ``cursor``.
    """

    ordering = ("-created_at", "-id")
    page_query_param = "page"

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        raw = request.query_params.get(self.page_query_param)
        if raw is not None and raw.strip() != "1":
            raise serializers.ValidationError({self.page_query_param: [
                "this list pages by cursor: follow the answer's next and previous links "
                "(?page=1 is the first page)"]})
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request: Request) -> Any:
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise serializers.ValidationError({self.cursor_query_param: [
                "not a cursor this list gave: follow the next and previous links"]}) from None
