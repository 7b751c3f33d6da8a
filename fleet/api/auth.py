"""Bearer-token authentication for tenant API tokens."""

from __future__ import annotations

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from fleet import tokens
from fleet.models import APIToken
from fleet.tenancy import TokenUser


class APITokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer sy_…``. Answers 401 with the reason for a bad token."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[TokenUser, APIToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() not in ("bearer", "token"):
            return None
        raw = raw.strip()
        if not raw:
            raise exceptions.AuthenticationFailed("Authorization header has no token")
        token, why = tokens.authenticate(raw)
        if token is None:
            raise exceptions.AuthenticationFailed(why)
        return TokenUser(token), token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
