"""What one sample is: the record one request through a route leaves (nginx's line or an Envoy
gateway's, parsed), and the errors of a line that cannot be one. Apart from
:mod:`rollouts.traffic.samples` (parsing, storage, summaries), so that the Envoy line mapper
(:mod:`rollouts.traffic.envoy_samples`) and the parser both use them without importing each
other."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache

ROUTE_NAME = re.compile(r"^dep-([1-9][0-9]{0,17})$")
VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # as fleet.adapters.routers.base
MAX_PATH = 512
# What a member stored before the newer values existed has instead: key, header_ms, stream,
# first_ms, tokens.
MEMBER_DEFAULTS = ("", None, 0, None, None)
MAX_KEY = 256  # characters of a sticky header's value read (nginx logs at most this many)


class SampleError(ValueError):
    """A line that is not a valid sample; the message says what is wrong with it."""


class Unmapped(SampleError):
    """A gateway's line whose route is not in force on a Kubernetes gateway, or whose backend
    is none of the route's variants (counted ``unmapped``)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One request through a route (or one mirrored copy of it).

    ``t``: when nginx finished it (epoch seconds, millisecond precision). ``latency_ms``:
    nginx's ``request_time``, what the client waited, from its first byte read to the last
    byte sent. ``upstream_ms``: the server's part (``upstream_response_time``, None when no
    server was reached). ``status``: what the client got; ``upstream_status``: what the
    server answered ("" when none did).

    ``key``: on a sticky route, who the request was for: a short keyed hash of the sticky
    header's value (:func:`split_key`; never the value itself), so that an A/B split can be
    judged per user; "" on other routes, for a request without the header, for a mirrored
    copy and for an Envoy gateway's line. ``header_ms``: the server's time to its response
    header (nginx's ``upstream_header_time``, Envoy's ``RESPONSE_DURATION``), for a streamed
    answer the time to its first token; None when no server answered. ``stream``: the server
    answered ``text/event-stream`` (a streamed answer).

    On an LLM route of a router that times tokens (nginx with its Lua module): ``first_ms``,
    the time from the request's start to the answer's first streamed event, as the router sent
    it (the client's time to first token), and ``tokens``, how many tokens the answer had (its
    usage's ``completion_tokens``, else its events); None for an answer that streamed nothing
    and on other routers.

    Members stored before ``key``, ``header_ms`` and ``stream`` existed still load, with
    these defaults, as do those stored before ``first_ms`` and ``tokens``.
    """

    t: float
    deployment_id: int
    variant: str
    mirror: bool
    status: int
    latency_ms: float
    upstream_ms: float | None
    bytes: int
    upstream_status: str
    upstream_addr: str
    method: str
    path: str
    request_id: str
    key: str = ""
    header_ms: float | None = None
    stream: bool = False
    first_ms: float | None = None
    tokens: int | None = None

    @property
    def upstream_failed(self) -> bool:
        """The server answered 5xx, or no server answered at all."""
        codes = status_codes(self.upstream_status)
        return not codes or any(code >= 500 for code in codes)

    @property
    def is_error(self) -> bool:
        """A 4xx or 5xx for the client, or a failed upstream."""
        return self.status >= 400 or self.upstream_failed

    def to_member(self) -> str:
        """The sample as stored (deployment, variant and mirror are in the Redis key); the
        stream flag as 0/1."""
        return json.dumps(
            [
                round(self.t, 3), self.status, self.latency_ms, self.upstream_ms, self.bytes,
                self.upstream_status, self.upstream_addr, self.method, self.path,
                self.request_id, self.key, self.header_ms, int(self.stream), self.first_ms,
                self.tokens,
            ],
            separators=(",", ":"),
        )

    @classmethod
    def from_member(cls, raw: bytes | str, deployment_id: int, variant: str, mirror: bool) -> Sample:
        """A stored member: its 15 values, or the 13 of one stored before ``first_ms`` and
        ``tokens`` existed, or the 10 of one stored before ``key``, ``header_ms`` and
        ``stream``."""
        t, status, latency, upstream, size, up_status, up_addr, method, path, rid, *newer = (
            json.loads(raw))
        key, header, stream, first, tokens = (*newer[:5], *MEMBER_DEFAULTS[len(newer):])
        return cls(t, deployment_id, variant, mirror, status, latency, upstream, size, up_status,
                   up_addr, method, path, rid, key, header, bool(stream), first, tokens)


@dataclass(frozen=True, slots=True)
class Unrouted:
    """A request of a route that no variant served (nginx answered it: a path the route does
    not serve); counted, not kept."""

    deployment_id: int


@lru_cache(maxsize=4)
def _hash_key(secret: str) -> bytes:
    return hashlib.sha256(b"switchyard split key:" + secret.encode()).digest()


def split_key(deployment_id: int, value: str, secret: str) -> str:
    """What a sample keeps of a sticky header's ``value``: 16 hex characters of a keyed hash
    (BLAKE2b, keyed by ``secret``, the project's SECRET_KEY) of ``"<deployment>:<value>"``,
    its first :data:`MAX_KEY` characters. The same user has the same key within a deployment,
    and no key can be turned back into, or looked up from, a user's identifier without the
    secret. "" for an empty value."""
    if not value:
        return ""
    data = f"{deployment_id}:{value[:MAX_KEY]}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=8, key=_hash_key(secret)).hexdigest()


def status_codes(text: str) -> list[int]:
    """``"502, 200"`` or ``"200 : 200"`` (retries, internal redirects) -> [502, 200]."""
    return [int(part) for part in re.split(r"[,:\s]+", text) if part.isdigit()]
