"""Console forms: bad input is a 4xx with the error on the field it names, never a 500, and the
domain functions' refusals show on the field they name, as the API reports them."""

from __future__ import annotations

import pytest
from django.test import Client

from rollouts.models import ModelLoad, ModelVersion
from rollouts.registry import approvals
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

Status = ModelVersion.Status


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def setup(tenant_a, tenant_b):
    cluster = ClusterFactory(name="c-forms")
    server = InferenceServerFactory(cluster=cluster, name="triton-1")
    model = ModelFactory(tenant=tenant_a, name="scorer")
    v1 = ModelVersionFactory(model=model, version=1, status=Status.APPROVED)
    deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=cluster, name="scorer-prod")
    deployment.servers.set([server])
    other = ModelVersionFactory(model=ModelFactory(tenant=tenant_a, name="other"), version=1)
    foreign = ModelVersionFactory(model=ModelFactory(tenant=tenant_b, name="theirs"), version=1)
    return {"server": server, "model": model, "v1": v1, "deployment": deployment,
            "other": other, "foreign": foreign}


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def load_url(setup) -> str:
    return f"/registry/deployments/{setup['deployment'].pk}/load/"


def errors(response) -> str:
    """The text of the form errors block the page shows."""
    body = response.content.decode()
    start = body.index('id="load-errors"')
    return body[start:body.index("</div>", start)]


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("abc", "not a version of this deployment&#x27;s model"),
        ("", "choose a version to load"),
        (None, "choose a version to load"),
        ("99999", "not a version of this deployment&#x27;s model"),
        ("1.5", "not a version of this deployment&#x27;s model"),
    ],
    ids=["letters", "empty", "missing", "unknown-id", "decimal"],
)
def test_a_load_with_a_bad_version_is_a_400_naming_version(dave, setup, version, message):
    data = {"action": "load"} | ({} if version is None else {"version": version})

    response = browser(dave).post(load_url(setup), data)

    assert response.status_code == 400
    assert "<strong>Version</strong>: " + message in errors(response)
    assert not ModelLoad.objects.exists()


@pytest.mark.parametrize("which", ["other", "foreign"])
def test_a_version_of_another_model_is_refused_naming_version(dave, setup, which):
    response = browser(dave).post(load_url(setup), {"version": setup[which].pk})

    assert response.status_code == 400
    assert "<strong>Version</strong>: not a version" in errors(response)
    assert not ModelLoad.objects.exists()


def test_an_unknown_action_is_refused_naming_action(dave, setup):
    response = browser(dave).post(load_url(setup), {"version": setup["v1"].pk, "action": "reboot"})

    assert response.status_code == 400
    assert "<strong>Action</strong>: Select a valid choice." in errors(response)


def test_the_domains_refusal_shows_on_the_field_it_names(dave, setup):
    """A rejected version: ``loads.check_loadable`` names ``version``, the API answers 400."""
    rejected = ModelVersionFactory(model=setup["model"], version=2, status=Status.REJECTED)

    response = browser(dave).post(load_url(setup), {"version": rejected.pk})

    assert response.status_code == 400
    assert "<strong>Version</strong>: version 2 is rejected" in errors(response)
    assert not ModelLoad.objects.exists()


def test_a_conflict_is_a_409_on_the_field_it_names(dave, setup):
    """Another load of the model in flight on the server: the API's 409, on ``version``."""
    v2 = ModelVersionFactory(model=setup["model"], version=2, status=Status.APPROVED)
    client = browser(dave)
    assert client.post(load_url(setup), {"version": setup["v1"].pk}).status_code == 302

    response = client.post(load_url(setup), {"version": v2.pk})

    assert response.status_code == 409
    assert "<strong>Version</strong>: pending of scorer v1 is in flight on triton-1" in errors(response)
    assert ModelLoad.objects.count() == 1


def test_a_refusal_naming_no_field_of_the_form_shows_on_the_form(alice, dave, setup):
    """An archived deployment: refused naming ``deployment``, which the form has no field for."""
    setup["deployment"].servers.clear()
    ModelLoad.objects.create(tenant=setup["deployment"].tenant, deployment=setup["deployment"],
                             server=setup["server"], version=setup["v1"], state="unloaded",
                             requested_by_label="dave")
    browser(alice).post(f"/registry/deployments/{setup['deployment'].pk}/delete/", {})

    response = browser(dave).post(load_url(setup), {"version": setup["v1"].pk})

    assert response.status_code == 409
    assert "<p>deployment scorer-prod is archived</p>" in errors(response)


def test_a_good_load_redirects_with_a_message_and_starts_the_load(dave, setup):
    client = browser(dave)

    response = client.post(load_url(setup), {"version": str(setup["v1"].pk)}, follow=True)

    assert response.redirect_chain == [(f"/registry/deployments/{setup['deployment'].pk}/", 302)]
    assert "Loading v1 onto 1 server." in response.content.decode()
    assert ModelLoad.objects.get().state == ModelLoad.State.PENDING


def test_a_viewer_is_refused_before_the_input_is_read(bob, setup):
    response = browser(bob).post(load_url(setup), {"version": "abc"})

    assert response.status_code == 403
    assert "this needs the deployer role in the tenant; you have viewer" in response.content.decode()


# --- version decisions


def version_url(version: ModelVersion, action: str) -> str:
    return f"/registry/versions/{version.pk}/{action}/"


def decision_errors(response) -> str:
    body = response.content.decode()
    start = body.index('id="decision-errors"')
    return body[start:body.index("</div>", start)]


def test_a_rejection_without_a_reason_is_a_400_on_reason_and_keeps_the_version(dave, erin, setup):
    pending = approvals.request_approval(dave, ModelVersionFactory(model=setup["model"], version=2))

    response = browser(erin).post(version_url(pending, "reject"), {"reason": "  "})

    assert response.status_code == 400
    assert "<strong>Reason</strong>: say why the version is rejected" in decision_errors(response)
    pending.refresh_from_db()
    assert pending.status == Status.PENDING_APPROVAL


def test_a_decision_on_a_decided_version_is_a_409_on_the_form(erin, setup):
    response = browser(erin).post(version_url(setup["v1"], "approve"), {"reason": "again"})

    assert response.status_code == 409
    assert "version 1 is already approved" in decision_errors(response)


def test_a_reason_too_long_is_a_400_naming_reason(dave, setup):
    version = ModelVersionFactory(model=setup["model"], version=2)

    response = browser(dave).post(version_url(version, "request-approval"), {"reason": "x" * 2001})

    assert response.status_code == 400
    assert "<strong>Reason</strong>: Ensure this value has at most 2000 characters" in decision_errors(response)
    version.refresh_from_db()
    assert version.status == Status.REGISTERED


def test_four_eyes_is_a_403_with_its_reason(setup, tenant_a):
    from tests.conftest import _member

    carol = _member("carol", tenant_a, "approver")
    pending = approvals.request_approval(carol, ModelVersionFactory(model=setup["model"], version=2))

    response = browser(carol).post(version_url(pending, "approve"), {"reason": "mine"})

    assert response.status_code == 403
    assert "someone else must approve it" in response.content.decode()
    pending.refresh_from_db()
    assert pending.status == Status.PENDING_APPROVAL


def test_an_unknown_version_action_is_a_404(erin, setup):
    response = browser(erin).post(version_url(setup["v1"], "promote"), {})

    assert response.status_code == 404


def test_a_decision_is_recorded_with_its_reason(dave, erin, setup):
    pending = approvals.request_approval(dave, ModelVersionFactory(model=setup["model"], version=2))

    response = browser(erin).post(version_url(pending, "approve"), {"reason": " benchmarks fine "})

    assert response.status_code == 302
    pending.refresh_from_db()
    assert (pending.status, pending.status_reason, pending.decided_by) == (
        Status.APPROVED, "benchmarks fine", erin)
