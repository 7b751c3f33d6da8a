"""The API's shapes of a deployment's consistency across its servers
(``rollouts.deployments.consistency``): the per-server view and what converging started."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from rollouts.deployments import consistency

STATES = [
    (consistency.CONSISTENT, "every server serves the same versions with the same config"),
    (consistency.INCONSISTENT, "the servers disagree"),
    (consistency.CONVERGING, "the servers disagree while a load is in flight"),
]


class ConsistencyRowSerializer(serializers.Serializer):
    """One version on one server (``version`` null: the server serves nothing of the model)."""

    server = serializers.CharField(source="server.name")
    server_id = serializers.IntegerField(source="server.pk")
    version = serializers.IntegerField(allow_null=True)
    state = serializers.CharField(
        help_text="the load's state (ready, loading, …), missing (ready on other servers, not "
                  "here) or nothing loaded")
    config_hash = serializers.CharField(
        help_text="sha256 of the config the server runs the version with, as last read back "
                  "(empty until a load has read it)")
    load = serializers.IntegerField(source="load_id", allow_null=True)
    judged = serializers.BooleanField(
        help_text="false for a Kubernetes workload's server, which serves the version it was "
                  "started with and is not held to the others")
    disagrees = serializers.BooleanField()
    why = serializers.CharField(help_text="how it disagrees with the other servers ('' when not)")


class ConsistencySerializer(serializers.Serializer):
    deployment = serializers.IntegerField(source="deployment.pk")
    state = serializers.ChoiceField(choices=STATES)
    consistent = serializers.BooleanField()
    reasons = serializers.ListField(child=serializers.CharField(),
                                    help_text="each disagreement, in words")
    blocker = serializers.SerializerMethodField(
        help_text="why converge would be refused now ('' when it may go; a deployment that "
                  "agrees has nothing to converge)")
    auto_converge = serializers.BooleanField(source="deployment.auto_converge")
    converged_at = serializers.DateTimeField(source="deployment.converged_at", allow_null=True)
    servers = ConsistencyRowSerializer(source="rows", many=True)

    def get_blocker(self, view: consistency.View) -> str:
        return consistency.blocker(view.deployment)


class ConvergeSerializer(serializers.Serializer):
    """What a converge started, and the deployment's consistency right after."""

    loads = serializers.SerializerMethodField(help_text="ids of the loads of missing versions")
    reloads = serializers.SerializerMethodField(
        help_text="ids of the loads whose version's config is sent again")
    reasons = serializers.ListField(child=serializers.CharField(),
                                    help_text="the disagreements it converges")
    consistency = serializers.SerializerMethodField()

    def get_loads(self, done: consistency.Convergence) -> list[int]:
        return [load.pk for load in done.loads]

    def get_reloads(self, done: consistency.Convergence) -> list[int]:
        return [load.pk for load in done.reloads]

    @extend_schema_field(ConsistencySerializer)
    def get_consistency(self, done: consistency.Convergence) -> dict[str, Any]:
        return ConsistencySerializer(consistency.view(done.deployment)).data
