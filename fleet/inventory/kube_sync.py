"""Kubernetes clusters' inventory kept in step with their API: nodes, GPUs, MIG slices and
the inference servers labelled for Switchyard.

One sync (:func:`sync_cluster`, a beat tick per cluster) is either

* a **list** (``ClusterSync.kind = list``): every Node (page by page), applied as the whole
  truth: new nodes added, changed ones updated, nodes no longer listed marked gone; then the
  Deployments labelled ``switchyard.io/deployment`` (discovered servers). It runs when no
  resourceVersion is stored yet, after a watch answered 410 Gone (the stored resourceVersion
  is older than the server keeps), and every ``SWITCHYARD_KUBE_RELIST_INTERVAL_S`` (60 s);
* or a **watch** (``kind = watch``): the Node events after the stored resourceVersion,
  streamed for at most the sync interval (less 2 s, so a tick ends before the next one),
  then applied in order. The last resourceVersion seen is stored
  (``Cluster.nodes_resource_version``): the next tick resumes from there. A watch with no
  change and no error writes no ClusterSync row.

Fetching happens outside any transaction; each result is applied in one transaction holding
the cluster row, and only if no other sync moved the stored resourceVersion meanwhile (two
syncs of one cluster cannot interleave their results).

Nodes that vanish get ``gone_at`` (they come back if they reappear). Their GPU rows are
kept while a placement holding quota (loading or active) references a server on them, and
deleted otherwise; a gone node nothing references is deleted a day later.

Failures never raise: wrong credentials (401), an unreachable API, TLS and unusable settings
fail the sync (``Cluster.sync_state = failed``, ``connection_state = failed``); an RBAC 403 on
one resource fails that part only (``partial``: the rest is applied); a watch that drops
keeps the events received before the drop (``partial``, resumed on the next tick). Each
outcome is a ClusterSync row (added, changed, gone, errors) and ``Cluster.sync_detail``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from console.exceptions import DomainError
from fleet.adapters import kube_nodes as kn
from fleet.adapters import kubernetes as kube
from fleet.inventory import kube_connection
from fleet.models import GPU, Cluster, ClusterSync, InferenceServer, Node, Placement

log = logging.getLogger(__name__)

KEEP_SYNCS = 50
GONE_RETENTION = timedelta(days=1)
DEFAULT_RELIST_INTERVAL_S = 60.0
# Failures that say the cluster cannot be used at all: nothing else is tried in that sync.
FATAL = ("unauthorized", "unreachable", "tls", "config", "not_kubernetes")


def relist_interval_s() -> float:
    return float(getattr(settings, "SWITCHYARD_KUBE_RELIST_INTERVAL_S",
                         DEFAULT_RELIST_INTERVAL_S))


def page_size_setting() -> int:
    """Nodes per page of a list (0: the whole list in one request)."""
    return int(getattr(settings, "SWITCHYARD_KUBE_PAGE_SIZE", kn.PAGE_SIZE) or 0)


def watch_timeout_s() -> int:
    """How long one watch streams: the sync interval less 2 s (at least 1 s)."""
    return max(int(settings.SWITCHYARD_KUBE_SYNC_INTERVAL_S) - 2, 1)


def clusters_to_sync() -> list[int]:
    """The Kubernetes clusters whose connection details are set."""
    ids = []
    for cluster in Cluster.objects.filter(kind=Cluster.Kind.KUBERNETES).exclude(kube_auth=""):
        in_cluster = cluster.kube_auth == Cluster.KubeAuth.IN_CLUSTER
        has_url = cluster.kube_auth != Cluster.KubeAuth.TOKEN or bool(cluster.api_url)
        if in_cluster or (cluster.has_kube_secret and has_url):
            ids.append(cluster.pk)
    return ids


@dataclass
class _Run:
    """What one list or watch did, before it is recorded."""

    kind: str
    started_at: datetime
    resource_version: str = ""
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    answered: bool = False  # the API server answered (it was reached and took the credentials)
    applied: bool = False  # some result was applied
    fatal: str = ""  # the message of a failure that stopped the sync
    expired: bool = False  # the watch's resourceVersion is too old (410 Gone)

    @property
    def quiet(self) -> bool:
        return not (self.added or self.changed or self.gone or self.errors)

    def fail(self, exc: kube.KubeError | DomainError) -> None:
        self.errors.append(exc.message)
        if isinstance(exc, DomainError) or exc.kind in FATAL:
            self.fatal = exc.message
        else:
            self.answered = True


# --- entry points ----------------------------------------------------------------------------


def sync_cluster_id(cluster_id: int, *, full: bool = False) -> ClusterSync | None:
    """The task's entry: sync one cluster (None when it is no Kubernetes cluster now)."""
    cluster = Cluster.objects.filter(pk=cluster_id, kind=Cluster.Kind.KUBERNETES).first()
    if cluster is None:
        return None
    return sync_cluster(cluster, full=full)


def sync_cluster(
    cluster: Cluster,
    *,
    page_size: int | None = None,
    watch_timeout: int | None = None,
    bookmarks: bool = False,
    full: bool = False,
) -> ClusterSync:
    """One sync of ``cluster`` (a list or a watch, see the module doc). Never raises.

    ``page_size``: nodes per page of a list (0: one request; None: the setting),
    ``watch_timeout``: seconds a watch streams (None: :func:`watch_timeout_s`); ``full``: a
    list even when a watch would do (a "sync now").
    Returns the ClusterSync that records it; after a quiet watch, an unsaved one.
    """
    if cluster.sync_state == Cluster.SyncState.NEVER:
        Cluster.objects.filter(pk=cluster.pk).update(sync_state=Cluster.SyncState.SYNCING)
    try:
        return _sync(cluster, page_size=page_size_setting() if page_size is None else page_size,
                     watch_timeout=watch_timeout or watch_timeout_s(), bookmarks=bookmarks,
                     full=full)
    except Exception as exc:  # a sync records its failure, never raises
        log.exception("sync of cluster %s failed", cluster)
        run = _Run(kind=ClusterSync.Kind.LIST, started_at=timezone.now())
        run.errors.append(f"internal error: {exc.__class__.__name__}: {exc}")
        return _finish(cluster, run)


def _sync(cluster: Cluster, *, page_size: int, watch_timeout: int,
          bookmarks: bool, full: bool) -> ClusterSync:
    start_rv = cluster.nodes_resource_version
    listing = full or not start_rv or _relist_due(cluster)
    first = _Run(kind=ClusterSync.Kind.LIST if listing else ClusterSync.Kind.WATCH,
                 started_at=timezone.now(), resource_version=start_rv)
    try:
        access = kube_connection.access_for(cluster)
    except DomainError as exc:
        first.fail(exc)
        return _finish(cluster, first)
    try:
        with kube.api_client(access) as api:
            if not listing:
                _watch(cluster, api, access, first, start_rv, watch_timeout, bookmarks)
                if not first.expired:
                    return _finish(cluster, first)
                _finish(cluster, first, final=False)
                run = _Run(kind=ClusterSync.Kind.LIST, started_at=timezone.now())
                run.notes.append(
                    f"the watch from resourceVersion {start_rv} expired (410 Gone): listed "
                    "again"
                )
            else:
                run = first
            _list(cluster, api, access, run, start_rv, page_size)
            if not run.fatal:
                _discover(cluster, api, access, run)
            return _finish(cluster, run)
    except kube.KubeError as exc:  # the access details themselves are unusable
        first.fail(exc)
        return _finish(cluster, first)


def _relist_due(cluster: Cluster) -> bool:
    last = (ClusterSync.objects.filter(cluster=cluster, kind=ClusterSync.Kind.LIST)
            .order_by("-started_at", "-id").values_list("started_at", flat=True).first())
    return last is None or timezone.now() - last >= timedelta(seconds=relist_interval_s())


# --- nodes: list and watch ---------------------------------------------------------------------


def _list(cluster: Cluster, api, access: kube.KubeAccess, run: _Run, start_rv: str,
          page_size: int) -> None:
    try:
        listing = kn.list_nodes(api, page_size=page_size,
                                request_timeout=kube.request_timeout(access))
    except kube.KubeError as exc:
        run.fail(exc)
        return
    run.answered = True
    if listing.relisted:
        run.notes.append("a continue token expired (410 Gone): the nodes were listed again "
                         "in one request")
    now = timezone.now()
    with transaction.atomic():
        if not _still_at(cluster, start_rv, run):
            return
        existing = {n.name: n for n in Node.objects.filter(cluster=cluster)}
        listed = set()
        for info in listing.nodes:
            listed.add(info.name)
            _apply_node(cluster, info, existing, run)
        for node in existing.values():
            if node.synced and node.name not in listed:
                _mark_gone(node, now, run)
        _prune_gone(cluster, now)
        _store_rv(cluster, listing.resource_version, run)
    run.applied = True


def _watch(cluster: Cluster, api, access: kube.KubeAccess, run: _Run, start_rv: str,
           timeout_s: int, bookmarks: bool) -> None:
    events: list[kn.NodeEvent] = []
    error: kube.KubeError | None = None
    try:
        read_timeout = timeout_s + access.timeout_s
        for event in kn.watch_nodes(api, start_rv, timeout_s=timeout_s, bookmarks=bookmarks,
                                    request_timeout=(kube.request_timeout(access)[0],
                                                     read_timeout)):
            events.append(event)
    except kube.KubeError as exc:
        error = exc
    if error is not None and error.kind == "gone":
        run.answered = True
        run.expired = True
        run.errors.append(error.message)
        if not events:
            return
    elif error is not None:
        run.fail(error)
        if events:  # the stream dropped after some events: the API was there
            run.answered = True
            run.fatal = ""
            run.errors[-1] += (
                f" after {len(events)} events; the next sync resumes from resourceVersion "
                f"{events[-1].resource_version or start_rv}"
            )
    else:
        run.answered = True
    if not events:
        return
    now = timezone.now()
    with transaction.atomic():
        if not _still_at(cluster, start_rv, run):
            return
        existing = {n.name: n for n in Node.objects.filter(cluster=cluster)}
        rv = start_rv
        for event in events:
            if event.node is not None and event.type in ("ADDED", "MODIFIED"):
                _apply_node(cluster, event.node, existing, run)
            elif event.node is not None and event.type == "DELETED":
                node = existing.get(event.node.name)
                if node is not None:
                    _mark_gone(node, now, run)
            rv = event.resource_version or rv
        if not run.expired:
            _store_rv(cluster, rv, run)
    run.applied = True


def _still_at(cluster: Cluster, start_rv: str, run: _Run) -> bool:
    """Lock the cluster row; False (noted) when another sync moved its resourceVersion."""
    current = (Cluster.objects.select_for_update().filter(pk=cluster.pk)
               .values_list("nodes_resource_version", flat=True).first())
    if current != start_rv:
        run.notes.append("another sync of this cluster applied newer state meanwhile: "
                         "this one's nodes were not applied")
        return False
    return True


def _store_rv(cluster: Cluster, rv: str, run: _Run) -> None:
    run.resource_version = rv
    Cluster.objects.filter(pk=cluster.pk).update(nodes_resource_version=rv)
    cluster.nodes_resource_version = rv


def _node_fields(info: kn.NodeInfo) -> dict[str, object]:
    return {
        "hostname": info.hostname[:255],
        "cpu_cores": info.cpu_cores,
        "memory_mib": info.memory_mib,
        "labels": info.labels,
        "ready": info.ready,
        "ready_detail": info.ready_detail[:500],
        "unschedulable": info.unschedulable,
        "taints": info.taints,
        "capacity": info.capacity,
        "allocatable": info.allocatable,
        "zone": info.zone[:100],
    }


def _apply_node(cluster: Cluster, info: kn.NodeInfo, existing: dict[str, Node],
                run: _Run) -> None:
    if not info.name or len(info.name) > Node._meta.get_field("name").max_length:
        run.errors.append(f"node {info.name[:60]!r}: the name is too long to keep")
        return
    fields = _node_fields(info)
    node = existing.get(info.name)
    if node is None:
        node = Node.objects.create(cluster=cluster, name=info.name, synced=True,
                                   resource_version=info.resource_version, **fields)
        existing[info.name] = node
        _reconcile_gpus(cluster, node, info.gpus)
        _note(run.added, f"node {info.name}")
        return
    came_back = node.gone_at is not None
    differs = not node.synced or any(getattr(node, k) != v for k, v in fields.items())
    if differs or came_back or node.resource_version != info.resource_version:
        for name, value in fields.items():
            setattr(node, name, value)
        node.synced = True
        node.gone_at = None
        node.resource_version = info.resource_version
        node.save()
    gpus_changed = _reconcile_gpus(cluster, node, info.gpus)
    if came_back:
        _note(run.added, f"node {info.name}")
    elif differs or gpus_changed:
        _note(run.changed, f"node {info.name}")


def _reconcile_gpus(cluster: Cluster, node: Node, gpus: list[kn.GpuInfo]) -> bool:
    """Make the node's GPU rows those of ``gpus``; True when anything changed."""
    want = {kn.gpu_uuid(cluster.pk, node.name, g.key): g for g in gpus}
    have = {g.uuid: g for g in GPU.objects.filter(node=node)}
    stale = [g.pk for uuid, g in have.items() if uuid not in want]
    changed = bool(stale)
    if stale:
        GPU.objects.filter(pk__in=stale).delete()
    rows: dict[str, GPU] = {}
    for uuid, info in sorted(want.items(), key=lambda item: item[1].is_mig):
        parent = rows.get(kn.gpu_uuid(cluster.pk, node.name, info.parent_key)) \
            if info.is_mig else None
        values = {
            "index": info.index,
            "model": info.model[:100],
            "device_class": info.device_class,
            "memory_mib": info.memory_mib,
            "mig_profile": info.mig_profile,
            "parent": parent,
        }
        row = have.get(uuid)
        if row is None:
            row = GPU.objects.create(node=node, uuid=uuid, **values)
            changed = True
        elif any(getattr(row, k) != v for k, v in values.items()):
            for name, value in values.items():
                setattr(row, name, value)
            row.save()
            changed = True
        rows[uuid] = row
    return changed


def _held(node: Node) -> bool:
    """A placement holding quota references a server on ``node``."""
    return Placement.objects.filter(server__node=node, state__in=Placement.HOLDING).exists()


def _mark_gone(node: Node, now: datetime, run: _Run) -> None:
    if node.gone_at is None:
        node.gone_at = now
        node.save(update_fields=["gone_at"])
        _note(run.gone, f"node {node.name}")
    if not _held(node):
        GPU.objects.filter(node=node).delete()


def _prune_gone(cluster: Cluster, now: datetime) -> None:
    """Delete nodes gone for a day that no holding placement references."""
    old = Node.objects.filter(cluster=cluster, synced=True, gone_at__lt=now - GONE_RETENTION)
    old.exclude(servers__placements__state__in=Placement.HOLDING).delete()


def _note(names: list[str], name: str) -> None:
    if name not in names:
        names.append(name)


# --- discovered servers ----------------------------------------------------------------------


def _discover(cluster: Cluster, api, access: kube.KubeAccess, run: _Run) -> None:
    try:
        found = kn.list_labelled_deployments(api, request_timeout=kube.request_timeout(access))
    except kube.KubeError as exc:
        run.fail(exc)
        return
    run.answered = True
    with transaction.atomic():
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
        _apply_servers(cluster, found, run)
    run.applied = True


def _apply_servers(cluster: Cluster, found: list[kn.DiscoveredServer], run: _Run) -> None:
    servers = list(InferenceServer.objects.filter(cluster=cluster))
    by_ref = {(s.kube_namespace, s.kube_name): s for s in servers if s.kube_name}
    names = {s.name for s in servers}
    nodes = list(Node.objects.filter(cluster=cluster, gone_at__isnull=True))
    seen: set[tuple[str, str]] = set()
    for item in found:
        ref = (item.namespace, item.name)
        seen.add(ref)
        server = by_ref.get(ref)
        if server is not None and server.source != InferenceServer.Source.DISCOVERED:
            continue  # created by hand or by Switchyard's workloads: not discovery's to change
        if not item.runtime:
            run.errors.append(
                f"deployment {item.namespace}/{item.name}: labelled {kn.DISCOVERY_LABEL} but "
                "neither its app label nor its image says triton or vllm: not added"
            )
            continue
        values = {
            "runtime": item.runtime,
            "http_url": item.http_url,
            "grpc_url": item.grpc_url,
            "metrics_url": item.metrics_url,
            "node_id": _node_for(item.node_selector, nodes),
        }
        if server is None:
            server = InferenceServer(
                cluster=cluster, name=_server_name(item, names),
                source=InferenceServer.Source.DISCOVERED, kube_namespace=item.namespace,
                kube_name=item.name, **values,
            )
            try:
                server.full_clean()
            except ValidationError as exc:
                run.errors.append(f"deployment {item.namespace}/{item.name}: "
                                  f"{'; '.join(exc.messages)}")
                continue
            server.save()
            names.add(server.name)
            _note(run.added, f"server {server.name}")
        elif any(getattr(server, k) != v for k, v in values.items()):
            for name, value in values.items():
                setattr(server, name, value)
            server.save()
            _note(run.changed, f"server {server.name}")
    for ref, server in by_ref.items():
        if server.source == InferenceServer.Source.DISCOVERED and ref not in seen:
            _note(run.gone, f"server {server.name}")


def _node_for(selector: dict[str, str], nodes: list[Node]) -> int | None:
    """The id of the one node the Deployment's nodeSelector matches (None: none or several).
    Pods are not read: with several candidates, which one runs the server is not known."""
    if not selector:
        return None
    matches = [n for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())]
    return matches[0].pk if len(matches) == 1 else None


def _server_slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:64].strip("-")


def _server_name(item: kn.DiscoveredServer, taken: set[str]) -> str:
    """A server name from the Deployment's (its namespace prefixed when that one is taken)."""
    for candidate in (_server_slug(item.name), _server_slug(f"{item.namespace}-{item.name}")):
        if candidate and candidate not in taken:
            return candidate
    base = _server_slug(f"{item.namespace}-{item.name}")[:60].strip("-") or "server"
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


# --- recording ---------------------------------------------------------------------------------


def device_classes(cluster: Cluster) -> dict[str, int]:
    """GPUs and MIG slices of the cluster's present nodes, counted by device class."""
    rows = GPU.objects.filter(node__cluster=cluster, node__gone_at__isnull=True)
    counts = Counter(rows.values_list("device_class", flat=True))
    return dict(sorted(counts.items()))


def summary(cluster: Cluster) -> str:
    """One readable line of what the cluster holds."""
    nodes = list(Node.objects.filter(cluster=cluster, synced=True)
                 .values_list("ready", "unschedulable", "gone_at"))
    present = [n for n in nodes if n[2] is None]
    states = []
    not_ready = sum(1 for n in present if n[0] is not True)
    cordoned = sum(1 for n in present if n[1])
    gone = len(nodes) - len(present)
    if not_ready:
        states.append(f"{not_ready} not ready")
    if cordoned:
        states.append(f"{cordoned} cordoned")
    if gone:
        states.append(f"{gone} gone")
    text = f"{len(present)} node{'' if len(present) == 1 else 's'}" + (
        f" ({', '.join(states)})" if states else "")
    classes = device_classes(cluster)
    if classes:
        text += "; GPUs: " + ", ".join(f"{name} x{n}" for name, n in classes.items())
    servers = InferenceServer.objects.filter(
        cluster=cluster, source=InferenceServer.Source.DISCOVERED
    ).count()
    return text + f"; {servers} discovered server{'' if servers == 1 else 's'}"


def _finish(cluster: Cluster, run: _Run, *, final: bool = True) -> ClusterSync:
    """Record ``run`` (a ClusterSync row, unless it is a quiet watch) and, when ``final``, the
    cluster's sync state and connection."""
    now = timezone.now()
    row = ClusterSync(
        cluster=cluster, kind=run.kind, ok=not run.errors, added=run.added,
        changed=run.changed, gone=run.gone, errors=run.errors,
        resource_version=run.resource_version or cluster.nodes_resource_version,
        started_at=run.started_at, finished_at=now,
    )
    if run.kind == ClusterSync.Kind.LIST or not run.quiet:
        row.save()
        _prune_syncs(cluster)
    if not final:
        return row
    fields: dict[str, object] = {"last_synced_at": now}
    notes = run.notes
    if run.errors and not run.applied:
        fields["sync_state"] = Cluster.SyncState.FAILED
        fields["sync_detail"] = "; ".join(notes + run.errors)
    elif run.errors:
        fields["sync_state"] = Cluster.SyncState.PARTIAL
        fields["sync_detail"] = "; ".join([*notes, *run.errors, summary(cluster)])
    elif run.kind == ClusterSync.Kind.LIST or (not run.quiet and cluster.sync_state in (
        Cluster.SyncState.OK, Cluster.SyncState.NEVER, Cluster.SyncState.SYNCING
    )):
        # A clean watch leaves a partial or failed state of the last list as it is, until
        # the next list says otherwise; a quiet one leaves the detail as it is.
        fields["sync_state"] = Cluster.SyncState.OK
        fields["sync_detail"] = "; ".join([*notes, summary(cluster)])
    if "sync_detail" in fields:
        fields["sync_detail"] = str(fields["sync_detail"])[:500]
    Cluster.objects.filter(pk=cluster.pk).update(**fields)
    for name, value in fields.items():
        setattr(cluster, name, value)
    if run.fatal:
        kube_connection.record_connection(cluster, ok=False, detail=run.fatal)
    elif run.answered:
        version = cluster.kube_server_version
        kube_connection.record_connection(
            cluster, ok=True,
            detail=f"connected: Kubernetes {version}" if version else "connected",
        )
    return row


def _prune_syncs(cluster: Cluster) -> None:
    old = list(ClusterSync.objects.filter(cluster=cluster).order_by("-started_at", "-id")
               .values_list("pk", flat=True)[KEEP_SYNCS:])
    if old:
        ClusterSync.objects.filter(pk__in=old).delete()
