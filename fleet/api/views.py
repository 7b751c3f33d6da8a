"""Fleet API: tenants, tokens, quotas, inventory, audit log."""

from __future__ import annotations

import copy
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from console.exceptions import DomainError
from console.filters import FilterSet
from console.pagination import NewestFirstCursorPagination
from fleet import audit
from fleet.api import inventory_serializers as inv
from fleet.api import serializers as s
from fleet.api.base import (
    ADMIN_WRITES,
    FleetViewSet,
    TenantScopedViewSetMixin,
    resolve_tenant,
)
from fleet.api.filters import AuditEventFilter, InferenceServerFilter
from fleet.api.refs import IdOrNameFilter, NodeFilter
from fleet.audit import export as audit_export
from fleet.inventory import health, kube_connection, routers
from fleet.models import (
    GPU,
    APIToken,
    AuditEvent,
    Cluster,
    ClusterSync,
    DevicePrice,
    InferenceServer,
    Node,
    Quota,
    QuotaRequest,
    Tenant,
)
from fleet.quota import admission as quota
from fleet.quota import requests as quota_requests
from fleet.quota.admission import usage_for
from fleet.tenancy import tokens
from fleet.tenancy.scoping import require_platform_admin
from fleet.tenancy.visibility import reported_models


class TenantViewSet(TenantScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """Tenants you belong to, with your role in each and their cohort."""

    queryset = Tenant.objects.select_related("cohort")
    serializer_class = s.TenantSerializer
    filterset_fields = ["slug"]


class APITokenViewSet(
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Tenant API tokens. Creating one needs the tenant admin role and shows the secret once;
    DELETE revokes (the row stays, for the audit trail)."""

    write_roles = ADMIN_WRITES
    queryset = APIToken.objects.select_related("tenant", "created_by")
    serializer_class = s.APITokenSerializer
    filterset_fields = ["tenant__slug", "role"]

    @extend_schema(responses={201: s.IssuedTokenSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        tenant = resolve_tenant(data, request.user)
        issued = tokens.issue(
            request.user, tenant, data["name"], data.get("role", "deployer"), data.get("expires_at")
        )
        body = s.IssuedTokenSerializer(issued.token, context=self.get_serializer_context()).data
        body["token"] = issued.secret
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        tokens.revoke(request.user, self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditedFleetViewSet(FleetViewSet):
    """Fleet writes (platform admins only) are recorded in the audit log."""

    audit_tenant_field: str | None = None
    #: Fields whose values the audit log must not hold (secrets, even encrypted): a change is
    #: recorded under the name given here as "changed" or "removed".
    audit_hidden: dict[str, str] = {}

    def _tenant(self, obj: Any) -> Tenant | None:
        return getattr(obj, self.audit_tenant_field) if self.audit_tenant_field else None

    def perform_create(self, serializer: BaseSerializer) -> None:
        obj = serializer.save()
        audit.record(self.request.user, "created", obj, tenant=self._tenant(obj),
                     after=dict(serializer.data))

    def perform_update(self, serializer: BaseSerializer) -> None:
        fields = [f for f in serializer.validated_data if f not in self.audit_hidden]
        hidden = [f for f in serializer.validated_data if f in self.audit_hidden]
        before = audit.snapshot(serializer.instance, fields)
        obj = serializer.save()
        after = audit.snapshot(obj, fields)
        for field in hidden:
            after[self.audit_hidden[field]] = "changed" if getattr(obj, field) else "removed"
        audit.record(self.request.user, "updated", obj, tenant=self._tenant(obj),
                     before=before, after=after)

    def perform_destroy(self, instance: Any) -> None:
        # One transaction: a delete refused for objects still in use records nothing.
        with transaction.atomic():
            audit.record(self.request.user, "deleted", instance, tenant=self._tenant(instance))
            instance.delete()


class QuotaViewSet(AuditedFleetViewSet):
    """Quota per tenant per device class, with live usage from active placements."""

    queryset = Quota.objects.select_related("tenant__cohort")
    serializer_class = s.QuotaSerializer
    filterset_fields = ["tenant__slug", "device_class"]
    audit_tenant_field = "tenant"

    def _with_usage(self, quotas: list[Quota]) -> list[Quota]:
        for usage in usage_for(quotas):
            for name in ("units_used", "memory_used_mib", "units_borrowed", "memory_borrowed_mib",
                         "units_lent", "memory_lent_mib"):
                setattr(usage.quota, name, getattr(usage, name))
        return quotas

    def perform_create(self, serializer: BaseSerializer) -> None:
        super().perform_create(serializer)
        quota.mark_borrowed(serializer.instance.tenant, serializer.instance.device_class)

    def perform_update(self, serializer: BaseSerializer) -> None:
        super().perform_update(serializer)
        quota.mark_borrowed(serializer.instance.tenant, serializer.instance.device_class)

    @extend_schema(parameters=[s.AdmissionQuerySerializer], responses={200: s.AdmissionSerializer})
    @action(detail=True, methods=["get"], permission_classes=[IsAuthenticated])
    def admission(self, request: Request, pk: str | None = None) -> Response:
        """What admission would decide now for ``units`` and ``memory_mib`` more of this
        quota's device class, and why: free in the quota, borrowable from the cohort,
        what would be reclaimed. Reserves nothing."""
        query = s.AdmissionQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        row = self.get_object()
        decision = quota.assess(row.tenant, row.device_class, query.validated_data["units"],
                                query.validated_data["memory_mib"])
        return Response(s.AdmissionSerializer(decision, context={"request": request}).data)

    def paginate_queryset(self, queryset: QuerySet) -> list[Quota] | None:
        page = super().paginate_queryset(queryset)
        return self._with_usage(list(page)) if page is not None else None

    def get_object(self) -> Quota:
        return self._with_usage([super().get_object()])[0]


class QuotaRequestViewSet(
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Requests for more quota: a tenant admin asks (``POST``: the totals wanted per device
    class, a reason, an optional end date); a platform admin approves (as asked, or with other
    totals) or refuses with a reason. A grant with ``until`` gives the quota back then."""

    write_roles = ADMIN_WRITES
    queryset = QuotaRequest.objects.select_related("tenant")
    serializer_class = s.QuotaIncreaseSerializer
    filterset_fields = ["tenant__slug", "device_class", "state"]

    @extend_schema(responses={
        201: s.QuotaIncreaseSerializer,
        409: OpenApiResponse(description="asks for no more than the quota allows now"),
    })
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().create(request, *args, **kwargs)

    def perform_create(self, serializer: s.QuotaIncreaseSerializer) -> None:
        data = serializer.validated_data
        serializer.instance = quota_requests.ask(
            self.request.user, resolve_tenant(data, self.request.user), data["device_class"],
            data["units"], data["memory_mib"], data["reason"], data.get("until"))

    def _decide(self, request: Request, approve: bool) -> Response:
        require_platform_admin(request.user)  # before the lookup: a 403 for every other caller
        decision = s.QuotaDecisionSerializer(data=request.data)
        decision.is_valid(raise_exception=True)
        data = decision.validated_data
        target = self.get_object()
        if approve:
            done = quota_requests.approve(request.user, target, data["reason"],
                                          units=data.get("units"), memory_mib=data.get("memory_mib"))
        else:
            done = quota_requests.refuse(request.user, target, data["reason"])
        return Response(self.get_serializer(done).data)

    @extend_schema(request=s.QuotaDecisionSerializer, responses=s.QuotaIncreaseSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        """Grant it (platform admins): the tenant's quota becomes the totals granted."""
        return self._decide(request, approve=True)

    @extend_schema(request=s.QuotaDecisionSerializer, responses=s.QuotaIncreaseSerializer)
    @action(detail=True, methods=["post"])
    def refuse(self, request: Request, pk: str | None = None) -> Response:
        """Refuse it with a reason (platform admins)."""
        return self._decide(request, approve=False)


class ClusterViewSet(AuditedFleetViewSet):
    """Clusters. Kubernetes ones: how to reach the API (the secret is write-only), what it
    last said, and the sync of their nodes. ``POST .../test-connection/`` asks the API now;
    ``POST .../sync/`` queues a sync; ``GET .../syncs/`` lists the recent ones, newest first.
    """

    queryset = Cluster.objects.all()
    serializer_class = inv.ClusterSerializer
    filterset_fields = ["kind", "name"]
    audit_hidden = {"kube_secret_encrypted": "kube_secret"}

    def perform_update(self, serializer: BaseSerializer) -> None:
        """A change of a Kubernetes cluster's router hands its routes over first
        (``fleet.inventory.routers.save_router_change``): refused, nothing is saved."""
        before = serializer.instance
        after = copy.copy(before)
        for name, value in serializer.validated_data.items():
            setattr(after, name, value)
        routers.save_router_change(before, after, lambda: super(ClusterViewSet, self)
                                   .perform_update(serializer))

    @extend_schema(request=None, responses=inv.ConnectionResultSerializer)
    @action(detail=True, methods=["post"], url_path="test-connection",
            serializer_class=inv.ConnectionResultSerializer, filter_backends=[])
    def test_connection(self, request: Request, pk: str | None = None) -> Response:
        """Ask the cluster's API server for its version and list its nodes with the cluster's
        credentials (platform admin). Always 200 for a kubernetes cluster: a failed connection
        is ``ok: false`` with the reason (401, RBAC, TLS, unreachable), recorded on the
        cluster as ``connection_state``. 400 on ``kind`` for another kind of cluster."""
        result = kube_connection.test_connection(self.get_object())
        return Response({"ok": result.ok, "detail": result.detail,
                         "server_version": result.server_version})

    @extend_schema(request=None, responses={202: inv.SyncQueuedSerializer})
    @action(detail=True, methods=["post"], serializer_class=inv.SyncQueuedSerializer,
            filter_backends=[])
    def sync(self, request: Request, pk: str | None = None) -> Response:
        """Queue a sync of the cluster's nodes and servers now (platform admin); follow it in
        ``sync_state`` and ``syncs/``. 400 on ``kind`` for a cluster that is not kubernetes."""
        cluster = self.get_object()
        queued = kube_connection.queue_sync(cluster)
        detail = kube_connection.sync_queued_text(cluster, queued)
        return Response({"queued": queued, "detail": detail}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=inv.ClusterSyncSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=inv.ClusterSyncSerializer,
            filter_backends=[])
    def syncs(self, request: Request, pk: str | None = None) -> Response:
        """The cluster's recent syncs, newest first: nodes and servers added, changed and
        gone, and (for platform admins) the errors met."""
        cluster = self.get_object()
        page = self.paginate_queryset(ClusterSync.objects.filter(cluster=cluster))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)


class NodeFilterSet(FilterSet):
    cluster = IdOrNameFilter(queryset=Cluster.objects.all())

    class Meta:
        model = Node
        fields = ["cluster", "name"]


class NodeViewSet(AuditedFleetViewSet):
    """Nodes. ``cluster`` is the cluster's id or name, in bodies and in the filter alike.
    A kubernetes cluster's nodes are synced from its API: read-only here (409)."""

    queryset = Node.objects.select_related("cluster")
    serializer_class = inv.NodeSerializer
    filterset_class = NodeFilterSet

    def perform_destroy(self, instance: Node) -> None:
        if instance.synced:
            raise inv.synced_refusal(instance)
        super().perform_destroy(instance)


class GPUFilterSet(FilterSet):
    node = NodeFilter(help_text="node id, or cluster/node")

    class Meta:
        model = GPU
        fields = ["node", "device_class"]


class DevicePriceViewSet(AuditedFleetViewSet):
    """Prices per device class (an hour of one unit): platform admins set them, every member
    reads them; what versions cost is read with them (``/versions/{id}/cost/``)."""

    queryset = DevicePrice.objects.all()
    serializer_class = s.DevicePriceSerializer
    filterset_fields = ["device_class"]


class GPUViewSet(AuditedFleetViewSet):
    """GPUs and MIG slices. ``node`` is the node's id or ``cluster/node``. Those of a synced
    node are read-only here (409)."""

    queryset = GPU.objects.select_related("node__cluster")
    serializer_class = inv.GPUSerializer
    filterset_class = GPUFilterSet

    def perform_destroy(self, instance: GPU) -> None:
        if instance.node.synced:
            raise inv.synced_refusal(instance.node)
        super().perform_destroy(instance)


class ServerFilterSet(InferenceServerFilter):
    cluster = IdOrNameFilter(queryset=Cluster.objects.all())
    node = NodeFilter(help_text="node id, or cluster/node")

    class Meta(InferenceServerFilter.Meta):
        fields = ["cluster", "node", "runtime", "health"]


class InferenceServerViewSet(AuditedFleetViewSet):
    """Inference servers and their observed health. POST .../check/ probes one right now.

    ``reported_models`` lists what the server reports of your tenants' models only;
    ``other_models`` counts the rest (platform admins see every model)."""

    queryset = InferenceServer.objects.select_related("cluster", "node")
    serializer_class = inv.InferenceServerSerializer
    filterset_class = ServerFilterSet

    def paginate_queryset(self, queryset: QuerySet) -> list[InferenceServer] | None:
        page = super().paginate_queryset(queryset)
        if page is None:
            return None
        shown = reported_models(self.request.user, page)
        for server in page:
            server.shown_models = shown[server.pk]
        return page

    @extend_schema(request=None, responses=inv.InferenceServerSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def check(self, request: Request, pk: str | None = None) -> Response:
        server = self.get_object()
        health.check_server(server.pk)
        server.refresh_from_db()
        return Response(self.get_serializer(server).data)


class AuditEventViewSet(TenantScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """The audit log of your tenants (platform admins see platform-level events too)."""

    queryset = AuditEvent.objects.select_related("tenant")
    serializer_class = s.AuditEventSerializer
    filterset_class = AuditEventFilter
    pagination_class = NewestFirstCursorPagination

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # A client that asks the export for text/csv gets the stream, and a refusal in JSON.
        return super().perform_content_negotiation(request, force=force or self.action == "export")

    @extend_schema(
        parameters=[OpenApiParameter("as", str, enum=list(audit_export.FORMATS), default="csv",
                                     description="csv (a header, then a line each) or jsonl")],
        responses={(200, "text/csv"): OpenApiTypes.STR,
                   (200, "application/x-ndjson"): OpenApiTypes.STR},
    )
    @action(detail=False, methods=["get"])
    def export(self, request: Request) -> StreamingHttpResponse:
        """The events the same filters select, oldest first, streamed as CSV or JSON Lines."""
        kind = request.query_params.get("as", "csv")
        if kind not in audit_export.FORMATS:
            raise DomainError(f"must be one of {', '.join(audit_export.FORMATS)}", field="as")
        events = self.filter_queryset(self.get_queryset())
        return audit_export.response(events, kind)
