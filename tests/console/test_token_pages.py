"""The API token and webhook pages: a new secret comes with a copy button; someone who may not
manage them reads why, not an empty table."""

from __future__ import annotations

import re

import pytest

MAIN = re.compile(r"<main>(.*)</main>", re.S)


def main_of(response) -> str:
    return MAIN.search(response.content.decode())[1]


def test_a_new_tokens_secret_comes_with_a_copy_button(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post("/fleet/tokens/new/", {"tenant": tenant_a.slug, "name": "ci",
                                                  "role": "deployer"})

    assert response.status_code == 200
    body = main_of(response)
    assert re.search(r'<div class="secret" id="new-token">sy_[\w-]+</div>', body)
    assert '<button type="button" data-copy="new-token" id="copy-token">Copy token</button>' in body


def test_a_new_webhooks_secret_comes_with_a_copy_button(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post("/fleet/webhooks/new/", {
        "tenant": tenant_a.slug, "name": "ops", "url": "https://hooks.example.com/x",
        "format": "json"})

    assert response.status_code == 200
    body = main_of(response)
    assert 'id="new-secret"' in body
    assert 'data-copy="new-secret"' in body


@pytest.mark.parametrize(("path", "says"), [
    ("/fleet/tokens/", "Only tenant admins make and see API tokens"),
    ("/fleet/webhooks/", "Only tenant admins manage webhooks"),
])
def test_someone_who_may_not_manage_them_reads_why_without_an_empty_table(client, bob, path,
                                                                         says):
    client.force_login(bob)

    response = client.get(path)

    assert response.status_code == 200
    body = main_of(response)
    assert says in body
    assert "<table" not in body


@pytest.mark.parametrize(("path", "empty"), [("/fleet/tokens/", "No tokens yet."),
                                             ("/fleet/webhooks/", "No webhooks yet.")])
def test_an_admin_with_none_yet_sees_the_empty_table(client, alice, path, empty):
    client.force_login(alice)

    body = main_of(client.get(path))

    assert "<table" in body and empty in body
    assert "Only tenant admins" not in body
