"""Every console form answers the same way: a successful POST redirects (a reload asks for the
page again and sends nothing twice), except the two pages that show a new secret once (API
token, webhook), which answer in place, kept by no cache and never written to the session; a
refused POST says at the top of the page that fields need a change, linking to the first one.

The successful POSTs are the console tenancy matrix's (``tests/console/test_tenancy_matrix.py``),
each called here by a persona allowed to; a form class that no URL of the matrix posts to fails
``test_every_console_form_is_posted_by_the_matrix``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import fleet
import rollouts
from console.forms import DomainForm
from fleet.inventory.forms import ClusterForm
from fleet.models import Membership
from tests.console import test_tenancy_matrix as matrix
from tests.console.test_tenancy_matrix import PAGES, PLATFORM, ROOT, Page, World

# The matrix's world, and what it needs: no probe touches the network, no task the broker.
world = matrix.world
fake_probes = matrix.fake_probes
queued = matrix.queued

Role = Membership.Role
PERSONA_FOR = {None: "dave", Role.VIEWER: "bob", Role.DEPLOYER: "dave", Role.APPROVER: "erin",
               Role.ADMIN: "alice", PLATFORM: ROOT}
# The pages that show a new secret once answer in place (200), never with a redirect.
SECRET_PAGES = {"fleet:token-create", "fleet:webhook-create"}


def _form_urls() -> dict[str, set[str]]:
    return {
        "ClusterForm": {"fleet:cluster-create", "fleet:cluster-edit"},
        "QuotaRequestForm": {"fleet:quota-request-create"},
        "QuotaDecisionForm": {"fleet:quota-request-decide"},
        "TokenForm": {"fleet:token-create"},
        "WebhookForm": {"fleet:webhook-create"},
        "ModelCreateForm": {"rollouts:model-create"},
        "ModelEditForm": {"rollouts:model-edit"},
        "VersionForm": {"rollouts:version-create"},
        "AliasForm": {"rollouts:alias-set"},
        "VersionActionForm": {"rollouts:version-action"},
        "DeploymentForm": {"rollouts:deployment-create", "rollouts:deployment-edit"},
        "DeploymentDeleteForm": {"rollouts:deployment-delete"},
        "DeploymentLoadForm": {"rollouts:deployment-load"},
        "ConvergeForm": {"rollouts:deployment-converge"},
        "RouteForm": {"rollouts:deployment-route"},
        "RouteDefaultForm": {"rollouts:deployment-route-default"},
        "RouteRemoveForm": {"rollouts:deployment-route-remove"},
        "RolloutStartForm": {"rollouts:deployment-rollout-start"},
        "RolloutActionForm": {"rollouts:rollout-action"},
        "BenchmarkStartForm": {"rollouts:deployment-benchmark-start"},
        "BenchmarkActionForm": {"rollouts:benchmark-action"},
        "WorkloadCreateForm": {"rollouts:deployment-workload-create"},
        "WorkloadActionForm": {"rollouts:workload-action"},
    }


def console_forms() -> set[str]:
    """Every form class the console's apps define (their ``forms`` modules)."""
    for package in (fleet, rollouts):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith(".forms"):
                importlib.import_module(info.name)

    def subclasses(cls: type) -> set[type]:
        found = set(cls.__subclasses__())
        return found | {s for c in found for s in subclasses(c)}

    found = subclasses(DomainForm) | {ClusterForm}
    return {cls.__name__ for cls in found if cls.__module__.startswith(("fleet.", "rollouts."))}


def test_every_console_form_is_posted_by_the_matrix():
    assert console_forms() == set(_form_urls())
    posted = {page.name for page in PAGES if page.method == "POST"}
    for names in _form_urls().values():
        assert names <= posted


def form_posts() -> list[Any]:
    names = set().union(*_form_urls().values())
    return [pytest.param(page, id=page.id) for page in PAGES
            if page.method == "POST" and page.name in names]


@pytest.mark.parametrize("page", form_posts())
def test_a_successful_post_redirects_and_a_secret_is_shown_once(world, page):
    for name in page.setup:
        getattr(world, name)
    client = world.browser(PERSONA_FOR[page.role])
    data = page.data(world) if page.data else {}

    response = client.post(page.url(world), data)

    if page.name in SECRET_PAGES:
        assert response.status_code == 200
        assert "no-store" in response["Cache-Control"]
        assert "form-alert" not in response.content.decode()
        secret = re.search(r'class="secret" id="new-(?:token|secret)">([^<]+)<', response.content.decode())
        assert secret, "the new secret is on the page"
        session = client.session
        assert secret.group(1).strip() not in str(dict(session.items()))
    else:
        assert response.status_code == 302, response.content.decode()[:2000]
    assert page.done is None or page.done(world, PERSONA_FOR[page.role])


@dataclass(frozen=True)
class Refused:
    """A refused POST of one form: the page it comes back on says so at the top, linking to
    ``field``'s message (or quoting ``refusal``, a refusal that names no field)."""

    page: str  # the matrix page id whose URL and persona are used
    data: Callable[[World], dict[str, Any]]
    field: str = ""
    refusal: str = ""


REFUSED = [
    Refused("fleet-cluster-create-POST", lambda w: {"name": "", "kind": "static"}, "name"),
    Refused("fleet-quota-request-create-POST",
            lambda w: {"tenant": w.tenant_a.slug, "device_class": "cpu", "units": "lots"}, "units"),
    Refused("fleet-token-create-POST",
            lambda w: {"tenant": w.tenant_a.slug, "name": "", "role": "deployer"}, "name"),
    Refused("fleet-webhook-create-POST",
            lambda w: {"tenant": w.tenant_a.slug, "name": "ops", "url": "not a url",
                       "format": "json", "events": ["rollout.rolled_back"]}, "url"),
    Refused("rollouts-model-create-POST", lambda w: {"tenant": w.tenant_a.slug, "name": ""},
            "name"),
    Refused("rollouts-version-create-POST",
            lambda w: {"version": "7", "artifact_uri": "http://x", "sha256": "7" * 64,
                       "size_bytes": "2048", "runtime": "triton", "backend": "python",
                       "gpus": "1", "estimated_gpu_memory_mib": "0"}, "artifact_uri"),
    Refused("rollouts-alias-set-POST", lambda w: {"name": "staging", "version": "abc"},
            "version"),
    Refused("rollouts-version-action-approve-POST", lambda w: {"reason": "again"},
            refusal="cannot become approved"),
    Refused("rollouts-deployment-create-POST",
            lambda w: {"name": "", "model": w.model_a.pk, "cluster": w.cluster.pk,
                       "slo_p99_ms": "300", "slo_error_rate": "1.00"}, "name"),
    Refused("rollouts-deployment-edit-POST",
            lambda w: {"name": "dep-a", "cluster": w.cluster.pk, "slo_p99_ms": "fast",
                       "slo_error_rate": "0.50"}, "slo_p99_ms"),
    Refused("rollouts-deployment-load-load-POST", lambda w: {"action": "load", "version": "abc"},
            "version"),
    Refused("rollouts-deployment-rollout-start-POST",
            lambda w: {"strategy": "canary", "version": str(w.spare_a.version),
                       "steps": "[{set_weight: 50"}, "steps"),
    Refused("rollouts-rollout-action-pause-POST", lambda w: {"reason": "again"},
            refusal="Action"),
    Refused("rollouts-deployment-benchmark-start-POST",
            lambda w: {"version": "1", "mode": "concurrency", "levels": "many",
                       "duration_s": "2", "warmup_s": "0"}, "bench-levels"),
    Refused("rollouts-workload-action-scale-POST", lambda w: {"replicas": "lots"}, "replicas"),
]


def page_by_id(page_id: str) -> Page:
    return next(page for page in PAGES if page.id == page_id)


def test_every_refusal_names_a_page_of_the_matrix():
    for refused in REFUSED:
        page_by_id(refused.page)


@pytest.mark.parametrize("refused", REFUSED, ids=[r.page for r in REFUSED])
def test_a_refused_post_says_so_at_the_top_and_links_to_the_first_field(world, refused):
    page = page_by_id(refused.page)
    for name in page.setup:
        getattr(world, name)
    if refused.page == "rollouts-version-action-approve-POST":
        target = world.version_a  # approved already: nothing waits for a decision
        url = page.url(world).replace(f"/{world.pending_a.pk}/", f"/{target.pk}/")
    elif refused.page == "rollouts-rollout-action-pause-POST":
        url = page.url(world).replace("/pause/", "/retry/")  # it has not ended: no retry
    else:
        url = page.url(world)
    client = world.browser(PERSONA_FOR[page.role])

    response = client.post(url, refused.data(world))

    body = response.content.decode()
    assert 400 <= response.status_code < 500, body[:2000]
    alert_at = body.index('id="form-alert"')
    assert alert_at < body.index('<main>') + 600, "the alert opens the page"
    alert = body[alert_at:body.index("</div>", alert_at)]
    if refused.field:
        assert f'href="#{refused.field}-error"' in alert, alert
        assert "need" in alert and "a change" in alert
        assert body.count(f'id="{refused.field}-error"') == 1, "the link leads to one message"
    else:
        assert refused.refusal in alert, alert
