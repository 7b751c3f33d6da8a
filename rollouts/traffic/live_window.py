"""Where the live latency window lives in Redis: one sorted set of points per (deployment,
version label) kept for 15 minutes, the set of a deployment's labels, and each server's
previous scrape. Written by the scrape tick (``rollouts.traffic.scrape_tick``), read by the
charts and the API (``rollouts.traffic.latency``).
"""

from __future__ import annotations

import json
from typing import Any

import redis
from django.conf import settings

WINDOW_S = 15 * 60


def connect() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def series_key(deployment_id: int, label: str) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:latency:{deployment_id}:series:{label}"


def labels_key(deployment_id: int) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:latency:{deployment_id}:labels"


def prev_key(server_id: int) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:metrics:prev:{server_id}"


def points(store: redis.Redis, deployment_id: int, label: str, since: float) -> list[dict[str, Any]]:
    """The points of one series dated ``since`` or later, oldest first."""
    raw = store.zrangebyscore(series_key(deployment_id, label), since, "+inf")
    return [json.loads(item) for item in raw]
