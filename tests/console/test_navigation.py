"""The top navigation marks the item of the page's section, and only that one."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from django.urls import reverse

from console.templatetags.switchyard import nav_section
from tests.console.test_tenancy_matrix import World, console_url_names

NAV_LINK = re.compile(r'<a href="[^"]*"\s*(?P<attrs>[^>]*)>(?P<label>[^<]+)</a>')

# (URL name, the World object whose pk the URL takes, the nav item it belongs to)
PAGES = [
    ("console:dashboard", None, "Dashboard"),
    ("console:audit", None, "Audit log"),
    ("rollouts:models", None, "Registry"),
    ("rollouts:model", "model_a", "Registry"),
    ("rollouts:version", "version_a", "Registry"),
    ("rollouts:approvals", None, "Registry"),
    ("rollouts:deployments", None, "Deployments"),
    ("rollouts:deployment", "deployment_a", "Deployments"),
    ("rollouts:load", "load_a", "Deployments"),
    ("rollouts:loads", None, "Deployments"),
    ("rollouts:rollouts", None, "Rollouts"),
    ("rollouts:rollout", "canary_a", "Rollouts"),
    ("rollouts:benchmarks", None, "Benchmarks"),
    ("rollouts:benchmark", "benchmark_a", "Benchmarks"),
    ("fleet:overview", None, "Fleet"),
    ("fleet:cluster", "cluster", "Fleet"),
    ("fleet:server", "server", "Fleet"),
    ("fleet:quotas", None, "Quotas"),
    ("fleet:tokens", None, "API tokens"),
    ("fleet:webhooks", None, "Webhooks"),
    ("fleet:webhook", "webhook_a", "Webhooks"),
]


def active_items(html: str) -> list[str]:
    nav = html.split('<nav aria-label="Main">', 1)[1].split("</nav>", 1)[0]
    return [m["label"] for m in NAV_LINK.finditer(nav) if 'class="active"' in m["attrs"]]


@pytest.mark.parametrize(("name", "target", "item"), PAGES, ids=[p[0] for p in PAGES])
def test_a_page_marks_its_own_section_in_the_navigation(request, db, name, target, item):
    world = World(request)
    url = reverse(name, kwargs={"pk": getattr(world, target).pk} if target else None)

    response = world.browser("alice").get(url)

    assert response.status_code == 200
    html = response.content.decode()
    assert active_items(html) == [item]
    assert html.count('aria-current="page"') == 1


def test_a_page_that_is_not_there_marks_no_section(client, alice):
    client.force_login(alice)

    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert active_items(response.content.decode()) == []


def test_every_console_page_belongs_to_a_section():
    """A new URL lands under an item without a change to the navigation; only the login
    and logout pages (with no navigation) and the icon are outside."""
    outside = set()
    for name in console_url_names():
        namespace, _, url_name = name.rpartition(":")
        if not nav_section(SimpleNamespace(namespace=namespace, url_name=url_name)):
            outside.add(name)

    assert outside <= {"login", "logout", "favicon"}
