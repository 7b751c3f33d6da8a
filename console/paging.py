"""Pagination and filtering shared by the console's list pages (htmx swaps the results)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet
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


# Lists that grow without bound (the audit log, loads) page by keyset instead: newest first
# by (created_at, id), each page read from an index where the last one ended, and a count
# that stops at COUNT_CAP instead of scanning millions of rows.
COUNT_CAP = 1000
OLDER, NEWER = "o", "n"


@dataclass
class KeysetPage:
    """One page of a newest-first list; ``older``/``newer`` are the cursors of the pages
    around it ("" where there is none), ``total`` the rows counted up to ``COUNT_CAP + 1``."""

    rows: list[Any]
    older: str
    newer: str
    total: int
    numbered_link: bool = False

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def total_label(self) -> str:
        return f"more than {COUNT_CAP:,}" if self.total > COUNT_CAP else f"{self.total:,}"


def encode_cursor(direction: str, row: Any) -> str:
    raw = f"{direction}|{row.created_at.isoformat()}|{row.pk}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[str, datetime, int] | None:
    """(direction, created_at, id) of a cursor this module gave, else None."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        direction, when, pk = raw.split("|")
        moment = datetime.fromisoformat(when)
        if direction not in (OLDER, NEWER) or moment.tzinfo is None:
            return None
        return direction, moment, int(pk)
    except (ValueError, UnicodeDecodeError):
        return None


def keyset_paginate(request: HttpRequest, queryset: QuerySet,
                    per_page: int = PAGE_SIZE) -> KeysetPage:
    """The page of ``queryset`` (newest first) that ``?cursor=`` names, or the newest page.

    An old ``?page=N`` link, or a cursor that cannot be read, shows the newest page
    (``numbered_link`` says so to the page)."""
    cursor = decode_cursor(request.GET.get("cursor", ""))
    rows: list[Any] = []
    if cursor is not None and cursor[0] == NEWER:
        _, when, pk = cursor
        rows = list(queryset.filter(created_at__gte=when)
                    .filter(Q(created_at__gt=when) | Q(pk__gt=pk))
                    .order_by("created_at", "id")[:per_page + 1])
        newer = rows[per_page - 1] if len(rows) > per_page else None
        rows = rows[:per_page][::-1]
        older = rows[-1] if rows else None
        if newer is None:  # back at the top: the newest page, full
            cursor = None
    if cursor is None:
        rows = list(queryset.order_by("-created_at", "-id")[:per_page + 1])
        older = rows[per_page - 1] if len(rows) > per_page else None
        rows, newer = rows[:per_page], None
    elif cursor[0] == OLDER:
        _, when, pk = cursor
        # created_at <= t bounds the index range; the OR settles rows of the same instant.
        rows = list(queryset.filter(created_at__lte=when)
                    .filter(Q(created_at__lt=when) | Q(pk__lt=pk))
                    .order_by("-created_at", "-id")[:per_page + 1])
        older = rows[per_page - 1] if len(rows) > per_page else None
        rows = rows[:per_page]
        newer = rows[0] if rows else None
    # In the page's order: the index the page is read from also finds the first rows to
    # count, where an unordered LIMIT under a filter may get a scan of the whole table.
    total = queryset.order_by("-created_at", "-id").values("pk")[:COUNT_CAP + 1].count()
    return KeysetPage(
        rows=rows,
        older=encode_cursor(OLDER, older) if older is not None else "",
        newer=encode_cursor(NEWER, newer) if newer is not None else "",
        total=total,
        numbered_link=request.GET.get("page", "1").strip() != "1",
    )


def querystring_without_cursor(request: HttpRequest) -> str:
    params = request.GET.copy()
    params.pop("page", None)
    params.pop("cursor", None)
    return params.urlencode()
