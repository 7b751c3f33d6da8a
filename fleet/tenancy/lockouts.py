"""Brute-force protection: logins (through django-axes) and API tokens (a counter in Redis).

Logins, on the console and in the admin, are refused for ``SWITCHYARD_LOGIN_COOLOFF_S`` once an
account, or an address, has failed ``SWITCHYARD_LOGIN_FAILURE_LIMIT`` times (axes counts in the
database; its admin page and ``manage.py axes_reset_username`` unlock early). Each refused
attempt during a lockout starts the cool-off again, so a guesser who keeps trying stays out.
API requests from an address that sent ``SWITCHYARD_TOKEN_FAILURE_LIMIT`` malformed or unknown
tokens are answered 429 for the same cool-off, valid tokens included: otherwise the answer to a
guess would still tell a right guess from a wrong one. Expired and revoked tokens do not count
(only their holder could send them). Each lockout is written once to the audit log.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from typing import Any

import redis
from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth import get_user_model
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.timesince import timeuntil

from fleet.models import AuditEvent

log = logging.getLogger(__name__)


def client_ip(request: HttpRequest) -> str | None:
    """The client's address: the socket's, or, only behind a proxy that is trusted
    (``SWITCHYARD_TRUST_PROXY_HEADERS``), the last X-Forwarded-For entry, the one it added.

    None when there is no valid address (a login made in code, not over HTTP): axes stores
    the address in an IP address column, which refuses anything else.
    """
    candidate = request.META.get("REMOTE_ADDR", "")
    if settings.SWITCHYARD_TRUST_PROXY_HEADERS:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        if hops:
            candidate = hops[-1]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return None


def _cooloff_words() -> str:
    now = timezone.now()
    return timeuntil(now + settings.AXES_COOLOFF_TIME, now)


def _record(verb: str, *, address: str, object_type: str, object_id: str, subject: str,
            after: dict[str, Any], reason: str) -> None:
    """An audit event for platform admins (no tenant): the actor is the client's address."""
    AuditEvent.objects.create(
        tenant=None,
        actor_label=f"anonymous from {address}"[:200],
        verb=verb,
        object_type=object_type,
        object_id=object_id,
        object_repr=subject[:300],
        after=after,
        reason=reason,
    )


# --- logins -----------------------------------------------------------------------------------


def login_refused_message() -> str:
    return (
        "Too many failed logins for this account or from this address. Logins are refused for "
        f"{_cooloff_words()}; wait, or ask a platform admin to unlock the account."
    )


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    """What a locked-out login gets, on the console and in the admin: the login page with the
    reason, answered 429 (django-axes' AXES_LOCKOUT_CALLABLE)."""
    return render(
        request,
        "registration/login.html",
        {"locked_out": login_refused_message(), "next": request.POST.get("next", "")},
        status=429,
    )


@receiver(user_locked_out)
def audit_login_lockout(sender: Any, request: HttpRequest, username: str | None,
                        ip_address: str | None, **kwargs: Any) -> None:
    # axes signals every refused attempt; the audit log keeps the moment the lock closed.
    failures = getattr(request, "axes_failures_since_start", None)
    if failures != settings.AXES_FAILURE_LIMIT:
        return
    user = get_user_model().objects.filter(username=username or "").first()
    _record(
        "locked_out",
        address=ip_address or "unknown",
        object_type="auth.user",
        object_id=str(user.pk) if user else "",
        subject=username or "",
        after={"username": username or "", "ip_address": ip_address or "", "failures": failures,
               "path": request.path},
        reason=f"{failures} failed logins; refused for {_cooloff_words()}",
    )


# --- API tokens -------------------------------------------------------------------------------


@functools.cache
def _client(url: str) -> redis.Redis:
    # One client (and connection pool) per process and URL: every API request with a token
    # asks it, and a new client per request would open and close a connection each time.
    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)


def _redis() -> redis.Redis:
    return _client(settings.REDIS_URL)


def _token_key(address: str) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:token-failures:{address}"


def token_lockout_left_s(address: str) -> int:
    """Seconds this address stays refused, 0 when it is not. Without Redis, nobody is refused
    (logged): an outage of the counter must not stop the API."""
    try:
        store = _redis()
        count = int(store.get(_token_key(address)) or 0)
        if count < settings.SWITCHYARD_TOKEN_FAILURE_LIMIT:
            return 0
        return max(int(store.ttl(_token_key(address))), 1)
    except redis.RedisError as exc:
        log.warning("token failure counter unavailable, not throttling: %s", exc)
        return 0


def token_failed(address: str, why: str) -> None:
    """Count a malformed or unknown token from ``address``; audit when the lock closes."""
    try:
        with _redis().pipeline() as pipe:
            pipe.incr(_token_key(address))
            pipe.expire(_token_key(address), int(settings.AXES_COOLOFF_TIME.total_seconds()))
            count, _ = pipe.execute()
    except redis.RedisError as exc:
        log.warning("token failure counter unavailable: %s", exc)
        return
    if count == settings.SWITCHYARD_TOKEN_FAILURE_LIMIT:
        _record(
            "locked_out",
            address=address,
            object_type="fleet.apitoken",
            object_id="",
            subject="API tokens",
            after={"ip_address": address, "failures": count, "last_reason": why},
            reason=f"{count} invalid API tokens; refused for {_cooloff_words()}",
        )
