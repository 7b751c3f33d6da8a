"""Model-load bench: Switchyard's load/unload path against bare Triton calls on one server.

    python bench/loads.py [--runs N] [--json]

Starts everything it needs and stops it again (also on Ctrl-C, SIGTERM or an error): a
temporary SWITCHYARD_DATA_DIR (its ``runtimes`` folder a symlink to the cached Triton runtime,
so nothing is rebuilt), a temporary SQLite database (migrated quietly), a moto S3 server and a
real tritonserver with an empty repository in explicit model-control mode.

Every run uses fresh model names, so every load is a real load on the server:

* load (end to end, cold cache): ``request_load`` → READY, the artifact not in the cache;
* unload (end to end): ``request_unload`` → UNLOADED (files removed, quota released);
* load (end to end, warm cache): the same version again, now a cache hit; then unloaded again;
* bare load / bare unload: ``tritonclient.http`` ``load_model(name, config=...)`` with the
  same full config + wait READY, and ``unload_model`` + wait UNAVAILABLE, for another model
  whose files were put into the repository folder beforehand.

The reconciler is driven in-process (``rollouts.loads.reconciler.advance`` in a tight loop; no Celery, no broker),
so the numbers are Switchyard's own overhead over the same server calls, not queueing delay.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import io
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tarfile
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
STEP_TIMEOUT_S = 90.0  # one load or unload, end to end
BARE_POLL_S = 0.01
# Triton's python backend takes 1.0-1.3 s to unload, in steps of ~0.1 s that depend on when the
# unload comes: an untimed random pause before each unload keeps that from favouring one side.
UNLOAD_JITTER_S = 0.25
SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP: list[int] = []  # signals received (an exception raised inside a gc callback is lost)


def on_signal(signum: int, frame: object) -> None:
    STOP.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def check_stop() -> None:
    """Raise KeyboardInterrupt if a signal came whose exception was swallowed."""
    if STOP:
        raise KeyboardInterrupt(f"signal {STOP[0]}")


def say(message: str) -> None:
    """Progress goes to stderr, so ``--json`` leaves stdout with one JSON object."""
    print(message, file=sys.stderr, flush=True)  # noqa: T201


# --------------------------------------------------------------------------------------------
# Environment: data dir, database, Django
# --------------------------------------------------------------------------------------------


def runtime_cache() -> Path:
    """Where the Triton runtime venv is cached: like the tests, $SWITCHYARD_DATA_DIR or
    ``<repo>/.switchyard``, read before this process points SWITCHYARD_DATA_DIR elsewhere."""
    configured = os.environ.get("SWITCHYARD_DATA_DIR")
    return (Path(configured) if configured else REPO_ROOT / ".switchyard") / "runtimes"


def prepare_environment(tmp: Path) -> Path:
    """A data dir under ``tmp`` sharing the runtime cache; env for Django; returns it."""
    data_dir = tmp / "data"
    data_dir.mkdir()
    cache = runtime_cache().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    (data_dir / "runtimes").symlink_to(cache, target_is_directory=True)
    os.environ["SWITCHYARD_DATA_DIR"] = str(data_dir)
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}"
    os.environ.setdefault("SWITCHYARD_LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return data_dir


MIGRATED_SQLITE_ENV = "SWITCHYARD_BENCH_MIGRATED_SQLITE"


def migrate() -> None:
    """Migrate the bench's database (after ``django.setup()``). Where
    ``$SWITCHYARD_BENCH_MIGRATED_SQLITE`` names a SQLite file migrated already (the suite's
    smoke tests make one a session) and the bench's database is a SQLite file not made yet,
    that file is copied in first: migrate then applies only what the copy lacks, instead of
    every migration from nothing (~7 s of CPU a bench)."""
    from django.conf import settings
    from django.core.management import call_command

    migrated = os.environ.get(MIGRATED_SQLITE_ENV)
    database = settings.DATABASES["default"]
    if migrated and database["ENGINE"] == "django.db.backends.sqlite3":
        target = Path(database["NAME"])
        if not target.exists():
            shutil.copyfile(migrated, target)
    call_command("migrate", verbosity=0, interactive=False)


def setup_django() -> None:
    import django

    django.setup()
    migrate()
    # No Celery: the bench advances loads itself; nothing is sent to a broker.
    import console.celery

    console.celery.publish = lambda name, args: None


# --------------------------------------------------------------------------------------------
# Artifacts
# --------------------------------------------------------------------------------------------


def demo_files(name: str, version: int) -> dict[str, str]:
    """The demo fraud scorer renamed ``name``: {relative path: text}."""
    from local.triton import DEMO_MODELS_DIR

    base = DEMO_MODELS_DIR / "fraud-scorer"
    config = (base / "config.pbtxt").read_text().replace('name: "fraud-scorer"', f'name: "{name}"')
    return {
        f"{name}/config.pbtxt": config,
        f"{name}/{version}/model.py": (base / "1" / "model.py").read_text(),
    }


def build_artifact(name: str, version: int) -> bytes:
    """A version artifact: tar.gz of <name>/config.pbtxt and <name>/<version>/model.py."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, text in demo_files(name, version).items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def full_config(name: str, version: int) -> str:
    """The config JSON a load sends: config.pbtxt as a ModelConfig, version_policy [version]."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    msg = model_config_pb2.ModelConfig()
    text_format.Parse(demo_files(name, version)[f"{name}/config.pbtxt"], msg)
    msg.ClearField("version_policy")
    msg.version_policy.specific.versions[:] = [version]
    return json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True))


# --------------------------------------------------------------------------------------------
# Timing helpers
# --------------------------------------------------------------------------------------------


class Spans:
    """Exclusive time spent in wrapped calls, per label, for the current measurement.

    Nested spans pause their parent (a database write from inside a fetch counts as db, not
    fetch; a garbage-collector pause counts as gc), so the labels plus the rest add up to the
    wall time.
    """

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._children: list[float] = []
        self._gc_started = 0.0

    def gc_callback(self, phase: str, info: dict[str, int]) -> None:
        """gc.callbacks hook: collector pauses count as gc, not as the span they interrupt."""
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        paused = time.perf_counter() - self._gc_started
        self.current["gc"] += paused
        if self._children:
            self._children[-1] += paused

    def reset(self) -> tuple[dict[str, float], dict[str, int]]:
        taken = (dict(self.current), dict(self.calls))
        self.current, self.calls = defaultdict(float), defaultdict(int)
        return taken

    def timed(self, label: str, call: Callable[[], Any]) -> Any:
        self._children.append(0.0)
        started = time.perf_counter()
        try:
            return call()
        finally:
            elapsed = time.perf_counter() - started
            self.current[label] += elapsed - self._children.pop()
            self.calls[label] += 1
            if self._children:
                self._children[-1] += elapsed

    def wrap(self, owner: Any, method: str, label: str) -> Callable[[], None]:
        """Time ``owner.method`` (a class, module or instance); returns the undo."""
        original = getattr(owner, method)
        spans = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            return spans.timed(label, lambda: original(*args, **kwargs))

        own = method in vars(owner)
        setattr(owner, method, timed)
        if own:
            return lambda: setattr(owner, method, original)
        return lambda: delattr(owner, method)

    def sql(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        """A Django execute_wrapper: every statement (BEGIN included) counts as db."""
        return self.timed("db", lambda: execute(sql, params, many, context))


SPANS = Spans()


def drive(load_id: int, until: str) -> None:
    """Advance the load in a tight loop until it reaches ``until`` (bounded)."""
    from rollouts.loads import reconciler
    from rollouts.models import ModelLoad

    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        check_stop()
        state = reconciler.advance(load_id)
        if state == until:
            return
        if state is None:  # not claimable now (backing off, or already settled)
            load = ModelLoad.objects.get(pk=load_id)
            if load.state == until:
                return
            if load.state not in ModelLoad.IN_FLIGHT:
                raise RuntimeError(f"load {load_id} ended {load.state}: {load.error}")
            time.sleep(0.01)
        elif state not in ModelLoad.IN_FLIGHT:
            error = ModelLoad.objects.get(pk=load_id).error
            raise RuntimeError(f"load {load_id} ended {state}, not {until}: {error}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"load {load_id} not {until} after {STEP_TIMEOUT_S:.0f} s")


def wait_state(client: Any, name: str, version: int, wanted: set[str]) -> None:
    """Poll the repository index until ``name`` version ``version`` is in ``wanted``."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        check_stop()
        state = ""
        for entry in client.get_model_repository_index():
            if entry.get("name") == name and str(entry.get("version", "")) == str(version):
                state = entry.get("state", "")
        if state in wanted:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{name} v{version} still {state or 'absent'} after {STEP_TIMEOUT_S:.0f} s"
            )
        time.sleep(BARE_POLL_S)


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p90 = ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]
    return {
        "median": statistics.median(ordered),
        "p90": p90,
        "max": ordered[-1],
        "min": ordered[0],
        "runs": len(ordered),
    }


# --------------------------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------------------------


class World:
    """Rows for the bench: a tenant, its deployer, a cpu quota, a server on the Triton."""

    def __init__(self, triton: Any, bucket: str, store: Any) -> None:
        from django.contrib.auth import get_user_model

        from fleet.models import Cluster, InferenceServer, Membership, Node, Quota, Tenant

        self.bucket, self.store, self.triton = bucket, store, triton
        cluster = Cluster.objects.create(name="bench", kind=Cluster.Kind.LOCAL)
        node = Node.objects.create(cluster=cluster, name="localhost", memory_mib=4096)
        self.cluster = cluster
        self.server = InferenceServer.objects.create(
            cluster=cluster,
            node=node,
            name="triton",
            runtime=InferenceServer.Runtime.TRITON,
            http_url=triton.http_url,
            model_repository=str(triton.model_repository),
            log_path=str(triton.log_path),
        )
        self.tenant = Tenant.objects.create(slug="bench", name="Bench")
        self.user = get_user_model().objects.create_user(username="bench-deployer", password=None)
        Membership.objects.create(user=self.user, tenant=self.tenant, role=Membership.Role.DEPLOYER)
        Quota.objects.create(tenant=self.tenant, device_class="cpu", units=4, memory_mib=1024)

    def new_version(self) -> tuple[Any, Any]:
        """A fresh model (new name) with one approved version uploaded to S3, and a deployment."""
        from rollouts.models import Deployment, Model, ModelVersion

        model = Model.objects.create(tenant=self.tenant, name=f"bench-{uuid.uuid4().hex[:8]}")
        deployment = Deployment.objects.create(
            tenant=self.tenant, model=model, cluster=self.cluster, name=model.name
        )
        deployment.servers.set([self.server])
        blob = build_artifact(model.name, 1)
        uri = f"s3://{self.bucket}/{model.name}/1.tar.gz"
        self.store.put(uri, blob)
        version = ModelVersion.objects.create(
            model=model,
            version=1,
            artifact_uri=uri,
            sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=len(blob),
            runtime="triton",
            backend="python",
            estimated_gpu_memory_mib=64,
            triton_config={},
            status=ModelVersion.Status.APPROVED,
        )
        return deployment, version


def switchyard_load(world: World, deployment: Any, version: Any) -> tuple[float, int]:
    from rollouts.loads import requests as loads
    from rollouts.models import ModelLoad

    gc.collect()  # every measurement starts without garbage left by the last
    SPANS.reset()
    started = time.perf_counter()
    rows, created = loads.request_load(world.user, deployment, version)
    if not created or len(rows) != 1:
        raise RuntimeError(f"request_load created nothing for {version} ({rows})")
    drive(rows[0].pk, ModelLoad.State.READY)
    return time.perf_counter() - started, rows[0].pk


def switchyard_unload(world: World, deployment: Any, version: Any) -> float:
    from rollouts.loads import requests as loads
    from rollouts.models import ModelLoad

    time.sleep(random.uniform(0, UNLOAD_JITTER_S))
    gc.collect()  # every measurement starts without garbage left by the last
    SPANS.reset()
    started = time.perf_counter()
    moved = loads.request_unload(world.user, deployment, version)
    if len(moved) != 1:
        raise RuntimeError(f"request_unload moved {len(moved)} loads of {version}")
    drive(moved[0].pk, ModelLoad.State.UNLOADED)
    return time.perf_counter() - started


def bare_round(client: Any, repository: Path) -> tuple[float, float]:
    """Place a model by hand, then time load_model + READY and unload_model + UNAVAILABLE."""
    name = f"bare-{uuid.uuid4().hex[:8]}"
    for path, text in demo_files(name, 1).items():
        target = repository / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    config = full_config(name, 1)
    try:
        gc.collect()
        started = time.perf_counter()
        client.load_model(name, config=config)
        wait_state(client, name, 1, {"READY"})
        load_s = time.perf_counter() - started
        time.sleep(random.uniform(0, UNLOAD_JITTER_S))
        gc.collect()
        started = time.perf_counter()
        client.unload_model(name)
        wait_state(client, name, 1, {"UNAVAILABLE", ""})
        unload_s = time.perf_counter() - started
    finally:
        with contextlib.suppress(Exception):
            client.unload_model(name)
            wait_state(client, name, 1, {"UNAVAILABLE", ""})
        shutil.rmtree(repository / name, ignore_errors=True)
    return load_s, unload_s


def bench(runs: int, tmp: Path, data_dir: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    from django.conf import settings

    from fleet.adapters.s3 import S3ArtifactStore
    from fleet.adapters.triton_runtime import TritonServerRuntime
    from local.s3 import (
        DEMO_ACCESS_KEY_ID,
        DEMO_REGION,
        DEMO_SECRET_ACCESS_KEY,
        start_moto,
    )
    from local.triton import ensure_runtime, server_version, start_triton

    say("starting moto S3 and tritonserver (empty repository, explicit mode)…")
    runtime = ensure_runtime(data_dir, progress=say)
    # Signals wait until each server is registered for shutdown: none is left running.
    with deferred_signals():
        moto = start_moto(log_path=tmp / "moto.log")
        stack.callback(moto.stop)
    (tmp / "models").mkdir()
    with deferred_signals():
        triton = start_triton(runtime, tmp / "models", log_path=tmp / "tritonserver.log")
        stack.callback(triton.stop)

    settings.SWITCHYARD_S3_ENDPOINT_URL = moto.endpoint_url
    settings.SWITCHYARD_S3_REGION = DEMO_REGION
    settings.SWITCHYARD_S3_ACCESS_KEY_ID = DEMO_ACCESS_KEY_ID
    settings.SWITCHYARD_S3_SECRET_ACCESS_KEY = DEMO_SECRET_ACCESS_KEY
    settings.SWITCHYARD_ARTIFACT_CACHE = data_dir / "cache" / "artifacts"
    settings.SWITCHYARD_LOAD_TIMEOUT_S = 60.0
    store = S3ArtifactStore(
        tmp / "upload-cache",
        endpoint_url=moto.endpoint_url,
        region=DEMO_REGION,
        access_key_id=DEMO_ACCESS_KEY_ID,
        secret_access_key=DEMO_SECRET_ACCESS_KEY,
    )
    store.ensure_bucket("bench-artifacts")
    cache = S3ArtifactStore(
        Path(settings.SWITCHYARD_ARTIFACT_CACHE), endpoint_url=moto.endpoint_url
    )
    world = World(triton, "bench-artifacts", store)

    from django.db import connections

    from rollouts.loads import reconciler

    spans = SPANS
    connection = connections["default"]
    connection.ensure_connection()
    stack.enter_context(connection.execute_wrapper(spans.sql))
    for owner, method, label in [
        (connection, "_commit", "db"),
        (reconciler, "artifact_store_for", "store_setup"),
        (S3ArtifactStore, "fetch", "fetch"),
        (TritonServerRuntime, "place", "place"),
        (TritonServerRuntime, "load", "triton_load"),
        (TritonServerRuntime, "unload", "triton_unload"),
        (TritonServerRuntime, "remove", "remove"),
    ]:
        stack.callback(spans.wrap(owner, method, label))

    gc.callbacks.append(spans.gc_callback)
    stack.callback(gc.callbacks.remove, spans.gc_callback)

    import tritonclient.http as triton_http

    address = triton.http_url.removeprefix("http://")
    client = triton_http.InferenceServerClient(address, connection_timeout=30, network_timeout=60)
    stack.callback(client.close)

    samples: dict[str, list[float]] = defaultdict(list)
    parts: dict[str, list[dict[str, float]]] = defaultdict(list)
    statements: dict[str, list[int]] = defaultdict(list)

    def record(key: str, seconds: float) -> None:
        samples[key].append(seconds)
        taken, calls = spans.reset()
        taken["other"] = seconds - sum(taken.values())
        parts[key].append(taken)
        statements[key].append(calls.get("db", 0))

    say(f"warming up, then {runs} run(s)…")
    bare_round(client, triton.model_repository)  # first stub start pays for cold disk caches
    deployment, version = world.new_version()
    switchyard_load(world, deployment, version)
    switchyard_unload(world, deployment, version)
    spans.reset()

    for run in range(1, runs + 1):
        check_stop()
        bare_load, bare_unload = bare_round(client, triton.model_repository)
        samples["bare_load"].append(bare_load)
        samples["bare_unload"].append(bare_unload)

        deployment, version = world.new_version()
        cache.evict(version.sha256)  # new name, new digest: cold anyway; made sure
        seconds, _ = switchyard_load(world, deployment, version)
        record("load", seconds)
        record("unload", switchyard_unload(world, deployment, version))
        if cache.cached_path(version.sha256) is None:
            raise RuntimeError("the artifact is not in the cache after a load")
        seconds, _ = switchyard_load(world, deployment, version)
        record("load_warm", seconds)
        record("unload", switchyard_unload(world, deployment, version))
        say(
            f"run {run}/{runs}: load {samples['load'][-1]:.3f} s (warm {seconds:.3f} s), "
            f"bare load {bare_load:.3f} s, unload {samples['unload'][-1]:.3f} s, "
            f"bare unload {bare_unload:.3f} s"
        )

    result: dict[str, Any] = {"runs": runs, "triton_version": server_version(triton.http_url)}
    for key, values in samples.items():
        for stat, value in summary(values).items():
            result[f"{key}_s_{stat}" if stat != "runs" else f"{key}_samples"] = value
    result["load_overhead_s_median"] = result["load_s_median"] - result["bare_load_s_median"]
    result["load_warm_overhead_s_median"] = (
        result["load_warm_s_median"] - result["bare_load_s_median"]
    )
    result["unload_overhead_s_median"] = result["unload_s_median"] - result["bare_unload_s_median"]
    result["breakdown_s_median"] = {
        key: {
            label: statistics.median(p.get(label, 0.0) for p in rows)
            for label in sorted({label for p in rows for label in p})
        }
        for key, rows in parts.items()
    }
    result["db_statements_median"] = {key: statistics.median(v) for key, v in statements.items()}
    return result


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back while a child server starts and is registered for shutdown: a
    signal then is only noted, and acted on right after. (Blocking them with
    ``pthread_sigmask`` instead is inherited: the server started deaf to SIGTERM, and each
    stop waited out its timeout before SIGKILL, about 15 s a server.)"""
    noted: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: noted.append(signum))
                for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if noted:
        STOP.append(noted[0])
        raise KeyboardInterrupt(f"signal {noted[0]}")


def print_table(result: dict[str, Any]) -> None:
    rows = [
        ("load (end to end, cold cache)", "load"),
        ("load (end to end, warm cache)", "load_warm"),
        ("bare load", "bare_load"),
        ("unload (end to end)", "unload"),
        ("bare unload", "bare_unload"),
    ]
    out = [
        f"Switchyard model loads vs bare Triton {result['triton_version']} "
        f"({result['runs']} runs; seconds; reconciler in-process, no Celery)",
        "",
        f"{'':32}{'median':>9}{'p90':>9}{'max':>9}{'min':>9}{'runs':>6}",
    ]
    for label, key in rows:
        out.append(
            f"{label:32}"
            + "".join(f"{result[f'{key}_s_{s}']:9.3f}" for s in ("median", "p90", "max", "min"))
            + f"{result[f'{key}_samples']:6d}"
        )
    bare_load, bare_unload = result["bare_load_s_median"], result["bare_unload_s_median"]
    out += [
        "",
        "Switchyard overhead over bare, at the median:",
        f"  load, cold cache  {result['load_overhead_s_median']:+.3f} s "
        f"({result['load_s_median'] / bare_load:.2f}x bare)",
        f"  load, warm cache  {result['load_warm_overhead_s_median']:+.3f} s "
        f"({result['load_warm_s_median'] / bare_load:.2f}x bare)",
        f"  unload            {result['unload_overhead_s_median']:+.3f} s "
        f"({result['unload_s_median'] / bare_unload:.2f}x bare)",
        "",
        "Where the end-to-end time goes (median seconds; db: SQL statements and commits, "
        "store_setup: artifact_store_for, other: the rest of Switchyard's Python):",
    ]
    for key, parts in result["breakdown_s_median"].items():
        shown = ", ".join(f"{label} {value:.3f}" for label, value in parts.items())
        out.append(f"  {key:10} {shown} ({result['db_statements_median'][key]:.0f} SQL statements)")
    print("\n".join(out))  # noqa: T201


def run_bench(prefix: str, body: Callable[[Path, contextlib.ExitStack], dict[str, Any]],
              as_json: bool, print_table: Callable[[dict[str, Any]], None]) -> int:
    """Run ``body(tmp, stack)`` in a temporary folder that is removed afterwards, with every
    server it registers on ``stack`` stopped at the end, on Ctrl-C, SIGTERM or an error; print
    its result as JSON or as a table. Returns the exit code."""
    for sig in SIGNALS:
        signal.signal(sig, on_signal)
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(shutil.rmtree, tmp, ignore_errors=True)
            try:
                result = body(tmp, stack)
                check_stop()
            finally:
                # Cleanup (servers, temp dir) must not be cut short by a second Ctrl-C.
                for sig in SIGNALS:
                    signal.signal(sig, signal.SIG_IGN)
    except KeyboardInterrupt:
        say("interrupted; everything stopped")
        return 130
    if as_json:
        print(json.dumps(result, sort_keys=True))  # noqa: T201
    else:
        print_table(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="measured runs (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")


    def body(tmp: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
        data_dir = prepare_environment(tmp)
        say(f"setting up a temporary database in {tmp}…")
        setup_django()
        from django.db import connections

        stack.callback(connections.close_all)
        return bench(args.runs, tmp, data_dir, stack)

    return run_bench("switchyard-bench-", body, args.json, print_table)


if __name__ == "__main__":
    sys.exit(main())
