"""Shared pieces for every API viewset: tenant scoping applied once, and fleet permissions."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import QuerySet
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import permissions, viewsets
from rest_framework.request import Request

from console.exceptions import DomainError
from fleet.models import Membership, Tenant
from fleet.tenancy.scoping import is_platform_admin, tenant_roles

#: The longest Idempotency-Key header a create call accepts.
MAX_IDEMPOTENCY_KEY = 200


def idempotency_key(request: Request) -> str:
    """The request's ``Idempotency-Key`` header ('' without one); too long is a 400."""
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > MAX_IDEMPOTENCY_KEY:
        raise DomainError(f"at most {MAX_IDEMPOTENCY_KEY} characters", field="idempotency_key")
    return key


def holds_role_somewhere(user: Any, role: str) -> bool:
    """Whether ``user`` holds ``role`` or more in at least one tenant (platform admins: yes)."""
    roles = tenant_roles(user)
    if roles is None:
        return True
    wanted = Membership.rank(role)
    return any(Membership.rank(held) >= wanted for held in roles.values())


class RoleFirstPermission(permissions.BasePermission):
    """A write whose action the view lists in ``write_roles`` needs that role in some tenant
    before its body is read: a viewer's POST is a 403 whatever it sends, never a 400 about the
    body ("already exists" would tell it what the tenant holds). The domain function still
    checks the role in the tenant the body names."""

    message = "your role in your tenants does not allow this"

    def has_permission(self, request: Request, view: Any) -> bool:
        role = getattr(view, "write_roles", {}).get(getattr(view, "action", None))
        if role is None or not request.user or not request.user.is_authenticated:
            return True  # nothing asked, or IsAuthenticated answers (401)
        roles = tenant_roles(request.user)
        if not roles or holds_role_somewhere(request.user, role):
            # A caller in no tenant sees no row: every reference in its body names nothing
            # and every object is a 404, as for another tenant's, so it learns nothing.
            return True
        best = max(roles.values(), key=Membership.rank)
        self.message = f"this needs the {role} role in the tenant; you have {best}"
        return False


#: ``write_roles`` of a viewset whose writes the deployer role may make.
DEPLOYER_WRITES = dict.fromkeys(("create", "update", "partial_update", "destroy"),
                                Membership.Role.DEPLOYER)
#: ``write_roles`` of a viewset whose writes only a tenant admin may make.
ADMIN_WRITES = dict.fromkeys(("create", "update", "partial_update", "destroy"),
                             Membership.Role.ADMIN)


class TenantScopedViewSetMixin:
    """Every queryset goes through ``visible_to(request.user)``: another tenant's row is a 404;
    an action named in ``write_roles`` is refused (403) before its body is read unless the
    caller holds that role in some tenant."""

    request: Request
    queryset: QuerySet
    #: Action name -> the least role it needs in some tenant (see RoleFirstPermission).
    write_roles: ClassVar[dict[str, str]] = {}

    def get_queryset(self) -> QuerySet:
        return self.queryset.visible_to(self.request.user)

    def get_permissions(self) -> list[permissions.BasePermission]:
        return [*super().get_permissions(), RoleFirstPermission()]  # type: ignore[misc]


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
