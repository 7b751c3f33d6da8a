"""Version approval: request, approve, reject, archive, with four-eyes and an audit trail.

Four-eyes: whoever asked for approval, in person or through a token they made, may not
approve. Decisions are made by people only (session login), never by API tokens.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from fleet import audit
from fleet.errors import Conflict, DomainError
from fleet.models import Membership
from fleet.tenancy import require_role, token_of
from rollouts.models import ModelVersion

Status = ModelVersion.Status


def _transition(
    actor: Any, version: ModelVersion, to: str, verb: str, reason: str, **fields: Any
) -> ModelVersion:
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        if locked.status == to:
            raise Conflict(f"version {locked.version} is already {to}", field="status")
        if not locked.can_become(to):
            raise Conflict(
                f"version {locked.version} is {locked.status} and cannot become {to}", field="status"
            )
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


def is_requester(actor: Any, version: ModelVersion) -> bool:
    if version.approval_requested_by_id is not None and version.approval_requested_by_id == actor.pk:
        return True
    token = version.approval_requested_by_token
    return token is not None and token.created_by_id == actor.pk


def approve(actor: Any, version: ModelVersion, reason: str = "") -> ModelVersion:
    _require_person_approver(actor, version)
    if version.status == Status.PENDING_APPROVAL and is_requester(actor, version):
        raise PermissionDenied(
            "four-eyes rule: you requested this approval, so someone else must approve it"
        )
    return _transition(actor, version, Status.APPROVED, "approved", reason, decided_by=actor)


def reject(actor: Any, version: ModelVersion, reason: str) -> ModelVersion:
    _require_person_approver(actor, version)
    if not reason.strip():
        raise DomainError("say why the version is rejected", field="reason")
    return _transition(actor, version, Status.REJECTED, "rejected", reason, decided_by=actor)


def archive(actor: Any, version: ModelVersion, reason: str = "") -> ModelVersion:
    require_role(actor, version.model.tenant, Membership.Role.APPROVER)
    return _transition(actor, version, Status.ARCHIVED, "archived", reason)
