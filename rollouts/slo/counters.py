"""Cumulative request counts per deployment, for Prometheus' own burn-rate rules.

The scrape tick adds each point's requests, failed requests and requests slower than the
deployment's latency SLO to one Redis hash per deployment, unless the deployment's router
saw its traffic in the last ``ROUTED_S``: then the SLO tick adds what the router counted
(``rollouts.slo.routed``), as Switchyard's own evaluation prefers it, and the servers'
counts are left out so no request is counted twice; ``/metrics`` exposes them as
counters (``switchyard_deployment_requests_total`` and its siblings), which
``deploy/prometheus/slo-rules.yml`` turns into the same multiwindow burn rates Switchyard
evaluates itself (``rollouts.slo.alerts``). They only grow; a Redis that lost them starts
again from zero, which Prometheus' ``rate()`` reads as a counter reset.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis
from django.conf import settings

FIELDS = ("requests", "failures", "slow")
ROUTED_S = 120  # the router's counts stand in for the servers' this long after its last minute


def routed_key(deployment_id: int) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:slo:{deployment_id}:routed"


def mark_routed(pipe: redis.client.Pipeline, deployment_id: int) -> None:
    """The router counts this deployment's traffic now (for ``ROUTED_S``)."""
    pipe.set(routed_key(deployment_id), 1, ex=ROUTED_S)


def routed_now(store: redis.Redis, deployment_ids: Iterable[int]) -> set[int]:
    """Of ``deployment_ids``, those whose traffic the router counts now."""
    ids = list(deployment_ids)
    if not ids:
        return set()
    found = store.mget([routed_key(pk) for pk in ids])
    return {pk for pk, value in zip(ids, found, strict=True) if value is not None}


def key(deployment_id: int) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:slo:{deployment_id}:counts"


def add(pipe: redis.client.Pipeline, deployment_id: int, *, requests: float, failures: float,
        slow: float) -> None:
    """Queue the increments on ``pipe`` (the caller executes it)."""
    name = key(deployment_id)
    for field, value in (("requests", requests), ("failures", failures), ("slow", slow)):
        if value:
            pipe.hincrbyfloat(name, field, value)


def read(store: redis.Redis, deployment_ids: Iterable[int]) -> dict[int, dict[str, float]]:
    """deployment id -> {requests, failures, slow} (0.0 for what was never counted)."""
    ids = list(deployment_ids)
    pipe = store.pipeline()
    for pk in ids:
        pipe.hmget(key(pk), *FIELDS)
    return {pk: {f: float(v) if v is not None else 0.0 for f, v in zip(FIELDS, values, strict=True)}
            for pk, values in zip(ids, pipe.execute(), strict=True)}
