"""What the rollout reconciler does to the world, shared by its steps
(:mod:`rollouts.canary.steps`) and its states (:mod:`rollouts.canary.reconciler`): write the
row while the lease is held, move it to another state with its event and notifications, put
weights (and copies) in force on the route, go back to the baseline, unload a version, and
move on to the next step."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from console.exceptions import Conflict, DomainError
from rollouts import leases
from rollouts.canary.timeline import notify, record_event
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, ModelVersion, Rollout, RolloutEvent
from rollouts.traffic import routes
from rollouts.traffic.specs import MirrorTarget

State = Rollout.State
Kind = RolloutEvent.Kind


def update(rollout: Rollout, *, said: str = "", **fields: Any) -> None:
    """Write fields only while we still hold the lease (a change of state is logged, with
    ``said`` as its why)."""
    leases.update(rollout, said=said, **fields)


def move(rollout: Rollout, to: str, message: str, *, kind: str = Kind.STATE,
          data: dict[str, Any] | None = None, **fields: Any) -> None:
    previous = rollout.state
    with transaction.atomic():  # the state, its event and its notification, together
        update(rollout, state=to, said=message, **fields)
        record_event(rollout, kind, message, data=data)
        if to != previous:
            notify(rollout, "rollout.state_changed", previous)
            if to == State.ROLLED_BACK:
                notify(rollout, "rollout.rolled_back", previous)
            if to == State.PENDING_APPROVAL:
                notify(rollout, "rollout.approval_needed", previous)


def route(rollout: Rollout, weights: dict[int, int], why: str, *, sticky: bool = False,
           mirror: MirrorTarget | None = None) -> None:
    """Put ``weights`` (by version) in force on the deployment's route, by the system on the
    rollout's behalf, with ``mirror`` (copies to a version) or none; the route in force
    already is a no-op. Raises the route's errors."""
    policy = "sticky" if sticky and rollout.sticky_header else "weighted"
    routes.set_route_as_system(
        rollout.deployment, {n: w for n, w in weights.items()}, policy=policy,
        sticky_header=rollout.sticky_header if policy == "sticky" else "", mirror=mirror,
        reason=f"rollout {rollout.pk}: {why}",
    )


def back_to_baseline(rollout: Rollout, why: str, ends_as: str, *,
                      data: dict[str, Any] | None = None) -> None:
    """All traffic to the baseline now; the rollout ends as ``ends_as`` (rolled_back or
    aborted), or stays rolling_back while the router does not take the change."""
    base = rollout.baseline.version
    try:
        if rollout.weights:  # the rollout moved traffic: all of it back (a route it never
            # touched, before its first step, stays as its owners set it)
            route(rollout, {base: 100}, f"back to v{base}: {why}")
    except DomainError as exc:
        if isinstance(exc, Conflict):  # the router refused, or another change holds the route
            move(rollout, State.ROLLING_BACK,
                  f"{why}; the router has not taken the way back to v{base} yet ({exc.message}): "
                  "trying again next tick", kind=Kind.ROLLBACK, data=data or {}, reason=why,
                  waiting_for=ends_as)
            return
        move(rollout, State.FAILED,
              f"{why}; traffic cannot go back to v{base}: {exc.message}. A person must route "
              "the deployment by hand", kind=Kind.ERROR, data=data or {}, reason=why,
              finished_at=timezone.now(), waiting_for="")
        return
    if rollout.strategy == Rollout.Strategy.CANARY and rollout.candidate_id:
        # All or none: the candidate's loads still on their way are let finish (ready or
        # failed) and then taken back with the rest, not left loaded holding quota.
        busy = sorted(ModelLoad.objects.filter(
            pk__in=rollout.load_ids, version=rollout.candidate,
            state__in=ModelLoad.IN_FLIGHT).exclude(state=ModelLoad.State.UNLOADING)
            .values_list("server__name", flat=True))
        if busy:
            if rollout.state != State.ROLLING_BACK:
                move(rollout, State.ROLLING_BACK,
                     f"{why}; all traffic on v{base}: waiting for v{rollout.candidate.version}'s "
                     f"loads still on their way to {', '.join(busy)} to end before taking them "
                     "back", kind=Kind.ROLLBACK, data=data or {}, reason=why,
                     weights={str(base): 100}, waiting_for=ends_as)
            return
    move(rollout, ends_as, f"{why}: all traffic back on v{base}", kind=Kind.ROLLBACK,
          data=data or {}, reason=why, weights={str(base): 100}, finished_at=timezone.now(),
          waiting_for="", requested_action="")
    if rollout.strategy == Rollout.Strategy.CANARY and rollout.candidate_id:
        unload(rollout, rollout.candidate, "the rollout went back to the baseline",
                own_only=True)


def unload(rollout: Rollout, version: ModelVersion, why: str, *, own_only: bool = False,
           everywhere: bool = False) -> None:
    """Take ``version`` off the rollout's servers (best effort: a refusal is recorded);
    with ``own_only``, only from the servers where the rollout itself loaded it; with
    ``everywhere``, from every server of the deployment where it is ready."""
    names = list(rollout.servers)
    if everywhere:
        names = sorted(set(ModelLoad.objects.filter(
            deployment=rollout.deployment, version=version, state=ModelLoad.State.READY)
            .values_list("server__name", flat=True)))
        if not names:
            return
    if own_only:
        names = sorted(set(ModelLoad.objects.filter(
            pk__in=rollout.load_ids, version=version).values_list("server__name", flat=True)))
        if not names:
            return
    try:
        taken = loads.unload_for(None, rollout.deployment, version, server_names=names or None,
                                 label=f"rollout {rollout.pk}")
    except DomainError as exc:
        record_event(rollout, Kind.LOAD, f"v{version.version} stays loaded ({why}), the unload was "
               f"refused: {exc.message}")
        return
    if taken:
        record_event(rollout, Kind.LOAD, f"unloading v{version.version} from "
               f"{', '.join(sorted({load.server.name for load in taken}))}: {why}",
               data={"loads": [load.pk for load in taken]})


def next_step(rollout: Rollout, message: str, data: dict[str, Any] | None = None, **fields: Any) -> None:
    with transaction.atomic():
        index = rollout.step_index
        record_event(rollout, Kind.STEP, message, data=data)
        # A step's own state ends with it; the rollback webhook's (asked all along) stays.
        kept = {k: v for k, v in (rollout.step_state or {}).items() if k.startswith("rollback_")}
        update(rollout, step_index=index + 1, step_started_at=timezone.now(), waiting_for="",
                failures=0, step_state=kept, **fields)


def copies(rollout: Rollout, percent: int, why: str) -> bool:
    """All traffic on the baseline, with copies of ``percent`` of the requests to the
    candidate (none at 0). False when the route is busy (next tick tries again); a copy the
    router cannot make ends the rollout (the route in force is unchanged)."""
    base, cand = rollout.baseline.version, rollout.candidate.version
    mirror = MirrorTarget(version=cand, percent=percent) if percent else None
    try:
        route(rollout, {base: 100}, f"{why}: copies of {percent}% of the requests to v{cand}",
               mirror=mirror)
    except DomainError as exc:
        if isinstance(exc, Conflict) and not isinstance(exc, routes.RouteFailed):
            record_event(rollout, Kind.ERROR, f"copying {percent}% of the requests to v{cand} "
                         f"did not take: {exc.message}; trying again next tick")
            return False  # another change holds the route: next tick
        # The router cannot copy this (a share it does not support): the route in force
        # is unchanged, and the rollout cannot go on as asked.
        back_to_baseline(rollout, f"{why}: the copies cannot start: {exc.message}",
                          State.ROLLED_BACK)
        return False
    return True
