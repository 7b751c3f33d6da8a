"""The Istio objects Switchyard writes for a route, as plain values: the destinations of a
route (:class:`Plan`), what of another writer's a write keeps, how a DestinationRule is
patched, the request deadline as an Istio duration, and how Istio's status reads. The
router (``fleet.adapters.routers.istio``, whose docstring says what is written and why) reads
and writes them. Plain Python: no Django, no settings.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from fleet.adapters.base import AdapterError
from fleet.adapters.routers.kube_common import ServiceRef, condition, guard

GROUP = "networking.istio.io"
VIRTUAL_SERVICES = "virtualservices"
DESTINATION_RULES = "destinationrules"
HTTP_ROUTE = "primary"
LOAD_BALANCER = {"simple": "LEAST_REQUEST"}
MISSING = "install Istio (1.22 or later for networking.istio.io/v1) or set the router's version"
API = "an Istio VirtualService"
OWN_HTTP_KEYS = {"name", "route", "mirror", "mirrorPercentage"}
#: What another writer may add to the HTTP route without changing which requests reach which
#: destination: kept by every write, and no reason to read the route as someone else's.
KEPT_HTTP_KEYS = {"retries", "timeout", "headers", "corsPolicy", "fault"}
#: The request deadline Switchyard wrote as the HTTP route's ``timeout``: a timeout equal to
#: it is Switchyard's (taken away when the route has no deadline any more), any other is
#: another writer's (kept).
TIMEOUT_ANNOTATION = "switchyard.io/request-timeout"


@dataclass(frozen=True)
class Destination:
    """A weighted destination: a Service port, and its subset when the Service is shared."""

    service: ServiceRef
    subset: str
    weight: int

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.service.host}
        if self.subset:
            out["subset"] = self.subset
        out["port"] = {"number": self.service.port}
        return out


@dataclass(frozen=True)
class Plan:
    """What a route becomes: destinations, the subsets' Service (None: no subsets) and the
    mirror (destination and percent)."""

    destinations: list[Destination]
    subset_service: ServiceRef | None
    mirror: Destination | None
    mirror_percent: int
    timeout: str = ""  # the request deadline as an Istio duration ("2.5s"); "" for none


def rule_patch(current: dict[str, Any], wanted: dict[str, Any], *, keep: bool) -> dict[str, Any] | None:
    """The merge patch that gives ``current`` the host, load balancer and subsets of
    ``wanted`` (with ``keep``, the subsets ``current`` has beyond them too), or None; it
    carries ``current``'s resourceVersion (409 if the rule changed since). The rest of the
    traffic policy, and what another writer added to a subset (its own traffic policy), are
    kept."""
    have = current.get("spec") or {}
    want = copy.deepcopy(wanted["spec"])
    had = {s.get("name"): s for s in have.get("subsets") or [] if isinstance(s, dict)}
    same_host = have.get("host") == want["host"]
    if same_host:
        want["subsets"] = [{**had.get(s["name"], {}), **s} for s in want["subsets"]]
    if keep and same_host:
        names = {s["name"] for s in want["subsets"]}
        want["subsets"] += [s for name, s in had.items() if name not in names]
    spec: dict[str, Any] = {}
    for key in ("host", "subsets"):
        if have.get(key) != want[key]:
            spec[key] = want[key]
    balancer = want["trafficPolicy"]["loadBalancer"]
    if ((have.get("trafficPolicy") or {}).get("loadBalancer")) != balancer:
        spec["trafficPolicy"] = {"loadBalancer": balancer}  # merged: the rest stays
    return {**guard(current), "spec": spec} if spec else None


def duration(value: float | None) -> str:
    """A deadline in seconds as an Istio duration (protobuf JSON: "2.5s"); "" for None."""
    if value is None:
        return ""
    return f"{value:.3f}".rstrip("0").rstrip(".") + "s"


def seconds(value: Any) -> float | None:
    """An Istio duration Switchyard wrote ("2.5s") in seconds; None when it is not one."""
    if not isinstance(value, str) or not value.endswith("s"):
        return None
    try:
        return float(value[:-1])
    except ValueError:
        return None


def annotations(obj: dict[str, Any]) -> dict[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def keeping(http: Any, route: dict[str, Any], ours: str | None = None) -> dict[str, Any]:
    """``route`` with what another writer added to the HTTP route in force (KEPT_HTTP_KEYS);
    a ``timeout`` equal to ``ours`` (the deadline Switchyard wrote) is Switchyard's own, so
    it is kept only when ``route`` sets it."""
    if not (isinstance(http, list) and len(http) == 1 and isinstance(http[0], dict)):
        return route
    have = http[0]
    if have.get("name") != HTTP_ROUTE or set(have) - OWN_HTTP_KEYS - KEPT_HTTP_KEYS:
        return route
    kept = {key: value for key, value in have.items() if key in KEPT_HTTP_KEYS
            and not (key == "timeout" and ours is not None and value == ours)}
    return {"name": route["name"], **kept,
            **{key: value for key, value in route.items() if key != "name"}}


def route_problem(obj: dict[str, Any]) -> str:
    """Why Istio says the VirtualService ``obj`` is not in force ("" when it says nothing
    against it)."""
    status = obj.get("status") or {}
    reconciled = condition(status.get("conditions"), "Reconciled")
    if reconciled is not None and reconciled.get("status") == "False":
        return f"not reconciled by istiod ({reconciled.get('message', '')})"
    for message in status.get("validationMessages") or []:
        if isinstance(message, dict) and (message.get("level") or "").upper() == "ERROR":
            code = (message.get("type") or {}).get("code", "")
            return f"istiod reports {code or 'an error'}: {message.get('documentationUrl', '')}"
    return ""


def uses_subsets(obj: dict[str, Any]) -> bool:
    for http in (obj.get("spec") or {}).get("http") or []:
        for item in (http or {}).get("route") or []:
            if ((item or {}).get("destination") or {}).get("subset"):
                return True
    return False


def destination_key(destination: dict[str, Any]) -> tuple[str, str, int]:
    port = (destination.get("port") or {}).get("number") or 0
    return str(destination.get("host", "")), str(destination.get("subset") or ""), int(port)


def service_base(host: str, namespace: str) -> str:
    labels = host.split(".")
    if len(labels) >= 2 and labels[1] != namespace:
        return f"{labels[0]}.{labels[1]}"
    return labels[0]


def foreign(where: str, why: str) -> AdapterError:
    return AdapterError(
        f"{where} is not in the shape Switchyard writes ({why}): it was changed outside "
        "Switchyard; apply the route again to take it back",
        permanent=True,
    )
