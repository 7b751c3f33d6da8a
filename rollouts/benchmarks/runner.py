"""One sweep, run in a process of its own: ``python -m rollouts.benchmarks.runner SPEC``.

A benchmark job's reconciler starts this for each config it measures and does not wait for
it: the worker stays free. The runner plans the levels (:mod:`.sweep`), drives each with the
engine (:mod:`.engine`), reads the server's own view of each measured window (Triton's
``nv_inference_*`` counters or vLLM's histograms, before and after), and reports through
Redis, where any worker can read it:

====================================  ==============================================================
``<prefix><run>:levels``              list: one JSON level result per level, in the order they ran
``<prefix><run>:current``             JSON: the level running now (index, value, when it started)
``<prefix><run>:alive``               set every second with a 5 s expiry: the runner is alive
``<prefix><run>:done``                JSON ``{"summary": ...}`` or ``{"error": ...}`` at the end
``<prefix><run>:cancel``              set by Switchyard to stop the run; read every 0.1 s
====================================  ==============================================================

No Django here. SPEC is a JSON file (see :func:`spec_for` in :mod:`rollouts.benchmarks.specs`
for what it holds).
"""

from __future__ import annotations

import base64
import json
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from fleet.adapters.base import AdapterError
from fleet.adapters.metrics import rates, scraping
from fleet.adapters.metrics.values import Counters, Histogram
from rollouts.benchmarks import engine, sweep
from rollouts.benchmarks.level import LLM_KINDS, STOP_POLL_S, Level, Target

KEY_TTL_S = 24 * 3600
ALIVE_TTL_S = 5


class Reporter:
    """The run's keys in Redis, and the cancel flag read in the background."""

    def __init__(self, redis_url: str, prefix: str, run_id: str) -> None:
        self.client = redis.Redis.from_url(redis_url, socket_timeout=5)
        self.base = f"{prefix}{run_id}:"
        self.cancelled = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def key(self, name: str) -> str:
        return self.base + name

    def _watch(self) -> None:
        beat = 0.0
        while not self._stop.is_set():
            try:
                if self.client.exists(self.key("cancel")):
                    self.cancelled = True
                now = time.monotonic()
                if now - beat >= 1.0:
                    self.client.set(self.key("alive"), "1", ex=ALIVE_TTL_S)
                    beat = now
            except redis.RedisError:
                pass  # the next look tries again; the run itself needs no Redis
            self._stop.wait(STOP_POLL_S)

    def stop(self) -> bool:
        return self.cancelled

    def put(self, name: str, value: Any) -> None:
        self.client.set(self.key(name), json.dumps(value), ex=KEY_TTL_S)

    def push_level(self, value: dict[str, Any]) -> None:
        pipe = self.client.pipeline()
        pipe.rpush(self.key("levels"), json.dumps(value))
        pipe.expire(self.key("levels"), KEY_TTL_S)
        pipe.execute()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.client.delete(self.key("alive"))


def target_of(spec: dict[str, Any]) -> Target:
    raw = spec["target"]
    return Target(
        kind=raw["kind"], url=raw["url"], model=raw["model"], version=raw.get("version", ""),
        bodies=tuple(base64.b64decode(b) for b in raw.get("bodies", [])),
        timeout_s=float(raw.get("timeout_s", 30.0)),
    )


class ServerView:
    """The server's own account of a window: counters scraped when it opens and closes."""

    def __init__(self, kind: str, metrics_url: str, model: str, version: str) -> None:
        self.kind, self.url = kind, metrics_url
        self.key = (model, version if kind == "triton" else "")
        self.before: Counters | None = None
        self.after: Counters | None = None
        self.error = ""

    def take(self) -> Counters | None:
        try:
            return scraping.scrape(self.kind, self.url, timeout=3.0).series.get(self.key)
        except AdapterError as exc:
            self.error = str(exc)
            return None

    def bracket(self, window_start: float, window_end: float) -> threading.Thread:
        """Scrape at the window's start and end (perf_counter times), in a thread; a window
        that ends early (cancelled, ``max_requests`` reached) is closed by :meth:`close`."""
        self._closed = threading.Event()

        def run() -> None:
            if self._closed.wait(max(window_start - time.perf_counter(), 0)):
                return  # ended before its window opened: nothing to compare
            self.before = self.take()
            self._closed.wait(max(window_end - time.perf_counter(), 0))
            self.after = self.take()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._closed.set()

    def summary(self) -> dict[str, Any]:
        return server_summary(self.kind, self.before, self.after, self.error)


def _ms(total_us: float, count: float) -> float | None:
    return round(total_us / count / 1000.0, 3) if count > 0 else None


def _hist(hist: Histogram | None, prev: Histogram | None) -> dict[str, Any] | None:
    """One vLLM histogram over the window: count, mean, and p50/p99 estimated from the bucket
    deltas (PromQL's linear interpolation in the bucket), capped by what the mean allows for
    values that are never negative (Markov: p50 <= 2 x mean, p99 <= 100 x mean); without the
    cap a window whose queue times are all ~0 ms reads p50 150 ms, the middle of vLLM's
    lowest queue bucket (0-300 ms)."""
    if hist is None:
        return None
    delta = hist.minus(prev)
    if delta.count <= 0:
        return {"count": 0, "mean": None, "p50": None, "p99": None}
    mean = delta.sum / delta.count
    quantiles = {}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        value = rates.histogram_quantile(q, delta.buckets)
        quantiles[name] = None if value is None else round(min(value, mean / (1 - q)) * 1000.0, 3)
    return {"count": int(delta.count), "mean": round(mean * 1000.0, 3), **quantiles}


def server_summary(kind: str, before: Counters | None, after: Counters | None,
                   error: str = "") -> dict[str, Any]:
    """What the server says happened between two scrapes of one model: requests, and mean
    request, queue and compute time (Triton) or TTFT, inter-token and e2e latency (vLLM).

    vLLM's counts are of events inside the window: ``requests`` finished in it, ``ttft_ms``
    counts first tokens, ``itl_ms`` gaps between tokens, ``prompt_tokens`` and
    ``generation_tokens`` tokens read and made in it (the client counts the requests it sent in
    the window instead: the two differ by the requests in flight at its edges). A vLLM whose
    counters went down in the window (restarted) has no view of it."""
    if before is None or after is None:
        return {"available": False, "error": error or "the server reported no series for the model"}
    if kind != "triton":
        restarted = after.success < before.success or after.failure < before.failure or \
            after.generation_tokens < before.generation_tokens or any(
                name in after.histograms and after.histograms[name].decreased_from(hist)
                for name, hist in before.histograms.items())
        if restarted:
            return {"available": False, "error": "the server's counters went down in the window "
                                                 "(it restarted): no view of the window"}
    success = after.success - before.success
    out: dict[str, Any] = {
        "available": True,
        "requests": int(success + after.failure - before.failure),
        "failures": int(after.failure - before.failure),
    }
    if kind == "triton":
        out["request_ms"] = _ms(after.request_us - before.request_us, success)
        out["queue_ms"] = _ms(after.queue_us - before.queue_us, success)
        out["compute_ms"] = _ms(after.compute_us - before.compute_us, success)
    else:
        for name in ("ttft", "itl", "e2e", "queue"):
            out[f"{name}_ms"] = _hist(after.histograms.get(name), before.histograms.get(name))
        out["prompt_tokens"] = int(after.prompt_tokens - before.prompt_tokens)
        out["generation_tokens"] = int(after.generation_tokens - before.generation_tokens)
    return out


def client_overhead_ms(url: str, samples: int = 50) -> float | None:
    """Median round trip of a request the server answers without work (its health check):
    the client and network share of every latency this run reports."""
    import httpx

    times: list[float] = []
    try:
        with httpx.Client(timeout=2.0) as client:
            for _ in range(samples):
                started = time.perf_counter()
                client.get(url)
                times.append(time.perf_counter() - started)
    except httpx.HTTPError:
        return None
    times.sort()
    return round(times[len(times) // 2] * 1000.0, 3)


def run(spec: dict[str, Any], reporter: Reporter) -> dict[str, Any]:
    target = target_of(spec)
    plan = sweep.Plan.from_json(spec["plan"])
    slo = sweep.Slo.from_json(spec.get("slo") or {})
    base = spec.get("level") or {}
    level_proto = Level(
        mode=plan.mode, value=0, duration_s=float(base.get("duration_s", 10)),
        warmup_s=float(base.get("warmup_s", 2)), max_requests=int(base.get("max_requests", 0)),
    )
    goodput = {"latency_ms": slo.p99_ms, "ttft_ms": slo.ttft_p99_ms, "itl_ms": slo.itl_p99_ms}
    server = spec.get("server") or {}
    overhead = client_overhead_ms(server["probe_url"]) if server.get("probe_url") else None
    results: list[dict[str, Any]] = []
    if target.kind in LLM_KINDS:
        # Imported now, not when the first level starts its clock (~0.2 s): the server's
        # window, scheduled from here, must open when the client's does.
        import aiohttp  # noqa: F401
    while not reporter.stop():
        value = sweep.next_level(plan, results, slo)
        if value is None:
            break
        if plan.mode == "concurrency":
            value = int(value)  # whole clients: 8, not 8.0, in what the job reports
        level = replace(level_proto, value=value, seed=len(results))
        refinement = len([r for r in results if not r.get("refinement")]) >= len(plan.levels) or \
            bool(sweep.stop_reason(plan, [r for r in results if not r.get("refinement")], slo))
        reporter.put("current", {"index": len(results), "value": value, "refinement": refinement,
                                 "started_at": time.time(), "warmup_s": level.warmup_s,
                                 "duration_s": level.duration_s})
        view = None
        if server.get("metrics_url"):
            # vLLM labels an adapter's requests with its base model's name.
            view = ServerView(server["kind"], server["metrics_url"],
                              server.get("metrics_model") or target.model, target.version)
            now = time.perf_counter()
            thread = view.bracket(now + level.warmup_s, now + level.warmup_s + level.duration_s)
        result = engine.run_level(target, level, reporter.stop, goodput=goodput)
        if view is not None:
            view.close()
            thread.join(timeout=10)
            result["server"] = view.summary()
        result["refinement"] = refinement
        result["verdict"] = sweep.verdict(result, slo)
        results.append(result)
        reporter.push_level(result)
        if not results[0]["ok"] and len(results) == 1:
            break  # nothing answered at the lowest level: the summary says why
    summary = sweep.summarize(plan, results, slo)
    summary["client_overhead_ms"] = overhead
    summary["cancelled"] = reporter.stop()
    if results and not any(r["ok"] for r in results):
        summary["error"] = f"no request succeeded: {results[0].get('first_error') or 'no answer'}"
    elif results and server_went_away(results[-1], plan.error_limit):
        last = results[-1]
        summary["error"] = (f"the server stopped answering at {plan.mode} {last['value']:g}: "
                            f"{last.get('first_error') or 'no answer'}")
    return summary


def server_went_away(level: dict[str, Any], error_limit: float) -> bool:
    """Most of a level's requests found no server (refused, dropped or unanswered): a
    fault of the server, not a measurement of it."""
    gone = sum(n for kind, n in level.get("errors", {}).items()
               if kind in ("connect", "connection", "timeout"))
    return level.get("requests", 0) > 0 and gone / level["requests"] > error_limit


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m rollouts.benchmarks.runner SPEC.json", file=sys.stderr)  # noqa: T201
        return 2
    spec = json.loads(Path(args[0]).read_text())
    reporter = Reporter(spec["redis_url"], spec["prefix"], spec["run_id"])
    signal.signal(signal.SIGTERM, lambda *_: setattr(reporter, "cancelled", True))
    try:
        reporter.put("done", {"summary": run(spec, reporter)})
    except Exception as exc:
        reporter.put("done", {"error": f"{type(exc).__name__}: {exc}",
                              "trace": traceback.format_exc()[-4000:]})
        return 1
    finally:
        reporter.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
