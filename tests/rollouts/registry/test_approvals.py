"""Version approval: request, approve, reject, archive; four-eyes; people decide, not tokens.

Tested twice: on the domain module ``rollouts.registry.approvals`` and over the API, which must give
the same answers as HTTP statuses (403 role or four-eyes, 409 illegal transition naming
``status``, 400 naming ``reason``).
"""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.db import transaction
from rest_framework.test import APIClient

from console.exceptions import Conflict, DomainError
from fleet.models import AuditEvent, Membership
from fleet.tenancy import tokens
from fleet.tenancy.scoping import TokenUser
from rollouts.models import ModelVersion
from rollouts.registry import approvals
from tests.factories import ModelFactory, ModelVersionFactory

Role = Membership.Role
Status = ModelVersion.Status


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def version(tenant_a) -> ModelVersion:
    return ModelVersionFactory(model=ModelFactory(tenant=tenant_a, name="resnet"), version=1)


def stored(version: ModelVersion) -> ModelVersion:
    return ModelVersion.objects.get(pk=version.pk)


def url(version: ModelVersion, action: str) -> str:
    return f"/api/v1/versions/{version.pk}/{action}/"


# --- domain: rollouts.registry.approvals ------------------------------------------------------------------


def test_a_deployer_requests_approval(dave, version):
    approvals.request_approval(dave, version, reason="ready for prod")

    row = stored(version)
    assert row.status == Status.PENDING_APPROVAL
    assert row.approval_requested_by == dave
    assert row.approval_requested_by_token is None
    [event] = AuditEvent.objects.filter(verb="requested_approval")
    assert (event.actor_label, event.before, event.after, event.reason) == (
        "dave", {"status": "registered"}, {"status": "pending_approval"}, "ready for prod"
    )


def test_a_deployer_cannot_approve_for_lack_of_the_approver_role(dave, version):
    approvals.request_approval(dave, version)

    with pytest.raises(PermissionDenied, match="needs the approver role in the tenant; you have deployer"):
        approvals.approve(dave, stored(version))

    assert stored(version).status == Status.PENDING_APPROVAL


def test_an_approver_cannot_approve_her_own_request(erin, version):
    approvals.request_approval(erin, version)

    with pytest.raises(PermissionDenied, match="four-eyes"):
        approvals.approve(erin, stored(version))

    assert stored(version).status == Status.PENDING_APPROVAL
    assert not AuditEvent.objects.filter(verb="approved").exists()


def test_another_approver_or_an_admin_approves(alice, erin, version):
    approvals.request_approval(erin, version)

    approvals.approve(alice, stored(version), reason="benchmarks fine")

    row = stored(version)
    assert row.status == Status.APPROVED
    assert row.decided_by == alice
    assert row.status_reason == "benchmarks fine"


def test_four_eyes_holds_for_platform_admins_too(root, erin, version):
    approvals.request_approval(root, version)

    with pytest.raises(PermissionDenied, match="four-eyes"):
        approvals.approve(root, stored(version))
    approvals.approve(erin, stored(version))

    assert stored(version).status == Status.APPROVED


def test_who_made_the_requesting_token_cannot_approve(alice, erin, tenant_a, version):
    """GIVEN a CI token made by alice requests approval
    THEN alice may not approve it (she asked, through her token) but erin may."""
    issued = tokens.issue(alice, tenant_a, "ci", Role.DEPLOYER)
    approvals.request_approval(TokenUser(issued.token), version)
    assert stored(version).approval_requested_by_token == issued.token

    with pytest.raises(PermissionDenied, match="four-eyes"):
        approvals.approve(alice, stored(version))
    approvals.approve(erin, stored(version))

    assert stored(version).status == Status.APPROVED


def test_a_token_made_by_a_token_stands_for_the_person_behind_the_first(alice, erin, tenant_a,
                                                                        version):
    """GIVEN alice makes admin token T1, T1 makes T2 and T2 requests approval
    THEN T2 records alice as its person and alice may not approve; erin may."""
    first = tokens.issue(alice, tenant_a, "t1", Role.ADMIN)
    second = tokens.issue(TokenUser(first.token), tenant_a, "t2", Role.ADMIN)
    third = tokens.issue(TokenUser(second.token), tenant_a, "t3", Role.DEPLOYER)
    assert (second.token.created_by, second.token.created_by_token) == (alice, first.token)
    assert (third.token.created_by, third.token.created_by_token) == (alice, second.token)

    approvals.request_approval(TokenUser(third.token), version)

    assert approvals.is_requester(alice, stored(version))
    with pytest.raises(PermissionDenied, match="four-eyes"):
        approvals.approve(alice, stored(version))
    assert stored(version).status == Status.PENDING_APPROVAL
    approvals.approve(erin, stored(version))
    assert stored(version).decided_by == erin


def test_four_eyes_is_checked_on_the_row_locked_for_the_transition(monkeypatch, alice, erin,
                                                                   tenant_a, version):
    """GIVEN alice holds a copy of the version read before anyone asked for approval
    WHEN her token asks and she then approves from that stale copy
    THEN the four-eyes check reads the locked row (inside the transaction), not her copy."""
    stale = stored(version)
    issued = tokens.issue(alice, tenant_a, "ci", Role.DEPLOYER)
    approvals.request_approval(TokenUser(issued.token), version)
    seen = []
    real = approvals.is_requester

    def spy(actor, checked):
        seen.append((checked is stale, checked.status, transaction.get_connection().in_atomic_block))
        return real(actor, checked)

    monkeypatch.setattr(approvals, "is_requester", spy)

    with pytest.raises(PermissionDenied, match="four-eyes"):
        approvals.approve(alice, stale)

    assert seen == [(False, Status.PENDING_APPROVAL, True)]
    assert stored(version).status == Status.PENDING_APPROVAL
    assert not AuditEvent.objects.filter(verb="approved").exists()


def test_a_token_cannot_decide_even_with_the_approver_role(alice, dave, tenant_a, version):
    issued = tokens.issue(alice, tenant_a, "approver-bot", Role.APPROVER)
    approvals.request_approval(dave, version)

    for decide in (approvals.approve, approvals.reject):
        with pytest.raises(PermissionDenied, match="decided by people"):
            decide(TokenUser(issued.token), stored(version), "automated")

    assert stored(version).status == Status.PENDING_APPROVAL


def test_approving_an_approved_version_is_a_conflict_naming_status(alice, dave, version):
    approvals.request_approval(dave, version)
    approvals.approve(alice, stored(version))

    with pytest.raises(Conflict) as refused:
        approvals.approve(alice, stored(version))

    assert refused.value.field == "status"
    assert refused.value.status_code == 409
    assert "already approved" in refused.value.message


def test_approving_a_merely_registered_version_is_a_conflict_naming_status(erin, version):
    with pytest.raises(Conflict) as refused:
        approvals.approve(erin, version)

    assert refused.value.field == "status"
    assert refused.value.message == "version 1 is registered and cannot become approved"
    assert stored(version).status == Status.REGISTERED


@pytest.mark.parametrize("reason", ["", "   "])
def test_rejecting_needs_a_reason(dave, erin, version, reason):
    approvals.request_approval(dave, version)

    with pytest.raises(DomainError) as refused:
        approvals.reject(erin, stored(version), reason)

    assert refused.value.field == "reason"
    assert refused.value.status_code == 400
    assert stored(version).status == Status.PENDING_APPROVAL


def test_an_approver_rejects_with_a_reason_that_the_audit_log_keeps(dave, erin, version):
    approvals.request_approval(dave, version)

    approvals.reject(erin, stored(version), "p99 regressed by 40%")

    row = stored(version)
    assert (row.status, row.status_reason, row.decided_by) == (
        Status.REJECTED, "p99 regressed by 40%", erin
    )
    [event] = AuditEvent.objects.filter(verb="rejected")
    assert (event.actor_label, event.reason, event.after) == (
        "erin", "p99 regressed by 40%", {"status": "rejected"}
    )


@pytest.mark.parametrize("decide", ["approve", "reject"])
def test_a_decided_version_can_be_archived(alice, dave, erin, version, decide):
    approvals.request_approval(dave, version)
    getattr(approvals, decide)(alice, stored(version), "decided")

    approvals.archive(erin, stored(version), reason="superseded by v2")

    assert stored(version).status == Status.ARCHIVED
    assert AuditEvent.objects.get(verb="archived").reason == "superseded by v2"


def test_a_registered_version_can_be_archived_but_a_pending_one_cannot(dave, erin, tenant_a,
                                                                       version):
    approvals.archive(erin, version)
    pending = ModelVersionFactory(model=version.model, version=2)
    approvals.request_approval(dave, pending)

    with pytest.raises(Conflict, match="is pending_approval and cannot become archived"):
        approvals.archive(erin, stored(pending))

    assert stored(version).status == Status.ARCHIVED
    assert stored(pending).status == Status.PENDING_APPROVAL


def test_an_archived_version_goes_nowhere(dave, erin, version):
    approvals.archive(erin, version)

    with pytest.raises(Conflict, match="is archived and cannot become pending_approval"):
        approvals.request_approval(dave, stored(version))


def test_archiving_needs_the_approver_role(dave, version):
    with pytest.raises(PermissionDenied, match="needs the approver role"):
        approvals.archive(dave, version)


def test_a_viewer_cannot_request_approval(bob, version):
    with pytest.raises(PermissionDenied, match="needs the deployer role in the tenant; you have viewer"):
        approvals.request_approval(bob, version)

    assert stored(version).status == Status.REGISTERED


# --- over the API ------------------------------------------------------------------------------


def test_api_request_then_the_requester_cannot_approve_and_another_can(client_for, erin, alice,
                                                                       version):
    requested = client_for(erin).post(url(version, "request-approval"), {"reason": "ready"})
    own = client_for(erin).post(url(version, "approve"))
    other = client_for(alice).post(url(version, "approve"), {"reason": "looks good"})

    assert requested.status_code == 200
    assert requested.json()["status"] == "pending_approval"
    assert own.status_code == 403
    assert "four-eyes" in own.json()["detail"]
    assert other.status_code == 200
    assert other.json()["status"] == "approved"
    assert other.json()["status_reason"] == "looks good"


def test_api_a_deployer_requests_but_cannot_approve(client_for, dave, version):
    client = client_for(dave)

    requested = client.post(url(version, "request-approval"))
    approve = client.post(url(version, "approve"))

    assert requested.status_code == 200
    assert approve.status_code == 403
    assert approve.json() == {
        "detail": "this needs the approver role in the tenant; you have deployer"
    }
    assert stored(version).status == Status.PENDING_APPROVAL


def test_api_whoever_made_the_requesting_token_cannot_approve(token_client, client_for, alice,
                                                              erin, tenant_a, version):
    ci = token_client(tenant_a, Role.DEPLOYER)  # conftest: tenant A tokens are made by alice

    requested = ci.post(url(version, "request-approval"))
    by_alice = client_for(alice).post(url(version, "approve"))
    by_erin = client_for(erin).post(url(version, "approve"))

    assert requested.status_code == 200, requested.json()
    assert by_alice.status_code == 403
    assert "four-eyes" in by_alice.json()["detail"]
    assert by_erin.status_code == 200
    assert stored(version).decided_by == erin


def test_api_a_token_made_by_a_token_cannot_launder_four_eyes(client_for, alice, erin, version):
    """alice makes an admin token over the API; it makes a deployer token; that one asks.
    alice is still the person behind the request, so she gets 403; erin approves."""
    first = client_for(alice).post("/api/v1/tokens/", {"name": "t1", "role": "admin"})
    assert first.status_code == 201, first.json()
    as_first = APIClient()
    as_first.credentials(HTTP_AUTHORIZATION=f"Bearer {first.json()['token']}")
    second = as_first.post("/api/v1/tokens/", {"name": "t2", "role": "deployer"})
    assert second.status_code == 201, second.json()
    assert second.json()["created_by"] == "alice"
    as_second = APIClient()
    as_second.credentials(HTTP_AUTHORIZATION=f"Bearer {second.json()['token']}")

    requested = as_second.post(url(version, "request-approval"))
    by_alice = client_for(alice).post(url(version, "approve"))
    by_erin = client_for(erin).post(url(version, "approve"))

    assert requested.status_code == 200, requested.json()
    assert by_alice.status_code == 403
    assert "four-eyes" in by_alice.json()["detail"]
    assert by_erin.status_code == 200
    assert stored(version).decided_by == erin


def test_api_registering_with_request_approval_makes_the_registrant_the_requester(
    client_for, dave, erin, alice, tenant_a
):
    model = ModelFactory(tenant=tenant_a, name="bert")
    registered = client_for(erin).post("/api/v1/versions/", {
        "model": model.pk, "version": 1, "artifact_uri": "s3://models/bert/1.tar.gz",
        "sha256": "c" * 64, "size_bytes": 1, "runtime": "vllm", "request_approval": True,
    })
    version = ModelVersion.objects.get(pk=registered.json()["id"])

    own = client_for(erin).post(url(version, "approve"))
    other = client_for(alice).post(url(version, "approve"))

    assert registered.status_code == 201, registered.json()
    assert registered.json()["status"] == "pending_approval"
    assert own.status_code == 403
    assert "four-eyes" in own.json()["detail"]
    assert other.status_code == 200


def test_api_a_token_cannot_approve(token_client, dave, tenant_a, version):
    approvals.request_approval(dave, version)

    response = token_client(tenant_a, Role.APPROVER).post(url(version, "approve"))

    assert response.status_code == 403
    assert response.json() == {
        "detail": "approvals are decided by people: log in to the console to decide"
    }


def test_api_approving_twice_is_a_409_naming_status(client_for, dave, erin, version):
    approvals.request_approval(dave, version)
    client = client_for(erin)
    assert client.post(url(version, "approve")).status_code == 200

    again = client.post(url(version, "approve"))

    assert again.status_code == 409
    assert again.json() == {"status": ["version 1 is already approved"]}


def test_api_approving_a_registered_version_is_a_409_naming_status(client_for, erin, version):
    response = client_for(erin).post(url(version, "approve"))

    assert response.status_code == 409
    assert response.json() == {"status": ["version 1 is registered and cannot become approved"]}


@pytest.mark.parametrize("payload", [{}, {"reason": ""}, {"reason": "  "}])
def test_api_rejecting_without_a_reason_is_a_400_naming_reason(client_for, dave, erin, version,
                                                              payload):
    approvals.request_approval(dave, version)

    response = client_for(erin).post(url(version, "reject"), payload)

    assert response.status_code == 400
    assert response.json() == {"reason": ["say why the version is rejected"]}
    assert stored(version).status == Status.PENDING_APPROVAL


def test_api_an_approver_rejects_and_the_reason_is_audited(client_for, dave, erin, bob, version):
    approvals.request_approval(dave, version)

    response = client_for(erin).post(url(version, "reject"), {"reason": "accuracy dropped"})
    log = client_for(bob).get("/api/v1/audit-events/", {"verb": "rejected"})

    assert response.status_code == 200
    assert response.json()["status"] == "rejected"
    assert response.json()["status_reason"] == "accuracy dropped"
    [event] = log.json()["results"]
    assert (event["actor_label"], event["reason"], event["object_id"]) == (
        "erin", "accuracy dropped", str(version.pk)
    )


def test_api_archive_after_approve(client_for, dave, erin, version):
    approvals.request_approval(dave, version)
    client = client_for(erin)
    client.post(url(version, "approve"))

    response = client.post(url(version, "archive"), {"reason": "superseded"})

    assert response.status_code == 200
    assert response.json()["status"] == "archived"
    assert response.json()["status_reason"] == "superseded"


def test_api_a_viewer_cannot_request_approval(client_for, bob, version):
    response = client_for(bob).post(url(version, "request-approval"))

    assert response.status_code == 403
    assert response.json() == {
        "detail": "this needs the deployer role in the tenant; you have viewer"
    }
    assert stored(version).status == Status.REGISTERED


def test_api_another_tenant_cannot_decide_at_all(client_for, charlie, dave, version):
    approvals.request_approval(dave, version)

    response = client_for(charlie).post(url(version, "approve"))

    assert response.status_code == 404
    assert stored(version).status == Status.PENDING_APPROVAL
