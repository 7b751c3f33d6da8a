"""Cumulative request counts per deployment, for Prometheus' own burn-rate rules.

The scrape tick adds each point's requests, failed requests and requests slower than the
deployment's latency SLO to one Redis hash per deployment; ``/metrics`` exposes them as
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
