"""Health probe of an NVIDIA Triton Inference Server over its HTTP (KServe v2) API.

``probe()`` never raises and never waits longer than its timeout: an unreachable, slow or
broken server gives ``ServerProbe(ready=False, ..., error="<readable reason>")``. The module
itself satisfies :class:`fleet.adapters.base.ServerProbeAdapter`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from fleet.adapters.base import (
    Call,
    Deadline,
    ModelState,
    ProbeFailed,
    ProbeSteps,
    ServerProbe,
    elapsed_ms,
    http_client,
    parse_json,
    probe_within,
    request,
    run_steps,
)

ENGINE = "triton"



def parse_index(payload: object) -> list[ModelState]:
    """Turn a ``POST /v2/repository/index`` answer into ModelStates.

    Models present in the repository but never loaded have no version and no state: they
    come back with ``version=""`` and ``state=""``.
    """
    if not isinstance(payload, list):
        raise ProbeFailed("repository index is not a JSON list")
    models = []
    for entry in payload:
        if not isinstance(entry, dict):
            continue
        models.append(
            ModelState(
                name=str(entry.get("name", "")),
                version=str(entry.get("version", "")),
                state=str(entry.get("state", "")),
                reason=str(entry.get("reason", "")),
            )
        )
    return models


def probe_steps(base: str, start: float) -> ProbeSteps:
    """The probe as the requests it makes (``fleet.adapters.base.ProbeSteps``)."""
    live = ready = False
    version = ""
    models: list[ModelState] = []
    problems: list[str] = []
    try:
        status, _ = yield Call("GET", f"{base}/v2/health/live")
        live = status == 200
        if not live:
            problems.append(f"not live (GET /v2/health/live returned {status})")
        status, _ = yield Call("GET", f"{base}/v2/health/ready")
        ready = status == 200
        if not ready:
            problems.append(f"not ready (GET /v2/health/ready returned {status})")

        url = f"{base}/v2"
        status, body = yield Call("GET", url)
        if status == 200:
            meta = parse_json(body, url)
            version = str(meta.get("version", "")) if isinstance(meta, dict) else ""
        else:
            problems.append(f"GET /v2 returned {status}")

        url = f"{base}/v2/repository/index"
        status, body = yield Call("POST", url, json_body={})
        if status == 200:
            models = parse_index(parse_json(body, url))
        else:
            problems.append(f"POST /v2/repository/index returned {status}")
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


def _probe(
    base: str, timeout: float, headers: Mapping[str, str] | None, start: float
) -> ServerProbe:
    deadline = Deadline(timeout, margin=min(0.1, timeout * 0.1))
    with http_client(headers=dict(headers or {})) as client:
        return run_steps(probe_steps(base, start), client, deadline)


def probe(
    http_url: str, timeout: float = 2.0, *, headers: Mapping[str, str] | None = None
) -> ServerProbe:
    """Probe the Triton server at ``http_url`` (e.g. "http://127.0.0.1:8000").

    Calls ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2`` (version) and
    ``POST /v2/repository/index`` (every model version with state and reason) within a
    total of ``timeout`` seconds. Transport failures give ``ready=False`` with a readable
    ``error``; HTTP error statuses are reported in ``error`` next to what was learned.
    """
    return probe_within(
        http_url, timeout, lambda base, start: _probe(base, timeout, headers, start)
    )


def model_metadata(http_url: str, model: str, version: int | str, timeout: float = 2.0) -> dict:
    """A loaded model version's KServe v2 metadata (``GET /v2/models/<m>/versions/<v>``):
    its ``inputs`` and ``outputs``, each ``{"name", "datatype", "shape"}``. Raises
    ProbeFailed with a readable reason when the server cannot say."""
    url = f"{http_url.rstrip('/')}/v2/models/{model}/versions/{version}"
    with http_client() as client:
        status, body = request(client, "GET", url, Deadline(timeout))
    if status != 200:
        try:
            error = json.loads(body).get("error", "")
        except (ValueError, AttributeError):
            error = ""
        raise ProbeFailed(f"GET {url} returned {status}{f': {error}' if error else ''}")
    meta = parse_json(body, url)
    if not isinstance(meta, dict):
        raise ProbeFailed(f"GET {url} did not answer a JSON object")
    return meta
