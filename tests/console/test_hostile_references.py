"""Console pages that read an id from the query string: Unicode digits (``³``, ``٣``, which
``str.isdigit()`` accepts and ``int()`` refuses or reads as another number) and ids too long
for a 64-bit column are no id, never a 500."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(alice):
    client = Client(raise_request_exception=False)
    client.force_login(alice)
    return client


@pytest.mark.parametrize("value", ["³", "٣", "\uff11\uff12", "9" * 30])
@pytest.mark.parametrize(("url", "param", "ok"), [
    ("/registry/loads/", "deployment", 200),
    ("/registry/loads/", "version", 200),
    ("/registry/loads/", "server", 200),
    ("/registry/rollouts/", "deployment", 200),
    ("/registry/deployments/new/", "model", 200),
])
def test_a_unicode_or_overlong_id_in_a_console_filter_is_no_id(browser, url, param, ok, value):
    response = browser.get(url, {param: value})
    assert response.status_code == ok, (response.status_code, response.content[:300])


@pytest.mark.parametrize("value", ["³", "٣", "9" * 30])
def test_a_unicode_or_overlong_benchmark_id_to_compare_is_a_400_naming_it(browser, value):
    response = browser.get("/registry/benchmarks/compare/", {"a": value, "b": "1"})
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert "give the id of a benchmark" in response.content.decode()
