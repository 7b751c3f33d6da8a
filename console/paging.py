"""Pagination and filtering shared by the console's list pages (htmx swaps the results)."""

from __future__ import annotations

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest

PAGE_SIZE = 25


def paginate(request: HttpRequest, queryset: QuerySet, per_page: int = PAGE_SIZE) -> Page:
    return Paginator(in_order(queryset), per_page).get_page(request.GET.get("page"))


def in_order(queryset: QuerySet) -> QuerySet:
    """``queryset`` in a deterministic order: its own if it has one, else by primary key.

    Pages of an unordered query may repeat or skip rows (Django's UnorderedObjectListWarning);
    an aggregate's GROUP BY drops the model's default ordering, so an annotated list needs this.
    """
    return queryset if queryset.ordered else queryset.order_by("pk")


def querystring_without_page(request: HttpRequest) -> str:
    params = request.GET.copy()
    params.pop("page", None)
    return params.urlencode()
