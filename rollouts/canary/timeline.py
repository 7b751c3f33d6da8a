"""A rollout's timeline and what its tenant is told: everything the requests and the reconciler
see and do is a :class:`RolloutEvent` (with its evidence), and each change of state that matters
is a webhook notification carrying :func:`payload`.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from fleet.webhooks import events as webhook_events
from rollouts.models import Rollout, RolloutEvent


def record_event(rollout: Rollout, kind: str, message: str, *, state: str | None = None,
                 data: dict[str, Any] | None = None, actor: str = "system") -> RolloutEvent:
    """One event on the rollout's timeline, at its current state and step."""
    return RolloutEvent.objects.create(
        rollout=rollout, kind=kind, state=state or rollout.state,
        step_index=rollout.step_index if rollout.current_step is not None else None,
        message=message, data=data or {}, actor_label=actor,
    )


def payload(rollout: Rollout) -> dict[str, Any]:
    """What notifications say about a rollout."""
    deployment = rollout.deployment
    return {
        "id": rollout.pk,
        "tenant": rollout.tenant.slug,
        "deployment": deployment.name,
        "model": deployment.model.name,
        "strategy": rollout.strategy,
        "state": rollout.state,
        "baseline": rollout.baseline.version,
        "candidate": rollout.candidate.version if rollout.candidate_id else None,
        "weights": rollout.weights,
        "step": rollout.step_index,
        "steps": len(rollout.steps),
        "reason": rollout.reason,
        "waiting_for": rollout.waiting_for,
        "path": reverse("rollouts:rollout", args=[rollout.pk]),
    }


def notify(rollout: Rollout, event: str, previous: str) -> None:
    """Tell the tenant's webhooks of ``event`` (``rollout.state_changed``, ...); ``previous``
    is the state the rollout left."""
    body = {**payload(rollout), "previous_state": previous}
    webhook_events.emit(rollout.tenant, event, body, summary=_summary(rollout, event))


def _summary(rollout: Rollout, event: str) -> str:
    dep = rollout.deployment.name
    if event == "rollout.approval_needed":
        return f"Rollout {rollout.pk} of {dep} waits for an approval"
    if event == "rollout.rolled_back":
        return f"Rollout {rollout.pk} of {dep} rolled back to v{rollout.baseline.version}: {rollout.reason}"
    return f"Rollout {rollout.pk} of {dep} is {rollout.get_state_display().lower()}" + (
        f": {rollout.reason}" if rollout.reason and rollout.state in Rollout.FINAL else "")
