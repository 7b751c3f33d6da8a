"""Where a tenant's webhook may point: a public address only. As the hostile tenant admin
would try it, through the API and the console: loopback, private, link-local, metadata and
unspecified addresses in every spelling, local names and credentials are a 400 on ``url``; a
row that slipped in anyway (or a name whose DNS answer changed) is refused at delivery, after
resolution, and connects to no one; a host the platform allows is reached; and what a receiver
answers is never kept or shown."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from django.urls import reverse

from fleet.models import Webhook, WebhookDelivery
from fleet.webhooks import outbound
from fleet.webhooks.delivery import deliver
from fleet.webhooks.requests import create_webhook, send_test
from tests.fixtures.http_server import QuietHTTPServer

State = WebhookDelivery.State
SECRET_ANSWER = "postgres: password=hunter2 for user switchyard"

REFUSED_URLS = [
    ("http://127.0.0.1:5432/", "127.0.0.1 is loopback"),
    ("http://localhost/admin", "localhost is a local host name"),
    ("http://LOCALHOST./admin", "localhost is a local host name"),
    ("http://api.localhost/", "api.localhost is a local host name"),
    ("http://[::1]/", "::1 is loopback"),
    ("http://169.254.169.254/latest/meta-data/iam/", "169.254.169.254 is a cloud metadata"),
    ("http://metadata.google.internal/computeMetadata/v1/", "local host name"),
    ("http://[fd00:ec2::254]/", "cloud metadata"),
    ("http://0.0.0.0:6379/", "0.0.0.0 is unspecified"),
    ("http://2130706433/", "127.0.0.1 is loopback"),
    ("http://127.1/", "127.0.0.1 is loopback"),
    ("http://0x7f.1/", "127.0.0.1 is loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback (it carries 127.0.0.1)"),
    ("http://10.0.0.1/", "10.0.0.1 is private"),
    ("http://172.16.5.4:8080/", "172.16.5.4 is private"),
    ("http://192.168.1.10/", "192.168.1.10 is private"),
    ("http://[fc00::1]/", "fc00::1 is private"),
    ("http://169.254.1.1/", "169.254.1.1 is link-local"),
    ("http://[fe80::1]/", "fe80::1 is link-local"),
    ("http://224.0.0.251/", "224.0.0.251 is multicast"),
    ("http://240.0.0.1/", "240.0.0.1 is reserved"),
    ("http://100.64.0.1/", "shared"),
    ("https://user:pass@hooks.example.com/", "user name or password"),
    ("https://token@hooks.example.com/", "user name or password"),
]


@pytest.fixture(autouse=True)
def nothing_allowed(settings) -> None:
    settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS = []


@pytest.fixture
def receiver() -> Iterator[dict[str, Any]]:
    """A receiver on 127.0.0.1 that answers 200 with something a tenant must not read."""
    seen: dict[str, Any] = {"requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen["requests"].append({"path": self.path, "host": self.headers.get("Host")})
            answer = SECRET_ANSWER.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = QuietHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    seen["port"] = server.server_address[1]
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    queued: list[int] = []
    monkeypatch.setattr("console.celery.send_now", lambda task, *args: queued.append(args[0]))
    return queued


@pytest.fixture
def dns(monkeypatch) -> dict[str, list[list[str]]]:
    """Answers for names under example.com, one list of addresses per lookup (the last one
    repeats); every other host resolves as usual. ``dns["asked"]`` counts the lookups."""
    answers: dict[str, list[list[str]]] = {"asked": []}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in answers or kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return real(host, port, *args, **kwargs)
        answers["asked"].append(name)
        queue = answers[name]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port or 0)) for a in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


def slipped_in(tenant, url: str) -> Webhook:
    """A webhook row written directly (before this check existed, or by hand)."""
    return Webhook.objects.create(tenant=tenant, name="old", url=url, secret="whsec_x" * 6)


def ping(alice, webhook: Webhook) -> WebhookDelivery:
    delivery = send_test(alice, webhook)
    deliver(delivery.pk)
    delivery.refresh_from_db()
    return delivery


# --- refused when saved ------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "why"), REFUSED_URLS)
def test_the_api_refuses_a_webhook_to_a_non_public_address(alice, tenant_a, client_for, url, why):
    response = client_for(alice).post("/api/v1/webhooks/", {"name": "ops", "url": url},
                                      format="json")

    assert response.status_code == 400, response.content
    assert list(response.json()) == ["url"]
    assert why in response.json()["url"][0]
    assert not Webhook.objects.exists()


def test_the_api_refuses_moving_a_webhook_to_a_non_public_address(alice, tenant_a, client_for):
    webhook = create_webhook(alice, tenant_a, name="ops",
                             url="https://hooks.example.com/switchyard").webhook
    api = client_for(alice)

    for url, why in REFUSED_URLS:
        response = api.patch(f"/api/v1/webhooks/{webhook.pk}/", {"url": url}, format="json")
        assert response.status_code == 400, (url, response.content)
        assert list(response.json()) == ["url"] and why in response.json()["url"][0]
    put = api.put(f"/api/v1/webhooks/{webhook.pk}/",
                  {"name": "ops", "url": "http://127.0.0.1:6379/"}, format="json")
    assert put.status_code == 400 and list(put.json()) == ["url"]

    webhook.refresh_from_db()
    assert webhook.url == "https://hooks.example.com/switchyard"


def test_the_console_form_refuses_what_the_api_refuses(alice, tenant_a, client):
    client.force_login(alice)

    page = client.post(reverse("fleet:webhook-create"), {
        "tenant": "tenant-a", "name": "ops", "url": "http://169.254.169.254/latest/",
        "format": "json"})

    assert page.status_code == 400
    text = page.content.decode()
    assert 'id="url-error"' in text and "169.254.169.254 is a cloud metadata address" in text
    assert not Webhook.objects.exists()


def test_a_public_host_is_taken(alice, tenant_a, client_for):
    response = client_for(alice).post(
        "/api/v1/webhooks/", {"name": "ops", "url": "https://hooks.example.com:8443/x"},
        format="json")

    assert response.status_code == 201, response.content


# --- refused at delivery, after DNS --------------------------------------------------------------


def test_a_local_name_that_slipped_in_is_refused_at_delivery(alice, tenant_a, receiver, sent):
    webhook = slipped_in(tenant_a, f"http://localhost:{receiver['port']}/hook")

    delivery = ping(alice, webhook)

    assert receiver["requests"] == []
    assert delivery.state == State.FAILED and delivery.response_status is None
    assert delivery.response_excerpt == (
        "localhost is a local host name: give a public host")


@pytest.mark.parametrize("answer", [["127.0.0.1"], ["93.184.216.34", "10.1.2.3"]])
def test_a_name_resolving_to_a_private_address_is_refused_at_delivery(
    alice, bob, tenant_a, client_for, receiver, sent, dns, answer,
):
    """GIVEN a webhook saved while its name was public, WHEN DNS now answers a loopback or
    private address (among others), THEN the delivery fails at once, readably, and nothing
    is sent anywhere."""
    dns["hooks.example.com"] = [answer]
    webhook = create_webhook(
        alice, tenant_a, name="ops", url=f"http://hooks.example.com:{receiver['port']}/hook",
    ).webhook

    delivery = ping(alice, webhook)

    assert receiver["requests"] == []
    assert (delivery.state, delivery.attempts, delivery.next_attempt_at) == (State.FAILED, 1, None)
    bad = answer[-1]
    kind = "loopback" if bad == "127.0.0.1" else "private"
    assert delivery.response_excerpt == f"address refused: {bad} is {kind}"
    [row] = client_for(bob).get(f"/api/v1/webhooks/{webhook.pk}/deliveries/").json()["results"]
    assert (row["state"], row["error"]) == ("failed", f"address refused: {bad} is {kind}")


def test_the_checked_address_is_the_one_connected_to(alice, tenant_a, receiver, sent, dns,
                                                     monkeypatch):
    """DNS rebinding: the name resolves to an address that passes the check, and would
    resolve to another one a moment later; the POST goes to the checked address, once looked
    up, with the name in its Host header."""
    monkeypatch.setattr(outbound, "refusal", lambda address: "")  # 127.0.0.1 passes, here
    dns["rebind.example.com"] = [["127.0.0.1"], ["192.0.2.1"]]
    webhook = create_webhook(
        alice, tenant_a, name="ops", url=f"http://rebind.example.com:{receiver['port']}/hook",
    ).webhook

    delivery = ping(alice, webhook)

    assert delivery.state == State.DELIVERED
    assert dns["asked"] == ["rebind.example.com"]
    assert receiver["requests"] == [
        {"path": "/hook", "host": f"rebind.example.com:{receiver['port']}"}]


def test_a_name_that_does_not_resolve_is_retried(alice, tenant_a, sent, dns):
    dns["gone.example.com"] = [[]]
    webhook = create_webhook(alice, tenant_a, name="ops",
                             url="https://gone.example.com/hook").webhook

    delivery = ping(alice, webhook)

    assert delivery.state == State.PENDING and delivery.next_attempt_at is not None
    assert delivery.response_excerpt == "could not resolve gone.example.com: no address"


# --- the platform's allowed hosts -------------------------------------------------------------


def test_a_host_the_platform_allows_is_reached(alice, tenant_a, client_for, receiver, sent,
                                               settings):
    port = receiver["port"]
    settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS = ["receiver.internal", f"127.0.0.1:{port}"]
    api = client_for(alice)

    other_port = api.post("/api/v1/webhooks/", {"name": "ops", "url": "http://127.0.0.1:5432/"},
                          format="json")
    created = api.post("/api/v1/webhooks/",
                       {"name": "ops", "url": f"http://127.0.0.1:{port}/hook"}, format="json")

    assert other_port.status_code == 400 and list(other_port.json()) == ["url"]
    assert created.status_code == 201, created.content
    delivery = ping(alice, Webhook.objects.get(pk=created.json()["id"]))
    assert delivery.state == State.DELIVERED
    assert len(receiver["requests"]) == 1


# --- the answer is never kept or shown ---------------------------------------------------------


def test_the_receivers_answer_is_neither_kept_nor_shown(alice, bob, tenant_a, client_for, client,
                                                        receiver, sent, settings):
    settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    webhook = create_webhook(alice, tenant_a, name="ops",
                             url=f"http://127.0.0.1:{receiver['port']}/hook").webhook

    delivery = ping(alice, webhook)

    assert (delivery.state, delivery.response_status, delivery.response_excerpt) == (
        State.DELIVERED, 200, "")
    log = client_for(bob).get(f"/api/v1/webhooks/{webhook.pk}/deliveries/")
    assert log.status_code == 200
    [row] = log.json()["results"]
    assert (row["response_status"], row["error"]) == (200, "")
    assert "response_excerpt" not in row
    assert "hunter2" not in log.content.decode()
    client.force_login(alice)
    page = client.get(reverse("fleet:webhook", kwargs={"pk": webhook.pk})).content.decode()
    assert "delivered" in page and "hunter2" not in page
