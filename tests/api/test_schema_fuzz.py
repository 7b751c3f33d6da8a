"""Fuzz every API operation from the OpenAPI schema with schemathesis, running all its checks:
no 5xx, every status and body documented, schema-valid input accepted, invalid input refused,
no access without credentials.

The caller is a tenant admin with an API token, in a database holding one of each object
(and another tenant's, which must stay out of reach). Bounded: a few examples per operation.

One check is made stricter in our own way. A schema states the shape of each input, not
whether the model, cluster, tenant or deployment it names exists: random names and ids name
nothing (nor a device class the fleet has none of), and the API answers those with a 400 naming the field (the name is the caller's
mistake, as a misspelt field would be). Nor can it say what the named server speaks: a
benchmark's protocol must fit the server's runtime (and gRPC needs its gRPC address), and what
each request carries is Triton inputs or LLM token counts by that protocol. Nor can it say that a moment lies in the future (a
token's ``expires_at``), which depends on the clock, nor that a PUT's ``name`` is the row's
own (models and aliases are not renamed), nor whether a webhook's host is a public
address (``http://0`` is 0.0.0.0, ``http://localhost`` is loopback). NUL characters are refused everywhere too
(no stored text may hold one; PostgreSQL cannot), which a schema has no plain way to say for
every string, and so are integers of 2**64 and past, which a free-form JSON value's schema
(a benchmark's KServe inputs) cannot bound. So schemathesis' ``positive_data_acceptance`` (a schema-valid request is
accepted) is replaced by :func:`positive_data_accepted`: a schema-valid request is accepted,
or refused with a 400 each of whose field errors is one of those refusals. Any other 400
fails, as does a 400 that mixes such a refusal with any other error.
"""

from __future__ import annotations

import json
import re
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from schemathesis.specs.openapi.checks import positive_data_acceptance

from fleet.adapters.base import ServerProbe
from fleet.inventory import health
from fleet.models import InferenceServer, Membership, Placement
from fleet.tenancy import tokens
from rollouts.models import ModelLoad, ModelVersion
from tests.api.benchmark_rows import finished_job
from tests.factories import (
    AliasFactory,
    ClusterFactory,
    DeploymentFactory,
    GPUFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
    NodeFactory,
    QuotaFactory,
)

EXAMPLES_PER_OPERATION = 12


@pytest.fixture
def one_connection():
    """The WSGI app closes the database connection after each request, as in production; the
    test's transaction lives on it, so keep it open (Django's test client does the same)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def world(tenant_a, tenant_b, alice, charlie, monkeypatch, one_connection):
    """One of everything in tenant A (and a model in tenant B); a token of tenant A's admin."""

    def probe(http_url: str, timeout: float) -> ServerProbe:
        return ServerProbe(ready=False, live=False, error=f"connection refused at {http_url}")

    monkeypatch.setattr(health, "PROBES", dict.fromkeys(InferenceServer.Runtime, probe))
    cluster = ClusterFactory(name="local")
    node = NodeFactory(cluster=cluster, name="node-1")
    GPUFactory(node=node, uuid="GPU-fuzz-0")
    server = InferenceServerFactory(cluster=cluster, name="triton-1", reported_models=[
        {"name": "fraud-scorer", "version": "1", "state": "READY", "reason": ""},
        {"name": "secret-b", "version": "1", "state": "UNAVAILABLE", "reason": "s3://b/private"},
    ])
    QuotaFactory(tenant=tenant_a, device_class="cpu")
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    v1 = ModelVersionFactory(model=model, version=1, status=ModelVersion.Status.APPROVED)
    ModelVersionFactory(model=model, version=2)
    AliasFactory(model=model, version=v1, name="production")
    deployment = DeploymentFactory(model=model, cluster=cluster, name="fraud-prod")
    deployment.servers.set([server])
    load = ModelLoad.objects.create(
        tenant=tenant_a, deployment=deployment, server=server, version=v1,
        state=ModelLoad.State.READY, requested_by_label="alice",
    )
    Placement.objects.create(tenant=tenant_a, server=server, model_version=v1,
                             device_class="cpu", units=1, memory_mib=64,
                             state=Placement.State.ACTIVE)
    load.save()
    # A finished config sweep, so the benchmark reads answer real figures.
    finished_job(deployment, v1, configs=[{"instance_group": [{"count": 1, "kind": "KIND_CPU"}]},
                                          {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}])
    ModelFactory(tenant=tenant_b, name="secret-b")
    return tokens.issue(alice, tenant_a, "fuzz", Membership.Role.ADMIN).secret


def _api_schema() -> schemathesis.schemas.BaseSchema:
    """The schema the site serves at /api/schema/, built in process, sent to the WSGI app."""
    generated = SchemaGenerator().get_schema(request=None, public=True)
    loaded = schemathesis.openapi.from_dict(json.loads(json.dumps(generated, default=str)))
    loaded.app = get_wsgi_application()
    loaded.config.generation.update(max_examples=EXAMPLES_PER_OPERATION)
    return loaded


schema = _api_schema()


# How the API words a refusal of a reference that names nothing (fleet/api/refs.py, the tenant
# field, versions, aliases and servers named inside a body), of a NUL character and of a moment
# that has passed.
UNKNOWN_REFERENCE = re.compile(
    r"^no [a-z][a-z ]* (with|named) "        # no model with name or id '0'; no node named 'x'
    r"|^no node '.*' in cluster "            # no node 'x' in cluster 'y'
    r"| has no (version|alias|server named) "  # fraud-scorer has no version 9
    r"|^unknown device class "                # a quota request's class the fleet has none of
)
# A benchmark protocol the named server does not speak, or a request body of the other
# protocol's kind (rollouts/benchmarks/specs.py).
NOT_SPOKEN = re.compile(
    r" does not fit a [a-z]+ server$| has no gRPC address recorded$"
    r"|^request\.inputs: inputs: a list of |^request: unknown fields inputs$"
)
NUL_REFUSED = re.compile(r"NUL characters are not allowed|cannot contain NUL characters")
# A free-form JSON value (a benchmark's KServe inputs, a Triton config) has no schema bound on
# every number in it; the parser refuses integers no field stores (2**64 and past) anywhere.
FREE_FORM_NUMBER = re.compile(r"^request\.inputs\[\d+\]\..*: the number "
                              r"\S+( \(\d+ characters\))? is out of range$", re.DOTALL)
IN_THE_PAST = re.compile(r"^must be in the future$")
# A webhook URL whose host is local, loopback, private, ... (fleet/outbound.py).
NOT_PUBLIC = re.compile(r": give a public (address|host)$")
# A PUT's name other than the row's own: whether it is a rename depends on the row, which
# the schema of the body cannot know.
RENAMED = re.compile(r"^an? [a-z]+ cannot be renamed(; create the new name)?$")


def _messages(errors: Any) -> list[str]:
    """Every message of a field's errors (a list, or an object for nested inputs)."""
    if isinstance(errors, str):
        return [errors]
    if isinstance(errors, list):
        return [m for item in errors for m in _messages(item)]
    if isinstance(errors, dict):
        return [m for item in errors.values() for m in _messages(item)]
    return [repr(errors)]


def refused_only_for_what_no_schema_states(response: Any) -> bool:
    if response.status_code != 400:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    if not isinstance(body, dict) or not body or "detail" in body:
        return False
    messages = _messages(body)
    return bool(messages) and all(
        UNKNOWN_REFERENCE.search(m) or NOT_SPOKEN.search(m) or NUL_REFUSED.search(m)
        or IN_THE_PAST.search(m) or FREE_FORM_NUMBER.search(m) or NOT_PUBLIC.search(m)
        or RENAMED.search(m)
        for m in messages
    )


def positive_data_accepted(ctx, response, case):
    """schemathesis' positive_data_acceptance, except for refusals no schema can state (see
    the module's docstring)."""
    if refused_only_for_what_no_schema_states(response):
        return None
    return positive_data_acceptance(ctx, response, case)


@schema.parametrize()
@hypothesis.settings(
    max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_the_api_answers_as_its_schema_says(case, world):
    case.call_and_validate(
        headers={"Authorization": f"Bearer {world}"},
        excluded_checks=[positive_data_acceptance],
        additional_checks=[positive_data_accepted],
    )
