"""Delivering tenant webhooks: notifications of rollout state changes, approvals needed,
rollbacks and quota requests.

``fleet.webhooks.events.emit()`` queues one delivery per active webhook of the tenant that
listens to the event, in the caller's transaction, and hands each to a worker once it commits.
``deliver()`` makes one
attempt: it claims the row (a conditional UPDATE, so two workers never send one delivery at
once), POSTs outside any transaction and records the answer. A 2xx answer delivers it; anything
else (another status, a refused connection, a timeout) is retried after 2, 4, 8, 16, ... s
(``SWITCHYARD_WEBHOOK_BACKOFF_S`` doubled each time) until ``SWITCHYARD_WEBHOOK_MAX_ATTEMPTS``
attempts, then the delivery fails. Beat's ``fleet.tasks.retry_webhook_deliveries`` sends what
is due, so no worker ever sleeps between attempts.

Signing: each POST carries ``X-Switchyard-Timestamp`` (Unix seconds) and
``X-Switchyard-Signature: sha256=<hex>``, the HMAC-SHA256 of ``f"{timestamp}.{body}"`` keyed
with the webhook's secret. ``verify()`` is what a receiver runs (docs/api.md, "Webhooks").

Where a webhook may point (``fleet.webhooks.outbound``): a public address only, checked when the URL is
saved and again at each attempt, after DNS, whose checked address is the one connected to. A
host named in ``SWITCHYARD_WEBHOOK_ALLOWED_HOSTS`` skips the check (the tests' receivers on
127.0.0.1). A refused address fails the delivery at once, with the reason. What a receiver
answers is never kept or shown, only its status: a tenant must not read, through a delivery
log, what some address inside the network says.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from fleet.adapters.base import http_client
from fleet.models import Webhook, WebhookDelivery
from fleet.webhooks import outbound
from fleet.webhooks.events import PING

REASON_CHARS = 500  # WebhookDelivery.response_excerpt: Switchyard's reason, never the answer
USER_AGENT = "Switchyard-Webhooks/1"
State = WebhookDelivery.State


# --------------------------------------------------------------------------------------------
# Signatures
# --------------------------------------------------------------------------------------------


def sign(secret: str, timestamp: int | str, body: bytes | str) -> str:
    """``sha256=`` + hex HMAC-SHA256 of ``f"{timestamp}.{body}"`` keyed with ``secret``."""
    raw = body.encode() if isinstance(body, str) else body
    message = f"{timestamp}.".encode() + raw
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(
    secret: str, timestamp: int | str, body: bytes | str, signature: str,
    *, max_age_s: float | None = None, now: float | None = None,
) -> bool:
    """Whether ``signature`` was made with ``secret`` for this timestamp and body (compared in
    constant time). With ``max_age_s``, a timestamp further than that from ``now`` is refused
    too, so a captured request cannot be replayed later."""
    if max_age_s is not None:
        try:
            age = abs((time.time() if now is None else now) - int(timestamp))
        except (TypeError, ValueError):
            return False
        if age > max_age_s:
            return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


# --------------------------------------------------------------------------------------------
# Delivering
# --------------------------------------------------------------------------------------------


def body_of(delivery: WebhookDelivery) -> bytes:
    """The bytes POSTed for ``delivery``: the same on every attempt (only the timestamp and
    signature headers change)."""
    webhook = delivery.webhook
    tenant = webhook.tenant.slug
    if webhook.format == Webhook.Format.SLACK:
        document: dict[str, Any] = slack_message(delivery)
    elif webhook.format == Webhook.Format.PAGERDUTY:
        document = pagerduty_event(delivery)
    else:
        document = {
            "id": delivery.pk, "event": delivery.event, "tenant": tenant,
            "created_at": delivery.created_at.isoformat().replace("+00:00", "Z"),
            "summary": delivery.summary, "data": delivery.payload,
        }
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


SLACK_FIELDS = ("deployment", "model", "state", "previous_state", "candidate", "baseline", "reason")


def slack_message(delivery: WebhookDelivery) -> dict[str, Any]:
    """An incoming-webhook message: ``text`` (the summary, also the notification) and blocks."""
    text = delivery.summary or f"{delivery.event} in {delivery.webhook.tenant.slug}"
    data = delivery.payload if isinstance(delivery.payload, dict) else {}
    fields = [
        {"type": "mrkdwn", "text": f"*{key.replace('_', ' ')}*\n{data[key]}"}
        for key in SLACK_FIELDS if data.get(key) not in (None, "")
    ]
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    if fields:
        blocks.append({"type": "section", "fields": fields[:10]})
    blocks.append({"type": "context", "elements": [{
        "type": "mrkdwn",
        "text": f"`{delivery.event}` · tenant {delivery.webhook.tenant.slug} · delivery {delivery.pk}",
    }]})
    return {"text": text, "blocks": blocks}


#: PagerDuty severities by event: what needs a person now, what is worth a look.
PAGERDUTY_SEVERITY = {"rollout.rolled_back": "warning", "rollout.approval_needed": "info"}


def pagerduty_event(delivery: WebhookDelivery) -> dict[str, Any]:
    """A PagerDuty Events API v2 event. An event that carries a ``dedup_key`` (an SLO alert)
    triggers with it and its resolution resolves the same incident; any other event
    triggers an incident of its own (``severity`` from the event, else by its name)."""
    webhook = delivery.webhook
    data = delivery.payload if isinstance(delivery.payload, dict) else {}
    dedup_key = data.get("dedup_key") or f"switchyard-{webhook.tenant.slug}-{delivery.pk}"
    action = "resolve" if data.get("state") == "resolved" and data.get("dedup_key") else "trigger"
    document: dict[str, Any] = {"routing_key": webhook.routing_key, "event_action": action,
                                "dedup_key": dedup_key}
    if action == "trigger":
        source = "/".join(str(p) for p in ("switchyard", webhook.tenant.slug, data.get("deployment")) if p)
        document["payload"] = {
            "summary": (delivery.summary or f"{delivery.event} in {webhook.tenant.slug}")[:1024],
            "source": source,
            "severity": data.get("severity") or PAGERDUTY_SEVERITY.get(delivery.event, "info"),
            "timestamp": delivery.created_at.isoformat().replace("+00:00", "Z"),
            "component": data.get("deployment") or None,
            "group": webhook.tenant.slug,
            "class": delivery.event,
            "custom_details": data,
        }
    return document


def backoff(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed attempt: base, 2 * base, 4 * base, ..."""
    return timedelta(seconds=settings.SWITCHYARD_WEBHOOK_BACKOFF_S * 2 ** (attempts - 1))


def claim_lease() -> timedelta:
    # Long enough for one POST to time out and its answer to be recorded.
    return timedelta(seconds=settings.SWITCHYARD_WEBHOOK_TIMEOUT_S * 2 + 10)


def due_deliveries(now: datetime | None = None, limit: int = 500) -> list[int]:
    """Pending deliveries whose next attempt is due (claimed ones are not: their lease is
    ``next_attempt_at``)."""
    now = now or timezone.now()
    return list(
        WebhookDelivery.objects.filter(state=State.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at", "pk").values_list("pk", flat=True)[:limit]
    )


def deliver(delivery_id: int) -> str:
    """Make one attempt at ``delivery_id`` if it is due; return its state afterwards.

    Safe to call twice, or from two workers at once: only the one whose conditional UPDATE
    claims the row sends; the other, and any call for a delivery not due, changes nothing.
    """
    now = timezone.now()
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, state=State.PENDING, next_attempt_at__lte=now
    ).update(attempts=F("attempts") + 1, next_attempt_at=now + claim_lease())
    delivery = WebhookDelivery.objects.select_related("webhook__tenant").filter(pk=delivery_id).first()
    if delivery is None:
        return ""
    if claimed != 1:
        return delivery.state  # another worker got there first, or it is not due, or done
    webhook = delivery.webhook
    if not webhook.active and delivery.event != PING:
        return _record(delivery, now, failed_why="the webhook was deactivated")
    if delivery.attempts > settings.SWITCHYARD_WEBHOOK_MAX_ATTEMPTS:
        # The worker of the last attempt was lost before it recorded anything.
        return _record(delivery, now, failed_why="no answer was recorded for the last attempt")
    started = time.monotonic()
    try:
        target, addresses = outbound.resolve(
            webhook.url, allowed_hosts=settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS)
    except outbound.Refused as exc:
        # Not worth another try: the address is not one we send to.
        return _record(delivery, timezone.now(), failed_why=exc.message,
                       duration_ms=_ms(started))
    except outbound.Unresolved as exc:
        return _record(delivery, timezone.now(), reason=str(exc), duration_ms=_ms(started))
    status, reason = _post(delivery, target, addresses)
    return _record(delivery, timezone.now(), status=status, reason=reason,
                   duration_ms=_ms(started))


def _post(
    delivery: WebhookDelivery, target: outbound.Target, addresses: list[str],
) -> tuple[int | None, str]:
    """POST the delivery once, outside any transaction, to the first of ``addresses`` that
    takes the connection (none: an allowed host, reached as the URL says): (status, "") or
    (None, why there was no answer). The answer's body is not read."""
    return _send(delivery.webhook, body_of(delivery), delivery.event, target, addresses,
                 {"X-Switchyard-Delivery": str(delivery.pk)})


def ask(webhook: Webhook, event: str, data: dict[str, Any], summary: str = "") -> tuple[int | None, str]:
    """POST one signed JSON document to ``webhook`` now and return its answer: (status, "")
    or (None, why there was none). For gates that wait on a receiver's say (a rollout's
    confirm step): not queued, not retried (the caller asks again), the same fence as every
    delivery (a refused address is (None, the reason)); what the receiver says is not read,
    only its status."""
    document = {"event": event, "tenant": webhook.tenant.slug, "summary": summary, "data": data,
                "created_at": timezone.now().isoformat().replace("+00:00", "Z")}
    body = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    try:
        target, addresses = outbound.resolve(
            webhook.url, allowed_hosts=settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS)
    except outbound.Refused as exc:
        return None, exc.message
    except outbound.Unresolved as exc:
        return None, str(exc)
    return _send(webhook, body, event, target, addresses, {})


def _send(webhook: Webhook, body: bytes, event: str, target: outbound.Target,
          addresses: list[str], extra_headers: dict[str, str]) -> tuple[int | None, str]:
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Switchyard-Event": event,
        **extra_headers,
        "X-Switchyard-Timestamp": str(timestamp),
        "X-Switchyard-Signature": sign(webhook.secret, timestamp, body),
    }
    timeout = settings.SWITCHYARD_WEBHOOK_TIMEOUT_S
    # No proxy from the environment: the connection must go to the address checked.
    with http_client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        reason = ""
        for address in addresses or [None]:
            url, extra, extensions = (
                outbound.pinned(target, address) if address else (target.url, {}, {}))
            try:
                with client.stream("POST", url, content=body, headers={**headers, **extra},
                                   extensions=extensions) as response:
                    return response.status_code, ""
            except httpx.ConnectError as exc:
                reason = f"could not connect: {_reason(exc)}"  # the next address, if any
            except httpx.TimeoutException:
                return None, f"no answer within {timeout:g} s"
            except httpx.HTTPError as exc:
                return None, f"{type(exc).__name__}: {_reason(exc)}"
    return None, reason


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    # "[Errno 111] Connection refused" reads better without the number.
    if text.startswith("[Errno ") and "] " in text:
        text = text.split("] ", 1)[1]
    return text[:REASON_CHARS]


def _ms(started: float) -> int:
    return max(0, round((time.monotonic() - started) * 1000))


def _record(
    delivery: WebhookDelivery, now: datetime, *, status: int | None = None, reason: str = "",
    duration_ms: int | None = None, failed_why: str = "",
) -> str:
    """Write the attempt's outcome, unless another worker took the row over meanwhile (our
    lease ran out and its attempt counter moved on). ``reason``/``failed_why`` are
    Switchyard's words for why there was no answer; a receiver's answer is never stored."""
    fields: dict[str, Any] = {"response_status": status, "duration_ms": duration_ms,
                              "response_excerpt": (failed_why or reason)[:REASON_CHARS]}
    if failed_why:
        fields.update(state=State.FAILED, next_attempt_at=None)
    elif status is not None and 200 <= status < 300:
        fields.update(state=State.DELIVERED, next_attempt_at=None, delivered_at=now)
    elif delivery.attempts >= settings.SWITCHYARD_WEBHOOK_MAX_ATTEMPTS:
        fields.update(state=State.FAILED, next_attempt_at=None)
    else:
        fields.update(next_attempt_at=now + backoff(delivery.attempts))
    WebhookDelivery.objects.filter(
        pk=delivery.pk, state=State.PENDING, attempts=delivery.attempts
    ).update(**fields)
    delivery.refresh_from_db()
    return delivery.state
