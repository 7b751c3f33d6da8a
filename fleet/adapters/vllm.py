"""Health probe of a vLLM OpenAI-compatible server.

``probe()`` never raises and never waits longer than its timeout: an unreachable, slow or
broken server gives ``ServerProbe(ready=False, ..., error="<readable reason>")``. The module
itself satisfies :class:`fleet.adapters.base.ServerProbeAdapter`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import httpx

from fleet.adapters.base import (
    Deadline,
    ModelState,
    ProbeFailed,
    ServerProbe,
    elapsed_ms,
    parse_json,
    request,
    run_with_deadline,
)

ENGINE = "vllm"



def parse_models(payload: object) -> list[ModelState]:
    """Turn a ``GET /v1/models`` answer into ModelStates.

    Every listed model is served, hence READY; vLLM has no versions (``version=""``). A LoRA
    adapter names its base model in ``parent``: it is reported as ``reason="adapter of <base>"``.
    """
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ProbeFailed("GET /v1/models did not answer an OpenAI model list")
    models = []
    for entry in data:
        if not isinstance(entry, dict) or "id" not in entry:
            continue
        parent = entry.get("parent")
        models.append(
            ModelState(
                name=str(entry["id"]),
                version="",
                state="READY",
                reason=f"adapter of {parent}" if parent else "",
            )
        )
    return models


def _probe(
    base: str, timeout: float, headers: Mapping[str, str] | None, start: float
) -> ServerProbe:
    deadline = Deadline(timeout, margin=min(0.1, timeout * 0.1))
    live = ready = False
    version = ""
    models: list[ModelState] = []
    problems: list[str] = []
    with httpx.Client(headers=dict(headers or {})) as client:
        try:
            # Any HTTP answer means the API process is up; 200 means the engine is healthy.
            status, _ = request(client, "GET", f"{base}/health", deadline)
            live = True
            ready = status == 200
            if not ready:
                problems.append(f"not ready (GET /health returned {status})")

            url = f"{base}/version"
            status, body = request(client, "GET", url, deadline)
            if status == 200:
                meta = parse_json(body, url)
                version = str(meta.get("version", "")) if isinstance(meta, dict) else ""
            else:
                problems.append(f"GET /version returned {status}")

            url = f"{base}/v1/models"
            status, body = request(client, "GET", url, deadline)
            if status == 200:
                models = parse_models(parse_json(body, url))
            else:
                problems.append(f"GET /v1/models returned {status}")
        except ProbeFailed as exc:
            return ServerProbe(
                ready=False,
                live=live,
                version=version,
                models=models,
                error=str(exc),
                latency_ms=elapsed_ms(start),
            )
    return ServerProbe(
        ready=ready,
        live=live,
        version=version,
        models=models,
        error="; ".join(problems),
        latency_ms=elapsed_ms(start),
    )


def probe(
    http_url: str, timeout: float = 2.0, *, headers: Mapping[str, str] | None = None
) -> ServerProbe:
    """Probe the vLLM server at ``http_url`` (e.g. "http://127.0.0.1:8000").

    Calls ``GET /health``, ``GET /version`` and ``GET /v1/models`` within a total of
    ``timeout`` seconds. Pass ``headers={"Authorization": "Bearer <key>"}`` for a server
    started with ``--api-key``. Transport failures give ``ready=False`` with a readable
    ``error``; HTTP error statuses are reported in ``error`` next to what was learned.
    """
    base = http_url.rstrip("/")
    start = time.monotonic()

    def on_timeout() -> ServerProbe:
        return ServerProbe(
            ready=False,
            live=False,
            error=f"timed out after {timeout:.1f} s at {base}",
            latency_ms=elapsed_ms(start),
        )

    return run_with_deadline(lambda: _probe(base, timeout, headers, start), timeout, on_timeout)
