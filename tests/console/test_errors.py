"""Error answers outside DRF's views: console pages in the console's look, JSON under /api/;
refusals logged as one line, failures with their traceback; and the site's /favicon.ico."""

from __future__ import annotations

import logging

import pytest
from django.test import Client
from rest_framework.test import APIClient

from fleet.models import Membership
from fleet.tenancy import tokens

CONSOLE_LOOK = ('<link rel="stylesheet" href="/static/switchyard/switchyard.css">',
                '<header class="topbar">')


def boom(*args: object, **kwargs: object) -> None:
    raise RuntimeError("the database went away")


@pytest.fixture
def token_a(alice, tenant_a):
    return tokens.issue(alice, tenant_a, "ci", Membership.Role.DEPLOYER).token


def refuse_bob(client: Client, bob, token_a):
    """bob (a viewer) revokes a token: only tenant admins may."""
    client.force_login(bob)
    return client.post(f"/fleet/tokens/{token_a.pk}/revoke/")


# --- pages ----------------------------------------------------------------------------------------


def test_a_page_that_is_not_there_is_a_console_page(client, alice):
    client.force_login(alice)

    response = client.get("/registry/models/999999/")

    assert response.status_code == 404
    body = response.content.decode()
    assert all(part in body for part in CONSOLE_LOOK)
    assert "Not found" in body


def test_a_refusal_is_a_console_page_naming_the_role_needed(client, bob, token_a):
    response = refuse_bob(client, bob, token_a)

    assert response.status_code == 403
    body = response.content.decode()
    assert all(part in body for part in CONSOLE_LOOK)
    assert "this needs the admin role in the tenant; you have viewer" in body


def test_a_request_django_cannot_read_is_a_console_page(client):
    response = client.get("/", HTTP_HOST="not-allowed.example")

    assert response.status_code == 400
    body = response.content.decode()
    assert CONSOLE_LOOK[0] in body
    assert 'id="error"' in body and "The request could not be read." in body


def test_a_form_without_its_csrf_token_is_a_console_page_saying_what_to_do(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)

    response = client.post("/fleet/tokens/new/", {"name": "ci"})

    assert response.status_code == 403
    body = response.content.decode()
    assert all(part in body for part in CONSOLE_LOOK)
    assert "Reload the page" in body


def test_a_server_error_is_a_page_of_its_own_that_needs_no_database(monkeypatch, alice):
    """GIVEN every query failing and the context processor with them, WHEN a page fails,
    THEN the 500 page still answers, in the console's colours, without the navigation (which
    needs the user, from the database) and under the same script policy as every page."""
    monkeypatch.setattr("console.views.render", boom)
    monkeypatch.setattr("console.context_processors.switchyard", boom)
    client = Client(raise_request_exception=False)
    client.force_login(alice)

    response = client.get("/")

    assert response.status_code == 500
    body = response.content.decode()
    assert "<h1>Server error</h1>" in body
    assert "#0f1b33" in body  # the top bar's colour, written into the page
    assert '<nav aria-label="Main">' not in body and "{%" not in body
    # Directives come in no fixed order: compare the one that matters, as a directive.
    directives = {d.strip() for d in response["Content-Security-Policy"].split(";")}
    assert "script-src 'self'" in directives


def test_the_500_page_answers_even_when_its_template_fails(monkeypatch, alice):
    monkeypatch.setattr("console.views.render", boom)
    monkeypatch.setattr("console.errors.loader.get_template", boom)
    client = Client(raise_request_exception=False)
    client.force_login(alice)

    response = client.get("/")

    assert response.status_code == 500
    assert "<h1>Server error</h1>" in response.content.decode()


# --- JSON under /api/ -----------------------------------------------------------------------------


def test_under_the_api_a_missing_path_and_a_failure_answer_json(monkeypatch, alice):
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(alice)
    monkeypatch.setattr("rollouts.api.views.ModelViewSet.list", boom)

    missing = client.get("/api/v1/no-such-thing/")
    failed = client.get("/api/v1/models/")

    assert missing.status_code == 404
    assert missing.json() == {"detail": "Not found: no API endpoint at /api/v1/no-such-thing/"}
    assert failed.status_code == 500
    assert failed["Content-Type"] == "application/json"
    assert failed.json() == {
        "detail": "internal server error: the error was logged for the operators"}


def test_under_the_api_a_refusal_answers_json(bob, token_a):
    client = APIClient()
    client.force_authenticate(bob)

    response = client.delete(f"/api/v1/tokens/{token_a.pk}/")

    assert response.status_code == 403
    assert response.json() == {"detail": "this needs the admin role in the tenant; you have viewer"}


# --- logging --------------------------------------------------------------------------------------


def request_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django.request"]


def test_a_refusal_is_logged_as_one_line_saying_why(client, bob, token_a, caplog):
    with caplog.at_level(logging.WARNING, logger="django.request"):
        refuse_bob(client, bob, token_a)

    [record] = request_records(caplog)
    assert record.levelno == logging.WARNING
    assert record.exc_info is None and not record.exc_text
    assert record.getMessage() == (
        f"Forbidden (Permission denied): /fleet/tokens/{token_a.pk}/revoke/ "
        "(this needs the admin role in the tenant; you have viewer)")


def test_an_api_refusal_is_logged_as_one_line(bob, token_a, caplog):
    client = APIClient()
    client.force_authenticate(bob)

    with caplog.at_level(logging.WARNING, logger="django.request"):
        client.delete(f"/api/v1/tokens/{token_a.pk}/")

    [record] = request_records(caplog)
    assert record.exc_info is None
    assert record.getMessage() == f"Forbidden: /api/v1/tokens/{token_a.pk}/"


def test_a_failure_keeps_its_traceback(monkeypatch, alice, caplog):
    monkeypatch.setattr("console.views.render", boom)
    client = Client(raise_request_exception=False)
    client.force_login(alice)

    with caplog.at_level(logging.WARNING, logger="django.request"):
        client.get("/")

    [record] = request_records(caplog)
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


# --- /favicon.ico ---------------------------------------------------------------------------------


def test_favicon_ico_is_the_consoles_icon(client):
    response = client.get("/favicon.ico")

    assert response.status_code == 302
    assert response["Location"] == "/static/switchyard/favicon.svg"
    assert "max-age=86400" in response["Cache-Control"]
    icon = client.get(response["Location"])
    assert icon.status_code == 200
    assert icon["Content-Type"] == "image/svg+xml"
    assert b"<svg" in b"".join(icon.streaming_content)
