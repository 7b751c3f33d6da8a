"""API load bench: the REST API under concurrent CI clients, on PostgreSQL and gunicorn.

    python bench/api.py [--clients 1 10 50] [--ci-clients 50] [--seconds 10] [--json]

Starts everything it needs and stops it again (also on Ctrl-C, SIGTERM or an error):

* a fresh PostgreSQL database on the local server (127.0.0.1:5432, trust authentication, as
  user ``postgres`` or ``root``), ``switchyard_bench_<pid>``, migrated, dropped at the end;
* realistic rows, written with ``bulk_create``: 3 tenants, 100 models with 1,000 versions,
  100 deployments on 16 servers, 2,000 loads with their events, quotas and placements, and
  100,000 audit events over six months; then ``VACUUM ANALYZE``, as autovacuum would have;
* a deployer API token of the biggest tenant (``fleet.tenancy.tokens.issue``), as a CI pipeline uses;
* the web server exactly as the image runs it: the Dockerfile's ``CMD`` (gunicorn
  ``console.wsgi``) and its ``WEB_CONCURRENCY``, with docker-compose's environment
  (production mode, ``SWITCHYARD_DB_CONN_MAX_AGE=60``, JSON logs, Redis at ``REDIS_URL`` or
  127.0.0.1:6379), bound to a free port on 127.0.0.1.

Then, level after level, clients (asyncio on uvloop, one keep-alive HTTP/1.1 connection each,
in this process) send GETs to the list and detail endpoints CI uses (models, versions,
deployments, loads, quotas, audit events; one of the 12 at random for each request) for
``--warmup`` seconds (not counted) and then ``--seconds`` seconds:

* ``--clients`` levels (1, 10, 50): closed loop, each client sends its next request as soon
  as the last one is answered;
* the CI-like level (``--ci-clients`` 50): each client pauses ``--think-ms`` (1000) on
  average between its requests (exponential pauses), as pipelines that poll and work between
  their calls do;
* the floor (``--floor-clients`` 50): a closed loop sending the same requests without a token,
  which the API answers 401 before it reads any table (no SQL, no serializer): what the web
  stack itself (gunicorn, Django's middleware, DRF's dispatch, the clients) allows on this
  machine, a bound no endpoint that reads the database can beat.

Every non-2xx answer (at the floor: every answer but 401), failed connection and timeout is an
error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import secrets
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

# bench/ is this script's folder, first on sys.path: the other benches' helpers are shared.
from freshness import deferred_signals, free_port, start_child, wait_until
from loads import REPO_ROOT, check_stop, run_bench, say

DEFAULT_LEVELS = (1, 10, 50)
# A level's kind: its tag in the JSON keys (p99_ms_c50, p99_ms_ci50, p99_ms_floor50) and its
# label in the table.
TAGS = {"closed": "c", "ci": "ci", "floor": "floor"}
LABELS = {"closed": "", "ci": "CI", "floor": "floor"}
PG_HOST, PG_PORT = "127.0.0.1", 5432
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
RESOURCES = ("models", "versions", "deployments", "loads", "quotas", "audit-events")
TENANT_SHARES = (("acme", 0.60), ("globex", 0.25), ("initech", 0.15))  # acme is the bench's
SERVERS_PER_CLUSTER = 8
DEVICE_CLASSES = ("cpu", "nvidia-a100-80gb", "nvidia-l4")
VERBS = ("created", "updated", "approved", "requested_approval", "loaded", "unloaded",
         "moved_alias", "started_rollout", "promoted", "rolled_back")
OBJECT_TYPES = ("rollouts.modelversion", "rollouts.deployment", "rollouts.modelload",
                "rollouts.alias", "rollouts.rollout", "fleet.quota", "fleet.apitoken")


# --------------------------------------------------------------------------------------------
# PostgreSQL: a database of the bench's own
# --------------------------------------------------------------------------------------------


def admin_connection(user: str | None) -> Any:
    """An autocommit connection to the server's ``postgres`` database as ``user`` (or as the
    first of postgres and root that the server lets in)."""
    import psycopg

    tried = []
    for name in [user] if user else ["postgres", "root"]:
        try:
            return psycopg.connect(host=PG_HOST, port=PG_PORT, user=name, dbname="postgres",
                                   autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            tried.append(f"{name}: {str(exc).strip().splitlines()[-1]}")
    raise RuntimeError(f"cannot reach PostgreSQL on {PG_HOST}:{PG_PORT} "
                       f"(trust authentication expected): {'; '.join(tried)}")


def create_database(user: str | None, stack: contextlib.ExitStack) -> str:
    """CREATE DATABASE switchyard_bench_<pid>, dropped when ``stack`` closes; its URL."""
    from psycopg import sql

    name = f"switchyard_bench_{os.getpid()}"
    with admin_connection(user) as conn:
        role = conn.info.user
        with deferred_signals():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            stack.callback(drop_database, role, name)
    return f"postgres://{role}@{PG_HOST}:{PG_PORT}/{name}"


def drop_database(user: str, name: str) -> None:
    from psycopg import sql

    try:
        with admin_connection(user) as conn:
            # FORCE: a gunicorn worker killed mid-request may leave a backend behind.
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
    except Exception as exc:  # cleanup goes on; say what is left behind
        say(f"could not drop database {name}: {exc}")


def vacuum_analyze(database_url: str) -> None:
    """Statistics and visibility maps, as autovacuum keeps them on a live database (fresh
    rows without them make the planner guess and index-only scans visit the heap)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


# --------------------------------------------------------------------------------------------
# Environment and Django
# --------------------------------------------------------------------------------------------


def compose_environment(tmp: Path, database_url: str, redis_url: str) -> None:
    """docker-compose's web environment (x-django-environment) for this process and gunicorn:
    production mode over plain HTTP on 127.0.0.1, persistent database connections."""
    data_dir = tmp / "data"
    data_dir.mkdir()
    (tmp / "static").mkdir()
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "SWITCHYARD_PRODUCTION": "true",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "SWITCHYARD_ALLOWED_HOSTS": "localhost,127.0.0.1",
        "SWITCHYARD_CSRF_TRUSTED_ORIGINS": "",
        "SWITCHYARD_SECURE_COOKIES": "true",
        "SWITCHYARD_SSL_REDIRECT": "false",
        "SWITCHYARD_TRUST_PROXY_HEADERS": "false",
        "DATABASE_URL": database_url,
        "SWITCHYARD_DB_CONN_MAX_AGE": "60",
        "REDIS_URL": redis_url,
        "SWITCHYARD_REDIS_PREFIX": f"switchyard-bench-{os.getpid()}",
        "SWITCHYARD_LOG_LEVEL": "INFO",
        "SWITCHYARD_LOG_FORMAT": "json",
        "SWITCHYARD_DATA_DIR": str(data_dir),
        "SWITCHYARD_STATIC_ROOT": str(tmp / "static"),
    })
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))


def check_redis(url: str) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        raise RuntimeError(f"no Redis at {url} ({exc}); start one or set REDIS_URL") from None


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


@dataclass
class World:
    """What the clients ask for: the token and the ids each detail endpoint is read with."""

    secret: str
    ids: dict[str, list[int]]
    counts: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def backdated(*fields: Any) -> Iterator[None]:
    """Let bulk_create write the given auto_now_add/auto_now fields as set (history)."""
    saved = [(f, f.auto_now_add, f.auto_now) for f in fields]
    for f in fields:
        f.auto_now_add = f.auto_now = False
    try:
        yield
    finally:
        for f, add, now in saved:
            f.auto_now_add, f.auto_now = add, now


def split(total: int) -> list[int]:
    """``total`` shared among the tenants by TENANT_SHARES (the first takes the rounding)."""
    parts = [int(total * share) for _, share in TENANT_SHARES]
    parts[0] += total - sum(parts)
    return parts


def triton_config(name: str, version: int) -> dict[str, Any]:
    return {
        "name": name, "backend": "python", "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1 + version % 2}],
        "dynamic_batching": {"max_queue_delay_microseconds": 100 * (version % 5)},
    }


def seed(models_n: int, versions_n: int, deployments_n: int, loads_n: int, audit_n: int,
         rng: random.Random) -> World:
    """Write the rows in bulk; the first tenant holds the biggest share and the token."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from fleet.models import (
        AuditEvent,
        Cluster,
        InferenceServer,
        Membership,
        Placement,
        Quota,
        Tenant,
    )
    from fleet.tenancy import tokens
    from rollouts.models import (
        Alias,
        Deployment,
        Model,
        ModelLoad,
        ModelLoadEvent,
        ModelVersion,
        Route,
    )

    now = timezone.now()
    six_months = timedelta(days=182)
    User = get_user_model()
    tenants = Tenant.objects.bulk_create(
        Tenant(slug=slug, name=slug.title()) for slug, _ in TENANT_SHARES)
    admins = User.objects.bulk_create(User(username=f"{t.slug}-admin") for t in tenants)
    Membership.objects.bulk_create(
        Membership(user=u, tenant=t, role=Membership.Role.ADMIN) for u, t in zip(admins, tenants))
    # The pipeline's token, and one made earlier by each tenant (who registered versions).
    issued = tokens.issue(admins[0], tenants[0], "ci-release-pipeline", Membership.Role.DEPLOYER)
    pipeline_tokens = [issued.token] + [
        tokens.issue(a, t, "ci-builds", Membership.Role.DEPLOYER).token
        for a, t in zip(admins[1:], tenants[1:])
    ]

    clusters = Cluster.objects.bulk_create(
        Cluster(name=name, kind=Cluster.Kind.STATIC) for name in ("prod-east", "prod-west"))
    servers = InferenceServer.objects.bulk_create(
        InferenceServer(cluster=c, name=f"triton-{i}", runtime=InferenceServer.Runtime.TRITON,
                        http_url=f"http://{c.name}-triton-{i}:8000",
                        health=InferenceServer.Health.HEALTHY, last_checked_at=now)
        for c in clusters for i in range(SERVERS_PER_CLUSTER))

    models = Model.objects.bulk_create(
        Model(tenant=t, name=f"model-{i:03d}", description=f"{t.name} model {i}")
        for t, count in zip(tenants, split(models_n)) for i in range(count))
    per_model = max(versions_n // len(models), 1)
    statuses = ModelVersion.Status
    version_fields = [ModelVersion._meta.get_field(n) for n in ("created_at", "status_changed_at")]
    rows = []
    for m in models:
        t_index = next(i for i, t in enumerate(tenants) if t.pk == m.tenant_id)
        for v in range(1, per_model + 1):
            made = now - six_months * (1 - v / (per_model + 1)) - timedelta(minutes=rng.random())
            by_token = v % 2 == 0
            rows.append(ModelVersion(
                model=m, version=v, artifact_uri=f"s3://models/{m.name}/{v}.tar.gz",
                sha256=f"{rng.getrandbits(256):064x}", size_bytes=rng.randint(10**6, 10**9),
                runtime=ModelVersion.Runtime.TRITON, backend="python",
                triton_config=triton_config(m.name, v),
                gpus=1, estimated_gpu_memory_mib=rng.choice((2048, 4096, 8192)),
                labels={"team": "risk", "dataset": f"2026-{v:02d}"},
                git_sha=f"{rng.getrandbits(160):040x}", training_run=f"run-{m.pk}-{v}",
                status=statuses.APPROVED if v >= per_model - 1 else statuses.ARCHIVED,
                status_changed_at=made, created_at=made,
                registered_by=None if by_token else admins[t_index],
                registered_by_token=pipeline_tokens[t_index] if by_token else None,
            ))
    with backdated(*version_fields):
        versions = ModelVersion.objects.bulk_create(rows, batch_size=2000)
    latest = {v.model_id: v for v in versions if v.version == per_model}
    previous = {v.model_id: v for v in versions if v.version == max(per_model - 1, 1)}
    Alias.objects.bulk_create(
        [Alias(model=m, name="production", version=previous[m.pk]) for m in models]
        + [Alias(model=m, name="staging", version=latest[m.pk]) for m in models])

    deployments = Deployment.objects.bulk_create(
        Deployment(tenant_id=m.tenant_id, model=m, cluster=clusters[i % 2],
                   name=f"{m.name}-{'prod' if i % 3 == 0 else 'staging'}-{i // len(models)}",
                   production=i % 3 == 0, slo_p99_ms=rng.choice((100, 250, 500)))
        for i, m in enumerate(models[i % len(models)] for i in range(deployments_n)))
    cluster_servers = {c.pk: [s for s in servers if s.cluster_id == c.pk] for c in clusters}
    through = Deployment.servers.through
    carried = {d.pk: rng.sample(cluster_servers[d.cluster_id], 2) for d in deployments}
    through.objects.bulk_create(
        through(deployment_id=d, inferenceserver_id=s.pk) for d, pair in carried.items()
        for s in pair)
    Route.objects.bulk_create(
        Route(deployment=d, name=f"dep-{d.pk}", url=f"http://router-{d.cluster_id}:{18100 + i}",
              state=Route.State.IN_FORCE, revision=3, applied_at=now)
        for i, d in enumerate(deployments) if i % 2 == 0)

    # Loads: a history per deployment, the newest version ready on both servers (and holding
    # quota through an active placement), older ones loaded and unloaded again.
    load_fields = [ModelLoad._meta.get_field(n)
                   for n in ("created_at", "updated_at", "phase_started_at")]
    versions_of: dict[int, list[Any]] = defaultdict(list)
    for v in versions:
        versions_of[v.model_id].append(v)
    placements, load_rows, held = [], [], set()
    per_deployment = max(loads_n // len(deployments), 2)
    for d in deployments:
        pair = carried[d.pk]
        history = sorted(versions_of[d.model_id], key=lambda v: v.version)
        for n in range(per_deployment):
            version = history[min(n // 2, len(history) - 1)] if n < per_deployment - 2 \
                else latest[d.model_id]
            server = pair[n % 2]
            made = now - six_months * (1 - (n + 1) / (per_deployment + 1))
            ready = n >= per_deployment - 2
            if ready and (server.pk, version.pk) not in held:
                held.add((server.pk, version.pk))
                placements.append(Placement(
                    tenant_id=d.tenant_id, server=server, model_version=version,
                    device_class="cpu", units=1, memory_mib=version.estimated_gpu_memory_mib,
                    state=Placement.State.ACTIVE))
            load_rows.append(ModelLoad(
                tenant_id=d.tenant_id, deployment=d, server=server, version=version,
                state=ModelLoad.State.READY if ready else ModelLoad.State.UNLOADED,
                requested_by_label="token:ci-release-pipeline",
                unload_requested_by_label="" if ready else "token:ci-release-pipeline",
                bytes_total=version.size_bytes, bytes_done=version.size_bytes,
                config_hash=f"{rng.getrandbits(256):064x}", created_at=made, updated_at=made,
                phase_started_at=made, ready_at=made + timedelta(seconds=20),
                finished_at=None if ready else made + timedelta(days=3),
            ))
    Placement.objects.bulk_create(placements)
    with backdated(*load_fields):
        loads = ModelLoad.objects.bulk_create(load_rows, batch_size=2000)
    steps = ("admitted", "fetching", "placing", "loading", "ready")
    event_field = ModelLoadEvent._meta.get_field("created_at")
    with backdated(event_field):
        ModelLoadEvent.objects.bulk_create(
            (ModelLoadEvent(load=load, state=state, message=f"{state}: step {i + 1} of 5",
                            created_at=load.created_at + timedelta(seconds=4 * i))
             for load in loads for i, state in enumerate(steps)), batch_size=5000)

    quotas = Quota.objects.bulk_create(
        Quota(tenant=t, device_class=dc, units=64, memory_mib=64 * 81920)
        for t in tenants for dc in DEVICE_CLASSES)

    # Audit events: spread over six months, most in tenants, a few platform-level ones.
    audit_field = AuditEvent._meta.get_field("created_at")
    shares = [share for _, share in TENANT_SHARES]
    with backdated(audit_field):
        for start in range(0, audit_n, 10_000):
            batch = []
            for i in range(start, min(start + 10_000, audit_n)):
                platform = i % 50 == 0
                t_index = rng.choices(range(len(tenants)), shares)[0]
                verb = VERBS[i % len(VERBS)]
                batch.append(AuditEvent(
                    tenant=None if platform else tenants[t_index],
                    actor_token=None if platform else pipeline_tokens[t_index],
                    actor_label="root" if platform else "token:ci-release-pipeline",
                    verb=verb, object_type=OBJECT_TYPES[i % len(OBJECT_TYPES)],
                    object_id=str(rng.randint(1, 5000)),
                    object_repr=f"{tenants[t_index].slug}/model-{i % 60:03d} v{i % 10 + 1}",
                    before={"status": "pending_approval"} if verb == "approved" else {},
                    after={"status": "approved", "version": i % 10 + 1},
                    reason="release pipeline" if i % 3 else "",
                    created_at=now - six_months * (1 - i / audit_n),
                ))
            AuditEvent.objects.bulk_create(batch, batch_size=5000)
            check_stop()

    mine = tenants[0].pk
    ids = {
        "models": [m.pk for m in models if m.tenant_id == mine],
        "versions": list(ModelVersion.objects.filter(model__tenant_id=mine)
                         .values_list("pk", flat=True)),
        "deployments": [d.pk for d in deployments if d.tenant_id == mine],
        "loads": [x.pk for x in loads if x.tenant_id == mine],
        "quotas": [q.pk for q in quotas if q.tenant_id == mine],
        # The newest events, as a pipeline reads what it just did.
        "audit-events": list(AuditEvent.objects.filter(tenant_id=mine).order_by("-created_at")
                             .values_list("pk", flat=True)[:1000]),
    }
    counts = {
        "tenants": len(tenants), "models": len(models), "versions": len(versions),
        "deployments": len(deployments), "servers": len(servers), "loads": len(loads),
        "load_events": len(loads) * len(steps), "quotas": len(quotas),
        "placements": len(placements), "audit_events": audit_n,
        "token_tenant_share": TENANT_SHARES[0][1],
    }
    return World(secret=issued.secret, ids=ids, counts=counts)


def paths_of(world: World) -> dict[str, tuple[str, list[str]]]:
    """Endpoint name → (kind, paths to pick from)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for resource in RESOURCES:
        out[f"{resource} list"] = ("list", [f"/api/v1/{resource}/"])
        out[f"{resource} detail"] = ("detail", [f"/api/v1/{resource}/{pk}/"
                                                for pk in world.ids[resource]])
    return out


def count_queries(world: World, endpoints: dict[str, tuple[str, list[str]]]) -> dict[str, int]:
    """SQL statements one request to each endpoint runs (in this process, the same stack of
    middleware, authentication and view as gunicorn's; the token's once-a-minute
    ``last_used_at`` write is made by a first request before counting)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_AUTHORIZATION=f"Bearer {world.secret}", HTTP_HOST="127.0.0.1",
                    HTTP_ACCEPT="application/json")
    client.get("/api/v1/models/")
    counts = {}
    for name, (_, paths) in endpoints.items():
        with CaptureQueriesContext(connection) as queries:
            response = client.get(paths[0])
        if response.status_code != 200:
            raise RuntimeError(f"{name}: {paths[0]} answered {response.status_code}: "
                               f"{response.content[:300]!r}")
        counts[name] = len(queries)
    return counts


def count_floor_queries(endpoints: dict[str, tuple[str, list[str]]]) -> int:
    """SQL statements the floor's request (no token) runs before its 401 (none, as measured
    here: a change that makes it read a table shows in the table's header line)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="127.0.0.1", HTTP_ACCEPT="application/json")
    path = next(iter(endpoints.values()))[1][0]
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    if response.status_code != 401:
        raise RuntimeError(f"{path} without a token answered {response.status_code}, not 401")
    return len(queries)


# --------------------------------------------------------------------------------------------
# gunicorn as the image runs it
# --------------------------------------------------------------------------------------------


def dockerfile_web() -> tuple[list[str], dict[str, str]]:
    """The image's default command and the gunicorn settings its ENV gives (WEB_CONCURRENCY)."""
    text = (REPO_ROOT / "Dockerfile").read_text()
    found = re.search(r"^CMD (\[.*\])\s*$", text, re.MULTILINE)
    if found is None:
        raise RuntimeError("the Dockerfile has no CMD [...] line")
    argv = json.loads(found[1])
    env = dict(re.findall(r"\b(WEB_CONCURRENCY|GUNICORN_CMD_ARGS)=(\S+?)\s*\\?$", text,
                          re.MULTILINE))
    return argv, env


@dataclass
class Web:
    url: str
    port: int
    child: Any
    argv: list[str]
    env: dict[str, str]


def start_web(tmp: Path, stack: contextlib.ExitStack, gunicorn_args: str | None,
              workers: int | None) -> Web:
    """gunicorn with the Dockerfile's CMD, bound to 127.0.0.1 on a free port."""
    argv, env = dockerfile_web()
    if argv[0] != "gunicorn":
        raise RuntimeError(f"the Dockerfile's CMD does not start gunicorn: {argv}")
    port = free_port()
    bind = argv.index("--bind") + 1
    argv = [*argv[:bind], f"127.0.0.1:{port}", *argv[bind + 1:]]
    if workers is not None:
        env["WEB_CONCURRENCY"] = str(workers)
    if gunicorn_args is not None:
        env["GUNICORN_CMD_ARGS"] = gunicorn_args
    os.environ.pop("GUNICORN_CMD_ARGS", None)
    os.environ.update(env)
    # The image's WORKDIR /app is the repository here.
    command = [sys.executable, "-m", "gunicorn", *argv[1:], "--chdir", str(REPO_ROOT)]
    child = start_child("web", command, tmp / "web.log", stack)
    return Web(f"http://127.0.0.1:{port}", port, child, argv, env)


def wait_ready(web: Web, secret: str) -> None:
    """Until an API request is answered 200 (every worker boots on its own)."""
    import http.client

    def ok() -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=5)
            conn.request("GET", "/api/v1/quotas/", headers={"Authorization": f"Bearer {secret}"})
            status = conn.getresponse().status
            conn.close()
        except OSError:
            return False
        if status != 200:
            raise RuntimeError(f"the API answered {status} at start:\n{web.child.tail()}")
        return True

    wait_until("gunicorn", ok, web.child, START_TIMEOUT_S)


def process_cpu_s(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) so far of each process still running."""
    import psutil

    taken = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            taken[pid] = times.user + times.system
    return taken


def cpu_used_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds taken between two samples by the processes running at the second (a
    process started in between counts from 0; one that ended in between, a database
    connection gunicorn closed, leaves out what it took since the first)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def server_pids(web: Web, database: str) -> tuple[list[int], list[int]]:
    """gunicorn's process tree, and the PostgreSQL backends serving the bench's database."""
    import psutil

    root = psutil.Process(web.child.popen.pid)
    gunicorn = [root.pid] + [p.pid for p in root.children(recursive=True)]
    backends = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if cmdline.startswith("postgres: ") and f" {database} " in cmdline:
            backends.append(proc.pid)
    return gunicorn, backends


# --------------------------------------------------------------------------------------------
# The clients
# --------------------------------------------------------------------------------------------


@dataclass
class Level:
    clients: int
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    first_errors: list[str] = field(default_factory=list)
    reconnects: int = 0
    window_s: float = 0.0


class Client:
    """One CI client: a keep-alive connection, one request at a time, a fresh connection
    when the server closes it (as HTTP client libraries do, a request that met a connection
    the server had just closed, before any answer, is sent again once; the time counts)."""

    def __init__(self, port: int, secret: str | None,
                 endpoints: dict[str, tuple[str, list[str]]], rng: random.Random) -> None:
        """``secret`` None: requests without a token, whose right answer is 401."""
        self.port = port
        auth = f"Authorization: Bearer {secret}\r\n" if secret else ""
        self.head = (f"Host: 127.0.0.1:{port}\r\n{auth}"
                     "Accept: application/json\r\nUser-Agent: switchyard-bench\r\n\r\n").encode()
        self.expect_401 = secret is None
        self.names = list(endpoints)
        self.endpoints = endpoints
        self.rng = rng
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = None

    async def _exchange(self, request: bytes) -> tuple[int, bool]:
        """Send and read one answer: (status, the server keeps the connection)."""
        assert self.reader is not None and self.writer is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lines = head.decode("latin-1").lower().split("\r\n")
        headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
        keep = headers.get("connection", "").strip() != "close" and head.startswith(b"HTTP/1.1")
        if "content-length" in headers:
            await self.reader.readexactly(int(headers["content-length"]))
        elif "chunked" in headers.get("transfer-encoding", ""):
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            await self.reader.read()
            keep = False
        return status, keep

    async def one(self, level: Level) -> tuple[str, float, str]:
        """One request: (endpoint, seconds, error kind or '')."""
        name = self.rng.choice(self.names)
        path = self.rng.choice(self.endpoints[name][1])
        request = f"GET {path} HTTP/1.1\r\n".encode() + self.head
        started = time.perf_counter()
        for attempt in (1, 2):
            fresh = self.writer is None
            try:
                if fresh:
                    self.reader, self.writer = await asyncio.open_connection("127.0.0.1",
                                                                             self.port)
                status, keep = await asyncio.wait_for(self._exchange(request), REQUEST_TIMEOUT_S)
            except asyncio.IncompleteReadError as exc:
                self.close()
                if not exc.partial and not fresh and attempt == 1:
                    level.reconnects += 1
                    continue
                return name, time.perf_counter() - started, f"connection: {exc!r}"
            except (OSError, TimeoutError, asyncio.LimitOverrunError, ValueError) as exc:
                self.close()
                if isinstance(exc, ConnectionResetError) and not fresh and attempt == 1:
                    level.reconnects += 1
                    continue
                return name, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
            elapsed = time.perf_counter() - started
            if not keep:
                self.close()
            ok = status == 401 if self.expect_401 else 200 <= status < 300
            return name, elapsed, "" if ok else f"http {status}"
        raise AssertionError("unreachable")


async def run_level(clients: int, port: int, secret: str | None,
                    endpoints: dict[str, tuple[str, list[str]]], warmup_s: float,
                    seconds: float, think_s: float, seed: int) -> Level:
    """``clients`` clients for ``warmup_s`` + ``seconds``; requests sent in the window count."""
    level = Level(clients)
    start = time.perf_counter()
    window_start, window_end = start + warmup_s, start + warmup_s + seconds

    async def client_loop(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        client = Client(port, secret, endpoints, rng)
        if think_s:  # CI clients do not start in step
            await asyncio.sleep(rng.uniform(0, think_s))
        try:
            while True:
                sent = time.perf_counter()
                if sent >= window_end:
                    return
                name, elapsed, error = await client.one(level)
                if sent >= window_start:
                    if error:
                        level.errors[name] += 1
                        if len(level.first_errors) < 5:
                            level.first_errors.append(f"{name}: {error}")
                    else:
                        level.latencies[name].append(elapsed)
                if think_s:
                    await asyncio.sleep(rng.expovariate(1 / think_s))
        finally:
            client.close()

    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    level.window_s = seconds
    return level


def percentile(ordered: list[float], p: float) -> float:
    """Nearest rank, in ms."""
    if not ordered:
        return math.nan
    return ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)] * 1000


def summarize(level: Level) -> dict[str, Any]:
    every = sorted(x for values in level.latencies.values() for x in values)
    errors = sum(level.errors.values())
    out: dict[str, Any] = {
        "clients": level.clients,
        "requests": len(every) + errors,
        "errors": errors,
        "rps": round(len(every) / level.window_s, 1),
        "reconnects": level.reconnects,
        "first_errors": level.first_errors,
    }
    for p in (50, 90, 99):
        out[f"p{p}_ms"] = round(percentile(every, p), 2)
    out["max_ms"] = round(every[-1] * 1000, 2) if every else math.nan
    out["endpoints"] = {
        name: {"requests": len(values) + level.errors.get(name, 0),
               "errors": level.errors.get(name, 0),
               "p50_ms": round(percentile(sorted(values), 50), 2),
               "p99_ms": round(percentile(sorted(values), 99), 2)}
        for name, values in sorted(level.latencies.items())
    }
    return out


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def measure(args: argparse.Namespace, web: Web, world: World, database: str,
            endpoints: dict[str, tuple[str, list[str]]]) -> list[dict[str, Any]]:
    """Each level in turn: the closed-loop ones (``--clients``), the CI-like one, the floor."""
    from rollouts.benchmarks.engine import new_loop

    plan = [("closed", clients, 0.0) for clients in args.clients]
    if args.ci_clients:
        plan.append(("ci", args.ci_clients, args.think_ms))
    if args.floor_clients:
        plan.append(("floor", args.floor_clients, 0.0))
    loop = new_loop()
    results = []
    try:
        for kind, clients, think_ms in plan:
            check_stop()
            how = {"closed": "", "ci": f", each pausing {think_ms:g} ms on average",
                   "floor": " without a token (answered 401, no SQL)"}[kind]
            say(f"{clients} client(s){how}: {args.warmup:g} s warm-up, {args.seconds:g} s "
                "measured…")
            gunicorn, backends = server_pids(web, database)
            cpu_before = (process_cpu_s(gunicorn), process_cpu_s(backends), time.process_time())
            level = loop.run_until_complete(run_level(
                clients, web.port, None if kind == "floor" else world.secret, endpoints,
                args.warmup, args.seconds, think_ms / 1000, args.seed))
            gunicorn, backends = server_pids(web, database)
            cpu_after = (process_cpu_s(gunicorn), process_cpu_s(backends), time.process_time())
            summary = summarize(level)
            summary["kind"] = kind
            summary["think_ms"] = think_ms
            elapsed = args.warmup + args.seconds
            used = (cpu_used_s(cpu_before[0], cpu_after[0]),
                    cpu_used_s(cpu_before[1], cpu_after[1]), cpu_after[2] - cpu_before[2])
            summary["cpu_share"] = {
                part: round(seconds / elapsed / (os.cpu_count() or 1), 3)
                for part, seconds in zip(("gunicorn", "postgres", "clients"), used)
            }
            say(f"  {summary['rps']:.0f} req/s, p50 {summary['p50_ms']:.1f} ms, "
                f"p99 {summary['p99_ms']:.1f} ms, {summary['errors']} error(s)")
            results.append(summary)
    finally:
        loop.close()
    return results


# --------------------------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    started = time.monotonic()
    load_start = loadavg()
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    check_redis(redis_url)
    database_url = create_database(args.pg_user, stack)
    database = database_url.rsplit("/", 1)[1]
    say(f"database {database}: migrating…")
    compose_environment(tmp, database_url, redis_url)
    setup_django()
    from django.db import connections

    stack.callback(connections.close_all)
    say(f"seeding {args.models} models, {args.versions} versions, {args.deployments} "
        f"deployments, {args.loads} loads, {args.audit} audit events…")
    seeded = time.monotonic()
    world = seed(args.models, args.versions, args.deployments, args.loads, args.audit,
                 random.Random(args.seed))
    connections.close_all()
    vacuum_analyze(database_url)
    say(f"  seeded in {time.monotonic() - seeded:.1f} s")
    endpoints = paths_of(world)
    queries = count_queries(world, endpoints)
    floor_queries = count_floor_queries(endpoints)
    connections.close_all()

    say("starting gunicorn as the image runs it…")
    web = start_web(tmp, stack, args.gunicorn_args, args.workers)
    wait_ready(web, world.secret)
    levels = measure(args, web, world, database, endpoints)
    if not web.child.running():
        raise RuntimeError(f"gunicorn exited during the bench:\n{web.child.tail()}")

    result: dict[str, Any] = {
        "levels": levels,
        "errors": sum(level["errors"] for level in levels),
        "database": database,
        "queries": queries,
        "floor_queries": floor_queries,
        "seeded": world.counts,
        "gunicorn": {"command": web.argv, "env": web.env},
        "seconds": args.seconds,
        "warmup_s": args.warmup,
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "bench_s": round(time.monotonic() - started, 1),
    }
    for level in levels:
        tag = f"{TAGS[level['kind']]}{level['clients']}"
        for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms"):
            result[f"{key}_{tag}"] = level[key]
        for key in ("rps", "requests", "errors"):
            result[f"{key}_{tag}"] = level[key]
    closed = [level for level in levels if level["kind"] == "closed"]
    ci = [level for level in levels if level["kind"] == "ci"]
    if closed:
        result["endpoints"] = _with_queries(closed[-1]["endpoints"], queries)
    if ci:
        result["endpoints_ci"] = _with_queries(ci[0]["endpoints"], queries)
        result["think_ms"] = ci[0]["think_ms"]
    return result


def _with_queries(endpoints: dict[str, Any], queries: dict[str, int]) -> dict[str, Any]:
    return {name: {**numbers, "queries": queries[name]} for name, numbers in endpoints.items()}


def print_table(r: dict[str, Any]) -> None:
    g = r["gunicorn"]
    env = " ".join(f"{k}={v}" for k, v in g["env"].items())
    s = r["seeded"]
    out = [
        f"Switchyard API under load: {env} {' '.join(g['command'])}",
        f"PostgreSQL, production settings; {s['versions']} versions, {s['deployments']} "
        f"deployments, {s['loads']} loads, {s['audit_events']} audit events; "
        f"{r['warmup_s']:g} s warm-up + {r['seconds']:g} s per level",
        f"machine: {r['cpus']} CPUs shared by the clients, gunicorn and PostgreSQL; load "
        f"average {r['loadavg_start']} at the start, {r['loadavg_end']} at the end",
        "",
        f"{'clients':>12}{'requests':>10}{'req/s':>8}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}"
        f"{'errors':>8}   CPU: gunicorn postgres clients",
    ]
    for level in r["levels"]:
        cpu = level["cpu_share"]
        label = f"{level['clients']} {LABELS[level['kind']]}".strip()
        out.append(
            f"{label:>12}{level['requests']:10d}{level['rps']:8.0f}"
            + "".join(f"{level[k]:8.1f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))
            + f"{level['errors']:8d}   {cpu['gunicorn']:8.0%} {cpu['postgres']:8.0%} "
            f"{cpu['clients']:7.0%}")
    out.append("(ms; N: N clients each sending its next request as soon as the last is "
               "answered" + (f"; N CI: N clients each pausing {r['think_ms']:g} ms on average "
                             "between requests" if "think_ms" in r else "")
               + ("; N floor: N clients sending without pause and without a token, answered "
                  f"401 with {r['floor_queries']} SQL statements: the web stack's own limit"
                  if any(
                      level["kind"] == "floor" for level in r["levels"]) else "") + ")")
    closed = [level for level in r["levels"] if level["kind"] == "closed"]
    columns = []
    if "endpoints" in r:
        columns.append((f"{closed[-1]['clients']} clients", r["endpoints"]))
    if "endpoints_ci" in r:
        ci = next(level for level in r["levels"] if level["kind"] == "ci")
        columns.append((f"{ci['clients']} CI", r["endpoints_ci"]))
    out += ["", "per endpoint (ms; queries: SQL statements per request):",
            f"  {'endpoint':22}{'queries':>8}"
            + "".join(f"{f'p50 {t}':>16}{f'p99 {t}':>16}" for t, _ in columns)]
    for name in r["queries"]:
        row = f"  {name:22}{r['queries'][name]:8d}"
        for _, endpoints in columns:
            e = endpoints.get(name, {"p50_ms": math.nan, "p99_ms": math.nan})
            row += f"{e['p50_ms']:16.1f}{e['p99_ms']:16.1f}"
        out.append(row)
    for level in r["levels"]:
        for line in level["first_errors"]:
            out.append(f"error at {level['clients']} clients: {line}")
    print("\n".join(out))  # noqa: T201


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="*", default=list(DEFAULT_LEVELS),
                        help="closed-loop levels: clients sending without pause (default 1 "
                             "10 50)")
    parser.add_argument("--ci-clients", type=int, default=50,
                        help="the CI-like level: clients pausing --think-ms between their "
                             "requests (default 50; 0: none)")
    parser.add_argument("--floor-clients", type=int, default=50,
                        help="the floor: clients sending without pause and without a token, "
                             "answered 401 before any SQL (default 50; 0: none)")
    parser.add_argument("--think-ms", type=float, default=1000.0,
                        help="mean pause of a CI-like client, exponential (default 1000)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="measured seconds per level (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds of load before each level's window (default 2)")
    parser.add_argument("--versions", type=int, default=1000,
                        help="model versions (default 1000), 10 per model")
    parser.add_argument("--deployments", type=int, default=None,
                        help="deployments (default: one per model)")
    parser.add_argument("--loads", type=int, default=None,
                        help="model loads (default: 20 per deployment), 5 events each")
    parser.add_argument("--audit", type=int, default=100_000,
                        help="audit events (default 100000)")
    parser.add_argument("--workers", type=int, default=None,
                        help="WEB_CONCURRENCY (default: the Dockerfile's)")
    parser.add_argument("--gunicorn-args", default=None,
                        help="GUNICORN_CMD_ARGS for the web server, e.g. '--threads 4'")
    parser.add_argument("--pg-user", default=None,
                        help="PostgreSQL user (default: postgres, else root)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    args.models = max(args.versions // 10, 1)
    if args.deployments is None:
        args.deployments = args.models
    if args.loads is None:
        args.loads = 20 * args.deployments
    if not args.clients and not args.ci_clients:
        parser.error("give at least one level: --clients N... or --ci-clients N")
    if min([*args.clients, 1]) < 1 or min(args.ci_clients, args.floor_clients) < 0 \
            or args.seconds <= 0 \
            or args.warmup < 0 or args.think_ms <= 0:
        parser.error("clients must be at least 1, seconds and think time positive, warm-up "
                     "not negative")
    if min(args.versions, args.deployments, args.loads, args.audit) < 1:
        parser.error("every row count must be at least 1")

    def body(tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
        return bench(args, tmp, stack)

    return run_bench("switchyard-api-", body, args.json, print_table)


if __name__ == "__main__":
    sys.exit(main())
