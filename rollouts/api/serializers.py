"""Serializers for the registry and deployments."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.api.serializers import TenantField, ValidatedModelSerializer
from fleet.models import Cluster, InferenceServer
from rollouts.models import Alias, Deployment, Model, ModelLoad, ModelLoadEvent, ModelVersion


class VisibleModelField(serializers.PrimaryKeyRelatedField):
    """A model by id, limited to the models the caller can see (others read as unknown)."""

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return Model.objects.visible_to(self.context["request"].user)


class ModelSerializer(serializers.ModelSerializer):
    tenant = TenantField(required=False, help_text="Tenant slug; optional for API tokens")
    latest_version = serializers.IntegerField(read_only=True, allow_null=True)
    aliases = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = ["id", "tenant", "name", "description", "latest_version", "aliases", "created_at"]
        read_only_fields = ["created_at"]
        # Uniqueness is handled by the idempotent create, not as a validation error.
        validators: list[Any] = []

    def get_aliases(self, model: Model) -> dict[str, int]:
        return {a.name: a.version.version for a in model.aliases.all()}


class ModelVersionSerializer(ValidatedModelSerializer):
    model = VisibleModelField()
    model_name = serializers.CharField(source="model.name", read_only=True)
    tenant = serializers.CharField(source="model.tenant.slug", read_only=True)
    request_approval = serializers.BooleanField(
        write_only=True, default=False, help_text="Ask for approval right away"
    )
    registered_by = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = [
            "id", "model", "model_name", "tenant", "version", "artifact_uri", "sha256",
            "size_bytes", "runtime", "backend", "triton_config", "gpus",
            "estimated_gpu_memory_mib", "labels", "adapter_of", "git_sha", "training_run", "status",
            "status_reason", "status_changed_at", "registered_by", "created_at",
            "request_approval",
        ]
        read_only_fields = ["status", "status_reason", "status_changed_at", "created_at"]
        validators: list[Any] = []

    def get_registered_by(self, version: ModelVersion) -> str | None:
        if version.registered_by_token_id:
            return f"token:{version.registered_by_token.name}"
        return version.registered_by.get_username() if version.registered_by else None

    def validate_labels(self, value: Any) -> Any:
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise serializers.ValidationError("must be an object of string keys and string values")
        return value

    def validate_triton_config(self, value: Any) -> Any:
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object (Triton model config)")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        request_approval = attrs.pop("request_approval", False)
        model = attrs.pop("model")
        attrs = super().validate(attrs)
        attrs["model"] = model
        attrs["request_approval"] = request_approval
        return attrs


class DecisionSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class AliasSerializer(serializers.ModelSerializer):
    model = VisibleModelField()
    version = serializers.IntegerField(source="version.version", help_text="Version number")
    reason = serializers.CharField(write_only=True, required=False, default="", allow_blank=True)

    class Meta:
        model = Alias
        fields = ["id", "model", "name", "version", "updated_at", "reason"]
        read_only_fields = ["updated_at"]
        validators: list[Any] = []

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        model = attrs.get("model") or self.instance.model
        if "version" not in attrs:
            if self.instance is None:
                raise serializers.ValidationError({"version": "this field is required"})
            attrs["model_version"] = self.instance.version
            return attrs
        number = attrs.pop("version")["version"]
        version = ModelVersion.objects.filter(model=model, version=number).first()
        if version is None:
            raise serializers.ValidationError(
                {"version": f"{model.name} has no version {number}"}
            )
        attrs["model_version"] = version
        return attrs


class ServerNamesField(serializers.ListField):
    """Server names in, server names out (the model holds a many-to-many of servers)."""

    def to_representation(self, data: Any) -> list[str]:
        return sorted(server.name for server in data.all())


class DeploymentSerializer(ValidatedModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    model = VisibleModelField()
    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all())
    servers = ServerNamesField(
        child=serializers.CharField(), required=False,
        help_text="Names of the cluster's inference servers that carry this deployment",
    )

    class Meta:
        model = Deployment
        fields = [
            "id", "tenant", "name", "model", "cluster", "servers", "production", "slo_p99_ms",
            "slo_error_rate", "description", "created_at", "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]
        validators: list[Any] = []

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        servers = attrs.pop("servers", None)
        model = attrs.get("model") or getattr(self.instance, "model", None)
        if model is not None:
            attrs["tenant"] = model.tenant
        if self.instance is not None and "model" in attrs and attrs["model"] != self.instance.model:
            raise serializers.ValidationError({"model": "a deployment's model cannot change"})
        attrs = super().validate(attrs)
        if servers is not None:
            cluster = attrs.get("cluster") or self.instance.cluster
            found = {s.name: s for s in InferenceServer.objects.filter(cluster=cluster, name__in=servers)}
            missing = sorted(set(servers) - set(found))
            if missing:
                raise serializers.ValidationError(
                    {"servers": f"cluster {cluster} has no server named {', '.join(missing)}"}
                )
            attrs["servers"] = list(found.values())
        return attrs


class ModelLoadEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ModelLoadEvent
        fields = ["created_at", "state", "message"]


class ModelLoadSerializer(serializers.ModelSerializer):
    deployment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    server = serializers.SlugRelatedField(slug_field="name", read_only=True)
    model = serializers.CharField(source="version.model.name", read_only=True)
    version = serializers.IntegerField(source="version.version", read_only=True)
    progress_percent = serializers.IntegerField(read_only=True)
    is_terminal = serializers.BooleanField(read_only=True)
    events = ModelLoadEventSerializer(many=True, read_only=True)

    class Meta:
        model = ModelLoad
        fields = [
            "id", "deployment", "server", "model", "version", "state", "is_terminal",
            "progress_percent", "bytes_done", "bytes_total", "config_hash", "error",
            "server_log", "attempts", "requested_by_label", "unload_requested_by_label",
            "idempotency_key", "created_at", "updated_at", "ready_at", "finished_at", "events",
        ]
        read_only_fields = fields


class LoadRequestSerializer(serializers.Serializer):
    """What to load or unload: a version (by number, or by alias) of a deployment's model."""

    deployment = serializers.PrimaryKeyRelatedField(queryset=Deployment.objects.none())
    version = serializers.IntegerField(required=False, min_value=1, help_text="Version number")
    alias = serializers.CharField(required=False, help_text="Or an alias, e.g. staging")
    action = serializers.ChoiceField(choices=["load", "unload"], default="load")
    servers = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="Server names; all the deployment's servers when left out",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.fields["deployment"].queryset = Deployment.objects.visible_to(request.user)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        deployment = attrs["deployment"]
        if ("version" in attrs) == ("alias" in attrs):
            raise serializers.ValidationError({"version": "give either version or alias"})
        if "alias" in attrs:
            alias = Alias.objects.filter(model=deployment.model, name=attrs["alias"]).select_related("version").first()
            if alias is None:
                raise serializers.ValidationError(
                    {"alias": f"{deployment.model.name} has no alias {attrs['alias']!r}"}
                )
            attrs["model_version"] = alias.version
        else:
            found = ModelVersion.objects.filter(model=deployment.model, version=attrs["version"]).first()
            if found is None:
                raise serializers.ValidationError(
                    {"version": f"{deployment.model.name} has no version {attrs['version']}"}
                )
            attrs["model_version"] = found
        return attrs
