"""Version approval: request, approve, reject, archive, with four-eyes and an audit trail.

Four-eyes: whoever asked for approval, in person or through a token that stands for them
(one they made, or one made by such a token), may not approve. The check compares persons
and runs on the version row locked for the transition, so it sees the request it decides.
Decisions are made by people only (session login), never by API tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.models import Membership
from fleet.tenancy.scoping import require_role, token_of
from fleet.tenancy.tokens import person_id
from rollouts.models import ModelVersion

Status = ModelVersion.Status


def _transition(
    actor: Any,
    version: ModelVersion,
    to: str,
    verb: str,
    reason: str,
    check: Callable[[ModelVersion], None] | None = None,
    **fields: Any,
) -> ModelVersion:
    """Move the version to ``to`` under its row lock. ``check`` sees the locked row once the
    transition is known to be legal, and may refuse it."""
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        if locked.status == to:
            raise Conflict(f"version {locked.version} is already {to}", field="status")
        if not locked.can_become(to):
            raise Conflict(
                f"version {locked.version} is {locked.status} and cannot become {to}", field="status"
            )
        if check is not None:
            check(locked)
        before = {"status": locked.status}
        locked.status = to
        locked.status_reason = reason
        locked.status_changed_at = timezone.now()
        for name, value in fields.items():
            setattr(locked, name, value)
        locked.save()
        audit.record(
            actor, verb, locked, tenant=locked.model.tenant, before=before,
            after={"status": to}, reason=reason,
        )
    return locked


def request_approval(actor: Any, version: ModelVersion, reason: str = "") -> ModelVersion:
    require_role(actor, version.model.tenant, Membership.Role.DEPLOYER)
    token = token_of(actor)
    return _transition(
        actor,
        version,
        Status.PENDING_APPROVAL,
        "requested_approval",
        reason,
        approval_requested_by=None if token else actor,
        approval_requested_by_token=token,
    )


def _require_person_approver(actor: Any, version: ModelVersion) -> None:
    if token_of(actor) is not None:
        raise PermissionDenied("approvals are decided by people: log in to the console to decide")
    require_role(actor, version.model.tenant, Membership.Role.APPROVER)


def requester_person_id(version: ModelVersion) -> int | None:
    """The person who asked for approval: in person, or the person behind the asking token."""
    if version.approval_requested_by_token_id is not None:
        return version.approval_requested_by_token.created_by_id
    return version.approval_requested_by_id


def is_requester(actor: Any, version: ModelVersion) -> bool:
    person = person_id(actor)
    return person is not None and person == requester_person_id(version)


def _not_the_requester(actor: Any) -> Callable[[ModelVersion], None]:
    def check(locked: ModelVersion) -> None:
        if is_requester(actor, locked):
            raise PermissionDenied(
                "four-eyes rule: you requested this approval, so someone else must approve it"
            )

    return check


def approve(actor: Any, version: ModelVersion, reason: str = "") -> ModelVersion:
    _require_person_approver(actor, version)
    return _transition(
        actor, version, Status.APPROVED, "approved", reason,
        check=_not_the_requester(actor), decided_by=actor,
    )


def reject(actor: Any, version: ModelVersion, reason: str) -> ModelVersion:
    _require_person_approver(actor, version)
    if not reason.strip():
        raise DomainError("say why the version is rejected", field="reason")
    return _transition(actor, version, Status.REJECTED, "rejected", reason, decided_by=actor)


def archive(actor: Any, version: ModelVersion, reason: str = "") -> ModelVersion:
    require_role(actor, version.model.tenant, Membership.Role.APPROVER)
    return _transition(actor, version, Status.ARCHIVED, "archived", reason)


# What an approver compares: everything a version states, but its number.
COMPARED_FIELDS = [
    "artifact_uri", "sha256", "size_bytes", "runtime", "backend", "gpus",
    "estimated_gpu_memory_mib", "adapter_of", "git_sha", "training_run",
]


def changes_from_previous(version: ModelVersion) -> tuple[ModelVersion | None, list[dict[str, Any]]]:
    """The version before this one (the highest lower number) and what differs from it, one
    row per field: ``{"field", "before", "after"}``; Triton config and labels are compared key
    by key (``triton_config.max_batch_size``), so a reviewer sees what moved, not two blobs."""
    previous = (
        ModelVersion.objects.filter(model_id=version.model_id, version__lt=version.version)
        .order_by("-version").first()
    )
    if previous is None:
        return None, []
    rows = [
        {"field": name, "before": getattr(previous, name), "after": getattr(version, name)}
        for name in COMPARED_FIELDS if getattr(previous, name) != getattr(version, name)
    ]
    for name in ("triton_config", "labels"):
        before, after = getattr(previous, name) or {}, getattr(version, name) or {}
        rows += [
            {"field": f"{name}.{key}", "before": before.get(key), "after": after.get(key)}
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)
        ]
    return previous, rows
