"""API tokens: ``Authorization: Bearer sy_<prefix>_<secret>``, per tenant, shown once."""

from __future__ import annotations

import secrets
from datetime import timedelta
from types import SimpleNamespace

import pytest
import time_machine
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.models import APIToken, AuditEvent, Membership
from fleet.tenancy import tokens
from rollouts.models import ModelVersion
from rollouts.registry import approvals
from tests.factories import ModelFactory, ModelVersionFactory

Role = Membership.Role

@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def model_a(tenant_a):
    return ModelFactory(tenant=tenant_a, name="model-a")


@pytest.fixture
def model_b(tenant_b):
    return ModelFactory(tenant=tenant_b, name="model-b")


def version_payload(model, number: int = 1) -> dict:
    return {
        "model": model.pk, "version": number, "artifact_uri": f"s3://models/x/{number}.tar.gz",
        "sha256": f"{number:02d}" * 32, "size_bytes": 1, "runtime": "triton", "backend": "python",
    }


# --- authentication --------------------------------------------------------------------------


def test_a_valid_bearer_token_authenticates(token_client, tenant_a, model_a):
    response = token_client(tenant_a, Role.VIEWER).get("/api/v1/models/")

    assert response.status_code == 200
    assert [row["name"] for row in response.json()["results"]] == ["model-a"]


def test_the_token_keyword_is_accepted_as_well_as_bearer(token_client, tenant_a, model_a):
    issued = token_client(tenant_a).issued
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issued.secret}")

    assert client.get("/api/v1/models/").status_code == 200


def test_an_expired_token_is_refused_saying_it_expired(token_client, tenant_a):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        client = token_client(tenant_a, expires_at=start + timedelta(hours=1))
        assert client.get("/api/v1/models/").status_code == 200

    with time_machine.travel(start + timedelta(hours=1, seconds=1), tick=False):
        response = client.get("/api/v1/models/")
        state = APIToken.objects.get(pk=client.issued.token.pk).state

    assert response.status_code == 401
    assert response.json() == {"detail": "token expired"}
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'
    assert state == "expired"


def test_a_revoked_token_is_refused_saying_it_was_revoked(token_client, tenant_a, alice):
    client = token_client(tenant_a)
    tokens.revoke(alice, client.issued.token, reason="leaked in a CI log")

    response = client.get("/api/v1/models/")

    assert response.status_code == 401
    assert response.json() == {"detail": "token revoked"}


@pytest.mark.parametrize(
    ("header", "detail"),
    [
        ("Bearer garbage", "malformed token"),
        ("Bearer sy_abcdefgh", "malformed token"),
        ("Bearer sy_short_secret", "malformed token"),
        ("Bearer xx_abcdefgh_secret", "malformed token"),
        ("Bearer sy_ABCDEFGH_" + "s" * 43, "malformed token"),
        ("Bearer sy_abcdefgh_" + "s" * 19, "malformed token"),
        ("Bearer sy_abcdefgh_" + "s" * 40 + "!!!", "malformed token"),
        ("Bearer sy_00000000_" + "s" * 43, "invalid token"),
        ("Bearer ", "Authorization header has no token"),
    ],
)
def test_a_malformed_or_unknown_token_is_refused(db, header, detail):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/v1/models/")

    assert response.status_code == 401
    assert response.json() == {"detail": detail}


def test_a_known_prefix_with_the_wrong_secret_is_refused(token_client, tenant_a):
    issued = token_client(tenant_a).issued
    forged = f"sy_{issued.token.prefix}_{'A' * 43}"

    response = bearer(forged).get("/api/v1/models/")

    assert response.status_code == 401
    assert response.json() == {"detail": "invalid token"}


def test_a_token_whose_secret_contains_underscores_authenticates(
    monkeypatch, alice, tenant_a, model_a
):
    """token_urlsafe() may put '_' in the secret: the token must still parse (it once split
    on every '_', refusing about half of all tokens as malformed)."""
    monkeypatch.setattr(tokens, "secrets", SimpleNamespace(
        token_hex=secrets.token_hex, token_urlsafe=lambda n: "under_score_" + "s" * 31,
    ))
    issued = tokens.issue(alice, tenant_a, "ci")

    response = bearer(issued.secret).get("/api/v1/models/")

    assert response.status_code == 200, response.json()


# --- tenancy and roles -----------------------------------------------------------------------


def test_a_token_of_tenant_b_cannot_see_tenant_a_models(token_client, tenant_b, model_a, model_b):
    client = token_client(tenant_b, Role.ADMIN)

    detail = client.get(f"/api/v1/models/{model_a.pk}/")
    listing = client.get("/api/v1/models/")

    assert detail.status_code == 404
    assert listing.status_code == 200
    assert [row["id"] for row in listing.json()["results"]] == [model_b.pk]
    assert client.get("/api/v1/tenants/").json()["results"][0]["slug"] == "tenant-b"
    assert client.get("/api/v1/tenants/").json()["count"] == 1


def test_a_token_is_never_a_platform_admin_even_when_root_made_it(root, tenant_a):
    issued = tokens.issue(root, tenant_a, "root-made", Role.ADMIN)
    client = bearer(issued.secret)

    response = client.post("/api/v1/clusters/", {"name": "new", "kind": "static"})

    assert response.status_code == 403
    assert "only platform admins" in response.json()["detail"]
    assert [t["slug"] for t in client.get("/api/v1/tenants/").json()["results"]] == ["tenant-a"]


def test_a_viewer_token_cannot_register_a_version(token_client, tenant_a, model_a):
    response = token_client(tenant_a, Role.VIEWER).post("/api/v1/versions/", version_payload(model_a))

    assert response.status_code == 403
    assert response.json() == {
        "detail": "this needs the deployer role in the tenant; you have viewer"
    }
    assert not ModelVersion.objects.exists()


def test_a_deployer_token_registers_a_version_in_its_own_name(token_client, tenant_a, model_a):
    client = token_client(tenant_a, Role.DEPLOYER, suffix="build")

    response = client.post("/api/v1/versions/", version_payload(model_a))

    assert response.status_code == 201, response.json()
    assert response.json()["registered_by"] == "token:ci-deployer-tenant-a-build"
    event = AuditEvent.objects.get(verb="registered")
    assert event.actor_label == "token:ci-deployer-tenant-a-build@tenant-a"
    assert event.actor_token_id == client.issued.token.pk
    assert event.actor_user_id is None


@pytest.mark.parametrize("role", [Role.APPROVER, Role.ADMIN])
def test_a_token_cannot_approve_a_version_whatever_its_role(token_client, tenant_a, dave, model_a,
                                                           role):
    version = approvals.request_approval(dave, ModelVersionFactory(model=model_a))

    response = token_client(tenant_a, role).post(f"/api/v1/versions/{version.pk}/approve/")

    assert response.status_code == 403
    assert "approvals are decided by people" in response.json()["detail"]
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.PENDING_APPROVAL


def test_an_admin_token_of_tenant_a_cannot_issue_tokens_for_tenant_b(token_client, tenant_a,
                                                                      tenant_b):
    client = token_client(tenant_a, Role.ADMIN)

    response = client.post("/api/v1/tokens/", {"tenant": "tenant-b", "name": "sneaky"})

    assert response.status_code == 400
    assert list(response.json()) == ["tenant"]
    assert not APIToken.objects.filter(name="sneaky").exists()


# --- issuing: the secret is shown once ----------------------------------------------------------


def test_the_secret_is_returned_once_on_create_and_never_again(client_for, alice, tenant_a):
    client = client_for(alice)

    created = client.post("/api/v1/tokens/", {"name": "deploy-bot", "role": "deployer"})

    assert created.status_code == 201, created.json()
    body = created.json()
    secret = body["token"]
    assert secret.startswith(f"sy_{body['prefix']}_")
    assert body["tenant"] == "tenant-a"
    assert body["state"] == "active"
    assert body["created_by"] == "alice"
    retrieved = client.get(f"/api/v1/tokens/{body['id']}/")
    listed = client.get("/api/v1/tokens/")
    for response in (retrieved, listed):
        assert response.status_code == 200
        assert secret not in response.content.decode()
        assert secret.split("_", 2)[2] not in response.content.decode()  # the random part
    assert "token" not in retrieved.json()
    assert "digest" not in retrieved.json()
    assert bearer(secret).get("/api/v1/models/").status_code == 200


def test_the_stored_digest_is_not_the_secret(alice, tenant_a):
    issued = tokens.issue(alice, tenant_a, "ci")
    random_part = issued.secret.split("_", 2)[2]

    row = APIToken.objects.filter(pk=issued.token.pk).values().get()

    assert len(row["digest"]) == 64
    assert int(row["digest"], 16) >= 0
    assert row["digest"] != issued.secret
    assert not any(random_part in str(value) for value in row.values())


def test_creating_a_token_needs_the_admin_role(client_for, erin, tenant_a):
    response = client_for(erin).post("/api/v1/tokens/", {"name": "mine"})

    assert response.status_code == 403
    assert response.json() == {"detail": "this needs the admin role in the tenant; you have approver"}
    assert not APIToken.objects.exists()


def test_an_expiry_in_the_past_is_refused_naming_expires_at(client_for, alice):
    past = (timezone.now() - timedelta(minutes=1)).isoformat()

    response = client_for(alice).post("/api/v1/tokens/", {"name": "ci", "expires_at": past})

    assert response.status_code == 400
    assert response.json() == {"expires_at": ["must be in the future"]}


def test_a_second_active_token_of_the_same_name_is_a_conflict(client_for, alice):
    client = client_for(alice)
    assert client.post("/api/v1/tokens/", {"name": "ci"}).status_code == 201

    response = client.post("/api/v1/tokens/", {"name": "ci"})

    assert response.status_code == 409
    assert response.json() == {"name": ["an active token named 'ci' already exists"]}


def test_a_token_needs_a_name(client_for, alice):
    response = client_for(alice).post("/api/v1/tokens/", {"name": ""})

    assert response.status_code == 400
    assert list(response.json()) == ["name"]
    assert not APIToken.objects.exists()


def test_an_expired_tokens_name_may_be_reused(client_for, alice, tenant_a):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        tokens.issue(alice, tenant_a, "ci", expires_at=start + timedelta(minutes=5))

    with time_machine.travel(start + timedelta(minutes=6), tick=False):
        response = client_for(alice).post("/api/v1/tokens/", {"name": "ci"})

    assert response.status_code == 201, response.json()
    assert APIToken.objects.filter(name="ci").count() == 2


def test_a_viewer_may_list_tokens_without_secrets_but_not_revoke_them(client_for, alice, bob,
                                                                       tenant_a):
    issued = tokens.issue(alice, tenant_a, "ci")
    client = client_for(bob)

    listing = client.get("/api/v1/tokens/")
    revoke = client.delete(f"/api/v1/tokens/{issued.token.pk}/")

    assert listing.status_code == 200
    assert [row["name"] for row in listing.json()["results"]] == ["ci"]
    assert issued.secret not in listing.content.decode()
    assert revoke.status_code == 403
    assert revoke.json() == {"detail": "this needs the admin role in the tenant; you have viewer"}
    assert APIToken.objects.get(pk=issued.token.pk).state == "active"


# --- last use and revocation -------------------------------------------------------------------


def test_last_used_at_is_set_on_use_at_most_once_a_minute(token_client, tenant_a):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        client = token_client(tenant_a)
        assert client.issued.token.last_used_at is None
        client.get("/api/v1/models/")
    token = client.issued.token
    token.refresh_from_db()
    assert token.last_used_at == start

    with time_machine.travel(start + timedelta(seconds=30), tick=False):
        client.get("/api/v1/models/")
    token.refresh_from_db()
    assert token.last_used_at == start

    with time_machine.travel(start + timedelta(minutes=2), tick=False):
        client.get("/api/v1/models/")
    token.refresh_from_db()
    assert token.last_used_at == start + timedelta(minutes=2)


def test_delete_revokes_and_keeps_the_row_and_a_second_delete_changes_nothing(
    client_for, alice, tenant_a
):
    issued = tokens.issue(alice, tenant_a, "ci")
    client = client_for(alice)

    first = client.delete(f"/api/v1/tokens/{issued.token.pk}/")
    token = APIToken.objects.get(pk=issued.token.pk)
    revoked_at = token.revoked_at
    second = client.delete(f"/api/v1/tokens/{issued.token.pk}/")

    assert first.status_code == 204
    assert second.status_code == 204
    token.refresh_from_db()
    assert token.state == "revoked"
    assert token.revoked_at == revoked_at
    assert client.get(f"/api/v1/tokens/{token.pk}/").json()["state"] == "revoked"
    assert AuditEvent.objects.filter(verb="revoked", object_id=str(token.pk)).count() == 1
    assert bearer(issued.secret).get("/api/v1/models/").json() == {"detail": "token revoked"}


def test_another_tenants_admin_cannot_revoke_a_token(client_for, alice, charlie, tenant_a):
    issued = tokens.issue(alice, tenant_a, "ci")

    response = client_for(charlie).delete(f"/api/v1/tokens/{issued.token.pk}/")

    assert response.status_code == 404
    assert APIToken.objects.get(pk=issued.token.pk).state == "active"
