"""The Istio traffic router: a route is a VirtualService whose route weights split it.

One route ``<name>`` is one VirtualService ``<name>`` in the cluster's namespace for the host
``<name>.<route domain>`` (set when the route is made: its URL stays, even when the cluster's
domain changes), bound to the cluster's Istio Gateway when one is named (else to the
mesh's sidecars), with one HTTP route ``primary`` holding one weighted destination per
variant (a Service's fully qualified host and port)::

    spec:
      hosts: [fraud-scorer.example]
      gateways: [inference-gw]
      http:
      - name: primary
        route:
        - {destination: {host: triton-fraud.serving.svc.cluster.local, subset: v1,
                         port: {number: 8000}}, weight: 90}
        - {destination: {host: triton-fraud.serving.svc.cluster.local, subset: v2,
                         port: {number: 8000}}, weight: 10}

What Istio expresses, and so what this router supports:

* weighted splits between Services, and between variants that share one Service: those get
  a subset each in a DestinationRule ``<name>`` for that Service (subset ``<variant>``
  selecting the pods labelled ``switchyard.io/revision: <variant>``, so the pods of each
  variant must carry that label; variant names must then be DNS labels). The rule's traffic
  policy is ``LEAST_REQUEST`` (Envoy picks the least busy pod inside a variant; Istio's own
  default since 1.14, written down so the route does not depend on it). Subsets of one
  Service per route: two Services that both need subsets are refused (``variants``);
* ``kserve-v2`` routes whose variants serve one model: the path passes through unchanged
  (Istio rewrites per HTTP route, not per destination), so each variant's pods must serve its
  version of the model; variants of different models are refused;
* mirroring ``percent`` % of the requests to a variant (``mirror`` + ``mirrorPercentage``);
* a request deadline (``timeout_s``) as the HTTP route's ``timeout`` (the whole request,
  streamed answers included: Envoy answers 504 when it passes), noted in the annotation
  ``switchyard.io/request-timeout`` so that a route whose deadline is taken away drops the
  ``timeout`` Switchyard wrote and keeps one another writer set;
* not the ``sticky`` or ``least-pending`` policies (``policy``): Istio picks the weighted
  destination at random for every request; a consistent hash in a DestinationRule only
  chooses a pod inside the destination, so it cannot keep a key on its variant.

Writes, and why: :meth:`IstioRouter.apply` reads the VirtualService; a missing one is
created (POST, and when the route needs subsets the DestinationRule first, so no destination
ever names a subset that does not exist); an existing one that differs gets one JSON merge
patch of the fields that differ (``hosts``, ``gateways``, the ``http`` list: never a weight
by its position, so a concurrent reorder cannot put weights on the wrong destinations).
Every merge patch of an existing VirtualService or DestinationRule carries the
``metadata.resourceVersion`` it was computed from: the API server checks it as it checks a
PUT's, answering 409 Conflict when anyone changed the object since (recorded against a real
kube-apiserver with Istio 1.22.8's CRDs; without it, a merge patch silently overwrites another
writer's change). On a 409 the router reads the object again and recomputes the patch, up to
``max_attempts`` times, after which a readable KubeError (``conflict``) says so; an
AlreadyExists on create (made meanwhile) takes the same path. A merge patch replaces a list
whole, so the ``http`` list is rebuilt from the one read: Switchyard sets the HTTP route's
destinations and mirror and keeps what another writer added to it (``retries``, ``timeout``,
``headers``, ``corsPolicy``, ``fault``; a route that ``match``es, rewrites, redirects or
delegates is not in Switchyard's shape and is replaced). Of a DestinationRule it sets the
host, the load balancer and its subsets' labels, keeping the rest of the traffic policy and
what another writer added to a subset. A merge patch is one atomic write, so a failed apply
leaves the VirtualService in force as it was; a DestinationRule created for a VirtualService
that was then refused is deleted again. Subsets are only ever added before the VirtualService
changes and pruned after it, so the route in force always finds its subsets.

API version: ``api_version`` (default ``v1``, served by Istio 1.22 and later; ``v1beta1`` for
older Istio). A cluster without Istio's CRDs answers a KubeError with ``missing_api``.

Reading back: :meth:`IstioRouter.read` returns the split the API server holds. A
VirtualService holds hosts, subsets, ports and weights, not Switchyard's protocol, model or
version: variants are named after their subset, else their Service (``-<port>`` when one
repeats), the upstream is ``http://<host>:<port>`` as written, the protocol ``openai`` (the
pass-through protocol) and weights are percentages of their sum.

Per-request samples: the ingress gateway's JSON access log, shipped as UDP syslog to
Switchyard's collector, is mapped to the route's variants by ``rollouts.traffic.envoy_samples`` (by
subset, else Service); without it latency comes from the servers' own metrics (see
docs/kubernetes.md). Plain Python: no Django, no settings.
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.adapters.base import AdapterError
from fleet.adapters.kubernetes import KubeAccess, KubeError
from fleet.adapters.routers.base import (
    OPENAI,
    ApplyResult,
    Mirror,
    RouterHealth,
    RouteSpec,
    RouteSpecError,
    Variant,
    validate_route,
)
from fleet.adapters.routers.istio_objects import (
    API,
    DESTINATION_RULES,
    GROUP,
    HTTP_ROUTE,
    KEPT_HTTP_KEYS,
    LOAD_BALANCER,
    MISSING,
    OWN_HTTP_KEYS,
    TIMEOUT_ANNOTATION,
    VIRTUAL_SERVICES,
    Destination,
    Plan,
    annotations,
    destination_key,
    duration,
    foreign,
    keeping,
    route_problem,
    rule_patch,
    seconds,
    service_base,
    uses_subsets,
)
from fleet.adapters.routers.kube_common import (
    MAX_ATTEMPTS,
    REVISION_LABEL,
    CustomObjects,
    check_expressible,
    guard,
    is_api_version,
    is_dns_label,
    is_domain,
    percentages,
    route_host,
    service_of,
    session,
    variant_names,
)

__all__ = ["MISSING", "IstioRouter", "route_problem", "rule_patch"]


class IstioRouter:
    """Routes as VirtualServices in ``namespace`` for ``<route>.<route_domain>``, bound to
    ``gateway`` ("namespace/name" or "name" in ``namespace``; "" for the mesh only)."""

    def __init__(
        self,
        access: KubeAccess,
        *,
        namespace: str,
        route_domain: str,
        gateway: str = "",
        api_version: str = "v1",
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        if not is_dns_label(namespace):
            raise ValueError(f"the routes' namespace must be a DNS label, got {namespace!r}")
        if not route_domain or not is_domain(route_domain):
            raise ValueError(
                "Istio routes need the domain they are served under (routes answer at "
                f"<route>.<domain>), got {route_domain!r}"
            )
        gateway_namespace, _, gateway_name = gateway.rpartition("/")
        if gateway and not (is_domain(gateway_name)
                            and (not gateway_namespace or is_dns_label(gateway_namespace))):
            raise ValueError(f"the Istio Gateway must be namespace/name or name, got {gateway!r}")
        if not is_api_version(api_version):
            raise ValueError(f"not an API version: {api_version!r}")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.access = access
        self.namespace = namespace
        self.route_domain = route_domain
        self.gateway = (gateway_name if gateway_namespace in ("", namespace) else gateway)
        self.api_version = api_version
        self.max_attempts = max_attempts

    # ----------------------------------------------------------------------------------------
    # The interface
    # ----------------------------------------------------------------------------------------

    def apply(self, route: RouteSpec) -> ApplyResult:
        """Put ``route`` in force (see the module docstring); no write when it already is."""
        plan = self.plan(route)
        wanted = self.virtual_service(route.name, plan)
        rule = self.destination_rule(route.name, plan)
        with self._session() as api:
            for _attempt in range(self.max_attempts):
                current = api.get(self.api_version, VIRTUAL_SERVICES, self.namespace, route.name)
                try:
                    created_rule, prune = self._ensure_rule(api, route.name, rule,
                                                            current is None)
                except KubeError as exc:
                    if exc.kind == "conflict":  # the DestinationRule changed since it was read
                        continue
                    raise
                patch = self.patch_for(current, wanted) if current is not None else None
                if current is not None and patch is None:
                    notes = self._tidy(api, route.name, rule, prune, current)
                    return ApplyResult(False, False, self._describe(current, "already in force",
                                                                    notes), self._url_of(current))
                try:
                    if current is None:
                        written = api.create(self.api_version, VIRTUAL_SERVICES, self.namespace,
                                             wanted)
                    else:
                        written = api.merge_patch(self.api_version, VIRTUAL_SERVICES,
                                                  self.namespace, route.name, patch or {})
                except KubeError as exc:
                    if created_rule:
                        self._undo_rule(api, route.name, exc)
                    if exc.kind == "conflict":  # made, or changed, since it was read: again
                        continue
                    raise
                notes = self._tidy(api, route.name, rule, prune, current)
                verb = "created" if current is None else "updated"
                return ApplyResult(True, True, self._describe(written, verb, notes),
                                   self._url_of(written))
        raise KubeError(
            f"VirtualService {self.namespace}/{route.name} changed under Switchyard on each of "
            f"{self.max_attempts} attempts (409 Conflict); nothing of this change was written: "
            "try again",
            kind="conflict", status=409, reason="Conflict",
        )

    def remove(self, name: str) -> bool:
        """Delete the VirtualService ``name``, then its DestinationRule when it used subsets;
        False when there is no VirtualService."""
        with self._session() as api:
            current = api.get(self.api_version, VIRTUAL_SERVICES, self.namespace, name)
            if current is None:
                return False
            existed = api.delete(self.api_version, VIRTUAL_SERVICES, self.namespace, name)
            if uses_subsets(current):
                api.delete(self.api_version, DESTINATION_RULES, self.namespace, name)
            return existed

    def read(self, name: str) -> RouteSpec | None:
        """The split in force as the API server holds it (see the module docstring), or None.
        AdapterError when the VirtualService is not in the shape Switchyard writes."""
        with self._session() as api:
            current = api.get(self.api_version, VIRTUAL_SERVICES, self.namespace, name)
        return None if current is None else self.spec_of(current)

    def url(self, name: str) -> str | None:
        """``http://<host>`` of the route ``name``, or None when there is none."""
        with self._session() as api:
            current = api.get(self.api_version, VIRTUAL_SERVICES, self.namespace, name)
        return None if current is None else self._url_of(current)

    def health(self) -> RouterHealth:
        """List the namespace's VirtualServices; Switchyard's (one HTTP route, named
        ``primary``) are in force unless Istio's status reports them not reconciled or invalid
        (Istio writes that status only with istiod's status reporting on). Never raises."""
        try:
            with self._session() as api:
                items = api.list(self.api_version, VIRTUAL_SERVICES, self.namespace)
        except AdapterError as exc:
            return RouterHealth(ok=False, message=exc.message)
        routes: dict[str, bool] = {}
        problems = []
        for item in items:
            name = str((item.get("metadata") or {}).get("name", ""))
            http = (item.get("spec") or {}).get("http") or []
            if [(h or {}).get("name") for h in http] != [HTTP_ROUTE]:
                continue  # not the shape Switchyard writes: someone else's
            problem = route_problem(item)
            routes[name] = not problem
            if problem:
                problems.append(f"route {name}: {problem}")
        if problems:
            return RouterHealth(ok=False, message="; ".join(problems), routes=routes)
        return RouterHealth(
            ok=True,
            message=f"{len(routes)} route{'' if len(routes) == 1 else 's'} written "
                    f"({GROUP}/{self.api_version}); Istio "
                    "reports no problem",
            routes=routes,
        )

    # ----------------------------------------------------------------------------------------
    # From a spec to the objects, and back
    # ----------------------------------------------------------------------------------------

    def plan(self, route: RouteSpec) -> Plan:
        """The destinations of ``route``; RouteSpecError naming the field for what Istio
        cannot express."""
        validate_route(route)
        check_expressible(route, API)
        services = [service_of(v.upstream, self.namespace, f"variants.{i}.upstream")
                    for i, v in enumerate(route.variants)]
        shared = {
            (s.host, s.port) for i, s in enumerate(services)
            if any((o.host, o.port) == (s.host, s.port) for o in services[:i])
        }
        hosts = sorted({host for host, _port in shared})
        if len(hosts) > 1:
            raise RouteSpecError(
                f"variants share more than one Service ({', '.join(hosts)}): a route tells "
                "variants on one Service apart by subsets of one DestinationRule; give the "
                "others Services of their own",
                field="variants",
            )
        subset_service = next((s for s in services if s.host in hosts), None)
        destinations = []
        for index, (variant, service) in enumerate(zip(route.variants, services, strict=True)):
            subset = ""
            if subset_service is not None and service.host == subset_service.host:
                if not is_dns_label(variant.name):
                    raise RouteSpecError(
                        f"variants on one Service become Istio subsets, whose names are DNS "
                        f"labels (lowercase letters, digits, '-'), got {variant.name!r}",
                        field=f"variants.{index}.name",
                    )
                subset = variant.name
            destinations.append(Destination(service, subset, variant.weight))
        mirror = None
        percent = 0
        if route.mirror is not None and route.mirror.percent > 0:
            mirror = destinations[[v.name for v in route.variants].index(route.mirror.variant)]
            percent = route.mirror.percent
        return Plan(destinations, subset_service, mirror, percent, duration(route.timeout_s))

    def http_route(self, plan: Plan) -> dict[str, Any]:
        http: dict[str, Any] = {
            "name": HTTP_ROUTE,
            "route": [{"destination": d.as_json(), "weight": d.weight} for d in plan.destinations],
        }
        if plan.mirror is not None:
            http["mirror"] = plan.mirror.as_json()
            http["mirrorPercentage"] = {"value": float(plan.mirror_percent)}
        if plan.timeout:
            http["timeout"] = plan.timeout
        return http

    def virtual_service(self, name: str, plan: Plan) -> dict[str, Any]:
        """The VirtualService of the route ``name``."""
        spec: dict[str, Any] = {"hosts": [route_host(name, self.route_domain)]}
        if self.gateway:
            spec["gateways"] = [self.gateway]
        spec["http"] = [self.http_route(plan)]
        metadata: dict[str, Any] = {"name": name, "namespace": self.namespace}
        if plan.timeout:
            metadata["annotations"] = {TIMEOUT_ANNOTATION: plan.timeout}
        return {
            "apiVersion": f"{GROUP}/{self.api_version}",
            "kind": "VirtualService",
            "metadata": metadata,
            "spec": spec,
        }

    def destination_rule(self, name: str, plan: Plan) -> dict[str, Any] | None:
        """The DestinationRule of the route's subsets, or None when it needs none."""
        if plan.subset_service is None:
            return None
        subsets = [d.subset for d in plan.destinations if d.subset]
        return {
            "apiVersion": f"{GROUP}/{self.api_version}",
            "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "host": plan.subset_service.host,
                "trafficPolicy": {"loadBalancer": dict(LOAD_BALANCER)},
                "subsets": [{"name": s, "labels": {REVISION_LABEL: s}} for s in subsets],
            },
        }

    @staticmethod
    def patch_for(current: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any] | None:
        """The merge patch that makes ``current``'s fields Switchyard owns ``wanted``'s (None
        when they already are), carrying ``current``'s resourceVersion so the API server
        refuses it (409) if the object changed since. ``http`` is sent whole, as merge patches
        replace lists, with what another writer added to the HTTP route kept (see the module
        docstring); ``hosts`` are kept."""
        have = current.get("spec") or {}
        want = copy.deepcopy(wanted["spec"])
        spec: dict[str, Any] = {}
        # A route's URL stays what it was made with (clients hold it): hosts are only set
        # where there are none, so a change of the cluster's route domain applies to new routes.
        if not have.get("hosts"):
            spec["hosts"] = want["hosts"]
        wrote = annotations(current).get(TIMEOUT_ANNOTATION)
        want["http"] = [keeping(have.get("http"), want["http"][0], ours=wrote)]
        for key in ("gateways", "http"):
            if (have.get(key) or None) != (want.get(key) or None):
                spec[key] = want.get(key)
        timeout = annotations(wanted).get(TIMEOUT_ANNOTATION)
        if not spec and wrote == timeout:
            return None
        patch: dict[str, Any] = {**guard(current), "spec": spec}
        if wrote != timeout:
            patch["metadata"] = {**patch.get("metadata", {}),
                                 "annotations": {TIMEOUT_ANNOTATION: timeout}}
        return patch

    def spec_of(self, obj: dict[str, Any]) -> RouteSpec:
        """The split a VirtualService holds, as a RouteSpec (see the module docstring)."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        where = f"VirtualService {self.namespace}/{name}"
        spec = obj.get("spec") or {}
        http = spec.get("http") or []
        if len(http) != 1 or (spec.get("tcp") or spec.get("tls")):
            raise foreign(where, f"{len(http)} HTTP routes, not one")
        extra = sorted(set(http[0]) - OWN_HTTP_KEYS - KEPT_HTTP_KEYS)
        if extra:
            raise foreign(where, f"its HTTP route has {', '.join(extra)}")
        routes = http[0].get("route") or []
        if not routes or not all(isinstance((r or {}).get("destination"), dict) for r in routes):
            raise foreign(where, "its HTTP route has no destinations")
        keys = [destination_key(r["destination"]) for r in routes]
        bases = [subset or service_base(host, self.namespace) for host, subset, _port in keys]
        names = variant_names(bases, [port for _host, _subset, port in keys])
        raw = [int(r.get("weight") or 0) for r in routes]
        if len(raw) == 1 and "weight" not in routes[0]:
            raw = [100]
        weights = percentages(raw)
        variants = tuple(
            Variant(name=n, upstream=f"http://{host}" + (f":{port}" if port else ""), weight=w)
            for n, (host, _subset, port), w in zip(names, keys, weights, strict=True)
        )
        mirror = None
        target = http[0].get("mirror")
        if isinstance(target, dict):
            key = destination_key(target)
            if key not in keys:
                raise foreign(where, "it mirrors to a destination it does not route to")
            value = (http[0].get("mirrorPercentage") or {}).get("value", 100)
            mirror = Mirror(variant=names[keys.index(key)], percent=round(float(value)))
        timeout = http[0].get("timeout")
        ours = timeout is not None and timeout == annotations(obj).get(TIMEOUT_ANNOTATION)
        return RouteSpec(name=name, protocol=OPENAI, variants=variants, mirror=mirror,
                         timeout_s=seconds(timeout) if ours else None)

    # ----------------------------------------------------------------------------------------
    # The DestinationRule
    # ----------------------------------------------------------------------------------------

    def _ensure_rule(self, api: CustomObjects, name: str, rule: dict[str, Any] | None,
                     route_is_new: bool) -> tuple[bool, bool]:
        """Make the DestinationRule hold every subset the route is about to name (those it
        names now kept, so the route in force keeps working). Returns (created it now, it holds
        subsets to prune once the VirtualService changed)."""
        if rule is None:
            return False, False
        if route_is_new:
            # A new route has no DestinationRule yet: create it at once; one left over (or
            # made meanwhile) answers AlreadyExists and is brought up to date below.
            try:
                api.create(self.api_version, DESTINATION_RULES, self.namespace, rule)
            except KubeError as exc:
                if exc.kind != "conflict":
                    raise
            else:
                return True, False
        current = api.get(self.api_version, DESTINATION_RULES, self.namespace, name)
        if current is None:
            api.create(self.api_version, DESTINATION_RULES, self.namespace, rule)
            return True, False
        patch = rule_patch(current, rule, keep=True)
        if patch is not None:
            current = api.merge_patch(self.api_version, DESTINATION_RULES, self.namespace, name,
                                      patch)
        return False, rule_patch(current, rule, keep=False) is not None

    def _tidy(self, api: CustomObjects, name: str, rule: dict[str, Any] | None, prune: bool,
              before: dict[str, Any] | None) -> str:
        """After the VirtualService is in force: drop the subsets it no longer names, or the
        DestinationRule it no longer needs. A failure here leaves unused subsets, which route
        nothing: it is reported in the message, not raised."""
        try:
            if rule is not None and prune:
                return self._prune(api, name, rule)
            if rule is None and before is not None and uses_subsets(before):
                api.delete(self.api_version, DESTINATION_RULES, self.namespace, name)
                return "DestinationRule no longer needed, deleted"
        except KubeError as exc:
            return f"unused subsets left in DestinationRule {self.namespace}/{name}: {exc.message}"
        return ""

    def _prune(self, api: CustomObjects, name: str, rule: dict[str, Any]) -> str:
        """Drop the subsets the route no longer names, by a guarded merge patch (read again
        and retried on a 409)."""
        for _attempt in range(self.max_attempts):
            current = api.get(self.api_version, DESTINATION_RULES, self.namespace, name)
            patch = None if current is None else rule_patch(current, rule, keep=False)
            if patch is None:
                return ""
            try:
                api.merge_patch(self.api_version, DESTINATION_RULES, self.namespace, name, patch)
            except KubeError as exc:
                if exc.kind == "conflict":
                    continue
                raise
            return "unused subsets removed"
        return (f"unused subsets left in DestinationRule {self.namespace}/{name}: it changed "
                f"under Switchyard on each of {self.max_attempts} attempts")

    def _undo_rule(self, api: CustomObjects, name: str, cause: KubeError) -> None:
        """Delete the DestinationRule created for a VirtualService that was refused."""
        try:
            api.delete(self.api_version, DESTINATION_RULES, self.namespace, name)
        except KubeError as exc:
            cause.message += (f" (and the DestinationRule {self.namespace}/{name} made for it "
                              f"could not be deleted: {exc.message})")
            cause.args = (cause.message,)

    # ----------------------------------------------------------------------------------------
    # Helpers
    # ----------------------------------------------------------------------------------------

    def _session(self) -> Any:
        return session(self.access, GROUP, MISSING)

    def _url_of(self, obj: dict[str, Any]) -> str:
        hosts = (obj.get("spec") or {}).get("hosts") or []
        name = (obj.get("metadata") or {}).get("name", "")
        return f"http://{hosts[0] if hosts else route_host(name, self.route_domain)}"

    def _describe(self, obj: dict[str, Any], what: str, notes: str = "") -> str:
        metadata = obj.get("metadata") or {}
        try:
            weights = ", ".join(f"{v.name} {v.weight}" for v in self.spec_of(obj).variants)
        except AdapterError:
            weights = "not readable"
        text = (f"VirtualService {self.namespace}/{metadata.get('name')} {what} (generation "
                f"{metadata.get('generation')}): weights in force {weights}")
        return f"{text}; {notes}" if notes else text

