"""Layout checked in a real browser (Debian's chromium) at the console's usual width."""

from __future__ import annotations

import itertools

import pytest

pytestmark = pytest.mark.browser

WIDTH = 1400  # the viewport of open_page
LINE_HEIGHT = ("parseFloat(getComputedStyle(document.querySelector('header.topbar nav a'))"
               ".lineHeight) || 0")


def test_the_navigation_fits_one_line_at_1400_px_for_a_platform_admin(
    transactional_db: None, live_server, root, open_page
) -> None:
    """GIVEN root (a platform admin: one more link, a longer name), WHEN a page opens 1,400 px
    wide, THEN every link of the top bar, the user's name and Log out sit on one line inside
    the window, none wrapped or overlapping."""
    page = open_page("root")
    page.goto(f"{live_server.url}/fleet/quotas/")
    boxes = page.evaluate("""() => {
        const bar = document.querySelector('header.topbar');
        const items = [...bar.querySelectorAll('nav a, .user > span, .user button, .brand')];
        return {bar: bar.getBoundingClientRect().toJSON(), scroll: bar.scrollWidth,
                items: items.map(e => ({text: e.textContent.trim(), lines: e.getClientRects().length,
                                        ...e.getBoundingClientRect().toJSON()}))};
    }""")
    assert "Admin" in [i["text"] for i in boxes["items"]]
    assert boxes["scroll"] <= WIDTH
    line = boxes["items"][0]["top"] + boxes["items"][0]["height"] / 2
    single = page.evaluate(LINE_HEIGHT)
    for item in boxes["items"]:
        assert item["right"] <= WIDTH, item
        assert item["top"] <= line <= item["bottom"], item  # all on one line
        assert item["lines"] == 1, item
        assert single == 0 or item["height"] < 2.2 * single, item  # not wrapped inside itself
    ordered = sorted(boxes["items"], key=lambda i: i["left"])
    for left, right in itertools.pairwise(ordered):
        assert left["right"] <= right["left"] + 0.5, (left, right)
