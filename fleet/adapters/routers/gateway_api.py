"""The Gateway API traffic router: a route is an HTTPRoute whose backendRef weights split it.

One route ``<name>`` is one HTTPRoute ``<name>`` in the cluster's namespace, labelled
``switchyard.io/deployment`` (``<name>`` when Switchyard creates it; an HTTPRoute without the
label is not Switchyard's and is never overwritten), attached to the cluster's Gateway
(``parentRefs``), serving the host ``<name>.<route domain>`` (a Gateway listener for
``*.<route domain>`` accepts it; point a wildcard DNS record at the Gateway's address; the
host is set when the route is made and kept, so its URL stays when the cluster's domain
changes) with one rule: every path (``PathPrefix /``) to one backendRef per variant, a
Service port with the variant's weight::

    spec:
      parentRefs: [{name: inference-gw, sectionName: http}]
      hostnames: [fraud-scorer.example]
      rules:
      - matches: [{path: {type: PathPrefix, value: /}}]
        backendRefs:
        - {group: "", kind: Service, name: triton-fraud-v1, port: 8000, weight: 90}
        - {group: "", kind: Service, name: triton-fraud-v2, port: 8000, weight: 10}

What the API expresses, and so what this router supports:

* weighted splits between Services (``weight`` 0 takes a backend out of traffic at once); a
  Service in another namespace gets ``namespace`` in its backendRef (that namespace needs a
  ReferenceGrant for HTTPRoutes of the route's namespace, or the controller reports
  ``ResolvedRefs`` False, which :meth:`GatewayApiRouter.health` shows); at most 16 variants;
* ``kserve-v2`` routes whose variants are distinct Services serving one model: requests pass
  through unchanged, so each Service must serve its variant's version of the model (a
  Switchyard workload runs one version per Deployment). Gateway API has no per-backend
  rewrite to ``/v2/models/<model>/versions/<n>``, so two variants on one Service port are
  refused (``variants.<i>.upstream``), as are variants of different models;
* a mirror of every request (``percent`` 100) as the rule's ``RequestMirror`` filter
  (Extended support: the controller says in ``Accepted`` whether it has it). Gateway API
  v1.0's RequestMirror has no percentage, so any other percent is refused
  (``mirror.percent``);
* not the ``sticky`` or ``least-pending`` policies (``policy``): see
  :func:`fleet.adapters.routers.kube_common.check_expressible`;
* not a request deadline (``timeout_s``): an HTTPRoute of v1.0's standard channel has no
  ``timeouts`` (they are experimental there), so a route with one is refused.

Writes, and why: :meth:`GatewayApiRouter.apply` reads the HTTPRoute; when there is none it
creates it (POST), when it differs it replaces it whole (PUT) with the ``resourceVersion`` it
read, so the API server refuses the write (409 Conflict) if anyone changed the route since.
Then the route is read again and the change recomputed, up to ``max_attempts`` times, after
which a readable KubeError (``conflict``) says so. A 409 AlreadyExists on create (another
writer made it meanwhile) takes the same path. Each attempt is one write of the whole
object, accepted or refused as a whole, so a failed apply leaves the route in force as it was.
A PUT was chosen over the alternatives the API server offers because: a JSON merge patch
(checked only when it carries the resourceVersion, as the Istio router's do) replaces the
rules list whole anyway; a JSON patch of
``/spec/rules/0/backendRefs/<i>/weight`` addresses backends by position, so a concurrent
reorder would put weights on the wrong Services unless guarded, and a failed ``test`` op is a
422 with no cause (indistinguishable from a real refusal); server-side apply with ``force``
takes fields from other managers silently. Fields of the HTTPRoute that Switchyard does not
own (annotations, other labels, status) are sent back as read.

API version: ``api_version`` when given, else discovered (``GET /apis/gateway.networking.
k8s.io``): ``v1`` when the cluster serves HTTPRoutes there (Gateway API v1.0 and later), else
``v1beta1`` (v0.6 to v0.8). The Gateway is read through the same version. A cluster without
the Gateway API CRDs answers a KubeError with ``missing_api`` that says so, never a 500.

The listener: with ``listener`` None the router reads the Gateway when it creates a route
and attaches to the one HTTP or HTTPS listener that accepts the route's host from its
namespace (``sectionName``; several: the whole Gateway), refusing readably when there is
none; ``listener`` "" attaches to the whole Gateway, and a name pins that listener.

Reading back: :meth:`GatewayApiRouter.read` returns the split the API server holds. An
HTTPRoute holds Services, ports and weights, not Switchyard's variant names, protocol, model
or version: the spec read back names each variant after its Service (``<service>``;
``<service>.<namespace>`` in another namespace; ``-<port>`` when a Service appears twice),
its upstream is the Service's canonical URL, its protocol ``openai`` (the pass-through
protocol: requests reach the backend unchanged, which is what an HTTPRoute does), and its
weights are percentages of their sum (the gateway splits in proportion).

Per-request samples: the gateway's JSON access log, shipped as UDP syslog to Switchyard's
collector, is mapped to the route's variants by ``rollouts.traffic.envoy_samples`` (a backendRef's
position is its variant's); without it latency comes from the servers' own metrics (see
docs/kubernetes.md). Plain Python: no Django, no settings.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet.adapters.base import AdapterError
from fleet.adapters.kubernetes import KubeAccess, KubeError
from fleet.adapters.routers.base import (
    KSERVE_V2,
    OPENAI,
    ApplyResult,
    Mirror,
    RouterHealth,
    RouteSpec,
    RouteSpecError,
    Variant,
    validate_route,
)
from fleet.adapters.routers.kube_common import (
    DEPLOYMENT_LABEL,
    MAX_ATTEMPTS,
    CustomObjects,
    ServiceRef,
    check_expressible,
    condition,
    is_api_version,
    is_dns_label,
    is_domain,
    percentages,
    route_host,
    service_of,
    session,
    variant_names,
)

GROUP = "gateway.networking.k8s.io"
PLURAL = "httproutes"
VERSIONS = ("v1", "v1beta1")  # the versions discovery picks from, by preference
MAX_BACKENDS = 16  # the CRD's maxItems for a rule's backendRefs
MISSING = (
    "install the Gateway API CRDs (v0.6 or later, standard channel) and a gateway controller"
)
API = "a Gateway API HTTPRoute"
ALL_PATHS = {"path": {"type": "PathPrefix", "value": "/"}}


@dataclass(frozen=True)
class Backend:
    """A backendRef: a Service port and its weight."""

    service: ServiceRef
    weight: int


class GatewayApiRouter:
    """Routes as HTTPRoutes in ``namespace`` attached to ``gateway`` ("namespace/name"),
    served at ``<route>.<route_domain>``; see the module docstring."""

    def __init__(
        self,
        access: KubeAccess,
        *,
        namespace: str,
        gateway: str,
        route_domain: str,
        api_version: str = "",
        listener: str | None = None,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        gateway_namespace, _, gateway_name = gateway.partition("/")
        if not (is_dns_label(gateway_namespace) and is_domain(gateway_name)):
            raise ValueError(f"the Gateway must be given as namespace/name, got {gateway!r}")
        if not is_dns_label(namespace):
            raise ValueError(f"the routes' namespace must be a DNS label, got {namespace!r}")
        if not route_domain or not is_domain(route_domain):
            raise ValueError(
                "Gateway API routes need the domain they are served under (routes answer at "
                f"<route>.<domain>), got {route_domain!r}"
            )
        if api_version and not is_api_version(api_version):
            raise ValueError(f"not an API version: {api_version!r}")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.access = access
        self.namespace = namespace
        self.gateway_namespace = gateway_namespace
        self.gateway_name = gateway_name
        self.route_domain = route_domain
        self.api_version = api_version
        self.listener = listener
        self.max_attempts = max_attempts

    # ----------------------------------------------------------------------------------------
    # The interface
    # ----------------------------------------------------------------------------------------

    def apply(self, route: RouteSpec) -> ApplyResult:
        """Put ``route`` in force (create, or replace with the resourceVersion read; see the
        module docstring); no write when the HTTPRoute already says it."""
        backends, mirror = self.plan(route)
        with self._session() as api:
            version = self._version(api)
            sections: list[str] = []

            def section() -> str:  # the Gateway is read once, and only when needed
                if not sections:
                    sections.append(self._section(api, version, route.name))
                return sections[0]

            for _attempt in range(self.max_attempts):
                current = api.get(version, PLURAL, self.namespace, route.name)
                if current is None:
                    body = self.route_object(route.name, version, backends, mirror, section())
                    try:
                        created = api.create(version, PLURAL, self.namespace, body)
                    except KubeError as exc:
                        if exc.kind == "conflict":
                            continue  # another writer created it meanwhile: read it again
                        raise
                    return self._written(created, "created")
                self._check_owned(current, route.name)
                body = self.updated_object(current, route.name, backends, mirror, section)
                if body is None:
                    return ApplyResult(False, False, self._describe(current, "already in force"),
                                       self._url_of(current))
                try:
                    replaced = api.replace(version, PLURAL, self.namespace, body)
                except KubeError as exc:
                    if exc.kind == "conflict":
                        continue  # changed since we read it: read it again and recompute
                    raise
                return self._written(replaced, "updated")
        raise KubeError(
            f"HTTPRoute {self.namespace}/{route.name} changed under Switchyard on each of "
            f"{self.max_attempts} attempts (409 Conflict); nothing of this change was written: "
            "try again",
            kind="conflict", status=409, reason="Conflict",
        )

    def remove(self, name: str) -> bool:
        """Delete the HTTPRoute ``name``; False when there is none."""
        with self._session() as api:
            return api.delete(self._version(api), PLURAL, self.namespace, name)

    def read(self, name: str) -> RouteSpec | None:
        """The split in force as the API server holds it (see the module docstring), or None.
        AdapterError when the HTTPRoute is not in the shape Switchyard writes."""
        with self._session() as api:
            current = api.get(self._version(api), PLURAL, self.namespace, name)
        return None if current is None else self.spec_of(current)

    def url(self, name: str) -> str | None:
        """``http://<host>`` of the HTTPRoute ``name``, or None when there is none."""
        with self._session() as api:
            current = api.get(self._version(api), PLURAL, self.namespace, name)
        return None if current is None else self._url_of(current)

    def health(self) -> RouterHealth:
        """List the namespace's HTTPRoutes; each labelled one is in force when the gateway
        controller reports ``Accepted`` and ``ResolvedRefs`` True on the cluster's Gateway for
        its current generation. Never raises."""
        try:
            with self._session() as api:
                version = self._version(api)
                items = api.list(version, PLURAL, self.namespace)
        except AdapterError as exc:
            return RouterHealth(ok=False, message=exc.message)
        routes: dict[str, bool] = {}
        problems = []
        for item in items:
            metadata = item.get("metadata") or {}
            if DEPLOYMENT_LABEL not in (metadata.get("labels") or {}):
                continue
            name = str(metadata.get("name", ""))
            problem = self.route_problem(item)
            routes[name] = not problem
            if problem:
                problems.append(f"route {name}: {problem}")
        if problems:
            return RouterHealth(ok=False, message="; ".join(problems), routes=routes)
        return RouterHealth(
            ok=True,
            message=f"{len(routes)} route{'' if len(routes) == 1 else 's'} accepted on Gateway "
                    f"{self.gateway_namespace}/{self.gateway_name} ({GROUP}/{version})",
            routes=routes,
        )

    # ----------------------------------------------------------------------------------------
    # From a spec to the object, and back
    # ----------------------------------------------------------------------------------------

    def plan(self, route: RouteSpec) -> tuple[list[Backend], ServiceRef | None]:
        """The backends and mirror target of ``route``; RouteSpecError naming the field for
        what an HTTPRoute cannot express."""
        validate_route(route)
        check_expressible(route, API)
        if route.timeout_s is not None:
            raise RouteSpecError(
                "a request deadline cannot be expressed by an HTTPRoute of Gateway API v1.0's "
                "standard channel (it has no timeouts; set the deadline on the Gateway's "
                "controller, or route through Istio or nginx): leave it empty",
                field="timeout_s",
            )
        if len(route.variants) > MAX_BACKENDS:
            raise RouteSpecError(
                f"an HTTPRoute rule holds at most {MAX_BACKENDS} backends, got "
                f"{len(route.variants)} variants",
                field="variants",
            )
        backends: list[Backend] = []
        seen: dict[tuple[str, str, int], int] = {}
        for index, variant in enumerate(route.variants):
            field = f"variants.{index}.upstream"
            service = service_of(variant.upstream, self.namespace, field)
            key = (service.name, service.namespace, service.port)
            if key in seen:
                why = ("cannot rewrite /v2/models/<model> to a version per backend"
                       if route.protocol == KSERVE_V2 else "cannot tell two backends apart")
                raise RouteSpecError(
                    f"variants {route.variants[seen[key]].name} and {variant.name} are the same "
                    f"Service port ({service.name}.{service.namespace}:{service.port}): an "
                    f"HTTPRoute {why}; give each variant a Service of its own",
                    field=field,
                )
            seen[key] = index
            backends.append(Backend(service, variant.weight))
        mirror = None
        if route.mirror is not None and route.mirror.percent > 0:
            if route.mirror.percent != 100:
                raise RouteSpecError(
                    "an HTTPRoute mirrors every request or none (Gateway API v1.0's "
                    f"RequestMirror has no percentage): 100 or no mirror, got "
                    f"{route.mirror.percent}",
                    field="mirror.percent",
                )
            mirror = backends[[v.name for v in route.variants].index(route.mirror.variant)].service
        return backends, mirror

    def _ref(self, service: ServiceRef) -> dict[str, Any]:
        ref: dict[str, Any] = {"group": "", "kind": "Service", "name": service.name}
        if service.namespace != self.namespace:
            ref["namespace"] = service.namespace
        ref["port"] = service.port
        return ref

    def rule(self, backends: list[Backend], mirror: ServiceRef | None) -> dict[str, Any]:
        """The one rule of a route: every path to the weighted backends (and the mirror)."""
        rule: dict[str, Any] = {
            "matches": [copy.deepcopy(ALL_PATHS)],
            "backendRefs": [{**self._ref(b.service), "weight": b.weight} for b in backends],
        }
        if mirror is not None:
            rule["filters"] = [
                {"type": "RequestMirror", "requestMirror": {"backendRef": self._ref(mirror)}}
            ]
        return rule

    def parent_ref(self, section: str) -> dict[str, Any]:
        ref: dict[str, Any] = {"name": self.gateway_name}
        if self.gateway_namespace != self.namespace:
            ref["namespace"] = self.gateway_namespace
        if section:
            ref["sectionName"] = section
        return ref

    def route_object(self, name: str, version: str, backends: list[Backend],
                     mirror: ServiceRef | None, section: str) -> dict[str, Any]:
        """The HTTPRoute that creates the route ``name``."""
        return {
            "apiVersion": f"{GROUP}/{version}",
            "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {DEPLOYMENT_LABEL: name}},
            "spec": {
                "parentRefs": [self.parent_ref(section)],
                "hostnames": [route_host(name, self.route_domain)],
                "rules": [self.rule(backends, mirror)],
            },
        }

    def updated_object(self, current: dict[str, Any], name: str, backends: list[Backend],
                       mirror: ServiceRef | None,
                       section: Callable[[], str]) -> dict[str, Any] | None:
        """``current`` with the fields Switchyard owns set to the route's (its
        resourceVersion kept, for the PUT), or None when they already are."""
        body = copy.deepcopy(current)
        spec = body.setdefault("spec", {})
        changed = False
        labels = body.setdefault("metadata", {}).setdefault("labels", {})
        if not labels.get(DEPLOYMENT_LABEL):
            labels[DEPLOYMENT_LABEL] = name
            changed = True
        # A route's URL stays what it was made with (clients hold it): the host is only set
        # where there is none, so a change of the cluster's route domain applies to new routes.
        if not spec.get("hostnames"):
            spec["hostnames"] = [route_host(name, self.route_domain)]
            changed = True
        parents = spec.get("parentRefs") or []
        if len(parents) != 1 or not self._is_our_gateway(parents[0]):
            spec["parentRefs"] = [self.parent_ref(section())]
            changed = True
        rules = [self.rule(backends, mirror)]
        if [self._canonical_rule(r) for r in spec.get("rules") or []] != [
            self._canonical_rule(r) for r in rules
        ]:
            spec["rules"] = rules
            changed = True
        return body if changed else None

    def _canonical_ref(self, ref: dict[str, Any], weighted: bool) -> dict[str, Any]:
        """A backendRef with the server's defaults filled in, for comparing."""
        out = {**ref, "group": ref.get("group", ""), "kind": ref.get("kind", "Service"),
               "namespace": ref.get("namespace") or self.namespace}
        if weighted:
            out["weight"] = ref.get("weight", 1)
        return out

    def _canonical_rule(self, rule: dict[str, Any]) -> dict[str, Any]:
        out = dict(rule)
        out["matches"] = rule.get("matches") or [ALL_PATHS]
        out["backendRefs"] = [self._canonical_ref(r, True) for r in rule.get("backendRefs") or []]
        filters = []
        for item in rule.get("filters") or []:
            mirrored = (item.get("requestMirror") or {}).get("backendRef")
            if item.get("type") == "RequestMirror" and isinstance(mirrored, dict):
                item = {**item, "requestMirror": {
                    **item["requestMirror"], "backendRef": self._canonical_ref(mirrored, False)}}
            filters.append(item)
        out["filters"] = filters
        return out

    def _is_our_gateway(self, ref: dict[str, Any]) -> bool:
        return (
            ref.get("group", GROUP) == GROUP
            and ref.get("kind", "Gateway") == "Gateway"
            and ref.get("name") == self.gateway_name
            and (ref.get("namespace") or self.namespace) == self.gateway_namespace
        )

    def spec_of(self, obj: dict[str, Any]) -> RouteSpec:
        """The split an HTTPRoute holds, as a RouteSpec (see the module docstring)."""
        metadata = obj.get("metadata") or {}
        name = str(metadata.get("name", ""))
        rules = (obj.get("spec") or {}).get("rules") or []
        where = f"HTTPRoute {self.namespace}/{name}"
        if len(rules) != 1:
            raise self._foreign(where, f"{len(rules)} rules, not one")
        rule = self._canonical_rule(rules[0])
        if rule["matches"] != [ALL_PATHS]:
            raise self._foreign(where, "its rule matches other paths than every path")
        refs = rule["backendRefs"]
        if not refs:
            raise self._foreign(where, "its rule has no backendRefs")
        if any(r["group"] != "" or r["kind"] != "Service" or "port" not in r for r in refs):
            raise self._foreign(where, "a backendRef is not a Service port")
        bases = [r["name"] if r["namespace"] == self.namespace else f"{r['name']}.{r['namespace']}"
                 for r in refs]
        names = variant_names(bases, [int(r["port"]) for r in refs])
        weights = percentages([int(r["weight"]) for r in refs])
        services = [ServiceRef(r["name"], r["namespace"], int(r["port"])) for r in refs]
        variants = tuple(
            Variant(name=n, upstream=s.url(), weight=w)
            for n, s, w in zip(names, services, weights, strict=True)
        )
        mirror = None
        for item in rule["filters"]:
            target = (item.get("requestMirror") or {}).get("backendRef")
            if item.get("type") != "RequestMirror" or not isinstance(target, dict):
                raise self._foreign(where, f"its rule has a {item.get('type')} filter")
            mirrored = ServiceRef(target.get("name", ""), target["namespace"],
                                  int(target.get("port") or 0))
            if mirrored not in services or mirror is not None:
                raise self._foreign(where, "it mirrors to a Service it does not route to")
            mirror = Mirror(variant=names[services.index(mirrored)], percent=100)
        return RouteSpec(name=name, protocol=OPENAI, variants=variants, mirror=mirror)

    @staticmethod
    def _foreign(where: str, why: str) -> AdapterError:
        return AdapterError(
            f"{where} is not in the shape Switchyard writes ({why}): it was changed outside "
            "Switchyard; apply the route again to take it back",
            permanent=True,
        )

    def route_problem(self, obj: dict[str, Any]) -> str:
        """Why the HTTPRoute ``obj`` is not in force on the cluster's Gateway ("" when it is),
        from the status its gateway controller writes."""
        generation = (obj.get("metadata") or {}).get("generation")
        gateway = f"{self.gateway_namespace}/{self.gateway_name}"
        parents = ((obj.get("status") or {}).get("parents")) or []
        ours = [p for p in parents if isinstance(p, dict)
                and self._is_our_gateway(p.get("parentRef") or {})]
        if not ours:
            return f"no gateway controller has accepted it on Gateway {gateway} yet (no status)"
        conditions = ours[0].get("conditions")
        for kind in ("Accepted", "ResolvedRefs"):
            found = condition(conditions, kind)
            if found is None:
                return f"the gateway controller reports no {kind} condition"
            if found.get("status") != "True":
                return (f"{kind} is {found.get('status')} ({found.get('reason', '')}: "
                        f"{found.get('message', '')})")
            seen = found.get("observedGeneration")
            if isinstance(seen, int) and isinstance(generation, int) and seen < generation:
                return (f"the gateway controller has taken generation {seen}, not the current "
                        f"{generation}, yet")
        return ""

    # ----------------------------------------------------------------------------------------
    # Helpers
    # ----------------------------------------------------------------------------------------

    def _session(self) -> Any:
        return session(self.access, GROUP, MISSING)

    def _version(self, api: CustomObjects) -> str:
        """The configured API version, else the best one the cluster serves HTTPRoutes at."""
        if self.api_version:
            return self.api_version
        group = api.discover()
        served = [v.get("version") for v in group.get("versions") or [] if isinstance(v, dict)]
        for version in VERSIONS:
            if version in served and PLURAL in api.resources(version):
                self.api_version = version
                return version
        raise KubeError(
            f"{GROUP} is served in {', '.join(map(str, served)) or 'no version'} without "
            f"HTTPRoutes in {' or '.join(VERSIONS)}: Switchyard writes those ({MISSING})",
            kind="not_found", status=404, missing_api=True,
        )

    def _section(self, api: CustomObjects, version: str, name: str) -> str:
        """The listener of the Gateway that accepts the route ``name`` ("" for all)."""
        if self.listener is not None:
            return self.listener
        gateway = api.get(version, "gateways", self.gateway_namespace, self.gateway_name)
        where = f"Gateway {self.gateway_namespace}/{self.gateway_name}"
        if gateway is None:
            raise KubeError(f"{where} does not exist: routes attached to it would not be served",
                            kind="not_found", status=404, reason="NotFound")
        host = route_host(name, self.route_domain)
        listeners = (gateway.get("spec") or {}).get("listeners") or []
        accepting = [item for item in listeners if self._accepts(item, host)]
        if not accepting:
            shown = ", ".join(
                f"{item.get('name')} {item.get('protocol')} {item.get('hostname') or '*'}:"
                f"{item.get('port')}" for item in listeners
            ) or "none"
            raise AdapterError(
                f"{where} has no HTTP listener that accepts HTTPRoutes for {host} from namespace "
                f"{self.namespace} (listeners: {shown})",
                permanent=True,
            )
        return str(accepting[0].get("name", "")) if len(accepting) == 1 else ""

    def _accepts(self, listener: dict[str, Any], host: str) -> bool:
        if listener.get("protocol") not in ("HTTP", "HTTPS"):
            return False
        pattern = listener.get("hostname") or ""
        if pattern.startswith("*."):
            if not (host.endswith(pattern[1:]) and len(host) > len(pattern) - 1):
                return False
        elif pattern and pattern != host:
            return False
        allowed = listener.get("allowedRoutes") or {}
        kinds = allowed.get("kinds")
        if kinds and not any(k.get("kind") == "HTTPRoute" for k in kinds if isinstance(k, dict)):
            return False
        # "Selector" needs the namespace's labels, which Switchyard does not read: the
        # controller's Accepted condition (health) says whether it matched.
        source = (allowed.get("namespaces") or {}).get("from", "Same")
        return source != "Same" or self.namespace == self.gateway_namespace

    def _check_owned(self, current: dict[str, Any], name: str) -> None:
        labels = (current.get("metadata") or {}).get("labels") or {}
        if not labels.get(DEPLOYMENT_LABEL):
            raise AdapterError(
                f"HTTPRoute {self.namespace}/{name} exists and is not Switchyard's (no label "
                f"{DEPLOYMENT_LABEL}): Switchyard does not overwrite it; rename or remove it",
                permanent=True,
            )

    def _url_of(self, obj: dict[str, Any]) -> str:
        hostnames = (obj.get("spec") or {}).get("hostnames") or []
        name = (obj.get("metadata") or {}).get("name", "")
        return f"http://{hostnames[0] if hostnames else route_host(name, self.route_domain)}"

    def _describe(self, obj: dict[str, Any], what: str) -> str:
        metadata = obj.get("metadata") or {}
        try:
            weights = ", ".join(f"{v.name} {v.weight}" for v in self.spec_of(obj).variants)
        except AdapterError:
            weights = "not readable"
        return (f"HTTPRoute {self.namespace}/{metadata.get('name')} {what} (generation "
                f"{metadata.get('generation')}): weights in force {weights}")

    def _written(self, obj: dict[str, Any], what: str) -> ApplyResult:
        return ApplyResult(True, True, self._describe(obj, what), self._url_of(obj))
