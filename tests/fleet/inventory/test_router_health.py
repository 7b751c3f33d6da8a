"""Traffic-router health: the fleet probe asks each cluster's REAL nginx how it is, records it
on the cluster, and the fleet page shows it: up, down while nginx is gone, up once it is back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from fleet.adapters.routers.base import KSERVE_V2, RouteSpec, Variant
from fleet.adapters.routers.nginx import NginxRouter
from fleet.inventory import health
from fleet.models import Cluster
from local.nginx import NginxProcess, start_nginx
from local.processes import free_ports
from tests.factories import ClusterFactory


@pytest.fixture
def local_nginx(tmp_path, settings) -> Iterator[NginxProcess]:
    """A real nginx on a prefix of this test's own, as the local cluster's router."""
    proc = start_nginx(tmp_path / "nginx", worker_processes=1)
    settings.SWITCHYARD_LOCAL_NGINX_DIR = proc.prefix
    settings.SWITCHYARD_LOCAL_NGINX_STATUS_PORT = proc.port
    settings.SWITCHYARD_ROUTE_PORTS = free_ports("127.0.0.1", 2)
    try:
        yield proc
    finally:
        proc.stop()


def fleet_page_row(user, cluster: Cluster) -> str:
    client = Client()
    client.force_login(user)
    html = client.get("/fleet/servers/live/").content.decode()
    start = html.index(f'data-router="{cluster.name}"')
    return html[start:html.index("</tr>", start)]


def test_a_router_is_recorded_up_then_down_while_nginx_is_gone_then_up_again(
    local_nginx, settings, bob, root
):
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.LOCAL)
    static_without_router = ClusterFactory(name="plain", kind=Cluster.Kind.STATIC)
    router = NginxRouter(**local_nginx.router_options(),  # type: ignore[arg-type]
                         ports=settings.SWITCHYARD_ROUTE_PORTS)
    router.apply(RouteSpec("dep-1", KSERVE_V2, (
        Variant("v1-a", "http://127.0.0.1:9", 100, model="m", version=1),)))

    up = health.check_routers()
    cluster.refresh_from_db()
    assert up == {"up": 1}
    assert cluster.router_state == Cluster.RouterState.UP
    assert (cluster.router_routes, cluster.router_detail) == (1, "1 route in force")
    assert cluster.router_connections >= 1  # the status request's own connection
    assert 'data-router-state="up"' in fleet_page_row(bob, cluster)
    static_without_router.refresh_from_db()
    assert static_without_router.router_state == Cluster.RouterState.UNKNOWN

    local_nginx.stop()
    down = health.check_routers()
    cluster.refresh_from_db()
    assert down == {"down": 1}
    assert cluster.router_state == Cluster.RouterState.DOWN
    assert "did not answer" in cluster.router_detail
    row = fleet_page_row(bob, cluster)
    # Members see the router down; why (the router's status URL) is for platform admins.
    assert 'data-router-state="down"' in row and "did not answer" not in row
    assert "did not answer" in fleet_page_row(root, cluster)
    changed = cluster.router_state_changed_at

    again = start_nginx(local_nginx.prefix, port=local_nginx.port, worker_processes=1)
    try:
        health.check_routers()
        cluster.refresh_from_db()
        assert cluster.router_state == Cluster.RouterState.UP
        assert cluster.router_state_changed_at > changed
        assert 'data-router-state="up"' in fleet_page_row(root, cluster)
    finally:
        again.stop()


@pytest.mark.django_db
def test_a_router_adapter_that_raises_is_recorded_down_with_the_reason(monkeypatch, settings):
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.LOCAL)

    def broken(self):
        raise RuntimeError("adapter bug")

    monkeypatch.setattr(NginxRouter, "health", broken)
    health.check_routers()
    cluster.refresh_from_db()

    assert cluster.router_state == Cluster.RouterState.DOWN
    assert cluster.router_detail == "probe failed: adapter bug"
