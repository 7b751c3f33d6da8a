"""Browser fixtures: Debian's chromium driven by Playwright, logged in through the form."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.fixtures import sent_tasks

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO_ROOT / "artifacts" / "screenshots"
PASSWORD = "pw-for-tests-1"  # tests.factories.UserFactory
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="module")
def _orm_beside_playwright() -> Iterator[None]:
    # Playwright's sync API keeps an asyncio loop running in this thread for as long as it
    # is started; without this, Django's ORM (the test's own queries and pytest-django's
    # flush after each test) refuses to run here with SynchronousOnlyOperation.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="module")
def browser(_orm_beside_playwright: None) -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def open_page(browser: Browser, live_server) -> Iterator:
    """``open_page(username)`` → a fresh browser context logged in through the login form."""
    contexts = []

    def login(username: str) -> Page:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.goto(f"{live_server.url}/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        expect(page.locator("header.topbar .user")).to_contain_text(username)
        return page

    yield login
    for context in contexts:
        context.close()




@pytest.fixture(autouse=True)
def enqueued_rollouts(monkeypatch) -> list[int]:
    """Console tests advance rollouts by calling the reconciler (``rollout.run_to_end``);
    what would go to the broker is kept here."""
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, "rollouts.tasks.advance_rollout", sent.append)
    return sent
