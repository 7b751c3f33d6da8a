"""The traffic-router interface: how a deployment's requests are split between its variants.

A route is what clients of one deployment call: a stable URL in front of several variants (a
model version on a server, or a server of its own), a policy that picks the variant of each
request, and an optional mirror that copies a share of the requests to a candidate whose
answers are discarded. Routers (a local proxy, a Kubernetes gateway) implement
:class:`TrafficRouter`; this module holds the engine-neutral values and the validation every
router shares. Plain Python: no Django, no settings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

from console.exceptions import DomainError

KSERVE_V2 = "kserve-v2"  # Triton's HTTP inference protocol
OPENAI = "openai"  # vLLM's OpenAI-compatible API
PROTOCOLS = (KSERVE_V2, OPENAI)

WEIGHTED = "weighted"  # each request picks a variant at random, in proportion to the weights
LEAST_PENDING = "least-pending"  # the variant with the fewest requests in flight (by weight)
STICKY = "sticky"  # the value of a request header picks the variant: a key keeps its variant
POLICIES = (WEIGHTED, LEAST_PENDING, STICKY)

# Route names become part of URLs, file names and identifiers: a DNS-label-like slug.
_ROUTE_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_VARIANT_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62})$")
# A header every proxy can read: letters, digits and hyphens (an RFC 9110 token without the
# punctuation, and without "_", which proxies drop by default).
_HEADER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,63}$")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HOST = re.compile(r"^[A-Za-z0-9.-]+$|^[0-9A-Fa-f:.]+$")  # a DNS name, IPv4 or IPv6 address


class RouteSpecError(DomainError):
    """A route that cannot be applied as given; ``field`` names the input at fault."""


@dataclass(frozen=True)
class Variant:
    """One destination of a route.

    ``upstream`` is the server's base URL (``http://host:port``). For ``kserve-v2`` routes,
    ``model`` and ``version`` name what the request is rewritten to: a client's
    ``/v2/models/<any>/infer`` reaches ``/v2/models/<model>/versions/<version>/infer`` on
    ``upstream`` (without ``version``, the server's own version policy picks). ``weight`` is
    the variant's share of traffic in percent; 0 takes it out of traffic at once.
    """

    name: str
    upstream: str
    weight: int
    model: str = ""
    version: int | None = None


@dataclass(frozen=True)
class Mirror:
    """Copy ``percent`` % of the route's requests to the variant ``variant``; its answers are
    discarded (shadow traffic)."""

    variant: str
    percent: int


@dataclass(frozen=True)
class RouteSpec:
    """What a route should do. ``name`` is the deployment route's slug.

    ``timeout_s`` is the route's request deadline: a request its variant has not answered
    within it ends with a 504 from the router (None: the router's own limit). How each
    router keeps it: nginx waits at most that long for each read of the answer (the first
    byte, then between the chunks of a streamed one), Istio for the whole request."""

    name: str
    protocol: str
    variants: tuple[Variant, ...]
    policy: str = WEIGHTED
    sticky_header: str = ""
    mirror: Mirror | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        # A list from an API payload compares equal to the tuple read back from a router.
        object.__setattr__(self, "variants", tuple(self.variants))

    def weights(self) -> dict[str, int]:
        """The weight of each variant, by name."""
        return {v.name: v.weight for v in self.variants}

    def variant(self, name: str) -> Variant:
        """The variant called ``name`` (KeyError when there is none)."""
        for candidate in self.variants:
            if candidate.name == name:
                return candidate
        raise KeyError(name)

    def to_json(self) -> dict[str, object]:
        """A JSON-serialisable dict (inverse of :meth:`from_json`)."""
        data = asdict(self)
        data["variants"] = [asdict(v) for v in self.variants]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RouteSpec:
        """Build a spec from :meth:`to_json` output (or an API payload of the same shape).

        Raises RouteSpecError naming the field when the shape is wrong; the values are checked
        by :func:`validate_route`.
        """
        try:
            raw_variants = data["variants"]
            if not isinstance(raw_variants, list | tuple):
                raise RouteSpecError("must be a list of variants", field="variants")
            variants = tuple(_variant_from_json(i, v) for i, v in enumerate(raw_variants))
            raw_mirror = data.get("mirror")
            mirror = None
            if raw_mirror is not None:
                if not isinstance(raw_mirror, Mapping):
                    raise RouteSpecError("must be an object or null", field="mirror")
                mirror = _mirror_from_json(raw_mirror)
            return cls(
                name=data["name"],  # type: ignore[arg-type]
                protocol=data["protocol"],  # type: ignore[arg-type]
                variants=variants,
                policy=data.get("policy", WEIGHTED),  # type: ignore[arg-type]
                sticky_header=data.get("sticky_header", "") or "",  # type: ignore[arg-type]
                mirror=mirror,
                timeout_s=data.get("timeout_s"),  # type: ignore[arg-type]
            )
        except KeyError as exc:
            raise RouteSpecError("is required", field=str(exc.args[0])) from exc


def _variant_from_json(index: int, data: object) -> Variant:
    if not isinstance(data, Mapping):
        raise RouteSpecError("must be an object", field=f"variants.{index}")
    try:
        return Variant(
            name=data["name"],
            upstream=data["upstream"],
            weight=data["weight"],
            model=data.get("model", "") or "",
            version=data.get("version"),
        )
    except KeyError as exc:
        raise RouteSpecError("is required", field=f"variants.{index}.{exc.args[0]}") from exc


def _mirror_from_json(data: Mapping[str, object]) -> Mirror:
    try:
        return Mirror(variant=data["variant"], percent=data["percent"])  # type: ignore[arg-type]
    except KeyError as exc:
        raise RouteSpecError("is required", field=f"mirror.{exc.args[0]}") from exc


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_route(route: RouteSpec) -> None:
    """Check every value of ``route``; raise RouteSpecError naming the first field at fault.

    Field names follow the spec's JSON shape: ``name``, ``protocol``, ``policy``,
    ``sticky_header``, ``variants``, ``variants.<i>.<field>``, ``weights``, ``mirror.variant``,
    ``mirror.percent``, ``timeout_s``.
    """
    if not isinstance(route.name, str) or not _ROUTE_NAME.match(route.name):
        raise RouteSpecError(
            "must be 1-63 lowercase letters, digits or hyphens, starting and ending with a "
            f"letter or digit, got {route.name!r}",
            field="name",
        )
    if route.protocol not in PROTOCOLS:
        raise RouteSpecError(
            f"must be one of {', '.join(PROTOCOLS)}, got {route.protocol!r}", field="protocol"
        )
    if route.policy not in POLICIES:
        raise RouteSpecError(
            f"must be one of {', '.join(POLICIES)}, got {route.policy!r}", field="policy"
        )
    _validate_sticky_header(route)
    if not route.variants:
        raise RouteSpecError("at least one variant is required", field="variants")
    seen: set[str] = set()
    for index, variant in enumerate(route.variants):
        _validate_variant(route.protocol, index, variant)
        if variant.name in seen:
            raise RouteSpecError(
                f"duplicate variant name {variant.name!r}", field=f"variants.{index}.name"
            )
        seen.add(variant.name)
    total = sum(v.weight for v in route.variants)
    if total != 100:
        raise RouteSpecError(f"must sum to 100, got {total}", field="weights")
    _validate_mirror(route, seen)
    _validate_timeout(route.timeout_s)


MIN_TIMEOUT_S = 0.1
MAX_TIMEOUT_S = 3600.0


def _validate_timeout(value: object) -> None:
    if value is None:
        return
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S):
        raise RouteSpecError(
            f"must be a number of seconds from {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g}, or null "
            f"for the router's own limit, got {value!r}",
            field="timeout_s",
        )


def _validate_sticky_header(route: RouteSpec) -> None:
    header = route.sticky_header
    if route.policy == STICKY:
        if not header:
            raise RouteSpecError("is required for the sticky policy", field="sticky_header")
        if not isinstance(header, str) or not _HEADER_NAME.match(header):
            raise RouteSpecError(
                "must be a header name of letters, digits and hyphens starting with a letter "
                f"(at most 64), got {header!r}",
                field="sticky_header",
            )
    elif header:
        raise RouteSpecError(
            f"is only used by the sticky policy, not by {route.policy!r}", field="sticky_header"
        )


def _validate_variant(protocol: str, index: int, variant: Variant) -> None:
    where = f"variants.{index}"
    if not isinstance(variant.name, str) or not _VARIANT_NAME.match(variant.name):
        raise RouteSpecError(
            "must be 1-63 letters, digits, dots, underscores or hyphens, starting with a letter "
            f"or digit, got {variant.name!r}",
            field=f"{where}.name",
        )
    if not _is_int(variant.weight) or not 0 <= variant.weight <= 100:
        raise RouteSpecError(
            f"must be an integer from 0 to 100, got {variant.weight!r}", field=f"{where}.weight"
        )
    problem = upstream_problem(variant.upstream)
    if problem:
        raise RouteSpecError(problem, field=f"{where}.upstream")
    if protocol == KSERVE_V2:
        if not isinstance(variant.model, str) or not _MODEL_NAME.match(variant.model):
            raise RouteSpecError(
                "must name the Triton model to route to (letters, digits, '.', '_', '-'), "
                f"got {variant.model!r}",
                field=f"{where}.model",
            )
        if variant.version is not None and (not _is_int(variant.version) or variant.version < 1):
            raise RouteSpecError(
                f"must be a positive integer or null, got {variant.version!r}",
                field=f"{where}.version",
            )
    else:
        if variant.model:
            raise RouteSpecError(
                "is only used by kserve-v2 routes (an openai route passes the request's own "
                "model through)",
                field=f"{where}.model",
            )
        if variant.version is not None:
            raise RouteSpecError("is only used by kserve-v2 routes", field=f"{where}.version")


def upstream_problem(url: object) -> str:
    """Why ``url`` is not a usable upstream base URL ("" when it is)."""
    if not isinstance(url, str) or not url:
        return "must be a base URL such as http://host:8000"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"must start with http:// or https://, got {url!r}"
    if parts.query or parts.fragment or parts.username or parts.password:
        return f"must be scheme://host[:port][/path] without query, fragment or user, got {url!r}"
    if not parts.hostname or not _HOST.match(parts.hostname):
        return f"has no valid host, got {url!r}"
    try:
        port = parts.port
    except ValueError:
        return f"has an invalid port, got {url!r}"
    if port == 0:
        return f"has an invalid port, got {url!r}"
    if any(c in parts.path for c in " ;{}\"'\\$"):
        return f"has characters that are not allowed in its path, got {url!r}"
    return ""


def _validate_mirror(route: RouteSpec, names: set[str]) -> None:
    mirror = route.mirror
    if mirror is None:
        return
    if mirror.variant not in names:
        raise RouteSpecError(
            f"must name one of the route's variants ({', '.join(sorted(names))}), "
            f"got {mirror.variant!r}",
            field="mirror.variant",
        )
    if not _is_int(mirror.percent) or not 0 <= mirror.percent <= 100:
        raise RouteSpecError(
            f"must be an integer from 0 to 100, got {mirror.percent!r}", field="mirror.percent"
        )


# --------------------------------------------------------------------------------------------
# Results and the interface
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyResult:
    """What :meth:`TrafficRouter.apply` did.

    ``changed`` is True when the route's configuration was rewritten, ``reloaded`` when the
    router was told to take a new configuration in force (both False when the route was
    already in force), ``message`` is the router's own word on it, and ``url`` the stable base
    URL clients of the route call.
    """

    changed: bool
    reloaded: bool
    message: str
    url: str


@dataclass(frozen=True)
class RouterHealth:
    """The router as seen now.

    ``ok`` is True when the router answers and every route it has is in force; ``routes``
    maps each route name to whether the configuration the router serves is the one last
    applied; ``active_connections`` is the router's count of open client connections when it
    reports one.
    """

    ok: bool
    message: str
    routes: dict[str, bool] = field(default_factory=dict)
    active_connections: int | None = None


@runtime_checkable
class TrafficRouter(Protocol):
    """Puts routes in force on one router. Every call is idempotent.

    Failures raise :class:`fleet.adapters.base.AdapterError` carrying the router's message
    (a configuration it refused is ``permanent``); the route in force before the call stays
    in force. An invalid spec raises :class:`RouteSpecError` before anything changes.
    """

    def apply(self, route: RouteSpec) -> ApplyResult:
        """Put ``route`` in force; no change and no reload when it already is."""
        ...

    def remove(self, name: str) -> bool:
        """Take the route ``name`` out of force; False (doing nothing) when there is none."""
        ...

    def read(self, name: str) -> RouteSpec | None:
        """The route ``name`` as last put in force, or None."""
        ...

    def url(self, name: str) -> str | None:
        """The base URL clients of the route ``name`` call, or None when there is no route."""
        ...

    def health(self) -> RouterHealth:
        """Whether the router answers and serves the routes last applied; never raises."""
        ...
