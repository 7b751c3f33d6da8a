"""Reading a Triton or vLLM server's own /metrics page, within a hard timeout."""

from __future__ import annotations

import time

import httpx

from fleet.adapters.base import AdapterError, Deadline, ProbeFailed, http_client, request
from fleet.adapters.metrics.parsing import PARSERS
from fleet.adapters.metrics.values import KINDS, Kind, Snapshot


def _get(url: str, timeout: float, what: str, client: httpx.Client | None = None) -> bytes:
    """GET ``url`` within a hard ``timeout``; AdapterError naming the URL on failure.

    Pass a shared ``client`` when scraping many servers at once: building one costs ~20 ms
    of CPU, which fifty scrapes in parallel would spend out of their own timeouts.
    """
    deadline = Deadline(timeout)
    try:
        if client is not None:
            status, body = request(client, "GET", url, deadline)
        else:
            with http_client() as own:
                status, body = request(own, "GET", url, deadline)
    except ProbeFailed as exc:
        raise AdapterError(f"{what}: {exc}", permanent=False) from exc
    if status != 200:
        raise AdapterError(
            f"{what}: GET {url} returned {status}: {body[:200].decode(errors='replace')}",
            permanent=400 <= status < 500,
        )
    return body


def scrape(kind: Kind | str, metrics_url: str, timeout: float = 5.0) -> Snapshot:
    """Read a Triton or vLLM ``/metrics`` page (the full URL) into a Snapshot.

    The whole call ends within about ``timeout`` seconds. Raises AdapterError: transient
    (``permanent=False``) for connection errors, timeouts and 5xx, naming the URL; permanent
    for 4xx answers and for a body that is not Prometheus text. ValueError for an unknown
    ``kind``.
    """
    if kind not in PARSERS:
        raise ValueError(f"unknown metrics kind {kind!r}: expected one of {', '.join(KINDS)}")
    what = f"scraping {kind} metrics"
    body = _get(metrics_url, timeout, what)
    taken_at = time.time()
    try:
        series = PARSERS[kind](body.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise AdapterError(
            f"{what}: {metrics_url} did not answer Prometheus text: {exc}", permanent=True
        ) from exc
    return Snapshot(taken_at=taken_at, series=series)


def fetch_text(
    kind: Kind | str, metrics_url: str, timeout: float = 5.0, client: httpx.Client | None = None
) -> str:
    """The raw ``/metrics`` text (callers that keep it to diff against the next scrape)."""
    if kind not in PARSERS:
        raise ValueError(f"unknown metrics kind {kind!r}: expected one of {', '.join(KINDS)}")
    body = _get(metrics_url, timeout, f"scraping {kind} metrics", client)
    return body.decode("utf-8", errors="replace")
