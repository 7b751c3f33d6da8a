"""Route specs: the split a deployer asks for, checked against what is ready, as a RouteSpec.

:func:`build` turns weights (per version or per (version, server)), a policy, a sticky header
and a mirror into the router's :class:`~fleet.adapters.routers.base.RouteSpec`, with one
variant per (ready version, server) named by :func:`variant_name`, and what each variant stands
for. Refusals name the field the caller gave (``weights``, ``policy``, ``sticky_header``,
``mirror``), or ``route`` when the deployment's own servers cannot be routed to.
``rollouts.traffic.routes`` puts the spec in force and records it.

What a route is made of, by runtime:

* Triton (``kserve-v2``): a variant per (ready version, server); a request for
  ``/v2/models/<any>/...`` reaches ``/v2/models/<model>/versions/<n>/...`` on its server,
  so versions on one server are split as well as servers.
* vLLM base models (``openai``): a variant per server (a vLLM server runs one base version).
* vLLM LoRA adapters (``openai``): the OpenAI paths carry the model name in the request body,
  which the router passes through, so a route splits by server only and clients name the
  adapter they want (``support-bot-v3``, ``fleet.adapters.vllm.adapter_name``). A server's
  adapters cannot be told apart by the router, so at most one adapter version per server may
  carry weight.

Weights are given per version (split evenly over the servers it is ready on, the remainder
going to the first servers by name, so the result is the same every time) or per (version,
server); ready versions not named get 0. They are integers summing to 100.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from console.exceptions import Conflict, DomainError
from fleet.adapters.routers.base import (
    KSERVE_V2,
    OPENAI,
    Mirror,
    RouteSpec,
    RouteSpecError,
    Variant,
    validate_route,
)
from fleet.models import InferenceServer
from rollouts.models import Deployment, ModelLoad, ModelVersion

ROUTE = "route"  # the field a refusal of the router (or of the route as a whole) names
REQUEST_TIMEOUT = "request_timeout_s"  # the deployment's field the route's deadline comes from
MAX_VARIANT_NAME = 63

Weights = Mapping[Any, Any]  # version number -> weight, or (version number, server name) -> weight


@dataclass(frozen=True)
class MirrorTarget:
    """Copy ``percent`` % of the requests to ``version`` (on ``server``, or the first server
    it is ready on, by name); the copies' answers are discarded."""

    version: int
    percent: int
    server: str = ""


def route_name(deployment: Deployment) -> str:
    """The route's name on the router, and the ``route`` of every sample."""
    return f"dep-{deployment.pk}"


def variant_name(version: int, server: str) -> str:
    """``v<version>-<server>``, shortened with a hash of the whole when it is too long."""
    name = f"v{version}-{server}"
    if len(name) <= MAX_VARIANT_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_VARIANT_NAME - 9].rstrip('-')}-{digest}"


def _servers_by_version(ready: Iterable[ModelLoad]) -> dict[int, list[InferenceServer]]:
    found: dict[int, list[InferenceServer]] = {}
    for load in ready:
        servers = found.setdefault(load.version.version, [])
        if load.server not in servers:
            servers.append(load.server)
    return found


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shares(deployment: Deployment, weights: Weights, ready: list[ModelLoad]) -> dict[tuple[int, str], int]:
    """The weight of every (version, server) ready, from the weights asked for."""
    model = deployment.model
    by_version = _servers_by_version(ready)
    known = set(model.versions.values_list("version", flat=True))
    shares = {(n, s.name): 0 for n, servers in by_version.items() for s in servers}
    named: dict[int, str] = {}  # version -> "version" or "server": how its weight was given
    if not isinstance(weights, Mapping) or not weights:
        raise DomainError("give the weight of at least one ready version", field="weights")
    for key, weight in weights.items():
        number, server = key if isinstance(key, tuple) else (key, None)
        if not _is_int(number) or number not in known:
            raise DomainError(f"{model.name} has no version {number}", field="weights")
        where = f"v{number}" + (f" on {server}" if server is not None else "")
        if not _is_int(weight) or not 0 <= weight <= 100:
            raise DomainError(
                f"{where}: a weight is an integer from 0 to 100, got {weight!r}", field="weights"
            )
        servers = by_version.get(number, [])
        how = "version" if server is None else "server"
        if named.setdefault(number, how) != how:
            raise DomainError(
                f"v{number}: give its weight once, either for the version or per server",
                field="weights",
            )
        if not servers:
            names = ", ".join(s.name for s in deployment.servers.order_by("name")) or "none"
            raise DomainError(
                f"v{number} is not ready on the deployment's servers ({names}): load it first",
                field="weights",
            )
        if server is None:
            base, extra = divmod(weight, len(servers))
            for index, each in enumerate(servers):
                shares[(number, each.name)] = base + (1 if index < extra else 0)
        elif server not in {s.name for s in servers}:
            raise DomainError(f"v{number} is not ready on {server}: load it there first",
                              field="weights")
        else:
            shares[(number, server)] = weight
    total = sum(shares.values())
    if total != 100:
        raise DomainError(f"must sum to 100, got {total}", field="weights")
    return shares


def _check_adapters(ready: list[ModelLoad], shares: dict[tuple[int, str], int]) -> None:
    """LoRA adapters on one server are told apart by the request body only: one may carry
    weight there."""
    carrying: dict[str, list[int]] = {}
    for load in ready:
        key = (load.version.version, load.server.name)
        if load.version.adapter_of and shares.get(key, 0) > 0:
            carrying.setdefault(load.server.name, []).append(load.version.version)
    for server, versions in carrying.items():
        if len(versions) > 1:
            listed = ", ".join(f"v{n}" for n in sorted(set(versions)))
            raise DomainError(
                f"LoRA adapters {listed} share server {server}: a route splits between servers, "
                "and clients pick the adapter by the model name they send; give weight to one "
                "adapter per server",
                field="weights",
            )


def _spec(
    deployment: Deployment,
    ready: list[ModelLoad],
    shares: dict[tuple[int, str], int],
    policy: str,
    sticky_header: str,
    mirror: MirrorTarget | None,
) -> tuple[RouteSpec, dict[str, dict[str, Any]]]:
    """The route spec, and what each variant stands for."""
    kserve = ready[0].version.runtime == ModelVersion.Runtime.TRITON
    variants: list[Variant] = []
    meaning: dict[str, dict[str, Any]] = {}
    names: dict[tuple[int, str], str] = {}
    for load in ready:
        key = (load.version.version, load.server.name)
        if key in names:
            continue
        name = variant_name(*key)
        names[key] = name
        variants.append(Variant(
            name=name,
            upstream=load.server.http_url.rstrip("/"),
            weight=shares[key],
            model=load.version.name_on(load.server) if kserve else "",
            version=load.version.version if kserve else None,
        ))
        meaning[name] = {
            "version_id": load.version_id, "version": load.version.version,
            "server_id": load.server_id, "server": load.server.name,
        }
    spec = RouteSpec(
        name=route_name(deployment),
        protocol=KSERVE_V2 if kserve else OPENAI,
        variants=tuple(variants),
        policy=policy,
        sticky_header=sticky_header,
        mirror=_mirror(deployment, ready, names, mirror),
        timeout_s=deployment.request_timeout_s,
    )
    try:
        validate_route(spec)
    except RouteSpecError as exc:
        raise refusal(exc) from None
    return spec, meaning


def refusal(exc: RouteSpecError) -> DomainError:
    """A route spec refused, as the caller's fault (the field they gave) or the route's."""
    field = exc.field or ROUTE
    if field in ("policy", "sticky_header", "weights"):
        return DomainError(exc.message, field=field)
    if field.startswith("mirror"):
        return DomainError(exc.message, field="mirror")
    if field == "timeout_s":  # the deployment's deadline, which this router cannot keep
        return DomainError(exc.message, field=REQUEST_TIMEOUT)
    # A variant the deployment's own servers make unroutable (their URL, or a router that
    # cannot tell them apart): not the caller's input, the route as a whole cannot be made.
    return Conflict(f"cannot route to the deployment's servers: {field} {exc.message}",
                    field=ROUTE)


def _mirror(
    deployment: Deployment,
    ready: list[ModelLoad],
    names: dict[tuple[int, str], str],
    mirror: MirrorTarget | None,
) -> Mirror | None:
    if mirror is None:
        return None
    if not _is_int(mirror.percent) or not 0 <= mirror.percent <= 100:
        raise DomainError(f"percent must be an integer from 0 to 100, got {mirror.percent!r}",
                          field="mirror")
    if not _is_int(mirror.version) or not deployment.model.versions.filter(
        version=mirror.version
    ).exists():
        raise DomainError(f"{deployment.model.name} has no version {mirror.version}", field="mirror")
    servers = [s.name for s in _servers_by_version(ready).get(mirror.version, [])]
    if mirror.server:
        servers = [s for s in servers if s == mirror.server]
    if not servers:
        where = f" on {mirror.server}" if mirror.server else " on the deployment's servers"
        raise DomainError(f"v{mirror.version} is not ready{where}: load it first to mirror to it",
                          field="mirror")
    if mirror.percent == 0:
        return None
    return Mirror(variant=names[(mirror.version, servers[0])], percent=mirror.percent)


def _by_version(shares: dict[tuple[int, str], int]) -> dict[str, int]:
    totals: dict[int, int] = {}
    for (number, _server), weight in shares.items():
        totals[number] = totals.get(number, 0) + weight
    return {str(n): w for n, w in sorted(totals.items())}


def summary(spec: RouteSpec) -> dict[str, Any]:
    """What ``spec`` asks for, as the audit log records it: weights by variant, policy, mirror."""
    data = spec.to_json()
    return {
        "weights": spec.weights(),
        "policy": spec.policy,
        "sticky_header": spec.sticky_header,
        "mirror": data["mirror"],
    }


def build(
    deployment: Deployment,
    ready: list[ModelLoad],
    weights: Weights,
    policy: str,
    sticky_header: str,
    mirror: MirrorTarget | None,
) -> tuple[RouteSpec, dict[str, dict[str, Any]], dict[str, int]]:
    """The route spec for ``weights`` over the ``ready`` loads, what each of its variants
    stands for, and the weight of each version (for the revision). A DomainError names the
    field at fault; a Conflict on ``route`` when the servers cannot be routed to."""
    shares = _shares(deployment, weights, ready)
    _check_adapters(ready, shares)
    spec, meaning = _spec(deployment, ready, shares, policy, sticky_header or "", mirror)
    return spec, meaning, _by_version(shares)
