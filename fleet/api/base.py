"""Shared pieces for every API viewset: tenant scoping applied once, and fleet permissions."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import permissions, viewsets
from rest_framework.request import Request

from fleet.errors import DomainError
from fleet.models import Tenant
from fleet.tenancy import is_platform_admin, tenant_roles

#: The longest Idempotency-Key header a create call accepts.
MAX_IDEMPOTENCY_KEY = 200


def idempotency_key(request: Request) -> str:
    """The request's ``Idempotency-Key`` header ('' without one); too long is a 400."""
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > MAX_IDEMPOTENCY_KEY:
        raise DomainError(f"at most {MAX_IDEMPOTENCY_KEY} characters", field="idempotency_key")
    return key


class TenantScopedViewSetMixin:
    """Every queryset goes through ``visible_to(request.user)``: another tenant's row is a 404."""

    request: Request
    queryset: QuerySet

    def get_queryset(self) -> QuerySet:
        return self.queryset.visible_to(self.request.user)


class PlatformAdminWritePermission(permissions.BasePermission):
    """Reading needs any tenant membership; writing needs a platform admin."""

    message = "only platform admins may change the fleet and quotas"

    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        return is_platform_admin(request.user)


class FleetViewSet(TenantScopedViewSetMixin, viewsets.ModelViewSet):
    permission_classes = (PlatformAdminWritePermission,)


def default_tenant(user: Any) -> Tenant | None:
    """The only tenant a caller belongs to (always so for tokens), else None."""
    roles = tenant_roles(user)
    if roles is not None and len(roles) == 1:
        return Tenant.objects.get(pk=next(iter(roles)))
    return None


def resolve_tenant(data: dict[str, Any], user: Any) -> Tenant:
    """The tenant named in ``data``, or the caller's only tenant; a 400 on ``tenant`` else."""
    tenant = data.get("tenant") or default_tenant(user)
    if tenant is None:
        raise DomainError("name the tenant (you belong to several)", field="tenant")
    return tenant


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "fleet.api.auth.APITokenAuthentication"
    name = "tenantToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant API token, `sy_<prefix>_<secret>`, made by a tenant admin.",
        }
