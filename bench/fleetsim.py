"""How fast the fleet simulator answers: start it as its own process with N servers, scrape
every server's /metrics a few rounds at a fixed concurrency, and print start-up time, memory,
wall time per round and the simulator's CPU per scrape.

    .venv/bin/python bench/fleetsim.py                      # 1,000 Triton servers, a table
    .venv/bin/python bench/fleetsim.py --kind vllm --servers 500 --json

Hung servers (``--hung``, the first ones) are started and left out of the rounds, so the figure
is what a fleet with some hung servers costs the simulator. See docs/operations.md, "The fleet
simulator".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent


async def rounds(urls: list[str], count: int, in_flight: int, proc: psutil.Process) -> list[dict]:
    """``count`` rounds of one GET per URL, ``in_flight`` at a time."""
    out = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=in_flight)) as client:

        async def one(url: str) -> int:
            async with client.get(url) as response:
                return len(await response.read()) if response.status == 200 else -1

        for _ in range(count):
            cpu = sum(proc.cpu_times()[:2])
            started = time.monotonic()
            sizes = await asyncio.gather(*(one(u) for u in urls))
            wall = time.monotonic() - started
            cpu = sum(proc.cpu_times()[:2]) - cpu
            out.append({"wall_s": round(wall, 3),
                        "cpu_ms_per_scrape": round(cpu * 1000 / len(urls), 3),
                        "errors": sizes.count(-1), "page_bytes": max(sizes)})
    return out


def measure(kind: str, servers: int, models: int, hung: int, count: int, in_flight: int) -> dict:
    command = [sys.executable, "-m", "local.fleetsim", f"--{kind}", str(servers),
               "--models", str(models), "--seconds", "600", "--json"]
    if kind == "vllm":
        command += ["--triton", "0"]
    if hung:
        command += ["--hung", f"0-{hung - 1}"]
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        described = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        start_s = time.monotonic() - started
        sim = psutil.Process(proc.pid)
        urls = [s["metrics_url"] for s in described["servers"] if s["state"] == "ok"]
        measured = asyncio.run(rounds(urls, count, in_flight, sim))
        return {"kind": kind, "servers": servers, "models": models, "hung": hung,
                "in_flight": in_flight, "start_s": round(start_s, 3),
                "rss_mib": round(sim.memory_info().rss / 2**20), "rounds": measured}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=("triton", "vllm"), default="triton")
    p.add_argument("--servers", type=int, default=1000)
    p.add_argument("--models", type=int, default=2)
    p.add_argument("--hung", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--in-flight", type=int, default=100)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = measure(args.kind, args.servers, args.models, args.hung, args.rounds, args.in_flight)
    if args.json:
        print(json.dumps(result))  # noqa: T201
        return 0
    print(f"{result['servers']} {result['kind']} servers ({result['models']} models, "  # noqa: T201
          f"{result['hung']} hung): started in {result['start_s']} s, {result['rss_mib']} MiB")
    for i, r in enumerate(result["rounds"]):
        print(f"round {i}: {args.servers - args.hung} scrapes in {r['wall_s']} s, "  # noqa: T201
              f"{r['cpu_ms_per_scrape']} ms simulator CPU a scrape, {r['errors']} errors, "
              f"pages up to {r['page_bytes']} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
