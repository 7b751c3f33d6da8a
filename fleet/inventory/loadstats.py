"""Each server's recent load, as the latency scraper last measured it (kept in Redis)."""

from __future__ import annotations

import json

import redis
from django.conf import settings

KEEP_S = 15 * 60


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def _key(server_id: int) -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:metrics:server:{server_id}"


def record(server_id: int, taken_at: float, rps: float, store: redis.Redis | None = None) -> None:
    (store or _redis()).set(_key(server_id), json.dumps({"t": taken_at, "rps": rps}), ex=KEEP_S)


def server_loads(server_ids: list[int]) -> dict[int, dict[str, float]]:
    """Requests per second each server served at its last scrape; {} when Redis is away."""
    if not server_ids:
        return {}
    try:
        raw = _redis().mget([_key(i) for i in server_ids])
    except redis.RedisError:
        return {}
    return {i: json.loads(v) for i, v in zip(server_ids, raw, strict=True) if v}
