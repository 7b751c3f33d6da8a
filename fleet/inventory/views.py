"""Inventory console pages: the fleet overview, servers with live health and load, clusters
with their nodes, GPUs and sync (and, for platform admins, adding, editing, testing and syncing
one)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import (
    Case,
    Count,
    F,
    Prefetch,
    Q,
    Sum,
    When,
    prefetch_related_objects,
)
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HTMX_STOP_POLLING

from console.exceptions import DomainError
from fleet.inventory import health, kube_connection, loadstats
from fleet.inventory.forms import ClusterForm
from fleet.models import GPU, Cluster, ClusterSync, InferenceServer, Node, Placement
from fleet.tenancy.scoping import is_platform_admin, require_platform_admin
from fleet.tenancy.visibility import reported_models, reported_models_of

# The overview draws a cluster's nodes, GPUs and servers while the cluster is small; past
# this many nodes it sums them up (a fleet's 10,000 GPUs are not one page's rows) and the
# cluster's own page has the tree.
TREE_NODES = 16
# The live server table redraws every 3 s: at most this many rows (1,000 took 200 ms and more).
LIVE_ROWS = 100


def _clusters(user: object) -> list[Cluster]:
    """The visible clusters with their counts: ``node_count``, ``server_count`` and
    ``gpu_classes`` (device class, GPUs, memory, MIG slices); the node tree of small ones."""
    clusters = list(Cluster.objects.visible_to(user).annotate(node_count=Count("nodes")))
    ids = [c.pk for c in clusters]
    servers = dict(InferenceServer.objects.filter(cluster_id__in=ids).values("cluster_id")
                   .annotate(n=Count("pk")).values_list("cluster_id", "n"))
    classes: dict[int, list[dict[str, Any]]] = {}
    for row in (GPU.objects.filter(node__cluster_id__in=ids)
                .values("node__cluster_id", "device_class")
                .annotate(gpus=Count("pk", filter=Q(parent__isnull=True)),
                          slices=Count("pk", filter=Q(parent__isnull=False)),
                          memory_mib=Sum("memory_mib", filter=Q(parent__isnull=True)))
                .order_by("node__cluster_id", "device_class")):
        classes.setdefault(row.pop("node__cluster_id"), []).append(row)
    for cluster in clusters:
        cluster.server_count = servers.get(cluster.pk, 0)
        cluster.gpu_classes = classes.get(cluster.pk, [])
        cluster.drawn = cluster.node_count <= TREE_NODES
    by_name = InferenceServer.objects.order_by("name")
    nodes = Node.objects.prefetch_related(
        Prefetch("gpus", queryset=GPU.objects.filter(parent__isnull=True).prefetch_related("mig_slices")),
        Prefetch("servers", queryset=by_name),
    )
    prefetch_related_objects([c for c in clusters if c.drawn], Prefetch("nodes", queryset=nodes),
                             Prefetch("servers", queryset=by_name))
    return clusters


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    return render(request, "fleet/overview.html", {"clusters": _clusters(request.user)})


@login_required
def servers_partial(request: HttpRequest) -> HttpResponse:
    """The live server table, re-rendered every few seconds by htmx. Past ``LIVE_ROWS``
    servers it shows the ones that are not healthy first and says how many it leaves out."""
    visible = InferenceServer.objects.visible_to(request.user).select_related("cluster", "node")
    total = visible.count()
    if total > LIVE_ROWS:
        healthy_last = Case(When(health=InferenceServer.Health.HEALTHY, then=1), default=0)
        visible = visible.order_by(healthy_last, "cluster__name", "name")[:LIVE_ROWS]
    servers = list(visible)
    loads = loadstats.server_loads([s.pk for s in servers])
    shown = reported_models(request.user, servers)
    now = timezone.now()
    for server in servers:
        server.shown_models = shown[server.pk]
        load = loads.get(server.pk)
        server.load_rps = load["rps"] if load else None
        server.load_age_s = now.timestamp() - load["t"] if load else None
    routers = Cluster.objects.visible_to(request.user).filter(
        Q(kind=Cluster.Kind.LOCAL) | Q(router_kind=Cluster.RouterKind.NGINX)
    ).order_by("name")
    return render(request, "fleet/partials/server_table.html",
                  {"servers": servers, "routers": routers, "now": now,
                   "left_out": total - len(servers)})


@login_required
def server_detail(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(InferenceServer.objects.visible_to(request.user), pk=pk)
    placements = (
        Placement.objects.visible_to(request.user)
        .filter(server=server, state__in=Placement.HOLDING)
        .select_related("tenant", "model_version__model")
    )
    server.shown_models = reported_models_of(request.user, server)
    return render(
        request,
        "fleet/server_detail.html",
        {"server": server, "now": timezone.now(), "placements": placements},
    )


def _status(request: HttpRequest, server: InferenceServer) -> HttpResponse:
    server.shown_models = reported_models_of(request.user, server)
    return render(
        request, "fleet/partials/server_status.html", {"server": server, "now": timezone.now()}
    )


@login_required
def server_status(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(InferenceServer.objects.visible_to(request.user), pk=pk)
    return _status(request, server)


@login_required
@require_POST
def server_check(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(InferenceServer.objects.visible_to(request.user), pk=pk)
    health.check_server(server.pk)
    server.refresh_from_db()
    return _status(request, server)


# --- clusters ------------------------------------------------------------------------------

#: How many recent syncs the cluster page lists.
RECENT_SYNCS = 10


@dataclass
class SliceGroup:
    """MIG slices of one profile on a node: ``count`` x ``profile`` (quota class)."""

    profile: str
    device_class: str
    count: int = 0


@dataclass
class GPUGroup:
    """A node's GPUs of one model: how many, how many are whole (not partitioned), and the
    MIG slices cut from the others, e.g. 8 x H100 - 6 whole, MIG: 2 x 3g.40gb, 7 x 1g.10gb."""

    model: str
    device_class: str
    memory_mib: int
    count: int = 0
    whole: int = 0
    slices: list[SliceGroup] = field(default_factory=list)


def gpu_groups(gpus: list[GPU]) -> list[GPUGroup]:
    """``gpus`` (one node's, slices included) grouped for showing. A slice is counted under
    its physical GPU's group; one without a parent, under the only group there is (or a group
    of its own model when there are several)."""
    physical = [g for g in gpus if g.parent_id is None and not g.mig_profile]
    slices = [g for g in gpus if g.parent_id is not None or g.mig_profile]
    partitioned = {g.parent_id for g in slices if g.parent_id is not None}
    groups: dict[tuple[str, str], GPUGroup] = {}
    by_pk: dict[int, GPUGroup] = {}
    for gpu in sorted(physical, key=lambda g: (g.model, g.index)):
        group = groups.setdefault(
            (gpu.model, gpu.device_class), GPUGroup(gpu.model, gpu.device_class, gpu.memory_mib)
        )
        group.count += 1
        group.whole += gpu.pk not in partitioned
        by_pk[gpu.pk] = group
    counted: dict[tuple[int, str, str], SliceGroup] = {}
    for piece in sorted(slices, key=lambda g: (g.mig_profile, g.index)):
        group = by_pk.get(piece.parent_id) if piece.parent_id is not None else None
        if group is None:
            only = list(groups.values())
            group = only[0] if len(only) == 1 else groups.setdefault(
                (piece.model, ""), GPUGroup(piece.model, "", 0))
        key = (id(group), piece.mig_profile, piece.device_class)
        if key not in counted:
            counted[key] = SliceGroup(piece.mig_profile or "MIG", piece.device_class)
            group.slices.append(counted[key])
        counted[key].count += 1
    for group in groups.values():
        # Bigger slices first: 3g.40gb before 1g.10gb.
        group.slices.sort(key=lambda s: (-_slice_size(s.profile), s.profile))
    return list(groups.values())


def _slice_size(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def _taint_text(taint: Any) -> str:
    if not isinstance(taint, dict):
        return str(taint)
    value = f"={taint['value']}" if taint.get("value") else ""
    effect = f":{taint['effect']}" if taint.get("effect") else ""
    return f"{taint.get('key', '')}{value}{effect}"


def _cluster(request: HttpRequest, pk: int) -> Cluster:
    # Clusters are shared: any tenant member sees them; anyone else gets a 404.
    return get_object_or_404(Cluster.objects.visible_to(request.user), pk=pk)


def _cluster_live(request: HttpRequest, cluster: Cluster) -> dict[str, Any]:
    """What the live part of the cluster page shows: sync state, recent syncs, nodes with
    their GPUs and what runs on them (placements of the caller's tenants only)."""
    servers = list(InferenceServer.objects.filter(cluster=cluster).order_by("name"))
    shown = reported_models(request.user, servers)
    placements = (
        Placement.objects.visible_to(request.user)
        .filter(server__in=servers, state__in=Placement.HOLDING)
        .select_related("tenant", "model_version__model")
        .order_by("tenant__slug", "model_version__model__name", "model_version__version")
    )
    held: dict[int, list[Placement]] = {}
    for placement in placements:
        held.setdefault(placement.server_id, []).append(placement)
    # Other tenants' placements are counted, never named (as their reported models are).
    everyone = Counter(
        Placement.objects.filter(server__in=servers, state__in=Placement.HOLDING)
        .values_list("server_id", flat=True)
    )
    on_node: dict[int, list[InferenceServer]] = {}
    elsewhere = []
    for server in servers:
        server.shown_models = shown[server.pk]
        server.held = held.get(server.pk, [])
        server.held_by_others = everyone[server.pk] - len(server.held)
        if server.node_id is None:
            elsewhere.append(server)
        else:
            on_node.setdefault(server.node_id, []).append(server)
    nodes = list(
        # Nodes in the cluster first, then the gone ones (NULLs first on every database).
        Node.objects.filter(cluster=cluster).prefetch_related("gpus").order_by(
            F("gone_at").asc(nulls_first=True), "name")
    )
    for node in nodes:
        node.gpu_groups = gpu_groups(list(node.gpus.all()))
        node.taint_texts = [_taint_text(t) for t in node.taints or []]
        node.server_list = on_node.pop(node.pk, [])
    for rest in on_node.values():  # a server whose node belongs to another cluster
        elsewhere.extend(rest)
    syncs = list(ClusterSync.objects.filter(cluster=cluster)[:RECENT_SYNCS])
    return {"cluster": cluster, "nodes": nodes, "elsewhere": elsewhere, "syncs": syncs,
            "now": timezone.now(), "polls": cluster.is_kubernetes,
            "sync_interval_s": round(settings.SWITCHYARD_KUBE_SYNC_INTERVAL_S)}


@login_required
def cluster_detail(request: HttpRequest, pk: int) -> HttpResponse:
    cluster = _cluster(request, pk)
    context = _cluster_live(request, cluster)
    # How the API is reached and with what is the platform's: a tenant's page never gets it
    # (the templates also show it only under ``is_platform_admin``).
    if is_platform_admin(request.user):
        context["secret_hint"] = kube_connection.secret_hint(cluster)
        context["ca_certificates"] = cluster.kube_ca_bundle.count("BEGIN CERTIFICATE")
    return render(request, "fleet/cluster_detail.html", context)


@login_required
def cluster_live(request: HttpRequest, pk: int) -> HttpResponse:
    """The live part of the cluster page. A kubernetes cluster is synced every few seconds
    (``SWITCHYARD_KUBE_SYNC_INTERVAL_S``) and its nodes can change at any moment, so the page
    keeps polling while it is open; other clusters have no sync: polling stops (286)."""
    cluster = _cluster(request, pk)
    status = 200 if cluster.is_kubernetes else HTMX_STOP_POLLING
    return render(request, "fleet/partials/cluster_live.html",
                  _cluster_live(request, cluster), status=status)


@login_required
@require_POST
def cluster_test(request: HttpRequest, pk: int) -> HttpResponse:
    """Test the cluster's connection now (platform admin); the result is a message and the
    connection state on the page."""
    cluster = _cluster(request, pk)
    require_platform_admin(request.user)
    try:
        result = kube_connection.test_connection(cluster)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        if result.ok:
            messages.success(request, f"{cluster.name}: {result.detail}")
        else:
            messages.error(request, f"{cluster.name}: connection failed: {result.detail}")
    return redirect("fleet:cluster", pk=cluster.pk)


@login_required
@require_POST
def cluster_sync(request: HttpRequest, pk: int) -> HttpResponse:
    """Queue a sync of the cluster now (platform admin)."""
    cluster = _cluster(request, pk)
    require_platform_admin(request.user)
    try:
        queued = kube_connection.queue_sync(cluster)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        text = kube_connection.sync_queued_text(cluster, queued)
        (messages.success if queued else messages.warning)(request, text[0].upper() + text[1:])
    return redirect("fleet:cluster", pk=cluster.pk)


def _cluster_form(request: HttpRequest, cluster: Cluster | None) -> HttpResponse:
    require_platform_admin(request.user)
    instance = cluster or Cluster(kind=Cluster.Kind.KUBERNETES)
    if request.method == "POST":
        form = ClusterForm(request.POST, instance=instance, actor=request.user)
        if form.is_valid():
            try:
                saved = form.save()
            except DomainError as exc:  # a router change whose routes could not move
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            else:
                done = "added" if cluster is None else "saved"
                messages.success(request, f"Cluster {saved.name} {done}.")
                return redirect("fleet:cluster", pk=saved.pk)
        status = 400
    else:
        form = ClusterForm(instance=instance, actor=request.user)
        status = 200
    response = render(request, "fleet/cluster_form.html", {
        "form": form, "cluster": cluster,
        "secret_hint": kube_connection.secret_hint(cluster) if cluster else "",
    }, status=status)
    add_never_cache_headers(response)
    return response


@login_required
@require_http_methods(["GET", "POST"])
def cluster_create(request: HttpRequest) -> HttpResponse:
    return _cluster_form(request, None)


@login_required
@require_http_methods(["GET", "POST"])
def cluster_edit(request: HttpRequest, pk: int) -> HttpResponse:
    return _cluster_form(request, _cluster(request, pk))
