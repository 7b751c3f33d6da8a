"""The console in a real browser: Debian's chromium driven by Playwright against ``live_server``.

Covers what only a browser shows: logging in through the form, the fleet table that htmx
loads and then refreshes every 3 s without a page reload, and the approval buttons.
Screenshots go to ``artifacts/screenshots/`` at the repository root.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from fleet.inventory import health
from fleet.models import InferenceServer
from local import cluster as local_cluster
from local.triton import TritonProcess
from rollouts.models import ModelVersion
from tests.console.conftest import SCREENSHOTS
from tests.factories import InferenceServerFactory, ModelFactory, ModelVersionFactory

pytestmark = pytest.mark.browser

Status = ModelVersion.Status


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.mark.triton
def test_fleet_page_shows_live_health_and_refreshes_without_reload(
    transactional_db: None, live_server, local_triton: TritonProcess, alice, open_page
) -> None:
    """GIVEN the real Triton registered as the local cluster and probed once,
    WHEN alice opens the fleet page, THEN it shows the server Healthy with her tenant's
    models named and the others counted;
    WHEN a dead server is added and probed, THEN the open page shows it Unreachable on its
    next htmx poll, without a reload."""
    ModelFactory(tenant=alice.memberships.get().tenant, name="fraud-scorer")
    server = local_cluster.register(
        local_triton.http_url, local_triton.grpc_url, local_triton.metrics_url,
        local_triton.model_repository,
    )
    assert health.check_all() == {InferenceServer.Health.HEALTHY: 1}

    page = open_page("alice")
    page.goto(f"{live_server.url}/fleet/")

    row = page.locator(f'tr[data-server="{server.name}"]')
    expect(row.locator("[data-health]")).to_have_attribute("data-health", "healthy")
    expect(row).to_contain_text("Healthy")
    expect(row).to_contain_text("2.51.0")
    expect(row).to_contain_text("fraud-scorer v1")
    expect(row).to_contain_text("fraud-scorer v2")
    expect(row).to_contain_text("1 other model")
    expect(row).not_to_contain_text("sentiment")
    expect(page.locator("section.panel", has_text="Node localhost")).to_be_visible()
    assert screenshot(page, "fleet.png").stat().st_size > 0

    # A marker on the window survives htmx swaps but not a navigation or reload.
    page.evaluate("window.__sameDocument = true")
    dead_url = closed_port_url()
    InferenceServerFactory(cluster=server.cluster, name="triton-dead", http_url=dead_url)
    health.check_all()

    dead_row = page.locator('tr[data-server="triton-dead"]')
    expect(dead_row).to_contain_text("Unreachable", timeout=8_000)
    expect(dead_row.locator("[data-health]")).to_have_attribute("data-health", "unreachable")
    expect(dead_row).to_contain_text(f"connection refused at {dead_url}")
    expect(row).to_contain_text("Healthy")
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    screenshot(page, "fleet-unreachable.png")


def test_an_approver_approves_and_the_requester_gets_no_approve_button(
    transactional_db: None, live_server, tenant_a, alice, dave, erin, open_page
) -> None:
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    pending = ModelVersionFactory(
        model=model, version=2, status=Status.PENDING_APPROVAL,
        registered_by=dave, approval_requested_by=dave,
    )
    also_pending = ModelVersionFactory(
        model=model, version=3, status=Status.PENDING_APPROVAL,
        registered_by=dave, approval_requested_by=dave,
    )
    reason = "benchmarks within SLO, lineage reviewed"

    page = open_page("erin")
    page.goto(f"{live_server.url}/registry/versions/{pending.pk}/")
    expect(page.locator("#version-status")).to_have_text("Pending approval")
    page.fill("#reason", reason)
    page.get_by_role("button", name="Approve").click()

    expect(page.locator("#version-status")).to_have_text("Approved")
    expect(page.locator(".messages")).to_contain_text("fraud-scorer v2 approved.")
    expect(page.locator("#decision")).to_contain_text("Decided by erin")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    screenshot(page, "version-approved.png")
    pending.refresh_from_db()
    assert pending.status == Status.APPROVED
    assert pending.decided_by == erin
    assert pending.status_reason == reason

    page = open_page("dave")
    page.goto(f"{live_server.url}/registry/versions/{also_pending.pk}/")
    expect(page.locator("#version-status")).to_have_text("Pending approval")
    expect(page.locator("#decision")).to_contain_text("You asked for this approval")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_role("button", name="Reject")).to_have_count(0)
    also_pending.refresh_from_db()
    assert also_pending.status == Status.PENDING_APPROVAL


def test_four_eyes_hides_approve_from_an_approver_who_asked(
    transactional_db: None, live_server, tenant_a, alice, open_page
) -> None:
    """alice is tenant admin (so approver too), but asked for this approval herself."""
    version = ModelVersionFactory(
        model=ModelFactory(tenant=tenant_a), status=Status.PENDING_APPROVAL,
        registered_by=alice, approval_requested_by=alice,
    )

    page = open_page("alice")
    page.goto(f"{live_server.url}/registry/versions/{version.pk}/")

    expect(page.locator("#decision")).to_contain_text("You asked for this approval")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
