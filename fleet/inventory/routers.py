"""Which traffic router serves a cluster's routes: the one place that maps clusters to routers.

* local clusters: the local nginx (``SWITCHYARD_LOCAL_NGINX_DIR``), which the local cluster
  runs next to its servers; routes listen on ``SWITCHYARD_LOCAL_ROUTE_LISTEN_HOST``;
* static clusters with ``router_kind`` ``nginx``: the nginx that the cluster names, through
  its configuration directory (writable here, e.g. a shared mount) and its reload command.
  Switchyard tests every change with its own ``nginx -t`` before the swap, so this host needs
  the nginx binary too. Routes listen on every address of the router's host and their URLs
  name ``router_public_host``;
* Kubernetes clusters with ``kube_router`` ``gateway-api``: HTTPRoutes in ``kube_namespace``
  attached to the Gateway ``kube_gateway`` (namespace/name), a route answering at
  ``<route>.<kube_route_host>`` (``fleet.adapters.routers.gateway_api``); with ``istio``:
  VirtualServices there for the same hosts, bound to ``kube_gateway`` when one is named
  (``fleet.adapters.routers.istio``). Both reach the API with ``kube_connection.access_for``;
  a cluster whose access or router settings are unusable raises ValueError with the reason;
* anything else (a Kubernetes cluster without ``kube_router``, a static cluster without a
  router): no router.

:func:`has_router` says which clusters have one without building it (a Kubernetes router
reaches the cluster's API); :func:`routed_clusters` says the same as a query filter.

A change of a Kubernetes cluster's router (``kube_router`` or ``kube_namespace``) moves the
routes: :func:`save_router_change` sends :data:`router_changing` before the row is saved (a
receiver, ``rollouts.traffic.handover``, writes each route on the new router and reads it back,
or refuses the change with a DomainError) and runs what the receivers returned once it is saved
(deleting the old router's objects). :func:`leftover_routers` are the routers of the other
kinds, to delete what they wrote for a route.

The nginx routers send each request's JSON sample as a UDP syslog message to the collector at
``SWITCHYARD_COLLECTOR_HOST:SWITCHYARD_COLLECTOR_PORT``; a Kubernetes gateway's access log is
its own (see the routers' documentation).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from django.conf import settings
from django.db.models import Q
from django.dispatch import Signal

from console.exceptions import DomainError
from fleet.adapters.routers import nginx_paths
from fleet.adapters.routers.base import TrafficRouter
from fleet.adapters.routers.gateway_api import GatewayApiRouter
from fleet.adapters.routers.istio import IstioRouter
from fleet.adapters.routers.nginx import NginxRouter, syslog_target
from fleet.inventory import kube_connection
from fleet.models import Cluster

T = TypeVar("T")

#: Sent (``sender=Cluster``) with ``before`` (the cluster as saved) and ``after`` (as it is about
#: to be saved) when a Kubernetes cluster's router or routes' namespace changes. A receiver may
#: refuse the change by raising a DomainError, and may return a callable run once it is saved.
router_changing = Signal()
#: The settings whose change moves a cluster's routes to other objects.
ROUTER_SETTINGS = ("kube_router", "kube_namespace")


def _access_log() -> list[str]:
    return [syslog_target(settings.SWITCHYARD_COLLECTOR_HOST, settings.SWITCHYARD_COLLECTOR_PORT)]


def local_router_options() -> dict[str, object]:
    """NginxRouter keyword arguments for the local nginx (as its process derives them)."""
    prefix = Path(settings.SWITCHYARD_LOCAL_NGINX_DIR)
    return {
        "conf_dir": nginx_paths.conf_dir(prefix),
        "nginx": nginx_paths.nginx_binary(),
        "main_config": nginx_paths.main_config(prefix),
        "prefix": prefix.resolve(),
        "status_url": nginx_paths.status_url("127.0.0.1", settings.SWITCHYARD_LOCAL_NGINX_STATUS_PORT),
        "error_log": nginx_paths.error_log(prefix),
        "load_modules": nginx_paths.token_timing_modules(),
    }


def has_router(cluster: Cluster) -> bool:
    """Whether ``cluster`` has a traffic router: a local cluster, a static cluster naming its
    nginx, a Kubernetes cluster naming its router. Its settings may still be unusable:
    :func:`router_for` says so when it builds the router."""
    if cluster.kind == Cluster.Kind.KUBERNETES:
        return bool(cluster.kube_router)
    return cluster.kind == Cluster.Kind.LOCAL or (
        cluster.kind == Cluster.Kind.STATIC and cluster.router_kind == Cluster.RouterKind.NGINX
    )


def routed_clusters(prefix: str = "") -> Q:
    """:func:`has_router` as a filter; ``prefix`` is the path from the queried model to its
    cluster (``"cluster__"`` for deployments)."""
    return (
        Q(**{f"{prefix}kind": Cluster.Kind.LOCAL})
        | Q(**{f"{prefix}kind": Cluster.Kind.STATIC, f"{prefix}router_kind": Cluster.RouterKind.NGINX})
        | (Q(**{f"{prefix}kind": Cluster.Kind.KUBERNETES}) & ~Q(**{f"{prefix}kube_router": ""}))
    )


def router_for(cluster: Cluster) -> TrafficRouter | None:
    """The traffic router of ``cluster``, or None when it has none (:func:`has_router`)."""
    if not has_router(cluster):
        return None
    ports = settings.SWITCHYARD_ROUTE_PORTS
    if cluster.kind == Cluster.Kind.LOCAL:
        listen = settings.SWITCHYARD_LOCAL_ROUTE_LISTEN_HOST
        return NginxRouter(
            **local_router_options(),  # type: ignore[arg-type]
            listen_host=listen,
            public_host=settings.SWITCHYARD_LOCAL_ROUTE_PUBLIC_HOST or listen,
            ports=ports,
            access_log=_access_log(),
        )
    if cluster.kind == Cluster.Kind.STATIC:
        return NginxRouter(
            Path(cluster.router_conf_dir),
            nginx=nginx_paths.nginx_binary(),
            reload_command=shlex.split(cluster.router_reload_command),
            listen_host="0.0.0.0",
            public_host=cluster.router_public_host,
            ports=ports,
            # The ports are on the router's host: nginx's own test of the config finds a
            # port taken there.
            check_ports=False,
            access_log=_access_log(),
        )
    return _kube_router(cluster)


def _kube_router(cluster: Cluster) -> TrafficRouter:
    try:
        access = kube_connection.access_for(cluster)
    except DomainError as exc:
        raise ValueError(exc.message) from None
    if not cluster.kube_route_host:
        raise ValueError(
            "kube_route_host is empty: routes answer at <route>.<kube_route_host>, so the "
            "cluster needs the domain its gateway serves"
        )
    if cluster.kube_router == Cluster.KubeRouter.GATEWAY_API:
        return GatewayApiRouter(
            access, namespace=cluster.kube_namespace, gateway=cluster.kube_gateway,
            route_domain=cluster.kube_route_host,
        )
    if cluster.kube_router == Cluster.KubeRouter.ISTIO:
        return IstioRouter(
            access, namespace=cluster.kube_namespace, route_domain=cluster.kube_route_host,
            gateway=cluster.kube_gateway,
        )
    raise ValueError(f"unknown Kubernetes router {cluster.kube_router!r}")


def router_changed(before: Cluster | None, after: Cluster) -> bool:
    """Whether saving ``after`` over ``before`` moves a Kubernetes cluster's routes."""
    return (before is not None and before.is_kubernetes and before.pk == after.pk
            and any(getattr(before, f) != getattr(after, f) for f in ROUTER_SETTINGS))


def save_router_change(before: Cluster | None, after: Cluster, save: Callable[[], T]) -> T:
    """``save()`` the cluster ``after``; when that changes its router (:func:`router_changed`),
    the receivers of :data:`router_changing` hand its routes over first (a DomainError from
    one refuses the change: nothing is saved), and what they returned runs once it is saved."""
    if not router_changed(before, after):
        return save()
    answers = router_changing.send(sender=Cluster, before=before, after=after)
    saved = save()
    for _receiver, finish in answers:
        if callable(finish):
            finish()
    return saved


def leftover_routers(cluster: Cluster) -> list[TrafficRouter]:
    """Routers of the Kubernetes router kinds ``cluster`` does not use now, in its namespace,
    built only to delete what they wrote for a route before a switch (their gateway and
    domain are placeholders: removing a route uses neither). Empty for other clusters."""
    if not cluster.is_kubernetes:
        return []
    try:
        access = kube_connection.access_for(cluster)
    except DomainError:
        return []
    namespace = cluster.kube_namespace
    found: list[TrafficRouter] = []
    if cluster.kube_router != Cluster.KubeRouter.GATEWAY_API:
        found.append(GatewayApiRouter(access, namespace=namespace, gateway=f"{namespace}/unused",
                                      route_domain="invalid"))
    if cluster.kube_router != Cluster.KubeRouter.ISTIO:
        found.append(IstioRouter(access, namespace=namespace, route_domain="invalid"))
    return found
