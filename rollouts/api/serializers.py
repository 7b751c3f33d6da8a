"""Serializers for the registry and deployments."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.serializers import BoundedFloatField, StrictFieldsMixin
from fleet.api.refs import IdOrNameField
from fleet.api.serializers import LabelsField, TenantField, ValidatedModelSerializer
from fleet.models import Cluster, InferenceServer
from rollouts.api.triton_schema import TritonConfigField
from rollouts.deployments import consistency
from rollouts.models import (
    Alias,
    Deployment,
    Model,
    ModelLoad,
    ModelLoadEvent,
    ModelVersion,
    Route,
    SloStatus,
)


def prefetched(relation: str) -> str:
    """The attribute a view's ``Prefetch(relation, to_attr=prefetched(relation))`` fills with
    a plain list of the related rows. Without ``to_attr`` Django gives every row of a page a
    related manager and a filtered queryset to hold its share, which cost more than reading
    the related rows themselves (a quarter of a page of 50 loads with their events)."""
    return f"{relation}_prefetched"


def related_rows(instance: Any, relation: str) -> Any:
    """The related rows a view prefetched into a list, else the relation's ``all()``."""
    rows = getattr(instance, prefetched(relation), None)
    return rows if rows is not None else getattr(instance, relation).all()


class PrefetchedListSerializer(serializers.ListSerializer):
    """A nested list read from the view's ``to_attr`` prefetch when there is one."""

    def get_attribute(self, instance: Any) -> Any:
        rows = getattr(instance, prefetched(self.source), None)
        return rows if rows is not None else super().get_attribute(instance)


class VisibleModelField(IdOrNameField):
    """A model by id or by name, limited to the models the caller can see (others read as
    unknown; a name two of the caller's tenants use needs the id)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "Model id, or its name")
        super().__init__(**kwargs)

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return Model.objects.visible_to(self.context["request"].user)


class ModelSerializer(StrictFieldsMixin, serializers.ModelSerializer):
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
        return {a.name: a.version.version for a in related_rows(model, "aliases")}

    def validate_tenant(self, tenant: Any) -> Any:
        if self.instance is not None and tenant != self.instance.tenant:
            raise serializers.ValidationError("a model's tenant cannot change")
        return tenant


class ModelVersionSerializer(ValidatedModelSerializer):
    model = VisibleModelField()
    model_name = serializers.CharField(source="model.name", read_only=True)
    tenant = serializers.CharField(source="model.tenant.slug", read_only=True)
    request_approval = serializers.BooleanField(
        write_only=True, default=False, help_text="Ask for approval right away"
    )
    registered_by = serializers.SerializerMethodField()
    labels = LabelsField()
    triton_config = TritonConfigField(required=False)

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

    # labels and triton_config are checked by ModelVersion.clean() (through full_clean), the
    # one rule the console, the admin and the API share.

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        request_approval = attrs.pop("request_approval", False)
        model = attrs.pop("model")
        attrs = super().validate(attrs)
        attrs["model"] = model
        attrs["request_approval"] = request_approval
        return attrs


class DecisionSerializer(StrictFieldsMixin, serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class AliasSerializer(StrictFieldsMixin, serializers.ModelSerializer):
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
        if self.instance is not None and model != self.instance.model:
            raise serializers.ValidationError({"model": "an alias cannot move to another model"})
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

    def get_attribute(self, instance: Any) -> Any:
        return related_rows(instance, self.source)

    def to_representation(self, data: Any) -> list[str]:
        return sorted(server.name for server in data)


PERCENT = re.compile(r"(100(\.0{0,2})?|[0-9]{1,2}(\.[0-9]{0,2})?)")


@extend_schema_field({"type": "string", "pattern": f"^{PERCENT.pattern}$", "example": "0.50"})
class PercentField(serializers.DecimalField):
    """A percentage from 0 to 100 with at most two decimals, written as a string ("0.50"),
    as it is read back."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.update(max_digits=5, decimal_places=2, min_value=0, max_value=100)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str) or not PERCENT.fullmatch(data):
            raise serializers.ValidationError(
                'must be a percentage from 0 to 100 with at most two decimals, as a string: "0.50"'
            )
        return super().to_internal_value(data)


class SloSerializer(serializers.Serializer):
    """Where the deployment stands against its SLO (``rollouts.slo``)."""

    state = serializers.ChoiceField(choices=SloStatus.State.choices)
    since = serializers.DateTimeField(allow_null=True, help_text="when it entered this state")
    reason = serializers.CharField()
    budget_left_pct = serializers.FloatField(
        allow_null=True, help_text="percent of the error budget of the last slo_window_days left "
                                   "(negative: overspent); the lower of the errors and latency objectives'")
    burn_rate_5m = serializers.FloatField(allow_null=True, help_text="1.0 spends the budget exactly over the window")
    burn_rate_30m = serializers.FloatField(allow_null=True)
    burn_rate_1h = serializers.FloatField(allow_null=True)
    burn_rate_6h = serializers.FloatField(allow_null=True)
    objectives = serializers.DictField(help_text="errors and latency: budget (a share), budget_left, burn per window")
    alerts_firing = serializers.IntegerField()
    evaluated_at = serializers.DateTimeField(allow_null=True)


def slo_of(deployment: Deployment) -> dict[str, Any]:
    found = deployment.slo_or_none
    if found is None:
        return {"state": SloStatus.State.NO_TRAFFIC, "since": None, "reason": "not evaluated yet",
                "budget_left_pct": None, "burn_rate_5m": None, "burn_rate_30m": None, "burn_rate_1h": None,
                "burn_rate_6h": None, "objectives": {}, "alerts_firing": 0, "evaluated_at": None}
    return {
        "state": found.state, "since": found.since, "reason": found.reason,
        "budget_left_pct": None if found.budget_left is None else round(found.budget_left * 100, 3),
        "burn_rate_5m": found.burn_5m, "burn_rate_30m": found.burn_30m, "burn_rate_1h": found.burn_1h,
        "burn_rate_6h": found.burn_6h, "objectives": found.detail.get("objectives", {}),
        "alerts_firing": getattr(deployment, "alerts_firing", 0) or 0, "evaluated_at": found.evaluated_at,
    }


class DeploymentSerializer(ValidatedModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    slo_error_rate = PercentField(required=False, help_text="Error-rate ceiling in percent")
    model = VisibleModelField()
    cluster = IdOrNameField(queryset=Cluster.objects.all(), read_as_name=True,
                            help_text="Cluster name (or id)")
    servers = ServerNamesField(
        child=serializers.CharField(), required=False,
        help_text="Names of the cluster's inference servers that carry this deployment",
    )
    route_url = serializers.SerializerMethodField(
        help_text="The URL clients send the deployment's traffic to (its route through the "
                  "cluster's traffic router); null while no route is in force",
    )
    reason = serializers.CharField(
        write_only=True, required=False, default="", allow_blank=True, max_length=2000,
        help_text="Why, for the audit log (e.g. why the production flag changes)",
    )
    request_timeout_s = BoundedFloatField(
        min_value=0.1, max_value=3600, allow_null=True, required=False,
        help_text="0.1 to 3600, or null: the route's request deadline in seconds. A request its "
                  "server has not answered by then ends with 504 from the router and counts as "
                  "an error, and as slow, in SLOs and rollout analysis; a change is put in force "
                  "on the route at once (a 409 on route when the router refuses it, and nothing "
                  "changes). Null: the router's own limit (nginx waits 300 s). Refused (400) on a "
                  "cluster routing through Gateway API, whose HTTPRoute has no timeouts")
    slo_status = serializers.SerializerMethodField(
        help_text="ok, at_risk, breaching or no_traffic (the same as slo.state)")
    slo = serializers.SerializerMethodField()
    consistency = serializers.SerializerMethodField(
        help_text="consistent (every server serves the same versions with the same config), "
                  "inconsistent (they disagree: GET consistency/ says how, POST converge/ "
                  "makes them agree) or converging (they disagree while a load is in flight)")
    consistent = serializers.SerializerMethodField(
        help_text="true when every server serves the same versions with the same config hash")

    class Meta:
        model = Deployment
        fields = [
            "id", "tenant", "name", "model", "cluster", "servers", "production", "guard_servers", "slo_p99_ms",
            "slo_error_rate", "slo_window_days", "request_timeout_s", "slo_status", "slo", "priority", "description",
            "route_url", "consistency", "consistent", "auto_converge", "converged_at",
            "created_at", "updated_at", "archived_at", "reason",
        ]
        read_only_fields = ["created_at", "updated_at", "archived_at", "converged_at"]
        extra_kwargs = {"production": {"help_text": (
            "Loads approved versions only, and its rollouts wait for an approver. Changing it "
            "on an existing deployment needs the approver role (403 otherwise); turning it on "
            "is a 409 while a version that is not approved is loaded, loading, in a rollout, "
            "a workload or a benchmark job on it")}}
        validators: list[Any] = []

    @extend_schema_field(serializers.ChoiceField(choices=SloStatus.State.choices))
    def get_slo_status(self, deployment: Deployment) -> str:
        return slo_of(deployment)["state"]

    @extend_schema_field(SloSerializer)
    def get_slo(self, deployment: Deployment) -> dict[str, Any]:
        return SloSerializer(slo_of(deployment)).data

    @extend_schema_field(serializers.ChoiceField(choices=["consistent", "inconsistent",
                                                          "converging"]))
    def get_consistency(self, deployment: Deployment) -> str:
        states = self.context.setdefault("consistency_states", {})
        if deployment.pk not in states:  # one deployment: judged once for both fields
            states.update(consistency.states_of([deployment]))
        return states[deployment.pk]

    def get_consistent(self, deployment: Deployment) -> bool:
        return self.get_consistency(deployment) == consistency.CONSISTENT

    @extend_schema_field({"type": ["string", "null"], "format": "uri"})
    def get_route_url(self, deployment: Deployment) -> str | None:
        route = getattr(deployment, "route", None)
        # A failed change leaves the route before it serving its URL.
        if route is None or not route.url or route.state == Route.State.REMOVED:
            return None
        return route.url

    def validate_servers(self, names: list[str]) -> list[Any]:
        """The servers named, checked with the other fields (one 400 names them all): in the
        cluster the body names, or the deployment's own; with a cluster refused, that
        refusal says enough."""
        cluster = getattr(self.instance, "cluster", None)
        if "cluster" in self.initial_data:
            try:
                cluster = self.fields["cluster"].run_validation(self.initial_data["cluster"])
            except serializers.ValidationError:
                return []
        if cluster is None:
            return []
        found = {s.name: s for s in InferenceServer.objects.filter(cluster=cluster, name__in=names)}
        missing = sorted(set(names) - set(found))
        if missing:
            raise serializers.ValidationError(
                f"cluster {cluster} has no server named {', '.join(missing)}")
        return list(found.values())

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        servers = attrs.pop("servers", None)
        reason = attrs.pop("reason", "")
        model = attrs.get("model") or getattr(self.instance, "model", None)
        if model is not None:
            attrs["tenant"] = model.tenant
        if self.instance is not None and "model" in attrs and attrs["model"] != self.instance.model:
            raise serializers.ValidationError({"model": "a deployment's model cannot change"})
        attrs = super().validate(attrs)
        if servers is not None:
            attrs["servers"] = servers
        attrs["reason"] = reason
        return attrs


class ModelLoadEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ModelLoadEvent
        fields = ["created_at", "state", "message"]
        list_serializer_class = PrefetchedListSerializer

    def to_representation(self, event: ModelLoadEvent) -> dict[str, Any]:
        # A page of 50 loads carries hundreds of events: three plain fields each, written
        # without DRF's walk over fields and attribute sources (the same output).
        return {"created_at": self.fields["created_at"].to_representation(event.created_at),
                "state": event.state, "message": event.message}


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
            "drained_at",
            "idempotency_key", "request_id", "created_at", "updated_at", "ready_at", "finished_at",
            "events",
        ]
        read_only_fields = fields


class LoadRequestSerializer(StrictFieldsMixin, serializers.Serializer):
    """What to load or unload: a version (by number, or by alias) of a deployment's model."""

    deployment = IdOrNameField(queryset=Deployment.objects.none(),
                               help_text="Deployment id, or its name")
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
        errors: dict[str, list[str]] = {}
        if ("version" in attrs) == ("alias" in attrs):
            errors["version"] = ["give either version or alias"]
        elif "alias" in attrs:
            alias = Alias.objects.filter(model=deployment.model, name=attrs["alias"]).select_related("version").first()
            if alias is None:
                errors["alias"] = [f"{deployment.model.name} has no alias {attrs['alias']!r}"]
            else:
                attrs["model_version"] = alias.version
        else:
            found = ModelVersion.objects.filter(model=deployment.model, version=attrs["version"]).first()
            if found is None:
                errors["version"] = [f"{deployment.model.name} has no version {attrs['version']}"]
            attrs["model_version"] = found
        # The servers named are checked beside the version, so one answer names both.
        unknown = sorted(set(attrs.get("servers") or ()) - set(deployment.servers.values_list("name", flat=True)))
        if unknown:
            errors["servers"] = [f"deployment {deployment.name} has no server named {', '.join(unknown)}"]
        if errors:
            raise serializers.ValidationError(errors)
        return attrs
