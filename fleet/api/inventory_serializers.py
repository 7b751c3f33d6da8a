"""Inventory API serializers: clusters (their syncs and connection tests), nodes, GPUs and
inference servers. What a Kubernetes sync observes is the sync's to write; what only a
platform admin may see is left out for everyone else."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.exceptions import Conflict
from fleet.api.refs import IdOrNameField, NodeField, NotFound, lookup_node
from fleet.api.serializers import AdminOnlyFieldsMixin, LabelsField, ValidatedModelSerializer
from fleet.inventory import kube_connection
from fleet.models import GPU, Cluster, ClusterSync, InferenceServer, Node
from fleet.tenancy.visibility import reported_models_of


class ClusterSerializer(AdminOnlyFieldsMixin, ValidatedModelSerializer):
    """A cluster and, for a kubernetes one, how to reach its API and what it last said.

    ``kube_secret`` (the bearer token, or the kubeconfig text) is write-only and stored
    encrypted; it is never returned: ``kube_secret_hint`` says what is stored. On update,
    leaving it out or sending ``""`` keeps the stored one, ``null`` removes it. Or name the
    environment variable that holds it in ``kube_secret_env`` (read where Switchyard runs);
    the one given last wins, both at once is a 400.

    Tenant members read the name, kind, namespace, router and health (connection and sync
    state); how the API is reached, its credentials and the error texts (which name the API
    server) are for platform admins only.
    """

    admin_only_fields = (
        "api_url", "s3_endpoint_url", "kube_auth", "kube_context", "kube_ca_bundle",
        "kube_secret_env", "kube_secret_hint", "connection_detail", "sync_detail",
    )

    kube_secret = serializers.CharField(
        write_only=True, required=False, allow_blank=True, allow_null=True,
        max_length=kube_connection.MAX_SECRET, style={"input_type": "password"},
        help_text="Bearer token (token auth) or kubeconfig text (kubeconfig auth); write-only, "
                  "stored encrypted. Empty or left out on update: keep the stored one; null: "
                  "remove it",
    )
    kube_secret_hint = serializers.SerializerMethodField(
        help_text="What is stored of the secret: its length and last characters, or the "
                  "environment variable it is read from"
    )

    class Meta:
        model = Cluster
        fields = [
            "id", "name", "kind", "description", "api_url", "s3_endpoint_url", "s3_region",
            "kube_auth", "kube_context", "kube_ca_bundle", "kube_secret", "kube_secret_env",
            "kube_secret_hint", "kube_namespace", "kube_router", "kube_gateway",
            "kube_route_host", "connection_state", "connection_detail", "connection_checked_at",
            "kube_server_version", "sync_state", "sync_detail", "last_synced_at", "created_at",
        ]
        read_only_fields = [
            "connection_state", "connection_detail", "connection_checked_at",
            "kube_server_version", "sync_state", "sync_detail", "last_synced_at", "created_at",
        ]

    def get_kube_secret_hint(self, cluster: Cluster) -> str:
        return kube_connection.secret_hint(cluster)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        secret = attrs.pop("kube_secret", "")
        env = attrs.get("kube_secret_env")
        # The secret is applied to a stand-in first: the row changes only when all is valid.
        stand_in = Cluster(
            kube_secret_encrypted=getattr(self.instance, "kube_secret_encrypted", ""),
            kube_secret_env=getattr(self.instance, "kube_secret_env", ""),
        )
        kube_connection.change_secret(stand_in, secret=secret, secret_env=env)
        if stand_in.kube_secret_encrypted != getattr(self.instance, "kube_secret_encrypted", ""):
            attrs["kube_secret_encrypted"] = stand_in.kube_secret_encrypted
        if stand_in.kube_secret_env != getattr(self.instance, "kube_secret_env", ""):
            attrs["kube_secret_env"] = stand_in.kube_secret_env
        return super().validate(attrs)


class ClusterSyncSerializer(AdminOnlyFieldsMixin, serializers.ModelSerializer):
    """One sync of a kubernetes cluster's inventory: what it added, changed, saw go, and the
    errors it met (platform admins only: they can name the API server)."""

    admin_only_fields = ("errors",)

    class Meta:
        model = ClusterSync
        fields = [
            "id", "kind", "ok", "added", "changed", "gone", "errors", "resource_version",
            "started_at", "finished_at",
        ]


class ConnectionResultSerializer(serializers.Serializer):
    """What "test connection" found; a failed connection is a result (ok false), not an
    error."""

    ok = serializers.BooleanField()
    detail = serializers.CharField(
        help_text="connected: Kubernetes <version>, N nodes listed; or why not (401, RBAC, TLS, "
                  "unreachable, a missing environment variable)"
    )
    server_version = serializers.CharField(
        allow_blank=True, help_text="The API server's gitVersion; empty when not reached"
    )


class SyncQueuedSerializer(serializers.Serializer):
    queued = serializers.BooleanField()
    detail = serializers.CharField()


@extend_schema_field({
    "type": "array",
    "items": {"type": "string"},
    "description": "The Node's taints as key=value:Effect (key:Effect without a value)",
    "example": ["nvidia.com/gpu=present:NoSchedule", "node.kubernetes.io/not-ready:NoSchedule"],
})
class TaintsField(serializers.JSONField):
    """A synced node's taints (read-only)."""


@extend_schema_field({
    "type": "object",
    "additionalProperties": {"type": "string"},
    "description": "Resource quantities as the Kubernetes API gives them (strings)",
    "example": {"cpu": "96", "memory": "2113531904Ki", "nvidia.com/gpu": "6",
                "nvidia.com/mig-3g.40gb": "2"},
})
class QuantitiesField(serializers.JSONField):
    """A synced node's capacity or allocatable resources (read-only)."""


#: Node fields observed from the Kubernetes API (a synced node's), never typed in.
OBSERVED_NODE_FIELDS = [
    "synced", "ready", "ready_detail", "unschedulable", "taints", "zone", "capacity",
    "allocatable", "gone_at",
]


def synced_refusal(node: Node) -> Conflict:
    """The 409 for a hand-made change to what the Kubernetes API owns."""
    return Conflict(
        f"node {node.name} comes from the Kubernetes API of cluster {node.cluster.name} and is "
        "kept in step with its Node object: change it there (kubectl), not here"
    )


def refuse_kubernetes_cluster(cluster: Cluster | None, field: str) -> None:
    """Nodes and GPUs of a kubernetes cluster are the sync's to make: a 400 on ``field``."""
    if cluster is not None and cluster.is_kubernetes:
        raise serializers.ValidationError({field: [
            f"the nodes and GPUs of kubernetes cluster {cluster.name} come from its Kubernetes "
            "API (the sync adds them); they are not added by hand"
        ]})


class NodeSerializer(ValidatedModelSerializer):
    """A node. ``synced`` nodes (a kubernetes cluster's) are read-only: their observed fields
    (Ready, cordoned, taints, zone, capacity, allocatable, gone) come from the Node object."""

    cluster = IdOrNameField(queryset=Cluster.objects.all(), help_text="Cluster id or name")
    labels = LabelsField()
    taints = TaintsField(read_only=True)
    capacity = QuantitiesField(read_only=True)
    allocatable = QuantitiesField(read_only=True)

    class Meta:
        model = Node
        fields = ["id", "cluster", "name", "hostname", "cpu_cores", "memory_mib", "labels",
                  *OBSERVED_NODE_FIELDS, "created_at"]
        read_only_fields = [*OBSERVED_NODE_FIELDS, "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None and self.instance.synced:
            raise synced_refusal(self.instance)
        cluster = attrs.get("cluster")
        if cluster is not None and cluster.pk != getattr(self.instance, "cluster_id", None):
            refuse_kubernetes_cluster(cluster, "cluster")
        return super().validate(attrs)


def _resolve_node(attrs: dict[str, Any], cluster: Cluster | None) -> None:
    """A node given by plain name is looked up now that the cluster is known."""
    if isinstance(attrs.get("node"), str):
        try:
            attrs["node"] = lookup_node(attrs["node"], cluster)
        except NotFound as exc:
            raise serializers.ValidationError({"node": [str(exc)]}) from None


class GPUSerializer(ValidatedModelSerializer):
    """A GPU or MIG slice. Those of a synced node are read-only (``synced``)."""

    node = NodeField(help_text="Node id, cluster/node, or a node name only one cluster has")
    parent = IdOrNameField(
        name_field="uuid", queryset=GPU.objects.all(), required=False, allow_null=True,
        help_text="For a MIG slice: the physical GPU's id or uuid",
    )
    synced = serializers.BooleanField(
        source="node.synced", read_only=True,
        help_text="Observed from the Kubernetes API through its node (read-only then)",
    )

    class Meta:
        model = GPU
        fields = [
            "id", "node", "index", "uuid", "model", "device_class", "memory_mib", "parent",
            "mig_profile", "synced",
        ]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None and self.instance.node.synced:
            raise synced_refusal(self.instance.node)
        _resolve_node(attrs, None)
        node = attrs.get("node")
        if node is not None and node.pk != getattr(self.instance, "node_id", None):
            if node.synced:
                raise serializers.ValidationError({"node": [
                    f"node {node.name} comes from the Kubernetes API of cluster "
                    f"{node.cluster.name}: its GPUs are observed there, not added by hand"
                ]})
            refuse_kubernetes_cluster(node.cluster, "node")
        return super().validate(attrs)


class ReportedModelSerializer(serializers.Serializer):
    """One entry of a server's model index, as the server reports it."""

    name = serializers.CharField()
    version = serializers.CharField(allow_blank=True)
    state = serializers.CharField(help_text="e.g. READY, UNAVAILABLE, LOADING")
    reason = serializers.CharField(allow_blank=True)


class InferenceServerSerializer(AdminOnlyFieldsMixin, ValidatedModelSerializer):
    """An inference server. Tenant members read its name, runtime, URLs to call it and its
    health; its files (model repository, log) and its metrics URL, which counts every
    tenant's models, are for platform admins only."""

    admin_only_fields = ("metrics_url", "model_repository", "log_path")
    cluster = IdOrNameField(queryset=Cluster.objects.all(), help_text="Cluster id or name")
    node = NodeField(
        required=False, allow_null=True,
        help_text="Node id, or its name in the server's cluster (optional)",
    )
    reported_models = serializers.SerializerMethodField(
        help_text="What the server reports of your tenants' models (all of them for platform "
                  "admins)"
    )
    other_models = serializers.SerializerMethodField(
        help_text="How many models of other tenants the server reports (not named)"
    )

    class Meta:
        model = InferenceServer
        fields = [
            "id", "cluster", "node", "name", "runtime", "http_url", "grpc_url", "metrics_url",
            "model_repository", "log_path", "health", "health_detail", "server_version",
            "reported_models", "other_models", "probe_latency_ms", "consecutive_failures",
            "last_checked_at", "last_seen_at", "health_changed_at", "created_at",
        ]
        read_only_fields = [
            "health", "health_detail", "server_version", "probe_latency_ms",
            "consecutive_failures", "last_checked_at", "last_seen_at", "health_changed_at",
            "created_at",
        ]

    def _reported(self, server: InferenceServer) -> Any:
        # Views that list servers compute this for the whole page at once.
        shown = getattr(server, "shown_models", None)
        if shown is None:
            shown = server.shown_models = reported_models_of(self.context["request"].user, server)
        return shown

    @extend_schema_field(ReportedModelSerializer(many=True))
    def get_reported_models(self, server: InferenceServer) -> list[dict[str, Any]]:
        return self._reported(server).models

    def get_other_models(self, server: InferenceServer) -> int:
        return self._reported(server).others

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        cluster = attrs.get("cluster", getattr(self.instance, "cluster", None))
        _resolve_node(attrs, cluster)
        node = attrs.get("node", getattr(self.instance, "node", None))
        if node is not None and cluster is not None and node.cluster_id != cluster.pk:
            raise serializers.ValidationError({"node": "the node belongs to another cluster"})
        return super().validate(attrs)
