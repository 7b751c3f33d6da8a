"""The audit log and the loads list page by keyset (newest first, by created_at then id), on
the console and in the API: following Older/Newer (``next``/``previous``) shows every row once,
rows of the same instant included, with the filters kept; an old ``?page=N`` link is answered
sensibly; the count stops at a cap instead of counting the whole table."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.test import Client
from rest_framework.test import APIClient

from console import paging
from fleet import audit
from fleet.models import AuditEvent
from rollouts.models import ModelLoad
from tests.factories import DeploymentFactory, InferenceServerFactory, ModelVersionFactory

START = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)


@pytest.fixture
def events(tenant_a, tenant_b, alice, charlie) -> list[int]:
    """70 events of tenant A, newest first, ten of each instant (ties the id settles), and
    tenant B's next to them."""
    for i in range(70):
        with time_machine.travel(START + timedelta(minutes=i // 10), tick=False):
            audit.record(alice, "updated" if i % 2 else "created", tenant_a, tenant=tenant_a)
            audit.record(charlie, "updated", tenant_b, tenant=tenant_b)
    return list(AuditEvent.objects.filter(tenant=tenant_a)
                .order_by("-created_at", "-id").values_list("pk", flat=True))


def console_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def walk_console(client: Client, path: str, params: dict[str, str] | None = None,
                 ) -> tuple[list[int], list[str]]:
    """Every row's id following Older from the first page; the pages' Older hrefs."""
    seen: list[int] = []
    hrefs = []
    query = dict(params or {})
    while True:
        response = client.get(path, query)
        assert response.status_code == 200
        page = response.context["page"]
        seen += [row.pk for row in page]
        if not page.older:
            return seen, hrefs
        hrefs += re.findall(r'href="(\?[^"]*cursor=[^"]*)"[^>]*>Older', response.content.decode())
        query = {**(params or {}), "cursor": page.older}


def test_the_console_audit_log_shows_every_event_once_older_and_back_newer(events, bob):
    client = console_of(bob)

    seen, _ = walk_console(client, "/audit/")

    assert seen == events  # 70 events, 25 a page: three pages, nothing repeated or skipped
    last = client.get("/audit/", {"cursor": paging.encode_cursor(paging.OLDER,
                                                                  AuditEvent.objects.get(pk=events[50]))})
    back = client.get("/audit/", {"cursor": last.context["page"].newer})
    assert [e.pk for e in last.context["page"]] == events[51:]
    assert [e.pk for e in back.context["page"]] == events[26:51]


def test_the_filters_ride_along_on_older_links(events, bob):
    client = console_of(bob)

    seen, hrefs = walk_console(client, "/audit/", {"verb": "updated"})

    assert seen == [pk for pk in events if AuditEvent.objects.get(pk=pk).verb == "updated"]
    assert hrefs and all("verb=updated" in href for href in hrefs)


def test_an_old_numbered_link_shows_the_newest_page_and_says_why(events, bob):
    response = console_of(bob).get("/audit/", {"page": "3"})

    assert response.status_code == 200
    assert [e.pk for e in response.context["page"]] == events[:25]
    assert "pages by Newer and Older now" in response.content.decode()


def test_a_cursor_that_cannot_be_read_shows_the_newest_page(events, bob):
    response = console_of(bob).get("/audit/", {"cursor": "not-a-cursor"})

    assert [e.pk for e in response.context["page"]] == events[:25]


def test_the_count_stops_at_the_cap(events, bob, monkeypatch):
    client = console_of(bob)
    assert "70 events" in client.get("/audit/").content.decode()

    monkeypatch.setattr(paging, "COUNT_CAP", 50)

    assert "more than 50 events" in client.get("/audit/").content.decode()


@pytest.fixture
def loads(tenant_a) -> list[int]:
    deployment = DeploymentFactory(tenant=tenant_a)
    server = InferenceServerFactory(cluster=deployment.cluster)
    version = ModelVersionFactory(model=deployment.model)
    for i in range(60):
        with time_machine.travel(START + timedelta(minutes=i // 7), tick=False):
            ModelLoad.objects.create(
                tenant=tenant_a, deployment=deployment, server=server, version=version,
                state=ModelLoad.State.READY if i % 3 else ModelLoad.State.FAILED,
                requested_by_label="ci")
    return list(ModelLoad.objects.order_by("-created_at", "-id").values_list("pk", flat=True))


def test_the_console_loads_list_pages_by_keyset_with_its_filter(loads, bob):
    client = console_of(bob)

    every, _ = walk_console(client, "/registry/loads/")
    ready, hrefs = walk_console(client, "/registry/loads/", {"state": "ready"})

    assert every == loads
    assert ready == [pk for pk in loads if ModelLoad.objects.get(pk=pk).state == "ready"]
    assert hrefs and all("state=ready" in href for href in hrefs)


def walk_api(client: APIClient, path: str) -> list[int]:
    seen: list[int] = []
    url: str | None = path
    while url:
        body = client.get(url).json()
        assert "count" not in body
        seen += [row["id"] for row in body["results"]]
        url = body["next"]
    return seen


def test_the_api_pages_the_audit_log_and_loads_by_cursor(events, loads, alice):
    client = APIClient()
    client.force_login(alice)

    assert walk_api(client, "/api/v1/audit-events/") == events  # 50 a page, ties included
    assert walk_api(client, "/api/v1/loads/?state=failed") == [
        pk for pk in loads if ModelLoad.objects.get(pk=pk).state == "failed"]
    second = client.get(client.get("/api/v1/audit-events/").json()["next"]).json()
    assert [row["id"] for row in client.get(second["previous"]).json()["results"]] == events[:50]


def test_the_api_answers_old_page_numbers_and_bad_cursors_naming_the_parameter(events, alice):
    client = APIClient()
    client.force_login(alice)

    first = client.get("/api/v1/audit-events/", {"page": "1"})
    later = client.get("/api/v1/audit-events/", {"page": "2"})
    junk = client.get("/api/v1/loads/", {"cursor": "junk"})

    assert [row["id"] for row in first.json()["results"]] == events[:50]
    assert later.status_code == 400 and "pages by cursor" in later.json()["page"][0]
    assert junk.status_code == 400 and list(junk.json()) == ["cursor"]
