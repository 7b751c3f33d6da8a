"""The "Servers on Kubernetes" panel of a deployment: what it shows, when it polls, and its
forms (create, scale, roll, delete) calling the same domain functions as the API."""

# ruff: noqa: F811 (the fixtures imported from test_workload_world are redefined as arguments)
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from console.exceptions import DomainError
from rollouts.loads import requests as loads
from rollouts.models import ServerWorkload
from rollouts.workloads import reconciler as workload_reconciler
from rollouts.workloads import requests as workloads
from tests.factories import ClusterFactory, DeploymentFactory
from tests.kube.test_workload_autoscaling import hpa_kube  # noqa: F401 (fixture)
from tests.kube.test_workload_world import (  # noqa: F401 (fixtures)
    A100,
    H100,
    TRITON_REQUEST,
    chat,
    enqueued_workloads,
    fake_kube,
    fraud,
    kube_cluster,
)

State = ServerWorkload.State
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def panel_url(deployment) -> str:
    return reverse("rollouts:deployment-workloads", args=[deployment.pk])


def action_url(workload, action: str) -> str:
    return reverse("rollouts:workload-action", args=[workload.pk, action])


def create_form(**changes) -> dict:
    return {"name": "triton-fraud-v1", "version": "", "replicas": "2",
            "gpu_resource": "nvidia.com/gpu", "gpu_product": "NVIDIA-A100-SXM4-80GB",
            "node_labels": "", "namespace": "", "image": "",
            "model_repository": "s3://switchyard-models/fraud-scorer", "volume_claim": "",
            **changes}


def run(deployment, version, dave, fake_kube, **request) -> ServerWorkload:
    """A workload made through the domain and advanced until ready."""
    values = {"name": "triton-fraud-v1", "replicas": 2, "node_selector": A100,
              "model_repository": "s3://switchyard-models/fraud-scorer", **request}
    workload, _ = workloads.create_workload(deployment, version, dave, **values)
    workload_reconciler.advance(workload.pk)
    workload_reconciler.advance(workload.pk)
    fake_kube.pods_ready(workload.namespace, workload.name)
    workload_reconciler.advance(workload.pk)
    return ServerWorkload.objects.get(pk=workload.pk)


# --- the panel ------------------------------------------------------------------------------


def test_the_deployment_page_loads_the_panel_on_kubernetes_clusters_only(fraud, bob, tenant_a):
    deployment, _versions = fraud
    static = DeploymentFactory(model=deployment.model, tenant=tenant_a, name="static-one",
                               cluster=ClusterFactory(name="static-1"))
    client = browser(bob)

    on_kube = client.get(reverse("rollouts:deployment", args=[deployment.pk])).content.decode()
    elsewhere = client.get(reverse("rollouts:deployment", args=[static.pk])).content.decode()

    assert f'hx-get="{panel_url(deployment)}"' in on_kube
    assert "Servers on Kubernetes" in on_kube
    assert "Servers on Kubernetes" not in elsewhere
    assert client.get(panel_url(static)).status_code == 404


def test_the_panel_lists_servers_with_state_replicas_and_gpu_resource(
    fraud, bob, dave, fake_kube
):
    deployment, (v1, _v2) = fraud
    run(deployment, v1, dave, fake_kube)

    response = browser(bob).get(panel_url(deployment), **HTMX)

    html = response.content.decode()
    assert response.status_code == 286  # nothing in flight: htmx stops polling
    assert 'data-state="ready"' in html
    assert "<td data-replicas>2/2</td>" in html
    assert "1 &times; <code>nvidia.com/gpu</code> per replica" in html
    assert "holds 2 of nvidia-a100-80gb" in html
    assert "hx-trigger" not in html
    assert 'id="workload-create"' not in html  # a viewer gets no forms
    assert "Scale</button>" not in html


def test_the_panel_polls_while_a_server_is_in_flight(fraud, dave):
    deployment, (v1, _v2) = fraud
    workloads.create_workload(deployment, v1, dave, name="triton-fraud-v1", node_selector=A100,
                              model_repository="s3://models/fraud")

    response = browser(dave).get(panel_url(deployment), **HTMX)

    html = response.content.decode()
    assert response.status_code == 200
    assert 'hx-trigger="every 2s"' in html
    assert 'data-state="pending"' in html
    assert "<td data-replicas>&ndash;/1</td>" in html


def test_without_htmx_the_panel_is_a_page_of_its_own(fraud, dave):
    deployment, _versions = fraud

    response = browser(dave).get(panel_url(deployment))

    html = response.content.decode()
    assert response.status_code == 200
    assert "<h1>Servers of fraud-scorer on Kubernetes</h1>" in html
    assert 'id="workload-create"' in html
    assert "No servers on Kubernetes yet." in html


def test_another_tenant_and_anonymous_visitors_do_not_see_the_panel(fraud, charlie):
    deployment, _versions = fraud

    assert browser(charlie).get(panel_url(deployment)).status_code == 404
    anonymous = Client().get(panel_url(deployment))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


# --- creating -------------------------------------------------------------------------------


def test_a_deployer_runs_a_server_through_the_form(fraud, dave, enqueued_workloads,
                                                   django_capture_on_commit_callbacks):
    deployment, (v1, _v2) = fraud
    url = reverse("rollouts:deployment-workload-create", args=[deployment.pk])

    with django_capture_on_commit_callbacks(execute=True):
        response = browser(dave).post(url, create_form(version=v1.pk, node_labels="pool=gpu"))

    assert response.status_code == 302
    assert response["Location"].endswith(f"/deployments/{deployment.pk}/#workloads")
    workload = ServerWorkload.objects.get()
    assert (workload.name, workload.replicas, workload.namespace) == ("triton-fraud-v1", 2,
                                                                      "serving")
    assert workload.node_selector == {"pool": "gpu", "nvidia.com/gpu.product":
                                      "NVIDIA-A100-SXM4-80GB"}
    assert workload.placement.units == 2
    assert enqueued_workloads == [workload.pk]


def test_a_short_quota_is_shown_in_place_with_the_numbers(fraud, dave):
    deployment, (v1, _v2) = fraud
    url = reverse("rollouts:deployment-workload-create", args=[deployment.pk])

    response = browser(dave).post(url, create_form(version=v1.pk, replicas="5"))

    html = response.content.decode()
    assert response.status_code == 409
    assert "asks 5, 4 left of 4 (short by 1)" in html
    assert 'id="workload-create-errors"' in html
    assert not ServerWorkload.objects.exists()


@pytest.mark.parametrize(("changes", "field", "text"), [
    ({"name": "Triton_1"}, "name", "Service name"),
    ({"gpu_product": "A100 80GB"}, "node_labels", "not a Kubernetes label value"),
    ({"node_labels": "pool"}, "node_labels", "line 1: write key=value"),
    ({"model_repository": "/models"}, "volume_claim", "PersistentVolumeClaim"),
    ({"version": ""}, "version", "choose a version"),
    ({"namespace": "kube-system"}, "namespace",
     "namespace kube-system is not granted to tenant tenant-a on cluster gpu-cluster; "
     "granted: serving"),
])
def test_a_refused_field_is_named_in_place(fraud, dave, changes, field, text):
    deployment, (v1, _v2) = fraud
    url = reverse("rollouts:deployment-workload-create", args=[deployment.pk])

    response = browser(dave).post(url, create_form(**{"version": v1.pk, **changes}))

    html = response.content.decode()
    assert response.status_code == 400
    assert f'id="{field}-error"' in html
    assert text in html


def test_the_form_names_the_namespaces_granted_and_the_default(fraud, dave):
    deployment, _versions = fraud

    html = browser(dave).get(panel_url(deployment), **HTMX).content.decode()

    assert 'placeholder="serving"' in html
    assert "granted: serving" in html


def test_a_viewer_cannot_post_the_form(fraud, bob):
    deployment, (v1, _v2) = fraud
    url = reverse("rollouts:deployment-workload-create", args=[deployment.pk])

    assert browser(bob).post(url, create_form(version=v1.pk)).status_code == 403
    assert not ServerWorkload.objects.exists()


# --- scaling, rolling, deleting -------------------------------------------------------------


def test_scaling_through_the_panel(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    workload = run(deployment, v1, dave, fake_kube)
    html = browser(dave).get(panel_url(deployment), **HTMX).content.decode()
    assert f'action="{action_url(workload, "scale")}"' in html

    response = browser(dave).post(action_url(workload, "scale"), {"replicas": "3"})

    assert response.status_code == 302
    workload.refresh_from_db()
    assert (workload.state, workload.replicas, workload.placement.units) == (State.APPLYING, 3, 3)


def test_scaling_beyond_the_quota_is_refused_on_the_servers_row(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    workload = run(deployment, v1, dave, fake_kube)

    response = browser(dave).post(action_url(workload, "scale"), {"replicas": "9"})

    html = response.content.decode()
    assert response.status_code == 409
    assert 'id="workload-refusal"' in html
    assert "asks 7 more, 2 left of 4 (short by 5)" in html
    workload.refresh_from_db()
    assert (workload.state, workload.replicas) == (State.READY, 2)


def test_a_server_in_flight_offers_no_change_and_refuses_one(fraud, dave):
    deployment, (v1, _v2) = fraud
    workload, _ = workloads.create_workload(deployment, v1, dave, name="triton-fraud-v1",
                                            node_selector=A100,
                                            model_repository="s3://models/fraud")

    html = browser(dave).get(panel_url(deployment), **HTMX).content.decode()
    response = browser(dave).post(action_url(workload, "scale"), {"replicas": "1"})

    assert "Scale</button>" not in html
    assert response.status_code == 409
    assert "wait for it to finish" in response.content.decode()


def test_rolling_a_vllm_server_through_the_panel(chat, dave, fake_kube):
    deployment, (v1, v2) = chat
    workload = run(deployment, v1, dave, fake_kube, name="vllm-llama", replicas=1,
                   node_selector=H100, model_repository="")
    html = browser(dave).get(panel_url(deployment), **HTMX).content.decode()
    assert f'<option value="{v2.pk}">v2</option>' in html

    response = browser(dave).post(action_url(workload, "roll"), {"version": v2.pk})

    assert response.status_code == 302
    workload.refresh_from_db()
    assert (workload.state, workload.version, workload.previous_version) == (
        State.APPLYING, v2, v1)


def test_triton_servers_offer_no_roll(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    run(deployment, v1, dave, fake_kube)

    html = browser(dave).get(panel_url(deployment), **HTMX).content.decode()

    assert "Roll</button>" not in html


def test_deleting_through_the_panel_asks_first(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    workload = run(deployment, v1, dave, fake_kube)
    html = browser(dave).get(panel_url(deployment), **HTMX).content.decode()
    assert 'data-confirm="Delete triton-fraud-v1 from the cluster?' in html

    response = browser(dave).post(action_url(workload, "delete"))

    assert response.status_code == 302
    workload.refresh_from_db()
    assert workload.state == State.DELETING


def test_unknown_actions_and_other_tenants_workloads_are_404(fraud, dave, charlie, fake_kube):
    deployment, (v1, _v2) = fraud
    workload = run(deployment, v1, dave, fake_kube)

    assert browser(dave).post(action_url(workload, "explode")).status_code == 404
    assert browser(charlie).post(action_url(workload, "delete")).status_code == 404
    workload.refresh_from_db()
    assert workload.state == State.READY


def test_a_viewer_cannot_scale(fraud, dave, bob, fake_kube):
    deployment, (v1, _v2) = fraud
    workload = run(deployment, v1, dave, fake_kube)

    assert browser(bob).post(action_url(workload, "scale"), {"replicas": "1"}).status_code == 403


# --- autoscaled servers ---------------------------------------------------------------------


def run_autoscaled(deployment, version, dave, hpa_kube, low=1, high=4) -> ServerWorkload:
    workload, _ = workloads.create_workload(
        deployment, version, dave, name="triton-fraud-v1", node_selector=A100,
        min_replicas=low, max_replicas=high, model_repository="s3://switchyard-models/fraud")
    workload_reconciler.advance(workload.pk)
    workload_reconciler.advance(workload.pk)
    hpa_kube.pods_ready(workload.namespace, workload.name)
    workload_reconciler.advance(workload.pk)
    return ServerWorkload.objects.get(pk=workload.pk)


def test_the_panel_shows_an_autoscaled_server_and_its_range_form(fraud, dave, hpa_kube):
    deployment, (v1, _v2) = fraud
    workload = run_autoscaled(deployment, v1, dave, hpa_kube)
    assert workload.state == State.READY

    html = browser(dave).get(panel_url(deployment), **HTMX).content.decode()

    assert "autoscaled 1-4 (HPA)" in html
    assert "holds 4 of nvidia-a100-80gb" in html
    assert 'name="min_replicas" min="1" max="100" value="1"' in html
    assert 'name="max_replicas" min="1" max="100" value="4"' in html
    assert "Change range</button>" in html
    assert f'id="replicas-{workload.pk}"' not in html  # no replica count to type
    # The create form offers the range too.
    assert 'name="min_replicas"' in html.split('id="workload-create"')[1]
    assert 'name="max_replicas"' in html.split('id="workload-create"')[1]


def test_a_server_of_a_fixed_count_shows_no_range(fraud, dave, fake_kube):
    deployment, (v1, _v2) = fraud
    run(deployment, v1, dave, fake_kube)

    html = browser(dave).get(panel_url(deployment), **HTMX).content.decode()

    assert "autoscaled" not in html.split('id="workload-create"')[0]
    assert "Scale</button>" in html and "Change range</button>" not in html


def test_a_deployer_runs_an_autoscaled_server_through_the_form(fraud, dave):
    deployment, (v1, _v2) = fraud
    url = reverse("rollouts:deployment-workload-create", args=[deployment.pk])

    response = browser(dave).post(url, create_form(version=v1.pk, replicas="", min_replicas="1",
                                                   max_replicas="3"))

    assert response.status_code == 302, response.content.decode()
    workload = ServerWorkload.objects.get()
    assert (workload.autoscaled, workload.min_replicas, workload.max_replicas) == (True, 1, 3)
    assert workload.placement.units == 3


@pytest.mark.parametrize(("changes", "field", "text"), [
    ({"replicas": "", "min_replicas": "2"}, "max_replicas", "together"),
    ({"replicas": "", "min_replicas": "3", "max_replicas": "2"}, "max_replicas",
     "at least min_replicas (3), got 2"),
    ({"replicas": "2", "min_replicas": "1", "max_replicas": "3"}, "replicas",
     "not replicas"),
    ({"replicas": "", "min_replicas": "1", "max_replicas": "5"}, "max_replicas",
     "asks 5, 4 left of 4 (short by 1)"),
])
def test_a_bad_range_is_named_in_place(fraud, dave, changes, field, text):
    deployment, (v1, _v2) = fraud
    url = reverse("rollouts:deployment-workload-create", args=[deployment.pk])

    response = browser(dave).post(url, create_form(**{"version": v1.pk, **changes}))

    html = response.content.decode()
    assert response.status_code in (400, 409)
    assert f'id="{field}-error"' in html
    assert text in html
    assert not ServerWorkload.objects.exists()


def test_changing_the_range_through_the_panel(fraud, dave, hpa_kube):
    deployment, (v1, _v2) = fraud
    workload = run_autoscaled(deployment, v1, dave, hpa_kube, 1, 2)

    replicas = browser(dave).post(action_url(workload, "scale"), {"replicas": "3"})
    response = browser(dave).post(action_url(workload, "scale"),
                                  {"min_replicas": "2", "max_replicas": "3"})

    assert replicas.status_code == 400
    assert "its HPA owns the replica count" in replicas.content.decode()
    assert response.status_code == 302
    workload.refresh_from_db()
    assert (workload.state, workload.min_replicas, workload.max_replicas) == (
        State.APPLYING, 2, 3)
    assert workload.placement.units == 3


def test_a_deployment_served_by_workloads_offers_no_load_that_would_be_refused(
    dave, fraud, fake_kube
):
    """Its servers run the version they were started with: the Load panel says to run a
    workload instead, and the ready version has no Unload button; a load asked for anyway
    is refused naming the servers."""
    deployment, (v1, _v2) = fraud
    workload, _ = workloads.create_workload(deployment, v1, dave, **TRITON_REQUEST)
    workload_reconciler.run_to_end(workload.pk, max_steps=2)
    fake_kube.pods_ready("serving", "triton-fraud-v1")
    ServerWorkload.objects.filter(pk=workload.pk).update(next_attempt_at=None)
    workload_reconciler.advance(workload.pk)

    page = Client()
    page.force_login(dave)
    html = page.get(f"/registry/deployments/{deployment.pk}/").content.decode()

    assert 'id="load-workloads-only"' in html
    assert "Load onto" not in html
    assert "(a Kubernetes workload: delete it there)" in html
    with pytest.raises(DomainError) as refused:
        loads.request_load(dave, deployment, v1)
    assert refused.value.field == "servers"
    assert "Kubernetes workloads" in refused.value.message
