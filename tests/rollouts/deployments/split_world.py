"""A deployment whose servers disagree, for the consistency tests of the API and the console:
two servers running v1 with two configs (and, asked, v2 on the first only)."""

from __future__ import annotations

from django.utils import timezone

from rollouts.models import Deployment, ModelLoad
from tests.factories import (
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

H1, H2 = "1" * 64, "2" * 64


def split_deployment(tenant, *, with_v2: bool = False) -> Deployment:
    cluster = ClusterFactory(name="c")
    servers = [InferenceServerFactory(cluster=cluster, name=f"triton-{i}") for i in (1, 2)]
    model = ModelFactory(tenant=tenant, name="scorer")
    deployment = DeploymentFactory(model=model, cluster=cluster, name="scorer")
    deployment.servers.set(servers)
    v1 = ModelVersionFactory(model=model, version=1)
    loads = [(servers[0], v1, H1), (servers[1], v1, H2)]
    if with_v2:
        loads.append((servers[0], ModelVersionFactory(model=model, version=2), H1))
    for server, version, config_hash in loads:
        ModelLoad.objects.create(tenant=tenant, deployment=deployment, server=server,
                                 version=version, state=ModelLoad.State.READY,
                                 config_hash=config_hash, ready_at=timezone.now(),
                                 requested_by_label="seed")
    return deployment
