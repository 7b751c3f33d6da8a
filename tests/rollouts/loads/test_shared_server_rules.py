"""Two tenants on one shared server: the names they are known by there.

vLLM serves a model by the name clients send in the request body, which routes pass through
untouched, so a tenant's model keeps its own name there. GIVEN acme's LoRA adapter
``support-tone`` loaded on a shared vLLM server, THEN globex's adapter of the same name and a
base model rolled over both are refused with a 409 naming ``servers``, while globex's adapter
of another name is accepted. On a shared Triton the call guide names the model as the
client sends it.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.adapters.base import ProbeFailed
from fleet.models import Cluster, InferenceServer, Membership
from rollouts.deployments import calling
from rollouts.models import ModelLoad, ModelVersion, Route
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    MembershipFactory,
    ModelFactory,
    ModelVersionFactory,
    TenantFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


def team(slug: str, server: InferenceServer, name: str) -> tuple[APIClient, dict[str, int]]:
    tenant = TenantFactory(slug=slug)
    user = UserFactory(username=f"{slug}-deployer")
    MembershipFactory(user=user, tenant=tenant, role=Membership.Role.DEPLOYER)
    model = ModelFactory(tenant=tenant, name=name)
    deployment = DeploymentFactory(tenant=tenant, model=model, cluster=server.cluster, name=f"{name}-prod")
    deployment.servers.set([server])
    for number, adapter_of in ((1, "smollm2"), (2, "smollm2"), (3, "")):
        ModelVersionFactory(model=model, version=number, runtime=ModelVersion.Runtime.VLLM, backend="",
                            adapter_of=adapter_of, status=ModelVersion.Status.APPROVED)
    client = APIClient()
    client.force_authenticate(user)
    return client, {"deployment": deployment.pk}


def load(client: APIClient, body: dict[str, int], version: int):
    return client.post("/api/v1/loads/", {**body, "version": version}, format="json")


@pytest.fixture
def server():
    return InferenceServerFactory(cluster=ClusterFactory(name="local"), name="vllm-local",
                                  runtime=InferenceServer.Runtime.VLLM)


def test_another_tenants_adapter_of_the_same_name_is_refused(server):
    acme, acme_dep = team("acme", server, "support-tone")
    globex, globex_dep = team("globex", server, "support-tone")
    assert load(acme, acme_dep, 1).status_code == 202

    refused = load(globex, globex_dep, 1)

    assert refused.status_code == 409, refused.content
    assert "another tenant's model named support-tone" in refused.json()["servers"][0]
    assert "acme" not in refused.content.decode()
    assert ModelLoad.objects.filter(tenant__slug="globex").count() == 0
    assert ModelLoad.objects.filter(tenant__slug="acme").count() == 1


def test_an_adapter_of_another_name_shares_the_server(server):
    acme, acme_dep = team("acme", server, "support-tone")
    globex, globex_dep = team("globex", server, "summarizer")
    assert load(acme, acme_dep, 1).status_code == 202

    assert load(globex, globex_dep, 1).status_code == 202


def test_a_base_model_rolled_over_another_tenants_models_is_refused(server):
    acme, acme_dep = team("acme", server, "support-tone")
    globex, globex_dep = team("globex", server, "chat")
    assert load(acme, acme_dep, 1).status_code == 202

    refused = load(globex, globex_dep, 3)  # v3 is a base model: a roll of the whole server

    assert refused.status_code == 409, refused.content
    assert "rolling a base model onto it would replace what they run on" in refused.json()["servers"][0]


@pytest.mark.parametrize("kind, called", [
    (Cluster.Kind.STATIC, "fraud-scorer"),  # nginx rewrites the path to the name on the server
    (Cluster.Kind.KUBERNETES, "acme.fraud-scorer"),  # an HTTPRoute passes the path through
])
def test_the_call_guide_names_the_model_as_the_route_passes_it_on(kind, called):
    """On a shared Triton acme's fraud-scorer is acme.fraud-scorer; the call guide shows the
    name a client sends through the deployment's route, and the server's name for direct calls."""
    tenant = TenantFactory(slug="acme")
    server = InferenceServerFactory(cluster=ClusterFactory(name=f"shared-{kind}", kind=kind),
                                    name="triton-shared", http_url="http://127.0.0.1:9")
    model = ModelFactory(tenant=tenant, name="fraud-scorer")
    deployment = DeploymentFactory(tenant=tenant, model=model, cluster=server.cluster)
    version = ModelVersionFactory(model=model, version=1, status=ModelVersion.Status.APPROVED)

    def no_answer(url: str, name: str, number: int) -> dict:
        raise ProbeFailed(f"{name} v{number} is not there")

    routed = calling._kserve(deployment, version, server, Route(url="http://route.example"), no_answer)
    direct = calling._kserve(deployment, version, server, None, no_answer)

    assert routed.endpoint == f"http://route.example/v2/models/{called}/infer"
    assert direct.endpoint == "http://127.0.0.1:9/v2/models/acme.fraud-scorer/versions/1/infer"
