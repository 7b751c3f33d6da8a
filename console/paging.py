"""Pagination and filtering shared by the console's list pages (htmx swaps the results)."""

from __future__ import annotations

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest

PAGE_SIZE = 25


def paginate(request: HttpRequest, queryset: QuerySet, per_page: int = PAGE_SIZE) -> Page:
    return Paginator(queryset, per_page).get_page(request.GET.get("page"))


def querystring_without_page(request: HttpRequest) -> str:
    params = request.GET.copy()
    params.pop("page", None)
    return params.urlencode()
