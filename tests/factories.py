"""factory_boy factories for every model the tests build."""

from __future__ import annotations

import hashlib

import factory
from django.contrib.auth import get_user_model

from fleet.models import GPU, Cluster, InferenceServer, Membership, Node, Quota, Tenant
from rollouts.models import Alias, Deployment, Model, ModelVersion


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-for-tests-1")


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Membership.Role.VIEWER


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota

    tenant = factory.SubFactory(TenantFactory)
    device_class = "cpu"
    units = 8
    memory_mib = 8192


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"cluster-{n}")
    kind = Cluster.Kind.STATIC


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"node-{n}")
    cpu_cores = 16
    memory_mib = 65536


class GPUFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GPU

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n % 8)
    uuid = factory.Sequence(lambda n: f"GPU-{n:08d}-0000-0000-0000-000000000000")
    model = "NVIDIA A100-SXM4-80GB"
    device_class = "nvidia-a100-80gb"
    memory_mib = 81920


class InferenceServerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = InferenceServer

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"server-{n}")
    runtime = InferenceServer.Runtime.TRITON
    http_url = "http://127.0.0.1:9"


class ModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Model

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"model-{n}")


class ModelVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ModelVersion

    model = factory.SubFactory(ModelFactory)
    version = factory.Sequence(lambda n: n + 1)
    artifact_uri = factory.LazyAttribute(lambda o: f"s3://models/{o.model.name}/{o.version}.tar.gz")
    sha256 = factory.LazyAttribute(lambda o: hashlib.sha256(o.artifact_uri.encode()).hexdigest())
    size_bytes = 1024
    runtime = ModelVersion.Runtime.TRITON
    backend = "python"


class AliasFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Alias

    model = factory.SubFactory(ModelFactory)
    name = "staging"
    version = factory.SubFactory(ModelVersionFactory, model=factory.SelfAttribute("..model"))


class DeploymentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Deployment

    model = factory.SubFactory(ModelFactory)
    tenant = factory.SelfAttribute("model.tenant")
    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"deployment-{n}")
