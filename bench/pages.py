"""Page bench: the console's pages and the API's lists on a database at fleet size.

    python bench/pages.py [--audit-events 10000000] [--requests 30] [--seconds 10] [--json]

Starts what it needs and stops it again (also on Ctrl-C, SIGTERM or an error):

* a fresh PostgreSQL database (127.0.0.1:5432, trust authentication), migrated, seeded with
  ``manage.py seed_fleet`` at issue 25's sizes: 10,000 GPUs, 1,000 servers, 1,000
  deployments, 100,000 loads and 10 million audit events over a year (``--audit-events``
  fewer for a quick run), then ``VACUUM ANALYZE``; dropped at the end. The seeding time is
  measured and reported;
* the console pages (dashboard, fleet, its live server table, deployments, audit log, loads;
  the audit log and loads also filtered and one page older), each read ``--requests`` times
  in this process through Django's test client, as a member of one of 20 tenants and as a
  platform admin: server time per request, p50 and p95, and SQL statements per page;
* gunicorn exactly as the image runs it (bench/api.py's), and 10 API clients (``--clients``)
  in a closed loop over the lists CI reads (models, versions, deployments, loads, quotas,
  audit events; loads and audit events also one cursor page on) with a tenant's token for
  ``--seconds``: p50 and p99 per list and over all.

Goals (issue 25): every page's p95 at most 300 ms, the API lists' p99 at most 100 ms at 10
clients. ``--json`` prints one object with ``page_p95_ms`` (page → the worse persona's
p95), ``api_p99_ms_c10`` and the details.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

# bench/ is this script's folder, first on sys.path: the other benches' helpers are shared.
from api import (
    check_redis,
    compose_environment,
    create_database,
    loadavg,
    percentile,
    run_level,
    setup_django,
    start_web,
    summarize,
    vacuum_analyze,
    wait_ready,
)
from loads import run_bench, say

PAGE_GOAL_MS = 300.0
API_GOAL_MS = 100.0
PERSONAS = {"tenant member": "fleet-00-viewer", "platform admin": "fleet-admin"}
PAGES = {
    "dashboard": "/",
    "fleet": "/fleet/",
    "fleet servers (live)": "/fleet/servers/live/",
    "deployments": "/registry/deployments/",
    "audit log": "/audit/",
    "audit log, older page": "/audit/?cursor={audit_older}",
    "audit log, by action": "/audit/?verb=promoted",
    "loads": "/registry/loads/",
    "loads, older page": "/registry/loads/?cursor={loads_older}",
    "loads, failed": "/registry/loads/?state=failed",
}
LISTS = ("models", "versions", "deployments", "loads", "quotas", "audit-events")


def seed(args: argparse.Namespace) -> float:
    from django.core.management import call_command

    started = time.monotonic()
    call_command("seed_fleet", tenants=20, gpus=args.gpus, servers=args.servers,
                 deployments=args.deployments, loads=args.loads,
                 audit_events=args.audit_events, verbosity=0)
    return time.monotonic() - started


def older_cursor(html: str) -> str:
    found = re.search(r'cursor=([A-Za-z0-9_-]+)"', html)
    return found[1] if found else ""


def counting(queries: list[str]) -> Any:
    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        queries.append(sql)
        return execute(sql, params, many, context)

    return wrapper


def measure_pages(requests: int) -> dict[str, dict[str, dict[str, float]]]:
    """Persona → page → p50/p95 (ms) and SQL statements, in-process (server time only)."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    out: dict[str, dict[str, dict[str, float]]] = {}
    for persona, username in PERSONAS.items():
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(get_user_model().objects.get(username=username))
        # One page on: the cursor of the first pages' Older link.
        cursors = {key: older_cursor(client.get(path).content.decode())
                   for key, path in (("audit_older", "/audit/"),
                                     ("loads_older", "/registry/loads/"))}
        out[persona] = {}
        for name, template in PAGES.items():
            path = template.format(**cursors)
            client.get(path)  # warm: templates, the connection
            queries: list[str] = []
            with connection.execute_wrapper(counting(queries)):
                response = client.get(path)
            if response.status_code != 200:
                raise RuntimeError(f"{path} as {persona} answered {response.status_code}")
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                client.get(path)
                times.append(time.perf_counter() - started)
            times.sort()
            out[persona][name] = {"p50_ms": round(percentile(times, 50), 1),
                                  "p95_ms": round(percentile(times, 95), 1),
                                  "queries": len(queries)}
            say(f"  {persona:15} {name:24} p95 {out[persona][name]['p95_ms']:7.1f} ms")
    return out


def api_endpoints(secret: str) -> dict[str, tuple[str, list[str]]]:
    """The lists, and the loads' and audit log's second pages (their ``next`` cursors)."""
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_HOST="127.0.0.1",
                    HTTP_ACCEPT="application/json")
    endpoints = {f"{name} list": ("list", [f"/api/v1/{name}/"]) for name in LISTS}
    for name in ("loads", "audit-events"):
        following = client.get(f"/api/v1/{name}/").json()["next"]
        if following:
            endpoints[f"{name} next page"] = ("list", [following.split("127.0.0.1", 1)[1]])
    return endpoints


def measure_api(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack,
                secret: str) -> dict[str, Any]:
    from rollouts.benchmarks.engine import new_loop

    endpoints = api_endpoints(secret)
    say("starting gunicorn as the image runs it…")
    web = start_web(tmp, stack, None, None)
    wait_ready(web, secret)
    say(f"{args.clients} API clients: {args.warmup:g} s warm-up, {args.seconds:g} s measured…")
    loop = new_loop()
    try:
        level = loop.run_until_complete(run_level(args.clients, web.port, secret, endpoints,
                                                  args.warmup, args.seconds, 0.0, 1))
    finally:
        loop.close()
    summary = summarize(level)
    say(f"  {summary['rps']:.0f} req/s, p99 {summary['p99_ms']:.1f} ms, "
        f"{summary['errors']} error(s)")
    return summary


def bench(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    started = time.monotonic()
    load_start = loadavg()
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    check_redis(redis_url)
    database_url = args.database or create_database(None, stack)
    say(f"database {database_url.rsplit('/', 1)[1]}: migrating…")
    compose_environment(tmp, database_url, redis_url)
    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connections
    from django.urls import get_resolver

    get_resolver().url_patterns  # import every view now, as gunicorn's workers do at start
    # Production settings serve hashed static files, as the image's build collects them.
    if args.no_compress:
        # The pages name the hashed files from the manifest only; the gzip and Brotli copies
        # beside them (~30 s of 2 cores) are what a browser would be sent, and none is asked.
        from whitenoise.storage import CompressedManifestStaticFilesStorage

        CompressedManifestStaticFilesStorage.compress_files = lambda self, paths: iter(())
    call_command("collectstatic", interactive=False, verbosity=0)
    from fleet.models import Membership, Tenant
    from fleet.tenancy import tokens

    stack.callback(connections.close_all)
    say(f"seeding {args.gpus:,} GPUs, {args.servers:,} servers, {args.deployments:,} "
        f"deployments, {args.loads:,} loads, {args.audit_events:,} audit events…")
    if args.database:
        say("  (already seeded: --database)")
        seed_s = None
    else:
        seed_s = seed(args)
        connections.close_all()
        vacuumed = time.monotonic()
        vacuum_analyze(database_url)
        say(f"  seeded in {seed_s:.0f} s, VACUUM ANALYZE {time.monotonic() - vacuumed:.0f} s")

    say(f"console pages, {args.requests} requests each…")
    pages = measure_pages(args.requests)
    admin = get_user_model().objects.get(username=PERSONAS["platform admin"])
    secret = tokens.issue(admin, Tenant.objects.get(slug="fleet-00"), f"bench-pages-{os.getpid()}",
                          Membership.Role.DEPLOYER).secret
    connections.close_all()
    api = measure_api(args, tmp, stack, secret)

    return {
        "page_p95_ms": {name: max(pages[p][name]["p95_ms"] for p in PERSONAS) for name in PAGES},
        f"api_p99_ms_c{args.clients}": api["p99_ms"],
        "pages": pages,
        "api": api,
        "clients": args.clients,
        "seeded": {"gpus": args.gpus, "servers": args.servers, "deployments": args.deployments,
                   "loads": args.loads, "audit_events": args.audit_events, "tenants": 20},
        "seed_s": round(seed_s, 1) if seed_s is not None else None,
        "requests": args.requests,
        "goals": {"page_p95_ms": PAGE_GOAL_MS, "api_p99_ms": API_GOAL_MS},
        "database": database_url.rsplit("/", 1)[1],
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "bench_s": round(time.monotonic() - started, 1),
    }


def print_table(r: dict[str, Any]) -> None:
    s = r["seeded"]
    out = [
        f"Switchyard pages at fleet size: {s['gpus']:,} GPUs, {s['servers']:,} servers, "
        f"{s['deployments']:,} deployments, {s['loads']:,} loads, {s['audit_events']:,} audit "
        f"events in {s['tenants']} tenants "
        + (f"(seeded in {r['seed_s']:.0f} s)" if r["seed_s"] is not None else "(seeded before)"),
        f"machine: {r['cpus']} CPUs; load average {r['loadavg_start']} at the start, "
        f"{r['loadavg_end']} at the end",
        "",
        f"console pages, server time over {r['requests']} requests (ms; goal p95 ≤ "
        f"{r['goals']['page_p95_ms']:g}):",
        f"  {'page':26}" + "".join(f"{f'p50 {p}':>22}{'p95':>8}{'SQL':>5}" for p in PERSONAS),
    ]
    for name in PAGES:
        row = f"  {name:26}"
        for persona in PERSONAS:
            m = r["pages"][persona][name]
            row += f"{m['p50_ms']:22.1f}{m['p95_ms']:8.1f}{m['queries']:5d}"
        out.append(row)
    api = r["api"]
    out += ["", f"API lists, {api['clients']} clients in a closed loop, a tenant's token "
            f"(ms; goal p99 ≤ {r['goals']['api_p99_ms']:g}): {api['rps']:.0f} req/s, "
            f"p50 {api['p50_ms']:.1f}, p99 {api['p99_ms']:.1f}, {api['errors']} error(s)",
            f"  {'list':26}{'requests':>10}{'p50':>8}{'p99':>8}"]
    for name, e in api["endpoints"].items():
        out.append(f"  {name:26}{e['requests']:10d}{e['p50_ms']:8.1f}{e['p99_ms']:8.1f}")
    out.extend(f"error: {line}" for line in api["first_errors"])
    print("\n".join(out))  # noqa: T201


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audit-events", type=int, default=10_000_000,
                        help="audit events (default 10,000,000: about 8 minutes to seed on "
                             "2 cores; 1,000,000 for a quick run)")
    parser.add_argument("--loads", type=int, default=100_000)
    parser.add_argument("--deployments", type=int, default=1_000)
    parser.add_argument("--servers", type=int, default=1_000)
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=30,
                        help="measured requests per page and persona (default 30)")
    parser.add_argument("--clients", type=int, default=10, help="API clients (default 10)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="measured seconds of API load (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds of API load before the window (default 2)")
    parser.add_argument("--database", default=None,
                        help="a PostgreSQL URL seed_fleet has seeded at these sizes: measure it "
                             "as it is (migrated, not seeded again, not dropped)")
    parser.add_argument("--no-compress", action="store_true",
                        help="collect the static files without their gzip and Brotli copies "
                             "(the manifest the pages read is the same; ~30 s less on 2 cores)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    if min(args.gpus, args.servers, args.deployments, args.requests, args.clients) < 1 \
            or min(args.loads, args.audit_events) < 0 or args.seconds <= 0 or args.warmup < 0:
        parser.error("sizes, requests and clients must be at least 1 (loads and audit events "
                     "0 or more), seconds positive")

    def body(tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
        return bench(args, tmp, stack)

    return run_bench("switchyard-pages-", body, args.json, print_table)


if __name__ == "__main__":
    sys.exit(main())
