"""A benchmark job's runs of the load generator, one per config: the runner process
(:mod:`.runner`) started from a spec file and stopped, its log kept a week, and the Redis keys
it reports through (the levels measured, the level under way, the result, a heartbeat) and
reads its stop flag from. No decisions here: the reconciler (:mod:`.reconciler`) decides when
a run starts and what its result means; a cancel (:mod:`.requests`) sets the stop flag.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import redis
from django.conf import settings

from rollouts.benchmarks.specs import key_prefix
from rollouts.models import BenchmarkJob

RUNNER_FILES_KEPT_S = 7 * 24 * 3600  # runner logs are kept a week
RUNNERS: dict[int, subprocess.Popen[bytes]] = {}  # the runners this worker started, until reaped


def redis_client() -> redis.Redis:
    """The Redis the runners report through (short timeouts: a tick must not hang on it)."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def run_key(job: BenchmarkJob, name: str) -> str:
    """The Redis key ``name`` of the job's current run (``levels``, ``current``, ``done``,
    ``alive``, ``cancel``)."""
    return f"{key_prefix()}{job.run_id}:{name}"


def spec_path(run_id: str) -> Path:
    """Where the run's spec file goes (its log beside it, ``.log``)."""
    folder = Path(settings.DATA_DIR) / "benchmarks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{run_id}.json"


def launch_runner(spec: dict[str, Any], run_id: str) -> int:
    """Write the run's spec file and start its runner process, logging beside it; its pid."""
    path = spec_path(run_id)
    path.write_text(json.dumps(spec))
    log_path = path.with_suffix(".log")
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollouts.benchmarks.runner", str(path)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=str(Path(settings.BASE_DIR)), env={**os.environ},
        )
    RUNNERS[proc.pid] = proc
    return proc.pid


def reap_runners() -> None:
    """Collect the exit status of runners this worker started that have ended."""
    for pid, proc in list(RUNNERS.items()):
        if proc.poll() is not None:
            RUNNERS.pop(pid, None)


def read_run(job: BenchmarkJob) -> tuple[list[dict[str, Any]], dict[str, Any] | None,
                                         dict[str, Any] | None, bool]:
    """What the run reported so far: the levels measured, the level under way, the result
    (None until it ends) and whether its heartbeat is alive."""
    client = redis_client()
    pipe = client.pipeline()
    pipe.lrange(run_key(job, "levels"), 0, -1)
    pipe.get(run_key(job, "current"))
    pipe.get(run_key(job, "done"))
    pipe.exists(run_key(job, "alive"))
    levels_raw, current, done, alive = pipe.execute()
    return ([json.loads(x) for x in levels_raw], json.loads(current) if current else None,
            json.loads(done) if done else None, bool(alive))


def stop_run(job: BenchmarkJob) -> None:
    """Stop a runner that may still be going, and drop its spec file."""
    if job.run_id:
        with contextlib.suppress(redis.RedisError):
            redis_client().set(run_key(job, "cancel"), "1", ex=3600)
        spec_path(job.run_id).unlink(missing_ok=True)
    _kill_runner(job)


def _kill_runner(job: BenchmarkJob) -> None:
    if not job.runner_pid:
        return
    try:
        proc = psutil.Process(job.runner_pid)
        if "rollouts.benchmarks.runner" in " ".join(proc.cmdline()):
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except psutil.TimeoutExpired:
                proc.kill()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass


def prune_runner_files(max_age_s: float = RUNNER_FILES_KEPT_S) -> int:
    """Remove runner logs (and specs left by a worker that died) older than ``max_age_s``,
    except those of jobs still active; returns how many went."""
    folder = Path(settings.DATA_DIR) / "benchmarks"
    if not folder.is_dir():
        return 0
    active = set(BenchmarkJob.objects.filter(state__in=BenchmarkJob.ACTIVE)
                 .exclude(run_id="").values_list("run_id", flat=True))
    cutoff = time.time() - max_age_s
    removed = 0
    for path in folder.iterdir():
        if path.suffix in (".json", ".log") and path.stem not in active and \
                path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)
            removed += 1
    return removed
