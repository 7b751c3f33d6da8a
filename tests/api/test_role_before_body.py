"""A write is refused for the caller's role before its body is read: a viewer (a person or a
viewer token) posting anything, valid, invalid or a duplicate of an existing row, gets a 403
naming the role, never a 400 that tells it what exists or what the body lacks."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.models import Membership
from tests.factories import DeploymentFactory, ModelFactory, ModelVersionFactory

pytestmark = pytest.mark.django_db
Role = Membership.Role

CREATES = [
    ("models/", "deployer"),
    ("versions/", "deployer"),
    ("aliases/", "deployer"),
    ("deployments/", "deployer"),
    ("loads/", "deployer"),
    ("rollouts/", "deployer"),
    ("workloads/", "deployer"),
    ("benchmarks/", "deployer"),
    ("routes/", "deployer"),
    ("webhooks/", "admin"),
    ("tokens/", "admin"),
    ("quota-requests/", "admin"),
]


@pytest.fixture
def existing(tenant_a):
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    version = ModelVersionFactory(model=model, version=1)
    deployment = DeploymentFactory(tenant=tenant_a, model=model, name="fraud-prod")
    return model, version, deployment


def bodies(existing) -> list[dict]:
    model, version, deployment = existing
    return [
        {},
        {"bogus": 1},
        # What exists already, as the viewer sent it: an answer of "already exists"
        # would tell a viewer what the tenant holds before telling it it may not write.
        {"name": deployment.name, "model": model.pk, "cluster": deployment.cluster_id,
         "deployment": deployment.pk, "version": version.pk},
    ]


def viewer_clients(bob, token_client, tenant_a):
    person = APIClient()
    person.force_authenticate(bob)
    return {"viewer": person, "viewer token": token_client(tenant_a, Role.VIEWER)}


@pytest.mark.parametrize(("path", "role"), CREATES)
def test_a_viewer_posting_any_body_is_refused_for_its_role_first(
        bob, token_client, tenant_a, existing, path, role):
    for who, client in viewer_clients(bob, token_client, tenant_a).items():
        for body in bodies(existing):
            response = client.post(f"/api/v1/{path}", body, format="json")
            assert response.status_code == 403, (who, body, response.status_code,
                                                 response.content[:300])
            assert f"needs the {role} role" in response.json()["detail"], response.json()


@pytest.mark.parametrize(("path", "role"), [(p, r) for p, r in CREATES if r == "admin"])
def test_a_deployer_posting_to_an_admin_endpoint_is_refused_for_its_role_first(
        dave, existing, path, role):
    client = APIClient()
    client.force_authenticate(dave)
    for body in bodies(existing):
        response = client.post(f"/api/v1/{path}", body, format="json")
        assert response.status_code == 403, (body, response.status_code, response.content[:300])


def test_a_deployer_still_gets_the_400_about_its_body(dave, existing):
    client = APIClient()
    client.force_authenticate(dave)
    _, _, deployment = existing
    response = client.post("/api/v1/deployments/", {"name": deployment.name,
                                                    "model": deployment.model_id,
                                                    "cluster": deployment.cluster_id},
                           format="json")
    assert response.status_code == 400


def test_a_viewer_changing_a_route_is_refused_for_its_role_first(bob, existing):
    client = APIClient()
    client.force_authenticate(bob)
    _, _, deployment = existing
    for method in ("put", "patch"):
        response = getattr(client, method)(f"/api/v1/routes/{deployment.pk}/",
                                           {"weights": {"1": 100}, "mirror": {}}, format="json")
        assert response.status_code == 403, (method, response.content[:300])


def test_anonymous_is_still_a_401(api):
    assert api.post("/api/v1/deployments/", {}, format="json").status_code == 401
