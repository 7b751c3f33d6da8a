"""Registering models and versions, and moving aliases. Views and the API call these."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.models import Membership, Tenant
from fleet.tenancy.scoping import require_role, token_of
from rollouts.models import Alias, Model, ModelLoad, ModelVersion
from rollouts.traffic.routes import PRODUCTION_ALIAS

VERSION_FIELDS = [
    "version",
    "artifact_uri",
    "sha256",
    "size_bytes",
    "runtime",
    "backend",
    "triton_config",
    "gpus",
    "estimated_gpu_memory_mib",
    "labels",
    "adapter_of",
    "git_sha",
    "training_run",
]


def create_model(actor: Any, tenant: Tenant, name: str, description: str = "") -> tuple[Model, bool]:
    """Create a model, or return the existing one of that name (idempotent)."""
    require_role(actor, tenant, Membership.Role.DEPLOYER)
    existing = Model.objects.filter(tenant=tenant, name=name).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            model = Model(tenant=tenant, name=name, description=description)
            model.full_clean()
            model.save()
    except IntegrityError:  # another request created it first
        return Model.objects.get(tenant=tenant, name=name), False
    audit.record(actor, "created", model, tenant=tenant, after={"name": name})
    return model, True


def update_model(
    actor: Any, model: Model, name: str | None = None, description: str | None = None
) -> Model:
    """Change a model's description. Names are permanent: versions and URIs refer to them."""
    require_role(actor, model.tenant, Membership.Role.DEPLOYER)
    if name is not None and name != model.name:
        raise DomainError("a model cannot be renamed", field="name")
    if description is not None and description != model.description:
        before = {"description": model.description}
        model.description = description
        model.save(update_fields=["description"])
        audit.record(actor, "updated", model, tenant=model.tenant, before=before,
                     after={"description": description})
    return model


def register_version(
    actor: Any, model: Model, data: dict[str, Any], *, request_approval: bool = False
) -> tuple[ModelVersion, bool]:
    """Register a version, idempotently.

    The same (model, version, sha256) returns the existing row; the same version with another
    digest is a Conflict naming both digests: versions are immutable.
    """
    require_role(actor, model.tenant, Membership.Role.DEPLOYER)
    existing = ModelVersion.objects.filter(model=model, version=data["version"]).first()
    if existing is None:
        version = ModelVersion(model=model, **{k: v for k, v in data.items() if k in VERSION_FIELDS})
        token = token_of(actor)
        if token is not None:
            version.registered_by_token = token
        else:
            version.registered_by = actor
        # Uniqueness is left to the database: a concurrent twin ends in the IntegrityError below.
        version.full_clean(validate_constraints=False)
        try:
            with transaction.atomic():
                version.save()
        except IntegrityError:  # a concurrent request registered this version first
            existing = ModelVersion.objects.get(model=model, version=data["version"])
        else:
            audit.record(
                actor,
                "registered",
                version,
                tenant=model.tenant,
                after=audit.snapshot(version, VERSION_FIELDS),
            )
            if request_approval:
                from rollouts.registry.approvals import request_approval as ask

                version = ask(actor, version, reason="requested at registration")
            return version, True
    if existing.sha256 != data["sha256"]:
        raise Conflict(
            f"version {existing.version} of {model.name} is already registered with sha256 "
            f"{existing.sha256}; this request has sha256 {data['sha256']}. Versions are "
            "immutable: register the new build as a new version",
            field="sha256",
        )
    return existing, False


def check_alias_target(name: str, version: ModelVersion) -> None:
    """The production alias names approved versions only: anything else is a DomainError on
    ``version``. Other aliases may name any version."""
    if name == PRODUCTION_ALIAS and version.status != ModelVersion.Status.APPROVED:
        raise DomainError(
            f"@{PRODUCTION_ALIAS} names approved versions only; v{version.version} is "
            f"{version.get_status_display().lower()}: have it approved first",
            field="version",
        )


def set_alias(actor: Any, model: Model, name: str, version: ModelVersion, reason: str = "") -> Alias:
    """Point ``name`` at ``version`` (create or move). Setting it to where it is changes
    nothing. The production alias moves to approved versions only (:func:`check_alias_target`)."""
    require_role(actor, model.tenant, Membership.Role.DEPLOYER)
    return move_alias(actor, model, name, version, reason)


def move_alias(actor: Any, model: Model, name: str, version: ModelVersion, reason: str) -> Alias:
    """:func:`set_alias` without the role check: the system moving an alias on someone's
    behalf (a rollout's promotion: its requester was checked when it was made). The
    production alias still moves to approved versions only."""
    try:
        return _set_alias(actor, model, name, version, reason)
    except IntegrityError:  # a concurrent request created the alias first: move it instead
        return _set_alias(actor, model, name, version, reason)


def _set_alias(actor: Any, model: Model, name: str, version: ModelVersion, reason: str) -> Alias:
    with transaction.atomic():
        alias = Alias.objects.select_for_update().filter(model=model, name=name).first()
        before = {"version": alias.version.version} if alias else {}
        if alias is not None and alias.version_id == version.pk:
            return alias
        alias = alias or Alias(model=model, name=name)
        alias.version = version
        alias.full_clean()
        check_alias_target(name, version)
        alias.save()
        audit.record(
            actor,
            "moved" if before else "created",
            alias,
            tenant=model.tenant,
            before=before,
            after={"version": version.version},
            reason=reason,
        )
    return alias


def delete_alias(actor: Any, alias: Alias, reason: str = "") -> None:
    require_role(actor, alias.model.tenant, Membership.Role.DEPLOYER)
    audit.record(
        actor,
        "deleted",
        alias,
        tenant=alias.model.tenant,
        before={"version": alias.version.version},
        reason=reason,
    )
    alias.delete()


GUARDED_ALIASES = (PRODUCTION_ALIAS,)


def alias_concerns(name: str, version: ModelVersion) -> list[str]:
    """Why pointing the alias ``name`` at an approved ``version`` deserves a second look, in
    words: its last load failed, or it runs nowhere. Only the production alias is guarded
    (a version that is not approved is refused outright, :func:`check_alias_target`); the
    console asks for confirmation when this is not empty."""
    if name not in GUARDED_ALIASES:
        return []
    concerns: list[str] = []
    label = f"v{version.version}"
    latest = version.loads.select_related("server").order_by("-created_at", "-id").first()
    if latest is not None and latest.state in (ModelLoad.State.FAILED, ModelLoad.State.LOST):
        what = "failed" if latest.state == ModelLoad.State.FAILED else "was lost from the server"
        error = f": {latest.error}" if latest.error else ""
        concerns.append(f"its last load, on {latest.server.name}, {what}{error}")
    if not version.loads.filter(state=ModelLoad.State.READY).exists():
        unloaded = version.loads.filter(state=ModelLoad.State.UNLOADED).exists()
        concerns.append(f"{label} was unloaded and runs on no server" if unloaded
                        else f"{label} is not loaded on any server")
    return concerns


def failed_version_ids(versions: Any) -> set[int]:
    """The ids of those of ``versions`` whose most recent load failed or was lost."""
    latest: dict[int, str] = {}
    rows = ModelLoad.objects.filter(version__in=versions).order_by("version_id", "-created_at", "-id")
    for version_id, state in rows.values_list("version_id", "state"):
        latest.setdefault(version_id, state)
    return {pk for pk, state in latest.items()
            if state in (ModelLoad.State.FAILED, ModelLoad.State.LOST)}
