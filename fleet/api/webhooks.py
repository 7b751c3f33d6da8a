"""Webhooks API: a tenant's webhooks (admins write, members read), their delivery log and a
test ping. Every write goes through ``fleet.webhooks.requests``, as the console's does."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.exceptions import DomainError
from console.serializers import StrictFieldsMixin
from fleet.api.base import ADMIN_WRITES, TenantScopedViewSetMixin, resolve_tenant
from fleet.api.serializers import TenantField
from fleet.models import Webhook, WebhookDelivery
from fleet.webhooks import requests as webhook_requests
from fleet.webhooks.events import EVENTS


@extend_schema_field({
    "type": "array",
    "items": {"type": "string", "enum": list(EVENTS)},
    "description": "Event names to send; empty (the default) sends every event",
})
class EventsField(serializers.ListField):
    child = serializers.CharField(max_length=64)


@extend_schema_field({
    "type": "string",
    "maxLength": 2000,
    # What fleet.webhooks.requests.validate_url takes, stated for clients (and the schema fuzzer).
    "pattern": r"^https?://[A-Za-z0-9.-]+(:[1-9][0-9]{0,3})?(/[^\s\x00-\x1f\x7f]*)?$",
    "description": "An http:// or https:// URL with a public host, to POST the events to "
                   "(local, loopback, private and metadata addresses are refused unless the "
                   "platform allows the host)",
    "example": "https://hooks.example.com/switchyard",
})
class URLField(serializers.CharField):
    """The URL as typed; ``fleet.webhooks.requests.validate_url`` says what is wrong with it."""


class LastDeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = ["id", "event", "state", "attempts", "response_status", "created_at"]


class WebhookSerializer(StrictFieldsMixin, serializers.ModelSerializer):
    tenant = TenantField(required=False)
    url = URLField(max_length=2000)
    events = EventsField(required=False)
    secret_prefix = serializers.CharField(
        read_only=True, help_text="The start of the signing secret (shown in full once, on create)"
    )
    created_by = serializers.StringRelatedField(allow_null=True)
    last_delivery = serializers.SerializerMethodField()
    routing_key = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=64,
        help_text="The pagerduty format's integration key (Events API v2); never shown back",
    )

    class Meta:
        model = Webhook
        fields = [
            "id", "tenant", "name", "url", "events", "format", "active", "routing_key", "secret_prefix",
            "created_by", "created_at", "last_delivery",
        ]
        read_only_fields = ["created_by", "created_at"]

    def get_validators(self) -> list[Any]:
        # Name clashes are the domain's to refuse (409 on ``name``), as for tokens.
        return []

    @extend_schema_field(LastDeliverySerializer(allow_null=True))
    def get_last_delivery(self, webhook: Webhook) -> dict[str, Any] | None:
        last = webhook.deliveries.order_by("-created_at", "-id").first()
        return LastDeliverySerializer(last).data if last is not None else None


class CreatedWebhookSerializer(WebhookSerializer):
    secret = serializers.CharField(
        read_only=True, help_text="The signing secret, shown this once only"
    )

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]


class WebhookDeliverySerializer(serializers.ModelSerializer):
    # The receiver's answer is never kept: only its status, and Switchyard's own reason when
    # there was none (the column kept its old name).
    error = serializers.CharField(
        source="response_excerpt", read_only=True,
        help_text="Why the last attempt got no answer, in Switchyard's words (could not "
                  "connect, no answer within the timeout, address refused); empty when the "
                  "receiver answered: see response_status",
    )

    class Meta:
        model = WebhookDelivery
        fields = [
            "id", "event", "state", "attempts", "next_attempt_at", "response_status",
            "error", "duration_ms", "created_at", "delivered_at", "summary", "payload",
        ]


class WebhookViewSet(
    TenantScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Tenant webhooks. Members list them; tenant admins create, change, delete and test them.
    The signing secret is returned once, on create; ``secret_prefix`` after."""

    write_roles = ADMIN_WRITES
    queryset = Webhook.objects.select_related("tenant", "created_by")
    serializer_class = WebhookSerializer
    filterset_fields = ["tenant__slug", "active"]  # not "format": DRF reads ?format= itself

    @extend_schema(responses={201: CreatedWebhookSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        tenant = resolve_tenant(data, request.user)
        data.pop("tenant", None)
        created = webhook_requests.create_webhook(request.user, tenant, **data)
        body = CreatedWebhookSerializer(created.webhook, context=self.get_serializer_context()).data
        body["secret"] = created.secret
        return Response(body, status=status.HTTP_201_CREATED)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        webhook = self.get_object()
        serializer = self.get_serializer(
            webhook, data=request.data, partial=kwargs.pop("partial", False)
        )
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        tenant = data.pop("tenant", webhook.tenant)
        if tenant != webhook.tenant:
            raise DomainError("a webhook cannot move to another tenant", field="tenant")
        webhook_requests.update_webhook(request.user, webhook, **data)
        return Response(self.get_serializer(webhook).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        webhook_requests.delete_webhook(request.user, self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=WebhookDeliverySerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=WebhookDeliverySerializer,
            filter_backends=[])
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        """The webhook's deliveries, newest first: each attempt's answer or error."""
        webhook = self.get_object()
        page = self.paginate_queryset(webhook.deliveries.order_by("-created_at", "-id"))
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)

    @extend_schema(request=None, responses={202: WebhookDeliverySerializer})
    @action(detail=True, methods=["post"], serializer_class=WebhookDeliverySerializer)
    def test(self, request: Request, pk: str | None = None) -> Response:
        """Queue a ``ping`` to this webhook (tenant admin); follow it in ``deliveries/``."""
        delivery = webhook_requests.send_test(request.user, self.get_object())
        return Response(WebhookDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)
