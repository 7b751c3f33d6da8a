"""The router's view of each deployment's SLO, a minute at a time.

Where a deployment's traffic goes through its route, the router logs every request: its
status and what the client waited. Each SLO tick counts the current and the previous
minute of those samples (kept 15 minutes in Redis) into ``RoutedMinute`` rows: requests,
failures (5xx, no answer, timeouts: ``rollouts.canary.arms.is_failure``, the judge's rule;
4xx are the client's and count as requests only) and answered requests slower than the
deployment's latency SLO. Recounting both minutes every tick is idempotent, and a minute
stops changing once it is over. What a recount adds goes to the deployment's /metrics
counters too (``rollouts.slo.counters``), which then leave the servers' counts out.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime

import redis

from rollouts.canary.arms import is_failure, is_timeout
from rollouts.models import Deployment, RoutedMinute
from rollouts.slo import counters
from rollouts.traffic import samples

log = logging.getLogger(__name__)


def fold(deployments: list[Deployment], now: float) -> int:
    """Count the current and previous minute of every deployment's router samples; returns
    how many minutes were written. A Redis that does not answer costs this tick its
    router counts (the servers' metrics stand in)."""
    since = now - now % 60 - 60
    written = 0
    try:
        store = samples.connect()
        for deployment in deployments:
            per_minute: dict[float, list[int]] = defaultdict(lambda: [0, 0, 0])
            by_variant = samples.window(deployment.pk, now - since, now=now, store=store)
            for found in by_variant.values():
                for s in found:
                    counts = per_minute[s.t - s.t % 60]
                    counts[0] += 1
                    failed = is_failure(s.status, s.upstream_failed)
                    counts[1] += failed
                    # A timeout waited at least this long: slow too (as the judge counts it).
                    if (not failed or is_timeout(s.status, s.upstream_status)) and s.latency_ms > deployment.slo_p99_ms:
                        counts[2] += 1
            if not per_minute:
                continue
            minutes = {datetime.fromtimestamp(start, tz=UTC): counts for start, counts in per_minute.items()}
            before = {row.minute: row for row in RoutedMinute.objects.filter(deployment=deployment,
                                                                             minute__in=list(minutes))}
            pipe = store.pipeline()
            for minute, (requests, failures, slow) in minutes.items():
                old = before.get(minute)
                RoutedMinute.objects.update_or_create(
                    deployment=deployment, minute=minute,
                    defaults={"requests": requests, "failures": failures, "slow": slow})
                # /metrics' counters grow by what this recount added (samples only arrive).
                counters.add(pipe, deployment.pk,
                             requests=max(requests - (old.requests if old else 0), 0),
                             failures=max(failures - (old.failures if old else 0), 0),
                             slow=max(slow - (old.slow if old else 0), 0))
                written += 1
            counters.mark_routed(pipe, deployment.pk)
            pipe.execute()
    except redis.RedisError as exc:
        log.warning("router samples unreadable for the SLO tick: %s", exc)
    return written


def prune(before: datetime) -> int:
    deleted, _ = RoutedMinute.objects.filter(minute__lt=before).delete()
    return deleted
