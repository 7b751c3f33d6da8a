"""Issue 20, item 3: a tenant's servers on Kubernetes stay inside the namespaces a platform
admin granted it, read Secrets of that namespace only, and pass vLLM only the flags the
platform allows.

The reproduction, as tenant A's deployer (dave) through the API: a version labelled
``vllm.hf_token_secret`` and ``vllm.args: --trust-remote-code``, and a workload asked for in
``kube-system``, were answered 201. Each is now a 400 naming the field, and nothing is written.
"""

# ruff: noqa: F811 (the fixtures imported from test_workload_world are redefined as arguments)
from __future__ import annotations

import pytest
from django.test import Client

from fleet.models import Placement, TenantNamespace
from rollouts.models import ModelVersion, ServerWorkload
from rollouts.registry import vllm_labels
from rollouts.workloads import requests as workloads
from rollouts.workloads import specs as workload_specs
from tests.factories import ClusterFactory, ModelFactory, ModelVersionFactory
from tests.kube.test_workload_world import (  # noqa: F401 (fixtures)
    A100,
    H100,
    chat,
    enqueued_workloads,
    fraud,
    grant,
    kube_cluster,
    make_kube_cluster,
)

WORKLOADS = "/api/v1/workloads/"
GRANTS = "/api/v1/tenant-namespaces/"
SHA = "ab" * 32


def triton_body(**changes) -> dict:
    return {"deployment": "fraud-scorer", "version": 1, "name": "triton-fraud-v1",
            "replicas": 1, "node_selector": A100,
            "model_repository": "s3://switchyard-models/fraud-scorer", **changes}


def vllm_body(version: int = 1, **changes) -> dict:
    return {"deployment": "llm-chat", "version": version, "name": "vllm-llama",
            "replicas": 1, "node_selector": H100, **changes}


def nothing_written() -> bool:
    return not ServerWorkload.objects.exists() and not Placement.objects.exists()


def labelled(chat, number: int = 3, **labels: str) -> ModelVersion:
    """Version ``number`` of llm-chat carrying ``labels``, as one registered before this fence
    was."""
    deployment, _versions = chat
    return ModelVersionFactory(
        model=deployment.model, version=number, runtime=ModelVersion.Runtime.VLLM, backend="",
        gpus=1, estimated_gpu_memory_mib=40960,
        labels={"vllm.model": "meta-llama/Llama-3.1-8B-Instruct", **labels},
    )


# --- the reproduction -----------------------------------------------------------------------


def test_the_probe_of_issue_20_is_refused_field_by_field(client_for, dave, chat):
    """kube-system, another tenant's Secret and --trust-remote-code: each a 400 on its field,
    and the server runs once the version passes only what the fence allows."""
    secret = {"vllm.hf_token_secret": "other-tenant-secret"}
    labelled(chat, 3, **secret, **{"vllm.args": "--trust-remote-code"})
    labelled(chat, 4, **secret, **{"vllm.args": "--max-model-len 8192"})
    client = client_for(dave)

    in_kube_system = client.post(WORKLOADS, vllm_body(version=3, namespace="kube-system"),
                                 format="json")
    in_own_namespace = client.post(WORKLOADS, vllm_body(version=3), format="json")
    allowed = client.post(WORKLOADS, vllm_body(version=4), format="json")

    assert in_kube_system.status_code == 400
    assert list(in_kube_system.json()) == ["namespace"]
    assert in_own_namespace.status_code == 400
    assert in_own_namespace.json()["version"][0].startswith(
        "v3's label vllm.args: --trust-remote-code is not a vLLM flag the platform allows")
    assert allowed.status_code == 201, allowed.content
    # The Secret named is looked up in serving, tenant A's own namespace, and nowhere else.
    spec = workload_specs.server_spec(ServerWorkload.objects.get(pk=allowed.json()["id"]))
    assert (spec.namespace, spec.env[0]["valueFrom"]["secretKeyRef"]["name"]) == (
        "serving", "other-tenant-secret")


# --- namespaces -----------------------------------------------------------------------------


def test_kube_system_is_refused_naming_the_namespace_and_what_is_granted(
    client_for, dave, fraud
):

    response = client_for(dave).post(WORKLOADS, triton_body(namespace="kube-system"),
                                     format="json")

    assert response.status_code == 400, response.content
    assert response.json() == {"namespace": [
        "namespace kube-system is not granted to tenant tenant-a on cluster gpu-cluster; "
        "granted: serving"]}
    assert nothing_written()


def test_another_tenants_namespace_is_refused(client_for, dave, fraud, tenant_b):
    deployment, _versions = fraud
    grant(tenant_b, deployment.cluster, "risk-b")

    response = client_for(dave).post(WORKLOADS, triton_body(namespace="risk-b"), format="json")

    assert response.status_code == 400
    assert list(response.json()) == ["namespace"]
    assert nothing_written()


def test_a_token_is_fenced_the_same_way(token_client, tenant_a, fraud):

    response = token_client(tenant_a).post(WORKLOADS, triton_body(namespace="default"),
                                           format="json")

    assert response.status_code == 400
    assert list(response.json()) == ["namespace"]


def test_no_namespace_named_is_the_first_granted_and_another_granted_one_may_be_named(
    client_for, dave, fraud, kube_cluster
):
    grant(fraud[0].tenant, kube_cluster, "batch")
    client = client_for(dave)

    first = client.post(WORKLOADS, triton_body(), format="json")
    named = client.post(WORKLOADS, triton_body(name="triton-batch", version=2,
                                               namespace="batch"), format="json")

    assert first.status_code == 201, first.content
    assert first.json()["namespace"] == "serving"
    assert named.status_code == 201, named.content
    assert named.json()["http_url"] == "http://triton-batch.batch.svc:8000"


def test_a_grant_on_every_cluster_counts_on_each(client_for, dave, fraud, tenant_a):
    TenantNamespace.objects.filter(tenant=tenant_a).delete()
    grant(tenant_a, None, "team-a")

    response = client_for(dave).post(WORKLOADS, triton_body(), format="json")

    assert response.status_code == 201, response.content
    assert response.json()["namespace"] == "team-a"


def test_a_tenant_with_no_namespace_is_told_who_grants_one(client_for, dave, fraud, tenant_a):
    TenantNamespace.objects.filter(tenant=tenant_a).delete()

    response = client_for(dave).post(WORKLOADS, triton_body(), format="json")

    assert response.status_code == 400
    [message] = response.json()["namespace"]
    assert message.startswith("tenant tenant-a has no Kubernetes namespace on cluster "
                              "gpu-cluster: a platform admin grants namespaces")
    assert nothing_written()


def test_a_grant_on_another_cluster_does_not_count(client_for, dave, fraud, tenant_a):
    TenantNamespace.objects.filter(tenant=tenant_a).delete()
    grant(tenant_a, make_kube_cluster("other-cluster"), "serving")

    response = client_for(dave).post(WORKLOADS, triton_body(namespace="serving"), format="json")

    assert response.status_code == 400
    assert response.json()["namespace"][0].endswith("granted: none")


def test_a_roll_in_a_namespace_no_longer_granted_is_refused(dave, chat, tenant_a):
    deployment, (v1, v2) = chat
    workload, _ = workloads.create_workload(deployment, v1, dave, name="vllm-llama",
                                            node_selector=H100)
    ServerWorkload.objects.filter(pk=workload.pk).update(
        state=ServerWorkload.State.READY, applied_spec={"kind": "Deployment"})
    TenantNamespace.objects.filter(tenant=tenant_a).delete()

    with pytest.raises(workloads.DomainError, match="not granted") as refused:
        workloads.roll_version(workload, v2, dave)

    assert refused.value.field == "namespace"


# --- granting namespaces (platform admins) --------------------------------------------------


def test_only_a_platform_admin_grants_and_members_read_their_tenants_grants(
    client_for, root, alice, bob, charlie, tenant_a, tenant_b, kube_cluster
):
    body = {"tenant": tenant_a.slug, "cluster": kube_cluster.name, "namespace": "team-a"}

    by_tenant_admin = client_for(alice).post(GRANTS, body, format="json")
    by_root = client_for(root).post(GRANTS, body, format="json")
    grant(tenant_b, kube_cluster, "team-b")
    seen_by_bob = client_for(bob).get(GRANTS).json()["results"]
    seen_by_charlie = client_for(charlie).get(GRANTS).json()["results"]
    changed_by_alice = client_for(alice).patch(f"{GRANTS}{by_root.json()['id']}/",
                                               {"namespace": "kube-system"}, format="json")

    assert by_tenant_admin.status_code == 403
    assert by_root.status_code == 201, by_root.content
    assert by_root.json() == {"id": by_root.json()["id"], "tenant": "tenant-a",
                              "cluster": "gpu-cluster", "namespace": "team-a",
                              "created_at": by_root.json()["created_at"]}
    assert [(g["tenant"], g["namespace"]) for g in seen_by_bob] == [("tenant-a", "team-a")]
    assert [(g["tenant"], g["namespace"]) for g in seen_by_charlie] == [("tenant-b", "team-b")]
    assert changed_by_alice.status_code == 403


@pytest.mark.parametrize(("change", "field", "text"), [
    ({"namespace": "kube-system"}, "namespace", "Kubernetes' own namespaces"),
    ({"namespace": "kube-public"}, "namespace", "Kubernetes' own namespaces"),
    ({"namespace": "Serving"}, "namespace", "a Kubernetes namespace name"),
    ({"namespace": "a/b"}, "namespace", "a Kubernetes namespace name"),
    ({"namespace": "team-b"}, "namespace", "granted to tenant tenant-b on gpu-cluster"),
    ({"cluster": None, "namespace": "team-b"}, "namespace", "granted to tenant tenant-b"),
    ({"cluster": "static-1"}, "cluster", "no cluster with name 'static-1'"),
    ({"tenant": "nobody"}, "tenant", "no tenant"),
])
def test_a_grant_that_would_break_the_fence_is_a_400_naming_the_field(
    client_for, root, tenant_a, tenant_b, kube_cluster, change, field, text
):
    ClusterFactory(name="static-1")
    grant(tenant_b, kube_cluster, "team-b")
    body = {"tenant": tenant_a.slug, "cluster": kube_cluster.name, "namespace": "team-a",
            **change}

    response = client_for(root).post(GRANTS, body, format="json")

    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert text in response.json()[field][0]


def test_the_same_grant_twice_is_refused_naming_the_namespace(client_for, root, tenant_a,
                                                              kube_cluster):
    client = client_for(root)
    for cluster in (kube_cluster.name, None):
        body = {"tenant": tenant_a.slug, "cluster": cluster, "namespace": "team-a"}
        assert client.post(GRANTS, body, format="json").status_code == 201

        again = client.post(GRANTS, body, format="json")

        assert again.status_code == 400, again.content
        assert list(again.json()) == ["namespace"]


def test_grants_are_edited_on_the_tenants_admin_page(root, tenant_a, kube_cluster):
    grant(tenant_a, kube_cluster, "team-a")
    page = Client()
    page.force_login(root)

    html = page.get(f"/admin/fleet/tenant/{tenant_a.pk}/change/").content.decode()
    listed = page.get("/admin/fleet/tenantnamespace/").content.decode()

    assert "Kubernetes namespace" in html and 'value="team-a"' in html
    assert "team-a" in listed


# --- Secrets --------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", [
    "kube-system/other-tenant-secret", "../other", "Other_Secret", "a" * 254, "x y",
])
def test_a_secret_of_another_namespace_or_no_secret_name_is_refused(client_for, dave, chat,
                                                                    secret):
    labelled(chat, **{"vllm.hf_token_secret": secret})

    response = client_for(dave).post(WORKLOADS, vllm_body(version=3), format="json")

    assert response.status_code == 400, response.content
    assert list(response.json()) == ["version"]
    assert "vllm.hf_token_secret" in response.json()["version"][0]
    assert nothing_written()


def test_the_token_secret_is_read_from_the_servers_own_namespace(client_for, dave, chat):

    response = client_for(dave).post(WORKLOADS, vllm_body(), format="json")

    assert response.status_code == 201, response.content
    workload = ServerWorkload.objects.get(pk=response.json()["id"])
    spec = workload_specs.server_spec(workload)
    assert spec.namespace == "serving"
    # A secretKeyRef has no namespace: the pod reads the Secret of its own namespace.
    assert spec.env == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "key": "token", "name": "hf-token"}}}]


# --- vLLM flags -----------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    "--trust-remote-code",
    "--max-model-len 4096 --trust-remote-code",
    "--trust_remote_code",
    "--trust-remote",  # an abbreviation argparse would take
    "--dtype=half --download-dir=/root",
    "--chat-template /etc/passwd",
    "--model other/weights",
    "--max-model-len 4096 /etc/passwd",
    "-tp 2",
    "--enable-lora 'unterminated",
])
def test_a_flag_the_platform_does_not_allow_is_refused_when_the_server_is_asked_for(
    client_for, dave, chat, args
):
    labelled(chat, **{"vllm.args": args})

    response = client_for(dave).post(WORKLOADS, vllm_body(version=3), format="json")

    assert response.status_code == 400, response.content
    assert list(response.json()) == ["version"]
    assert "vllm.args" in response.json()["version"][0]
    assert nothing_written()


def test_a_roll_to_a_version_with_a_flag_not_allowed_is_refused(dave, chat):
    deployment, (v1, _v2) = chat
    workload, _ = workloads.create_workload(deployment, v1, dave, name="vllm-llama",
                                            node_selector=H100)
    ServerWorkload.objects.filter(pk=workload.pk).update(
        state=ServerWorkload.State.READY, applied_spec={"kind": "Deployment"})

    with pytest.raises(workloads.DomainError, match="--trust-remote-code") as refused:
        workloads.roll_version(workload, labelled(chat, **{"vllm.args": "--trust-remote-code"}),
                               dave)

    assert refused.value.field == "version"


def test_allowed_flags_in_each_form_pass(client_for, dave, chat):
    labelled(chat, **{"vllm.args": "--max-model-len=4096 --max_num_seqs 64 --enforce-eager "
                                   "--swap-space -1 --kv-cache-dtype fp8"})

    response = client_for(dave).post(WORKLOADS, vllm_body(version=3), format="json")

    assert response.status_code == 201, response.content
    spec = workload_specs.server_spec(ServerWorkload.objects.get(pk=response.json()["id"]))
    assert spec.extra_args[2:] == ["--max-model-len=4096", "--max_num_seqs", "64",
                                   "--enforce-eager", "--swap-space", "-1",
                                   "--kv-cache-dtype", "fp8"]


def test_the_allowed_flags_are_the_platforms_setting(client_for, dave, chat, settings):
    settings.SWITCHYARD_VLLM_ALLOWED_ARGS = ["--max-model-len"]

    response = client_for(dave).post(WORKLOADS, vllm_body(), format="json")

    assert response.status_code == 400
    assert response.json()["version"][0] == (
        "v1's label vllm.args: --enable-lora is not a vLLM flag the platform allows; allowed: "
        "--max-model-len")


def test_the_default_allows_serving_knobs_and_not_code_or_paths():
    allowed = vllm_labels.allowed_flags()

    assert {"--max-model-len", "--gpu-memory-utilization", "--enable-lora",
            "--tensor-parallel-size", "--enforce-eager"} <= allowed
    assert not {"--trust-remote-code", "--download-dir", "--chat-template", "--model",
                "--port", "--host", "--lora-modules", "--config"} & allowed


# --- at registration ------------------------------------------------------------------------


@pytest.mark.parametrize("labels", [
    {"vllm.args": "--trust-remote-code"},
    {"vllm.hf_token_secret": "kube-system/other-tenant-secret"},
])
def test_a_vllm_version_with_such_labels_is_refused_at_registration(client_for, dave, tenant_a,
                                                                    labels):
    model = ModelFactory(tenant=tenant_a, name="llm-chat")

    response = client_for(dave).post("/api/v1/versions/", {
        "model": model.pk, "version": 1, "artifact_uri": "s3://models/llm-chat/1.tar.gz",
        "sha256": SHA, "size_bytes": 2048, "runtime": "vllm", "labels": labels,
    }, format="json")

    assert response.status_code == 400, response.content
    assert list(response.json()) == ["labels"]
    assert next(iter(labels)) in response.json()["labels"][0]
    assert not ModelVersion.objects.exists()
