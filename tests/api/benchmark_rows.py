"""Benchmark job rows as the reconciler leaves them, for API tests that do not run a sweep.

The figures have the shape the runner records (engine level results with the server's view,
the sweep's summary); tests/benchmarks/ produce real ones on a real Triton.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from rollouts.benchmarks import specs
from rollouts.models import BenchmarkJob, Deployment, ModelVersion


def level(value: int, rps: float, p99: float, *, verdict: list[str] | None = None,
          refinement: bool = False) -> dict[str, Any]:
    """One level's result: the engine's figures, the server's view, the SLO verdict."""
    requests = int(rps * 2)
    return {
        "mode": "concurrency", "value": value, "requests": requests, "ok": requests,
        "errors": {}, "error_rate": 0.0, "first_error": "", "window_s": 2.0,
        "throughput_rps": rps, "offered_rps": None, "cancelled": False,
        "latency_ms": {"p50": round(p99 / 2, 3), "p90": round(p99 * 0.8, 3),
                       "p95": round(p99 * 0.9, 3), "p99": p99, "mean": round(p99 / 2, 3),
                       "max": p99 * 1.2},
        "server": {"available": True, "requests": requests, "failures": 0,
                   "request_ms": round(p99 / 2 - 0.3, 3), "queue_ms": 0.05,
                   "compute_ms": round(p99 / 2 - 0.5, 3)},
        "refinement": refinement, "verdict": verdict or [],
    }


def sweep_summary(max_load: int | None, rps: float | None) -> dict[str, Any]:
    return {"mode": "concurrency", "max_load": max_load, "max_load_rps": rps,
            "max_load_p99_ms": 9.5 if rps else None, "first_failing": 4,
            "first_failing_why": ["p99 52.0 ms over 40 ms"], "peak_rps": (rps or 0) * 1.2,
            "goodput_rps": None, "stopped_early": "", "levels_run": 3,
            "client_overhead_ms": 0.21}


def finished_job(deployment: Deployment, version: ModelVersion, *, rps: float = 240.0,
                 configs: list[dict[str, Any]] | None = None,
                 state: str = BenchmarkJob.State.SUCCEEDED, **fields: Any) -> BenchmarkJob:
    """A job that measured ``version`` (one entry per config; the first carries ``rps``)."""
    server = fields.pop("server", None) or deployment.servers.first()
    configs = configs or []
    results = []
    for index, override in enumerate(configs or [None]):
        carried = rps * (1 + 0.25 * index)
        results.append({
            "config": override or {}, "label": specs.config_label(override),
            "levels": [level(1, carried / 2, 5.2), level(2, carried, 9.5),
                       level(4, carried * 1.1, 52.0, verdict=["p99 52.0 ms over 40 ms"])],
            "summary": sweep_summary(2, carried), "error": "", "load_id": None,
        })
    best = len(results) - 1
    summary = {
        "best_config": best, "best_label": results[best]["label"],
        "best": results[best]["summary"],
        "configs": [{"label": r["label"], "max_load": 2,
                     "max_load_rps": r["summary"]["max_load_rps"], "error": ""}
                    for r in results],
    }
    now = timezone.now()
    return BenchmarkJob.objects.create(
        tenant=deployment.tenant, deployment=deployment, version=version, server=server,
        protocol=BenchmarkJob.Protocol.TRITON_HTTP, levels=[1, 2, 4], duration_s=2,
        warmup_s=0.5, slo={"p99_ms": 40.0, "error_rate": 0.01}, configs=configs,
        state=state, phase="done", progress=1.0, results=results, summary=summary,
        started_at=now, finished_at=now, **{"requested_by_label": "seed", **fields},
    )


def queued_job(deployment: Deployment, version: ModelVersion, **fields: Any) -> BenchmarkJob:
    """A job asked for and not yet taken by the reconciler."""
    server = fields.pop("server", None) or deployment.servers.first()
    fields.setdefault("requested_by_label", "seed")
    return BenchmarkJob.objects.create(
        tenant=deployment.tenant, deployment=deployment, version=version, server=server,
        protocol=BenchmarkJob.Protocol.TRITON_HTTP, levels=[1, 2, 4],
        slo={"p99_ms": 40.0, "error_rate": 0.01}, phase="queued", **fields,
    )
