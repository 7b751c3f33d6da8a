"""Pages say what they know in words: a ready load's "On the server" is never empty (what the
server's last check says of the version, or why it says nothing), and the audit log's Change
column reads as words, not Python reprs."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from console.templatetags.switchyard import change_rows, in_words
from fleet.models import AuditEvent, InferenceServer
from rollouts.models import ModelLoad
from tests.console import test_rollout_pages as pages

setup = pages.setup  # fraud: v1 ready on its server ("triton"), v2 and v3 registered
Health = InferenceServer.Health


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def on_server(user, load: ModelLoad) -> str:
    body = browser(user).get(f"/registry/loads/{load.pk}/").content.decode()
    start = body.index('id="load-on-server">') + len('id="load-on-server">')
    return body[start:body.index("</span>", start)]


@pytest.mark.parametrize(("server", "shown"), [
    ({"last_checked_at": None}, "not known yet: triton has not been checked"),
    ({"health": Health.UNREACHABLE, "health_detail": "connection refused"},
     "not known: triton was unreachable at its last check (connection refused), so its model "
     "list was not read"),
    ({"health": Health.HEALTHY, "reported_models": [
        {"name": "NAME", "version": "1", "state": "READY"}]}, "triton reports v1 READY"),
    ({"health": Health.HEALTHY, "reported_models": []}, "triton does not list v1"),
], ids=["never-checked", "unreachable", "listed", "not-listed"])
def test_on_the_server_says_what_is_known_or_why_nothing_is(setup, bob, server, shown):
    load = ModelLoad.objects.get(deployment=setup["deployment"])
    ModelLoad.objects.filter(pk=load.pk).update(ready_at=timezone.now() - dt.timedelta(hours=1))
    fields = {"last_checked_at": timezone.now(), "health_detail": "", "probe_latency_ms": 5.0}
    name = setup["versions"][1].name_on(setup["server"])  # the model's name on the server
    server = server | {"reported_models": [m | {"name": name} for m in
                                           server.get("reported_models", [])]}
    InferenceServer.objects.filter(pk=setup["server"].pk).update(**(fields | server))

    assert on_server(bob, load).strip() == shown


def test_a_check_older_than_the_load_says_so(setup, bob):
    load = ModelLoad.objects.get(deployment=setup["deployment"])
    ModelLoad.objects.filter(pk=load.pk).update(ready_at=timezone.now())
    InferenceServer.objects.filter(pk=setup["server"].pk).update(
        health=Health.HEALTHY, health_detail="", reported_models=[],
        last_checked_at=timezone.now() - dt.timedelta(minutes=5))

    assert "last checked before v1 was ready" in on_server(bob, load)


@pytest.mark.parametrize(("value", "words"), [
    (None, "none"), (True, "yes"), (False, "no"), ([], "none"), (["a", "b"], "a, b"),
    ({"p99_ms": 50, "error_rate": None}, "p99 ms: 50, error rate: none"), (12, "12"),
    ([{"version": 1, "weight": 90}, {"version": 2, "weight": 10}],
     "version: 1, weight: 90, version: 2, weight: 10"),
])
def test_a_recorded_value_reads_as_words(value, words):
    assert in_words(value) == words


def test_the_audit_log_change_column_reads_as_words(setup, alice, tenant_a):
    AuditEvent.objects.create(
        tenant=tenant_a, actor_label="alice", verb="update", object_type="rollouts.deployment",
        object_id="1", object_repr="fraud",
        before={"production": False, "servers": ["triton"], "slo": {"p99_ms": 500}},
        after={"production": True, "servers": ["triton", "triton-2"], "slo": {"p99_ms": 250},
               "description": None})

    body = browser(alice).get("/audit/").content.decode()

    start = body.index("data-change>")
    change = body[start:body.index("</td>", start)]
    assert "production</span>: no → yes" in change
    assert "servers</span>: triton → triton, triton-2" in change
    assert "slo</span>: p99 ms: 500 → p99 ms: 250" in change
    assert "description</span>: none" in change
    for repr_text in ("True", "False", "None", "[", "{", "&#x27;"):
        assert repr_text not in change, repr_text
    assert change_rows("not a dict", None) == []
