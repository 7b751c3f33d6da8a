"""Tenancy in one place: who may see which rows, and who may do what in a tenant.

Every view, viewset and console page scopes its querysets with ``visible_to(user)`` and
checks writes with ``require_role``. Another tenant's object is therefore a 404, too low a
role a 403.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from django.core.exceptions import PermissionDenied
from django.db import models

from fleet.tenancy.roles import Role, rank

if TYPE_CHECKING:
    from fleet.models import APIToken, Tenant


class TokenUser:
    """The principal behind an API token: one tenant, one fixed role, never a platform admin."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None

    def __init__(self, token: APIToken) -> None:
        self.api_token = token
        self.username = f"token:{token.name}"

    def __str__(self) -> str:
        return f"token {self.api_token.name} ({self.api_token.tenant.slug})"

    def get_username(self) -> str:
        return self.username

    def has_perm(self, perm: str, obj: object = None) -> bool:
        return False

    def has_module_perms(self, app_label: str) -> bool:
        return False


def token_of(user: Any) -> APIToken | None:
    return getattr(user, "api_token", None)


def is_platform_admin(user: Any) -> bool:
    return bool(
        user is not None
        and user.is_authenticated
        and user.is_active
        and user.is_superuser
        and token_of(user) is None
    )


def tenant_roles(user: Any) -> dict[int, str] | None:
    """Map tenant id → role for this user; ``None`` means every tenant, as admin."""
    if user is None or not user.is_authenticated or not user.is_active:
        return {}
    token = token_of(user)
    if token is not None:
        return {token.tenant_id: token.role}
    if is_platform_admin(user):
        return None
    cache = getattr(user, "_switchyard_roles", None)
    if cache is None:
        cache = dict(user.memberships.values_list("tenant_id", "role"))
        user._switchyard_roles = cache
    return cache


def role_in(user: Any, tenant: Tenant | int) -> str | None:
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    roles = tenant_roles(user)
    if roles is None:
        return Role.ADMIN
    return roles.get(tenant_id)


def has_role(user: Any, tenant: Tenant | int, role: str) -> bool:
    held = role_in(user, tenant)
    return held is not None and rank(held) >= rank(role)


def require_role(user: Any, tenant: Tenant | int, role: str) -> None:
    """Raise PermissionDenied (403) unless ``user`` holds ``role`` or more in ``tenant``."""
    if not has_role(user, tenant, role):
        held = role_in(user, tenant) or "no role"
        raise PermissionDenied(f"this needs the {role} role in the tenant; you have {held}")


def require_platform_admin(user: Any) -> None:
    if not is_platform_admin(user):
        raise PermissionDenied("only platform admins may change this")


def is_member_anywhere(user: Any) -> bool:
    roles = tenant_roles(user)
    return roles is None or bool(roles)


class TenantScopedQuerySet(models.QuerySet):
    """A queryset that knows the path from its model to ``Tenant``."""

    tenant_path = "tenant"

    def visible_to(self, user: Any) -> Self:
        """Platform admin: everything; member or token: its tenants; anyone else: nothing."""
        roles = tenant_roles(user)
        if roles is None:
            return self.all()
        if not roles:
            return self.none()
        return self.filter(**{f"{self.tenant_path}__in": list(roles)})

    def with_role(self, user: Any, role: str) -> Self:
        """Only rows in tenants where ``user`` holds ``role`` or more."""
        roles = tenant_roles(user)
        if roles is None:
            return self.all()
        wanted = rank(role)
        ids = [tid for tid, held in roles.items() if rank(held) >= wanted]
        return self.filter(**{f"{self.tenant_path}__in": ids})


def scoped_manager(path: str) -> models.Manager:
    """A manager whose querysets reach the tenant through ``path`` (e.g. ``model__tenant``)."""
    queryset_class = type(
        f"TenantScopedQuerySet_{path}", (TenantScopedQuerySet,), {"tenant_path": path}
    )
    return models.Manager.from_queryset(queryset_class)()


class FleetQuerySet(models.QuerySet):
    """Shared infrastructure (clusters, nodes, GPUs, servers): visible to any tenant member."""

    def visible_to(self, user: Any) -> Self:
        return self.all() if is_member_anywhere(user) else self.none()


# --------------------------------------------------------------------------------------------
# Names on shared servers
# --------------------------------------------------------------------------------------------

#: Between a tenant's slug and its model's name on a shared server: slugs and model names are
#: lowercase letters, digits and dashes, so a name with one dot is one tenant's, unambiguously.
SERVED_NAME_SEPARATOR = "."


def served_model_name(tenant_slug: str, model_name: str) -> str:
    """The name a tenant's model has in a shared server's model index (``acme.fraud-scorer``).

    A Triton server keeps one model repository, one index and one set of metrics labelled by
    model name for every tenant that loads onto it; two tenants may each have a model called
    ``fraud-scorer``. Qualified by the tenant, their files, loads, unloads and metrics never
    meet. Clients still call ``fraud-scorer``: the deployment's route rewrites the path.
    """
    return f"{tenant_slug}{SERVED_NAME_SEPARATOR}{model_name}"


def tenant_of_served_name(name: object) -> str | None:
    """The tenant slug of a name made by :func:`served_model_name`; None for any other name."""
    if not isinstance(name, str) or name.count(SERVED_NAME_SEPARATOR) != 1:
        return None
    slug, model = name.split(SERVED_NAME_SEPARATOR)
    return slug if slug and model else None
