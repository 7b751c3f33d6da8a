"""Managing a tenant's webhooks (the API and the console call these): create, change, delete
and test one, with the checks both share (the name, the URL behind the outbound fence of
``fleet.webhooks.outbound``, the events, the format). Every change is audited; a test ping is
queued like any delivery."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.models import Membership, Tenant, Webhook, WebhookDelivery
from fleet.tenancy.scoping import require_role
from fleet.tenancy.tokens import person_id
from fleet.webhooks import outbound
from fleet.webhooks.events import EVENTS, PING, queue_delivery

SECRET_PREFIX = "whsec_"


@dataclass(frozen=True)
class CreatedWebhook:
    webhook: Webhook
    secret: str  # shown this once


def validate_url(url: str) -> str:
    """An absolute http:// or https:// URL with a host and no credentials, whose host is not
    local, loopback, private or otherwise not public (``fleet.webhooks.outbound.check_url``) unless
    ``SWITCHYARD_WEBHOOK_ALLOWED_HOSTS`` names it; else DomainError on ``url``."""
    url = url.strip()
    problem = ""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is no number or out of range
    except ValueError as exc:
        problem, port = f"not a valid URL ({exc})", None
    if not problem:
        if parts.scheme not in ("http", "https"):
            problem = "must start with http:// or https://"
        elif not parts.hostname:
            problem = "must name a host, e.g. https://hooks.example.com/switchyard"
        elif any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
            problem = "must not contain spaces or control characters"
        elif len(url) > 2000:
            problem = "must be at most 2000 characters"
        elif port == 0:
            problem = "port 0 is not a port"
    if problem:
        raise DomainError(problem, field="url")
    outbound.check_url(url, allowed_hosts=settings.SWITCHYARD_WEBHOOK_ALLOWED_HOSTS, field="url")
    return url


def validate_events(events: list[str]) -> list[str]:
    """Known event names, each once, in the order given; empty means every event."""
    seen: list[str] = []
    for event in events:
        if event not in EVENTS:
            known = ", ".join(EVENTS)
            raise DomainError(f"unknown event {event!r}: choose among {known}", field="events")
        if event not in seen:
            seen.append(event)
    return seen


def _validate_name(tenant: Tenant, name: str, exclude: int | None = None) -> str:
    if not name or len(name) > 100:
        raise DomainError("give the webhook a name of 1 to 100 characters", field="name")
    if Webhook.objects.filter(tenant=tenant, name=name).exclude(pk=exclude).exists():
        raise Conflict(f"a webhook named {name!r} already exists", field="name")
    return name


def _validate_format(value: str) -> str:
    if value not in Webhook.Format.values:
        raise DomainError(f"must be one of {', '.join(Webhook.Format.values)}", field="format")
    return value


AUDITED = ["name", "url", "events", "format", "active"]
ROUTING_KEY = re.compile(r"[A-Za-z0-9]{1,64}")


def _validate_routing_key(value: str, format: str) -> str:
    value = (value or "").strip()
    if format != Webhook.Format.PAGERDUTY:
        if value:
            raise DomainError("only a pagerduty webhook takes a routing key", field="routing_key")
        return ""
    if not ROUTING_KEY.fullmatch(value):
        raise DomainError("give the PagerDuty service's integration key (Events API v2): 1 to 64 "
                          "letters and digits", field="routing_key")
    return value


def create_webhook(
    actor: Any, tenant: Tenant, *, name: str, url: str, events: list[str] | None = None,
    format: str = Webhook.Format.JSON, active: bool = True, routing_key: str = "",
) -> CreatedWebhook:
    """Make a webhook with a fresh secret. Needs the admin role in the tenant."""
    require_role(actor, tenant, Membership.Role.ADMIN)
    fields = {
        "name": _validate_name(tenant, name), "url": validate_url(url),
        "events": validate_events(events or []), "format": _validate_format(format),
        "active": active,
    }
    fields["routing_key"] = _validate_routing_key(routing_key, fields["format"])
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        webhook = Webhook.objects.create(
            tenant=tenant, secret=secret, created_by_id=person_id(actor), **fields,
        )
        audit.record(actor, "created", webhook, tenant=tenant,
                     after=audit.snapshot(webhook, AUDITED))
    return CreatedWebhook(webhook=webhook, secret=secret)


def update_webhook(actor: Any, webhook: Webhook, **changes: Any) -> Webhook:
    """Change any of name, url, events, format, active and routing_key. Needs the admin role."""
    require_role(actor, webhook.tenant, Membership.Role.ADMIN)
    unknown = set(changes) - {*AUDITED, "routing_key"}
    if unknown:
        raise DomainError(f"cannot change {', '.join(sorted(unknown))}", field=sorted(unknown)[0])
    checks = {
        "name": lambda v: _validate_name(webhook.tenant, v, exclude=webhook.pk),
        "url": validate_url, "events": validate_events, "format": _validate_format,
        "active": bool,
    }
    clean = {key: checks[key](value) for key, value in changes.items() if key != "routing_key"}
    format = clean.get("format", webhook.format)
    if "routing_key" in changes:
        clean["routing_key"] = _validate_routing_key(changes["routing_key"], format)
    elif format != webhook.format:  # leaving the pagerduty format drops its key; coming to it needs one
        clean["routing_key"] = _validate_routing_key("" if format != Webhook.Format.PAGERDUTY
                                                     else webhook.routing_key, format)
    changed = [key for key, value in clean.items() if getattr(webhook, key) != value]
    if not changed:
        return webhook
    # The routing key is a credential: the audit says it changed, never what it is.
    shown = [key for key in changed if key != "routing_key"]
    before = audit.snapshot(webhook, shown)
    with transaction.atomic():
        for key in changed:
            setattr(webhook, key, clean[key])
        webhook.save(update_fields=changed)
        after = audit.snapshot(webhook, shown)
        if "routing_key" in changed:
            after["routing_key"] = "changed"
        audit.record(actor, "updated", webhook, tenant=webhook.tenant, before=before, after=after)
    return webhook


def delete_webhook(actor: Any, webhook: Webhook) -> None:
    """Delete a webhook and its delivery log. Needs the admin role."""
    require_role(actor, webhook.tenant, Membership.Role.ADMIN)
    with transaction.atomic():
        audit.record(actor, "deleted", webhook, tenant=webhook.tenant,
                     before=audit.snapshot(webhook, AUDITED))
        webhook.delete()


def send_test(actor: Any, webhook: Webhook) -> WebhookDelivery:
    """Queue a ``ping`` to this one webhook, active or not, whatever its events."""
    require_role(actor, webhook.tenant, Membership.Role.ADMIN)
    payload = {"tenant": webhook.tenant.slug, "webhook": webhook.name,
               "requested_by": audit.actor_label(actor)}
    summary = f"Test message from Switchyard for webhook {webhook.name}"
    with transaction.atomic():
        return queue_delivery(webhook, PING, payload, summary)
