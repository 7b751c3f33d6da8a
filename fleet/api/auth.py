"""Bearer-token authentication for tenant API tokens."""

from __future__ import annotations

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from fleet.models import APIToken
from fleet.tenancy import lockouts, tokens
from fleet.tenancy.scoping import TokenUser


class TooManyInvalidTokens(exceptions.Throttled):
    """429 with Retry-After, for an address locked out by ``fleet.tenancy.lockouts``."""

    default_detail = "Too many invalid API tokens from this address."
    extra_detail_singular = "Try again in {wait} second."
    extra_detail_plural = "Try again in {wait} seconds."


class APITokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer sy_…``. Answers 401 with the reason for a bad token, and 429 to
    an address that sent too many malformed or unknown tokens (``fleet.tenancy.lockouts``)."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[TokenUser, APIToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() not in ("bearer", "token"):
            return None
        address = lockouts.client_ip(request) or "unknown"
        wait = lockouts.token_lockout_left_s(address)
        if wait:
            raise TooManyInvalidTokens(wait)
        raw = raw.strip()
        if not raw:
            raise exceptions.AuthenticationFailed("Authorization header has no token")
        token, why = tokens.authenticate(raw)
        if token is None:
            if why in ("malformed token", "invalid token"):
                lockouts.token_failed(address, why)
            raise exceptions.AuthenticationFailed(why)
        return TokenUser(token), token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
