"""Tenant webhooks against a real HTTP receiver on 127.0.0.1: signatures, retries with
backoff, giving up, a receiver that is down, the Slack format, who gets which event, and the
API and console faces. The receivers are on 127.0.0.1, which SWITCHYARD_WEBHOOK_ALLOWED_HOSTS
lets through here; tests/fleet/webhooks/test_webhook_targets.py is about the addresses refused."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
import time_machine
from django.db import transaction
from django.test import TestCase
from django.urls import reverse
from django.utils import timezone

from console.exceptions import Conflict, DomainError
from fleet.models import AuditEvent, Webhook, WebhookDelivery
from fleet.webhooks import events
from fleet.webhooks.delivery import claim_lease, deliver, due_deliveries, sign, verify
from fleet.webhooks.requests import create_webhook, update_webhook
from tests.factories import TenantFactory
from tests.fixtures.http_server import QuietHTTPServer

State = WebhookDelivery.State
ROLLOUT = {"id": 3, "tenant": "tenant-a", "deployment": "fraud-prod", "model": "fraud-scorer",
           "state": "rolled_back", "previous_state": "rolling_back", "reason": "p99 breached"}


@dataclass
class Receiver:
    """A webhook receiver: records every request; answers ``fail`` 500s before 200s."""

    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    fail: int = 0

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r["body"]) for r in self.requests]


@pytest.fixture(autouse=True)
def local_receivers_allowed(settings) -> None:
    settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            failing = state.fail > 0
            state.fail -= failing
            answer = b"receiver broke: try later" if failing else b"ok"
            self.send_response(500 if failing else 200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = QuietHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    """Deliveries handed to the broker (tests then call ``deliver`` themselves)."""
    queued: list[int] = []
    monkeypatch.setattr("console.celery.send_now", lambda task, *args: queued.append(args[0]))
    return queued


def hook(alice, tenant, url: str, **kwargs: Any) -> Webhook:
    kwargs.setdefault("name", "ops")
    return create_webhook(alice, tenant, url=url, **kwargs).webhook


def emit(tenant, event: str = "rollout.rolled_back", payload: dict | None = None) -> int:
    """Emit in a transaction that commits (the test's own never does: what would run on its
    commit runs when this block ends)."""
    with TestCase.captureOnCommitCallbacks(execute=True), transaction.atomic():
        return events.emit(tenant, event, payload or ROLLOUT, summary="Rollout 3 rolled back")


def later(seconds: float) -> time_machine.travel:
    return time_machine.travel(timezone.now() + timedelta(seconds=seconds), tick=True)


# --- sending and signing --------------------------------------------------------------------


def test_a_delivery_is_posted_signed_and_recorded(alice, tenant_a, receiver, sent):
    webhook = hook(alice, tenant_a, receiver.url)

    assert emit(tenant_a) == 1
    [delivery] = WebhookDelivery.objects.all()
    assert sent == [delivery.pk]  # handed to a worker on commit
    assert deliver(delivery.pk) == State.DELIVERED

    [request] = receiver.requests
    headers = request["headers"]
    assert headers["X-Switchyard-Event"] == "rollout.rolled_back"
    assert headers["X-Switchyard-Delivery"] == str(delivery.pk)
    assert headers["Content-Type"] == "application/json"
    assert verify(webhook.secret, headers["X-Switchyard-Timestamp"], request["body"],
                  headers["X-Switchyard-Signature"], max_age_s=300)
    assert not verify("whsec_another", headers["X-Switchyard-Timestamp"],
                      request["body"], headers["X-Switchyard-Signature"])
    assert not verify(webhook.secret, headers["X-Switchyard-Timestamp"],
                      request["body"] + b" ", headers["X-Switchyard-Signature"])
    body = json.loads(request["body"])
    assert body["event"] == "rollout.rolled_back"
    assert body["id"] == delivery.pk
    assert body["tenant"] == "tenant-a"
    assert body["data"] == ROLLOUT
    delivery.refresh_from_db()
    # The status is kept, the answer's body is not.
    assert (delivery.attempts, delivery.response_status, delivery.response_excerpt) == (1, 200, "")
    assert delivery.delivered_at is not None and delivery.duration_ms is not None

    # Delivering again changes nothing and sends nothing.
    assert deliver(delivery.pk) == State.DELIVERED
    assert len(receiver.requests) == 1


def test_verify_refuses_an_old_timestamp():
    body = b'{"event":"ping"}'
    signature = sign("whsec_x", 1_000, body)

    assert verify("whsec_x", 1_000, body, signature)
    assert verify("whsec_x", "1000", body.decode(), signature, max_age_s=300, now=1_200)
    assert not verify("whsec_x", 1_000, body, signature, max_age_s=300, now=2_000)


def test_it_retries_with_backoff_until_delivered(alice, tenant_a, receiver, sent):
    hook(alice, tenant_a, receiver.url)
    receiver.fail = 3
    emit(tenant_a)
    delivery = WebhookDelivery.objects.get()
    waits = []

    for _ in range(3):
        attempted_at = timezone.now()
        assert deliver(delivery.pk) == State.PENDING
        delivery.refresh_from_db()
        waits.append(round((delivery.next_attempt_at - attempted_at).total_seconds()))
        assert delivery.response_status == 500
        assert delivery.response_excerpt == ""  # the answer is not kept
        # Not due yet: a call now (a second worker, an early tick) sends nothing.
        assert deliver(delivery.pk) == State.PENDING
        assert delivery.pk not in due_deliveries()
        with later(waits[-1] + 0.5):
            assert due_deliveries() == [delivery.pk]
            if len(waits) == 3:
                assert deliver(delivery.pk) == State.DELIVERED
        if len(waits) < 3:
            WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())

    assert waits == [2, 4, 8]
    assert len(receiver.requests) == 4
    # Every attempt is the same body, signed anew.
    assert len({r["body"] for r in receiver.requests}) == 1
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.response_status) == (State.DELIVERED, 4, 200)


def test_it_gives_up_after_max_attempts(alice, tenant_a, receiver, sent, settings):
    settings.SWITCHYARD_WEBHOOK_MAX_ATTEMPTS = 3
    hook(alice, tenant_a, receiver.url)
    receiver.fail = 10
    emit(tenant_a)
    delivery = WebhookDelivery.objects.get()

    states = []
    for _ in range(4):
        states.append(deliver(delivery.pk))
        WebhookDelivery.objects.filter(pk=delivery.pk, state=State.PENDING).update(
            next_attempt_at=timezone.now())

    assert states == [State.PENDING, State.PENDING, State.FAILED, State.FAILED]
    assert len(receiver.requests) == 3
    delivery.refresh_from_db()
    assert delivery.attempts == 3
    assert delivery.next_attempt_at is None
    assert delivery.response_status == 500
    assert delivery.response_excerpt == ""
    assert due_deliveries() == []


def test_a_receiver_that_is_down_is_recorded_readably(alice, tenant_a, closed_port, sent):
    hook(alice, tenant_a, f"http://127.0.0.1:{closed_port}/hook")
    emit(tenant_a)
    delivery = WebhookDelivery.objects.get()

    assert deliver(delivery.pk) == State.PENDING

    delivery.refresh_from_db()
    assert delivery.response_status is None
    assert delivery.response_excerpt == "could not connect: Connection refused"
    assert delivery.attempts == 1


def test_a_receiver_that_does_not_answer_times_out(alice, tenant_a, settings, sent):
    settings.SWITCHYARD_WEBHOOK_TIMEOUT_S = 0.3
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        hook(alice, tenant_a, f"http://127.0.0.1:{silent.getsockname()[1]}/")
        emit(tenant_a)
        delivery = WebhookDelivery.objects.get()

        assert deliver(delivery.pk) == State.PENDING

    delivery.refresh_from_db()
    assert delivery.response_excerpt == "no answer within 0.3 s"


def test_the_slack_format_sends_an_incoming_webhook_message(alice, tenant_a, receiver, sent):
    webhook = hook(alice, tenant_a, receiver.url, format="slack")
    emit(tenant_a)

    deliver(WebhookDelivery.objects.get().pk)

    [request] = receiver.requests
    body = json.loads(request["body"])
    assert body["text"] == "Rollout 3 rolled back"
    assert body["blocks"][0] == {"type": "section",
                                 "text": {"type": "mrkdwn", "text": "Rollout 3 rolled back"}}
    fields = [f["text"] for f in body["blocks"][1]["fields"]]
    assert "*deployment*\nfraud-prod" in fields
    assert "*reason*\np99 breached" in fields
    assert "rollout.rolled_back" in body["blocks"][-1]["elements"][0]["text"]
    headers = request["headers"]
    assert verify(webhook.secret, headers["X-Switchyard-Timestamp"], request["body"],
                  headers["X-Switchyard-Signature"])


def test_emit_reaches_only_the_tenants_active_webhooks_for_the_event(
    alice, charlie, tenant_a, tenant_b, receiver, sent
):
    all_events = hook(alice, tenant_a, receiver.url, name="all")
    approvals = hook(alice, tenant_a, receiver.url, name="approvals",
                     events=["rollout.approval_needed"])
    hook(alice, tenant_a, receiver.url, name="off", active=False)
    hook(charlie, tenant_b, receiver.url, name="b-all")

    assert emit(tenant_a, "rollout.state_changed") == 1
    assert emit(tenant_a, "rollout.approval_needed") == 2

    got = sorted(WebhookDelivery.objects.values_list("webhook__name", "event"))
    assert got == [("all", "rollout.approval_needed"), ("all", "rollout.state_changed"),
                   ("approvals", "rollout.approval_needed")]
    assert {all_events.pk, approvals.pk} == set(
        WebhookDelivery.objects.values_list("webhook", flat=True))
    with pytest.raises(ValueError, match="unknown webhook event"):
        events.emit(tenant_a, "rollout.exploded", {})


def test_emit_queues_nothing_when_the_transaction_rolls_back(alice, tenant_a, receiver, sent):
    hook(alice, tenant_a, receiver.url)

    with pytest.raises(RuntimeError), transaction.atomic():
        events.emit(tenant_a, "rollout.state_changed", ROLLOUT)
        raise RuntimeError("the state change failed")

    assert not WebhookDelivery.objects.exists()
    assert sent == []


def test_a_deactivated_webhook_fails_its_pending_deliveries(alice, tenant_a, receiver, sent):
    webhook = hook(alice, tenant_a, receiver.url)
    emit(tenant_a)
    update_webhook(alice, webhook, active=False)

    assert deliver(WebhookDelivery.objects.get().pk) == State.FAILED

    assert receiver.requests == []
    assert WebhookDelivery.objects.get().response_excerpt == "the webhook was deactivated"


def test_a_lost_workers_claim_is_retried_after_its_lease(alice, tenant_a, receiver, sent):
    hook(alice, tenant_a, receiver.url)
    emit(tenant_a)
    delivery = WebhookDelivery.objects.get()
    # A worker claimed it, then died before posting.
    now = timezone.now()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=1, next_attempt_at=now + claim_lease())
    assert deliver(delivery.pk) == State.PENDING
    assert receiver.requests == []

    with later(claim_lease().total_seconds() + 1):
        assert due_deliveries() == [delivery.pk]
        assert deliver(delivery.pk) == State.DELIVERED

    assert len(receiver.requests) == 1
    assert WebhookDelivery.objects.get().attempts == 2


def test_the_beat_task_hands_due_deliveries_to_workers(alice, tenant_a, receiver, sent,
                                                       monkeypatch):
    from fleet import tasks

    hook(alice, tenant_a, receiver.url)
    emit(tenant_a)
    delivered: list[int] = []
    monkeypatch.setattr(tasks.deliver_webhook, "delay", delivered.append)

    assert tasks.retry_webhook_deliveries() == 1
    tasks.deliver_webhook(delivered[0])
    tasks.deliver_webhook(delivered[0])  # a second time changes nothing

    assert tasks.retry_webhook_deliveries() == 0
    assert len(receiver.requests) == 1


def test_a_rollout_that_rolls_back_notifies_its_tenants_webhooks(alice, tenant_a, receiver, sent):
    """GIVEN a rollout of tenant A rolling back and a webhook for rollbacks only
    WHEN the reconciler moves it to rolled_back
    THEN one delivery carries the rollout, and the receiver gets it signed."""
    from rollouts.canary import actions
    from rollouts.models import Rollout
    from tests.factories import DeploymentFactory, ModelFactory, ModelVersionFactory

    webhook = hook(alice, tenant_a, receiver.url, events=["rollout.rolled_back"])
    model = ModelFactory(tenant=tenant_a, name="fraud-scorer")
    base, candidate = (ModelVersionFactory(model=model, version=n) for n in (1, 2))
    made = Rollout.objects.create(
        tenant=tenant_a, deployment=DeploymentFactory(model=model, name="fraud-prod"),
        baseline=base, candidate=candidate, state=Rollout.State.ROLLING_BACK,
        weights={"1": 90, "2": 10}, requested_by_label="alice",
    )

    with TestCase.captureOnCommitCallbacks(execute=True):
        actions.move(made, Rollout.State.ROLLED_BACK, "p99 breached", reason="p99 breached")

    delivery = WebhookDelivery.objects.get()
    assert (delivery.webhook, delivery.event) == (webhook, "rollout.rolled_back")
    assert sent == [delivery.pk]
    assert deliver(delivery.pk) == State.DELIVERED
    [request] = receiver.requests
    data = json.loads(request["body"])["data"]
    assert (data["id"], data["state"], data["previous_state"]) == (made.pk, "rolled_back", "rolling_back")
    assert data["deployment"] == "fraud-prod"


# --- managing webhooks -------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://127.0.0.1/x", "must start with http:// or https://"),
    ("127.0.0.1:8000/hook", "must start with http:// or https://"),
    ("http:///path", "must name a host"),
    ("http://127.0.0.1:99999/", "not a valid URL"),
    ("http://exa mple.com/", "must not contain spaces"),
])
def test_bad_urls_are_refused_naming_the_field(alice, tenant_a, url, message):
    with pytest.raises(DomainError) as refused:
        create_webhook(alice, tenant_a, name="x", url=url)

    assert refused.value.field == "url"
    assert message in refused.value.message


def test_unknown_events_and_taken_names_are_refused(alice, tenant_a, receiver):
    with pytest.raises(DomainError) as refused:
        create_webhook(alice, tenant_a, name="x", url=receiver.url, events=["nope"])
    assert refused.value.field == "events"
    hook(alice, tenant_a, receiver.url, name="x")
    with pytest.raises(Conflict):
        create_webhook(alice, tenant_a, name="x", url=receiver.url)


# --- the API ---------------------------------------------------------------------------------


def test_the_api_shows_the_secret_once_and_audits_every_change(alice, tenant_a, client_for,
                                                              receiver, sent):
    api = client_for(alice)

    created = api.post("/api/v1/webhooks/", {"name": "ops", "url": receiver.url,
                                             "events": ["rollout.rolled_back"]}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    webhook = Webhook.objects.get(pk=body["id"])
    assert body["secret"] == webhook.secret and body["secret"].startswith("whsec_")
    assert body["secret_prefix"] == webhook.secret[:10] + "…"
    shown = api.get(f"/api/v1/webhooks/{webhook.pk}/").json()
    assert "secret" not in shown and webhook.secret not in json.dumps(shown)

    changed = api.patch(f"/api/v1/webhooks/{webhook.pk}/", {"format": "slack"}, format="json")
    assert changed.status_code == 200 and changed.json()["format"] == "slack"
    ping = api.post(f"/api/v1/webhooks/{webhook.pk}/test/")
    assert ping.status_code == 202 and ping.json()["event"] == "ping"
    deliver(ping.json()["id"])
    assert receiver.requests[0]["headers"]["X-Switchyard-Event"] == "ping"
    log = api.get(f"/api/v1/webhooks/{webhook.pk}/deliveries/").json()
    assert [(d["event"], d["state"], d["response_status"]) for d in log["results"]] == [
        ("ping", "delivered", 200)]
    assert api.get("/api/v1/webhooks/").json()["results"][0]["last_delivery"]["state"] == "delivered"
    assert api.delete(f"/api/v1/webhooks/{webhook.pk}/").status_code == 204

    verbs = list(AuditEvent.objects.filter(object_type="fleet.webhook")
                 .order_by("pk").values_list("verb", flat=True))
    assert verbs == ["created", "updated", "deleted"]
    assert webhook.secret not in json.dumps(list(AuditEvent.objects.values("before", "after")))


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "ops", "url": "gopher://127.0.0.1/"}, "url"),
    ({"name": "ops", "url": "http://127.0.0.1\x00/"}, "url"),
    ({"name": "o\x00ps", "url": "http://127.0.0.1/"}, "name"),
    ({"name": "ops", "url": "http://127.0.0.1/", "events": ["rollout.exploded"]}, "events"),
    ({"name": "ops", "url": "http://127.0.0.1/", "events": "rollout.rolled_back"}, "events"),
    ({"name": "ops", "url": "http://127.0.0.1/", "format": "teams"}, "format"),
    ({"name": "ops", "url": "http://127.0.0.1/", "secret": "mine"}, "secret"),
    ({"url": "http://127.0.0.1/"}, "name"),
])
def test_bad_input_is_a_400_naming_the_field(alice, tenant_a, client_for, body, field):
    response = client_for(alice).post("/api/v1/webhooks/", body, format="json")

    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert not Webhook.objects.exists()


def test_a_webhook_cannot_move_to_another_tenant(alice, charlie, tenant_a, tenant_b, client_for,
                                                 receiver):
    webhook = hook(alice, tenant_a, receiver.url)
    response = client_for(alice).patch(f"/api/v1/webhooks/{webhook.pk}/", {"tenant": "tenant-b"},
                               format="json")

    assert response.status_code == 400
    assert list(response.json()) == ["tenant"]


# --- the console ---------------------------------------------------------------------------------


def test_the_console_page_creates_a_webhook_and_shows_its_log(alice, tenant_a, client, receiver,
                                                             sent):
    client.force_login(alice)

    page = client.post(reverse("fleet:webhook-create"), {
        "tenant": "tenant-a", "name": "ops", "url": receiver.url, "format": "json",
        "events": ["rollout.rolled_back", "rollout.approval_needed"]})

    assert page.status_code == 200, page.content
    webhook = Webhook.objects.get()
    assert webhook.events == ["rollout.rolled_back", "rollout.approval_needed"]
    assert webhook.secret in page.content.decode()  # shown this once
    assert webhook.secret not in client.get(reverse("fleet:webhooks")).content.decode()
    emit(tenant_a)
    deliver(WebhookDelivery.objects.get().pk)
    log = client.get(reverse("fleet:webhook", kwargs={"pk": webhook.pk})).content.decode()
    assert "rollout.rolled_back" in log and "delivered" in log


def test_the_console_form_refuses_what_the_api_refuses(alice, tenant_a, client):
    client.force_login(alice)

    page = client.post(reverse("fleet:webhook-create"), {
        "tenant": "tenant-a", "name": "ops", "url": "ftp://127.0.0.1/", "format": "json"})

    assert page.status_code == 400
    assert 'id="url-error"' in page.content.decode()
    assert "must start with http:// or https://" in page.content.decode()
    assert not Webhook.objects.exists()


def test_another_tenants_webhook_is_a_404_in_the_console(alice, charlie, tenant_a, client,
                                                         receiver):
    TenantFactory(slug="tenant-c")
    webhook = hook(alice, tenant_a, receiver.url)
    client.force_login(charlie)

    assert client.get(reverse("fleet:webhook", kwargs={"pk": webhook.pk})).status_code == 404
