"""References and filters a hostile caller can break: a ``%`` in a whole-number filter,
Unicode digits (``³``, ``٣``) where an id or a name is expected, and a route change that
sends the wrong shape for ``mirror``. Each is a 400 naming the parameter or the field,
never a 500."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

pytestmark = pytest.mark.django_db


def client_of(user) -> APIClient:
    """A client that answers what the server answers, 500s included, instead of raising."""
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(user)
    return client


@pytest.fixture
def world(tenant_a):
    cluster = ClusterFactory(name="local")
    server = InferenceServerFactory(cluster=cluster)
    deployment = DeploymentFactory(tenant=tenant_a, model__tenant=tenant_a, cluster=cluster)
    deployment.servers.add(server)
    version = ModelVersionFactory(model=deployment.model, version=1)
    return deployment, version


def assert_names(response, field: str) -> None:
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert field in response.json(), response.json()


@pytest.mark.parametrize(("url", "param"), [
    ("/api/v1/versions/", "version"),
    ("/api/v1/loads/", "version__version"),
])
@pytest.mark.parametrize("value", ["%", "%25", "1%", "%d", "٣", "³"])
def test_a_percent_or_unicode_digit_in_a_whole_number_filter_is_a_400_naming_it(
        alice, world, url, param, value):
    assert_names(client_of(alice).get(url, {param: value}), param)


@pytest.mark.parametrize(("url", "param"), [
    ("/api/v1/deployments/", "model"),
    ("/api/v1/loads/", "deployment"),
    ("/api/v1/versions/", "model"),
    ("/api/v1/nodes/", "cluster"),
])
@pytest.mark.parametrize("value", ["³", "٣", "\uff11\uff12", "²³"])
def test_unicode_digits_in_an_id_or_name_filter_are_no_500(alice, world, url, param, value):
    """'³'.isdigit() is True but int('³') fails: a name with no row of that name is simply
    a name that matches nothing."""
    response = client_of(alice).get(url, {param: value})
    assert response.status_code in (200, 400), (response.status_code, response.content[:300])
    if response.status_code == 200:
        assert response.json()["results"] == []
    else:
        assert param in response.json()


@pytest.mark.parametrize("value", ["³", "٣", "\uff11\uff12"])
def test_unicode_digits_as_a_loads_deployment_are_a_400_naming_it(dave, world, value):
    _, version = world
    response = client_of(dave).post("/api/v1/loads/", {"deployment": value,
                                                      "version": version.pk}, format="json")
    assert_names(response, "deployment")
    assert "no deployment" in " ".join(response.json()["deployment"])


def test_a_name_made_of_unicode_digits_is_still_found_by_name(alice, tenant_a):
    model = ModelFactory(tenant=tenant_a, name="model-³")
    other = ModelFactory(tenant=tenant_a, name="³")
    ModelVersionFactory(model=model, version=1)
    ModelVersionFactory(model=other, version=1)
    listed = client_of(alice).get("/api/v1/versions/", {"model": "³"}).json()["results"]
    assert [v["model"] for v in listed] == [other.pk]


@pytest.mark.parametrize("method", ["patch", "put"])
@pytest.mark.parametrize("mirror", [{}, {"percent": 10}, {"version": 1}, {"server": "x"}])
def test_a_mirror_without_its_version_or_percent_is_a_400_naming_mirror(
        dave, world, method, mirror):
    deployment, _ = world
    response = getattr(client_of(dave), method)(
        f"/api/v1/routes/{deployment.pk}/", {"weights": {"1": 100}, "mirror": mirror},
        format="json")
    assert_names(response, "mirror")
    missing = {"version", "percent"} - set(mirror)
    assert set(response.json()["mirror"]) == missing
