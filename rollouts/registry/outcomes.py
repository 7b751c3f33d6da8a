"""What became of versions brought in by canaries: a version whose last canary was rolled
back says so wherever the registry shows it, beside its approval status."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Q

from rollouts.models import Model, ModelVersion, Rollout


def rolled_back_canaries(version_ids: Iterable[int]) -> dict[int, Rollout]:
    """Each version's last ended canary (a dry run included), for those whose last canary
    was rolled back; a later canary of the version that succeeded clears it."""
    last: dict[int, Rollout] = {}
    ended = Rollout.objects.filter(
        candidate_id__in=list(version_ids), strategy=Rollout.Strategy.CANARY,
        state__in=Rollout.FINAL,
    ).order_by("finished_at", "id")
    for rollout in ended:
        last[rollout.candidate_id] = rollout
    return {pk: r for pk, r in last.items() if r.state == Rollout.State.ROLLED_BACK}


def mark_rolled_back(versions: Iterable[ModelVersion]) -> None:
    """Set ``rolled_back`` (the rollout, or None) on each of ``versions``."""
    versions = list(versions)
    found = rolled_back_canaries(v.pk for v in versions)
    for version in versions:
        version.rolled_back = found.get(version.pk)


def mark_latest_rolled_back(models: Iterable[Model]) -> None:
    """Set ``latest_rolled_back`` on each model (annotated with ``latest``, its newest
    version number): the rollout that rolled that version's canary back, or None."""
    models = list(models)
    wanted = Q(pk__in=[])
    for model in models:
        if getattr(model, "latest", None) is not None:
            wanted |= Q(model_id=model.pk, version=model.latest)
    latest = {v.model_id: v.pk for v in ModelVersion.objects.filter(wanted).only("pk", "model_id")}
    found = rolled_back_canaries(latest.values())
    for model in models:
        model.latest_rolled_back = found.get(latest.get(model.pk, -1))
