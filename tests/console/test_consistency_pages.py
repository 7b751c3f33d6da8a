"""The console's view of one version everywhere: the per-server table on a deployment's page,
its Converge button, the mark on the deployments list and the setting to converge by itself."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from fleet.models import AuditEvent
from rollouts.models import Deployment, ModelLoad
from tests.factories import (
    DeploymentFactory,
)
from tests.rollouts.deployments.split_world import H1, H2, split_deployment

State = ModelLoad.State


@pytest.fixture
def split(tenant_a):
    """Tenant A's deployment on two servers: v1 on both with two configs, v2 on the first."""
    return split_deployment(tenant_a, with_v2=True)


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def rows_of(html: str) -> list[tuple[str, str, bool]]:
    """(server, version, highlighted) of each row of the per-server table."""
    table = html.split('id="consistency-table"', 1)[1].split("</table>", 1)[0]
    return [(server, version or "", "disagrees" in attrs) for attrs, server, version in re.findall(
        r'<tr([^>]*) data-server="([^"]+)"(?: data-version="(\d+)")?>', table)]


def test_the_page_shows_each_server_and_highlights_those_that_disagree(split, dave):
    html = client_of(dave).get(reverse("rollouts:deployment", args=[split.pk])).content.decode()
    assert 'id="consistency-state">inconsistent<' in html
    assert rows_of(html) == [("triton-1", "1", True), ("triton-1", "2", False),
                             ("triton-2", "1", True), ("triton-2", "2", True)]
    assert H1[:12] in html and H2[:12] in html
    assert "v2 is not ready on triton-2 (it is on triton-1)" in html
    assert 'id="converge-form"' in html


def test_a_viewer_sees_the_table_without_the_button(split, bob):
    html = client_of(bob).get(reverse("rollouts:deployment", args=[split.pk])).content.decode()
    assert 'id="consistency-table"' in html and 'id="converge-form"' not in html


def test_converge_starts_the_loads_and_says_so(split, dave):
    answer = client_of(dave).post(reverse("rollouts:deployment-converge", args=[split.pk]), {"reason": "agree"},
                                  follow=True)
    html = answer.content.decode()
    assert "Converging scorer: loading 1 missing version and sending the config again on 1 server." in html
    assert ModelLoad.objects.filter(server__name="triton-2", version__version=2,
                                    state=State.PENDING).exists()
    assert AuditEvent.objects.get(verb="converged").reason == "agree"
    # A load is in flight now: the page says why converge waits, and offers no button.
    assert 'id="converge-blocked"' in html and 'id="converge-form"' not in html
    assert 'id="consistency-state">converging<' in html


def test_a_refused_converge_is_shown_on_the_page_with_409(split, dave):
    ModelLoad.objects.filter(deployment=split).update(config_hash=H1)
    ModelLoad.objects.filter(deployment=split, version__version=2).delete()
    answer = client_of(dave).post(reverse("rollouts:deployment-converge", args=[split.pk]), {})
    assert answer.status_code == 409
    html = answer.content.decode()
    assert 'id="converge-errors"' in html and "nothing to converge" in html


def test_the_list_marks_a_deployment_whose_servers_disagree(split, bob):
    DeploymentFactory(model=split.model, cluster=split.cluster, name="quiet")
    html = client_of(bob).get(reverse("rollouts:deployments")).content.decode()
    scorer = html.split(f'href="{reverse("rollouts:deployment", args=[split.pk])}"', 1)[1].split("</tr>", 1)[0]
    assert ">inconsistent</a>" in scorer
    assert html.count(">inconsistent</a>") == 1


def test_the_edit_form_sets_converging_by_itself(split, dave):
    answer = client_of(dave).post(reverse("rollouts:deployment-edit", args=[split.pk]), {
        "name": "scorer", "cluster": split.cluster.pk, "servers": [s.pk for s in split.servers.all()],
        "slo_p99_ms": 500, "slo_error_rate": "1.00", "auto_converge": "on"})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert Deployment.objects.get(pk=split.pk).auto_converge is True
    html = client_of(dave).get(reverse("rollouts:deployment", args=[split.pk])).content.decode()
    assert 'id="auto-converge">converges by itself' in html
