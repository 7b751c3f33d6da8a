"""What a caller may see of a shared inference server's own report.

A server's ``reported_models`` is its whole model index: every tenant's models on it, with
versions and failure reasons (which can quote private artifact paths). Each tenant sees the
entries of its own models; the others are counted, never named. Platform admins see all.

Switchyard loads a tenant's model onto a shared Triton server under a name its tenant's slug
qualifies (``acme.fraud-scorer``, :func:`fleet.tenancy.scoping.served_model_name`): such an entry is
that tenant's. Any other name (vLLM serves models by the names clients send, a server's own
models) is a tenant's when one of its registry models has the name and no other tenant holds
a placement of that name on the server.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet.models import InferenceServer, Placement, Tenant
from fleet.tenancy.scoping import tenant_of_served_name, tenant_roles


@dataclass(frozen=True)
class ReportedModels:
    """The entries of a server's model index a caller may see, and how many models it may not."""

    models: list[dict[str, Any]] = field(default_factory=list)
    others: int = 0


def reported_models(user: Any, servers: Iterable[InferenceServer]) -> dict[int, ReportedModels]:
    """For each server (by id): what ``user`` may see of its reported models."""
    servers = list(servers)
    roles = tenant_roles(user)
    if roles is None:
        return {s.pk: ReportedModels(list(s.reported_models or [])) for s in servers}
    own = set(roles)
    own_slugs = set(Tenant.objects.filter(pk__in=own).values_list("slug", flat=True)) if own else set()
    own_names = set(
        Tenant.objects.filter(pk__in=own, models__isnull=False).values_list("models__name", flat=True)
    ) if own else set()
    holders: dict[tuple[int, str], set[int]] = {}
    if own_names:
        held = Placement.objects.filter(
            server__in=[s.pk for s in servers], state__in=Placement.HOLDING,
            model_version__model__name__in=own_names,
        ).values_list("server_id", "model_version__model__name", "tenant_id")
        for server_id, name, tenant_id in held:
            holders.setdefault((server_id, name), set()).add(tenant_id)

    def is_own(server: InferenceServer, name: Any) -> bool:
        slug = tenant_of_served_name(name)
        if slug is not None:
            return slug in own_slugs
        if name not in own_names:
            return False
        holding = holders.get((server.pk, name))
        # Another tenant's model of the same name, placed there by it: theirs, not ours.
        return not holding or bool(holding & own)

    seen: dict[int, ReportedModels] = {}
    for server in servers:
        entries = [m for m in server.reported_models or [] if isinstance(m, dict)]
        mine = [m for m in entries if is_own(server, m.get("name"))]
        hidden = {m.get("name") for m in entries if not is_own(server, m.get("name"))}
        seen[server.pk] = ReportedModels(mine, len(hidden))
    return seen


def reported_models_of(user: Any, server: InferenceServer) -> ReportedModels:
    """What ``user`` may see of one server's reported models."""
    return reported_models(user, [server])[server.pk]
