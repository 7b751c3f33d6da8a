"""A new API token's secret, copied with its button in a real browser (Debian's chromium)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def test_the_copy_button_copies_the_secret_or_selects_it_where_the_clipboard_is_closed(
    transactional_db: None, live_server, alice, tenant_a, open_page
) -> None:
    """GIVEN alice on the token page, WHEN she creates a token and presses "Copy token",
    THEN the clipboard holds the secret, under the page's script policy; WHEN the browser
    refuses the page the clipboard (plain HTTP to a remote host), THEN the button selects the
    secret for her to copy and says so."""
    page = open_page("alice")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)
    page.goto(f"{live_server.url}/fleet/tokens/")
    page.fill("#t-name", "ci-release")
    page.click("button:has-text('Create token')")
    secret = page.locator("#new-token").inner_text().strip()
    assert secret.startswith("sy_")

    page.click("#copy-token")

    expect(page.locator("#copy-token")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    expect(page.locator("#copy-token")).to_have_text("Copy token", timeout=5000)

    page.evaluate("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
    page.click("#copy-token")

    expect(page.locator("#copy-token")).to_have_text("Selected: press Ctrl+C")
    assert page.evaluate("window.getSelection().toString()").strip() == secret
    assert refused == []
