"""The approvals queue decides inline: a rollout waiting for an approver is approved (or
aborted) from the queue as a version is, each reason box on one line with its button, and
the decision comes back to the queue."""

from __future__ import annotations

import pytest
from django.test import Client
from playwright.sync_api import expect

from rollouts.models import ModelVersion, Rollout
from rollouts.registry import approvals
from tests.console import test_rollout_pages as pages
from tests.console.test_rollout_pages import make

setup = pages.setup  # fraud: v1 ready on its server, v2 and v3 registered
QUEUE = "/registry/approvals/"


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def waiting(setup, dave) -> Rollout:
    return make(setup, dave, state=Rollout.State.PENDING_APPROVAL, step_index=0, weights={},
                requires_approval=True)


def test_an_approver_approves_a_rollout_from_the_queue_and_comes_back_to_it(setup, dave, erin):
    rollout = waiting(setup, dave)
    body = browser(erin).get(QUEUE).content.decode()
    assert f'action="/registry/rollouts/{rollout.pk}/approve/"' in body
    assert f'action="/registry/rollouts/{rollout.pk}/abort/"' in body

    response = browser(erin).post(f"/registry/rollouts/{rollout.pk}/approve/",
                                  {"reason": "plan reviewed", "next": QUEUE})

    assert response.status_code == 302
    assert response["Location"] == QUEUE
    rollout.refresh_from_db()
    assert rollout.state != Rollout.State.PENDING_APPROVAL
    assert rollout.approvals.get().reason == "plan reviewed"


def test_the_requester_may_abort_but_not_approve_it(setup, dave):
    rollout = waiting(setup, dave)
    body = browser(dave).get(QUEUE).content.decode()
    assert f"/registry/rollouts/{rollout.pk}/approve/" not in body
    assert "You asked for this rollout" in body
    assert f'action="/registry/rollouts/{rollout.pk}/abort/"' in body

    response = browser(dave).post(f"/registry/rollouts/{rollout.pk}/abort/",
                                  {"reason": "wrong version", "next": QUEUE})

    assert response["Location"] == QUEUE
    assert Rollout.objects.get(pk=rollout.pk).requested_action == "abort"


@pytest.mark.parametrize("next_url", ["https://elsewhere.example/", "//elsewhere.example/", ""])
def test_a_next_off_this_site_goes_to_the_rollouts_page(setup, dave, erin, next_url):
    rollout = waiting(setup, dave)

    response = browser(erin).post(f"/registry/rollouts/{rollout.pk}/approve/",
                                  {"reason": "", "next": next_url})

    assert response["Location"] == f"/registry/rollouts/{rollout.pk}/"


def test_a_version_approved_from_the_queue_comes_back_to_it(setup, dave, erin):
    version = approvals.request_approval(dave, setup["versions"][3], "ready")

    response = browser(erin).post(f"/registry/versions/{version.pk}/approve/",
                                  {"reason": "", "next": QUEUE})

    assert response["Location"] == QUEUE
    assert ModelVersion.objects.get(pk=version.pk).status == ModelVersion.Status.APPROVED


@pytest.mark.browser
def test_each_reason_box_sits_on_one_line_with_its_button(
    transactional_db: None, live_server, setup, dave, erin, open_page
) -> None:
    """GIVEN a version and a rollout waiting, WHEN erin opens the queue at 1,400 px, THEN each
    decision's reason box and button share their top and their height."""
    approvals.request_approval(dave, setup["versions"][3], "ready")
    waiting(setup, dave)
    page = open_page("erin")
    page.goto(f"{live_server.url}{QUEUE}")
    forms = page.locator("form.decide")
    expect(forms).to_have_count(4)  # approve or reject the version, approve or abort the rollout
    for i in range(4):
        box = forms.nth(i).locator("input[name=reason]").bounding_box()
        button = forms.nth(i).locator("button").bounding_box()
        assert box and button
        assert abs(box["y"] - button["y"]) < 1 and abs(box["height"] - button["height"]) < 1
        assert box["x"] + box["width"] <= button["x"]
