"""Load-engine bench: the benchmark jobs' own load generator against wrk on the same server.

    python bench/engine_vs_wrk.py [--duration S] [--runs N] [--concurrency C ...] [--json]

Starts everything it needs and stops it again (also on Ctrl-C, SIGTERM or an error): a real
tritonserver (its runtime the cached one, as for the other benches) serving the demo
fraud-scorer with its simulated delay set to 0, so the server answers as fast as it can and
the client's own cost shows.

For each concurrency (1, 4, 16, 64 by default) and run, wrk (Debian's ``wrk``, ``--latency``,
1 thread at concurrency 1 else 2, a Lua script posting the KServe v2 JSON body) and the engine
(``rollouts.benchmarks.engine.run_level``, kind ``triton_http``, closed loop, the same body and
duration) load ``/v2/models/fraud-scorer/versions/1/infer`` one after the other, the order
alternating between runs so drift favours neither. Each figure is the median over the runs.
Goals: the engine reaches at least 80% of wrk's request rate, and its p50 is within 10% of
wrk's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# bench/ is this script's folder, first on sys.path: the other benches' helpers are shared.
from freshness import deferred_signals
from loads import REPO_ROOT, check_stop, run_bench, runtime_cache, say

MODEL = "fraud-scorer"
VERSION = "1"
PATH = f"/v2/models/{MODEL}/versions/{VERSION}/infer"
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}]}
).encode()
CONCURRENCY = (1, 4, 16, 64)
ENGINE_WARMUP_S = 0.5  # the engine's own warm-up before its measured window (not counted)
WRK_WARMUP_S = 1  # one untimed wrk run first: connections, Triton's first requests
RATE_GOAL = 0.80  # engine req/s at least this share of wrk's
P50_GOAL = 0.10  # engine p50 within this fraction of wrk's
WRK_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


def bench_repository(dest: Path) -> list[str]:
    """The demo fraud scorer answering at once (``sleep_ms`` 0 for both versions)."""
    from local.triton import write_demo_repository

    write_demo_repository(dest)
    shutil.rmtree(dest / "sentiment", ignore_errors=True)
    config = dest / MODEL / "config.pbtxt"
    text = re.sub(r'(key: "sleep_ms(?:_v2)?" value \{ string_value: )"\d+"', r'\1"0"',
                  config.read_text())
    config.write_text(text)
    return [MODEL]


# --------------------------------------------------------------------------------------------
# The two clients
# --------------------------------------------------------------------------------------------


def wrk_script(dest: Path) -> Path:
    """The Lua script that makes wrk send the bench's inference (a POST with its body)."""
    dest.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = [[{BODY.decode()}]]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    return dest


def parse_wrk(out: str) -> dict[str, float]:
    """wrk's ``--latency`` report: p50 and p99 (ms), requests per second, requests, errors."""
    found: dict[str, float] = {}
    for label, key in (("50%", "p50_ms"), ("99%", "p99_ms")):
        match = re.search(rf"^\s+{re.escape(label)}\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
        if match is None:
            raise RuntimeError(f"no {label} latency in wrk's output:\n{out}")
        found[key] = float(match.group(1)) * WRK_UNITS[match.group(2)]
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if rps is None or count is None:
        raise RuntimeError(f"no request rate in wrk's output:\n{out}")
    found["rps"] = float(rps.group(1))
    found["requests"] = int(count.group(1))
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    found["errors"] = (int(failed.group(1)) if failed else 0) + (
        sum(int(g) for g in errors.groups()) if errors else 0)
    return found


def run_wrk(url: str, concurrency: int, seconds: float, script: Path) -> dict[str, float]:
    """One wrk run; raises when any request failed."""
    threads = 1 if concurrency == 1 else 2
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{seconds:g}s", "--latency",
         "--timeout", "10s", "-s", str(script), f"{url}{PATH}"],
        capture_output=True, text=True, timeout=seconds + 60, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = parse_wrk(done.stdout)
    if found["errors"]:
        raise RuntimeError(f"wrk saw failed requests:\n{done.stdout}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    found["cpu_us"] = cpu / max(found["requests"], 1) * 1e6
    return found


def run_engine(url: str, concurrency: int, seconds: float) -> dict[str, float]:
    """One engine level (closed loop); raises when any request failed."""
    from rollouts.benchmarks.engine import run_level
    from rollouts.benchmarks.level import Level, Target

    target = Target(kind="triton_http", url=url, model=MODEL, version=VERSION, bodies=(BODY,),
                    timeout_s=10.0)
    level = Level(mode="concurrency", value=concurrency, duration_s=seconds,
                  warmup_s=ENGINE_WARMUP_S)
    cpu = time.process_time()
    result = run_level(target, level)
    cpu = time.process_time() - cpu
    if result["errors"] or not result["ok"]:
        raise RuntimeError(f"the engine saw failed requests: {result['errors']} "
                           f"({result['first_error']})")
    # CPU time over the warm-up and the window, per request sent in them (about).
    sent = result["throughput_rps"] * (ENGINE_WARMUP_S + seconds)
    return {"rps": result["throughput_rps"], "p50_ms": result["latency_ms"]["p50"],
            "p99_ms": result["latency_ms"]["p99"], "requests": result["ok"],
            "cpu_us": cpu / max(sent, 1) * 1e6}


# --------------------------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------------------------


def measure(url: str, levels: list[int], duration: float, runs: int,
            script: Path) -> list[dict[str, Any]]:
    say("warm-up: one wrk run and one engine level…")
    run_wrk(url, 4, WRK_WARMUP_S, script)
    run_engine(url, 4, WRK_WARMUP_S)
    out = []
    for concurrency in levels:
        samples: dict[str, list[dict[str, float]]] = {"engine": [], "wrk": []}
        for i in range(runs):
            order = ("engine", "wrk") if i % 2 == 0 else ("wrk", "engine")
            for tool in order:
                check_stop()
                sample = (run_engine(url, concurrency, duration) if tool == "engine"
                          else run_wrk(url, concurrency, duration, script))
                samples[tool].append(sample)
                say(f"  c={concurrency} run {i + 1}/{runs} {tool:6}: {sample['rps']:8.0f} req/s, "
                    f"p50 {sample['p50_ms']:.3f} ms")
        row: dict[str, Any] = {"concurrency": concurrency, "runs": runs}
        for tool in ("engine", "wrk"):
            for key in ("rps", "p50_ms", "p99_ms", "cpu_us"):
                row[f"{tool}_{key}"] = round(statistics.median(s[key] for s in samples[tool]), 3)
            row[f"{tool}_requests"] = sum(int(s["requests"]) for s in samples[tool])
        row["rps_share"] = round(row["engine_rps"] / row["wrk_rps"], 3) if row["wrk_rps"] else None
        row["p50_diff"] = (round(row["engine_p50_ms"] / row["wrk_p50_ms"] - 1, 3)
                           if row["wrk_p50_ms"] else None)
        row["rps_ok"] = row["rps_share"] is not None and row["rps_share"] >= RATE_GOAL
        row["p50_ok"] = row["p50_diff"] is not None and abs(row["p50_diff"]) <= P50_GOAL
        out.append(row)
    return out


def bench(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    from local.triton import ensure_runtime, server_version, start_triton

    say("starting tritonserver (fraud-scorer answering at once)…")
    runtime = ensure_runtime(runtime_cache().parent, progress=say)
    names = bench_repository(tmp / "models")
    with deferred_signals():
        triton = start_triton(runtime, tmp / "models", load_models=names,
                              log_path=tmp / "tritonserver.log")
        stack.callback(triton.stop)
    wrk_version = subprocess.run(["wrk", "--version"], capture_output=True, text=True,
                                 check=False).stdout.splitlines()
    result: dict[str, Any] = {
        "triton_version": server_version(triton.http_url),
        "wrk_version": wrk_version[0].split(" Copyright")[0].strip() if wrk_version else "",
        "duration_s": args.duration,
        "runs": args.runs,
        "goals": {"rps_share_min": RATE_GOAL, "p50_diff_max": P50_GOAL},
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    result["levels"] = measure(triton.http_url, args.concurrency, args.duration, args.runs,
                               wrk_script(tmp / "post.lua"))
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["passed"] = all(r["rps_ok"] and r["p50_ok"] for r in result["levels"])
    return result


def print_table(r: dict[str, Any]) -> None:
    mark = {True: "ok", False: "FAIL"}
    out = [
        f"Load engine vs wrk ({r['wrk_version']}) on Triton {r['triton_version']} "
        f"(fraud-scorer answering at once; {r['duration_s']:g} s a level, median of "
        f"{r['runs']} run{'s' if r['runs'] != 1 else ''})",
        f"machine: {r['cpus']} CPUs, load average {r['loadavg_start']} at the start, "
        f"{r['loadavg_end']} at the end",
        "",
        f"{'concurrency':>11}{'engine req/s':>14}{'wrk req/s':>11}{'share':>8}{'':5}"
        f"{'engine p50':>12}{'wrk p50':>9}{'p50 diff':>10}{'':5}"
        f"{'engine CPU/req':>16}{'wrk CPU/req':>13}",
    ]
    for row in r["levels"]:
        out.append(
            f"{row['concurrency']:>11}{row['engine_rps']:>14.0f}{row['wrk_rps']:>11.0f}"
            f"{row['rps_share']:>8.0%} {mark[row['rps_ok']]:<4}"
            f"{row['engine_p50_ms']:>12.3f}{row['wrk_p50_ms']:>9.3f}{row['p50_diff']:>+10.1%}"
            f" {mark[row['p50_ok']]:<4}"
            f"{row['engine_cpu_us']:>14.1f}us{row['wrk_cpu_us']:>11.1f}us"
        )
    out += ["", f"goals: engine req/s >= {RATE_GOAL:.0%} of wrk's, engine p50 within "
                f"{P50_GOAL:.0%} of wrk's (p50 in ms; CPU/req: the client's own CPU time per "
                f"request)"]
    print("\n".join(out))  # noqa: T201


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=4,
                        help="whole seconds per level and tool, as wrk takes them (default 4)")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs per level and tool; figures are the median (default 3)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY),
                        help="concurrencies to measure (default 1 4 16 64)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    if args.duration < 1 or args.runs < 1 or min(args.concurrency) < 1:
        parser.error("--duration must be at least 1, --runs and --concurrency at least 1")
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (Debian's wrk; scripts/test installs it)")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))

    return run_bench("switchyard-engine-", lambda tmp, stack: bench(args, tmp, stack), args.json,
                     print_table)


if __name__ == "__main__":
    sys.exit(main())
