"""Lists page in a deterministic order, on the console and in the API, so no row repeats or goes
missing between pages (and Django has nothing to warn about)."""

from __future__ import annotations

import warnings

import pytest
from django.core.paginator import UnorderedObjectListWarning
from django.db.models import Count
from django.test import RequestFactory
from rest_framework.request import Request

from console.pagination import PageNumberPagination
from console.paging import paginate
from rollouts.models import Model
from tests.factories import ModelFactory


@pytest.fixture
def models(tenant_a) -> list[Model]:
    return [ModelFactory(tenant=tenant_a, name=f"m-{n:02}") for n in range(30)]


def unordered() -> object:
    """The registry's list as an aggregate makes it: GROUP BY drops the model's ordering."""
    query = Model.objects.annotate(versions_n=Count("versions"))
    assert not query.ordered
    return query


def test_the_console_pages_an_unordered_list_by_primary_key(models):
    request = RequestFactory().get("/", {"page": "2"})

    with warnings.catch_warnings():
        warnings.simplefilter("error", UnorderedObjectListWarning)
        page = paginate(request, unordered())

    assert [m.pk for m in page] == [m.pk for m in models[25:]]


def test_the_api_pages_an_unordered_list_by_primary_key(models):
    request = Request(RequestFactory().get("/", {"page": "2"}))
    pagination = PageNumberPagination()
    pagination.page_size = 25

    with warnings.catch_warnings():
        warnings.simplefilter("error", UnorderedObjectListWarning)
        rows = pagination.paginate_queryset(unordered(), request)

    assert [m.pk for m in rows] == [m.pk for m in models[25:]]


def test_a_list_with_an_order_of_its_own_keeps_it(models):
    request = RequestFactory().get("/")

    page = paginate(request, Model.objects.order_by("-name"))

    assert page[0].name == "m-29"


def test_the_registry_list_pages_without_a_warning_in_name_order(client, bob, models):
    client.force_login(bob)

    with warnings.catch_warnings():
        warnings.simplefilter("error", UnorderedObjectListWarning)
        first = client.get("/registry/").context["page"]
        second = client.get("/registry/", {"page": "2"}).context["page"]

    assert [m.name for m in [*first, *second]] == [m.name for m in models]
