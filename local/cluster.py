"""The local cluster: a real tritonserver that Switchyard runs on this machine.

``up()`` prepares the Triton runtime (its own virtualenv, made on first use), writes the demo
model repository, starts the server on the configured ports, records it as cluster ``local``
and writes a pidfile; ``down()`` stops the server named in the pidfile. ``run_nginx()`` runs
the local cluster's traffic router (nginx, restarted when it dies). The demo and the tests
use it; production clusters are ``static`` or ``kubernetes``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from django.conf import settings
from django.db import transaction

from fleet.models import Cluster, InferenceServer, Node
from local import nginx_supervisor
from local import triton as triton_local
from local import vllm as vllm_local
from local.vllm_roll import host_pidfile, stop_from_pidfile

CLUSTER_NAME = "local"
SERVER_NAME = "triton-local"
VLLM_SERVER_NAME = "vllm-local"
VLLM_BASE_MODEL = "smollm2"


@dataclass(frozen=True)
class LocalPaths:
    root: Path
    model_repository: Path
    log: Path
    pidfile: Path

    @classmethod
    def from_settings(cls) -> LocalPaths:
        root = settings.DATA_DIR / "local"
        return cls(
            root=root,
            model_repository=root / "triton" / "models",
            log=root / "logs" / "triton.log",
            pidfile=root / "run" / "triton.pid",
        )


def _memory_mib() -> int:
    return psutil.virtual_memory().total // 2**20


@transaction.atomic
def register(
    http_url: str,
    grpc_url: str,
    metrics_url: str,
    model_repository: Path,
    log_path: Path | None = None,
) -> InferenceServer:
    """Record the local cluster, this host as its node, and the Triton server (idempotent)."""
    cluster, _ = Cluster.objects.update_or_create(
        name=CLUSTER_NAME,
        defaults={
            "kind": Cluster.Kind.LOCAL,
            "description": "Real Triton run by Switchyard on this machine (CPU only)",
        },
    )
    hostname = socket.gethostname()
    node, _ = Node.objects.update_or_create(
        cluster=cluster,
        name="localhost",
        defaults={
            "hostname": hostname,
            "cpu_cores": os.cpu_count() or 1,
            "memory_mib": _memory_mib(),
            "labels": {"device-class": "cpu"},
        },
    )
    server, _ = InferenceServer.objects.update_or_create(
        cluster=cluster,
        name=SERVER_NAME,
        defaults={
            "node": node,
            "runtime": InferenceServer.Runtime.TRITON,
            "http_url": http_url,
            "grpc_url": grpc_url,
            "metrics_url": metrics_url,
            "model_repository": str(model_repository),
            "log_path": str(log_path or ""),
        },
    )
    return server


def configured_urls() -> tuple[str, str, str]:
    host = "127.0.0.1"
    return (
        f"http://{host}:{settings.SWITCHYARD_LOCAL_TRITON_HTTP_PORT}",
        f"{host}:{settings.SWITCHYARD_LOCAL_TRITON_GRPC_PORT}",
        f"http://{host}:{settings.SWITCHYARD_LOCAL_TRITON_METRICS_PORT}/metrics",
    )


def register_configured() -> InferenceServer:
    """Register the local server at its configured ports, whether or not it runs now."""
    http_url, grpc_url, metrics_url = configured_urls()
    paths = LocalPaths.from_settings()
    return register(http_url, grpc_url, metrics_url, paths.model_repository, paths.log)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def up(progress: Callable[[str], None] = print, *, preload: bool = True) -> triton_local.TritonProcess:
    """Start the local Triton and register it.

    With ``preload`` the demo models are written into the repository and loaded at start;
    without, the server starts with an empty repository and versions arrive through model
    loads (the demo's way: from S3, admitted against quota, like in production).
    """
    paths = LocalPaths.from_settings()
    if paths.pidfile.exists():
        old = int(paths.pidfile.read_text().strip() or 0)
        if old and triton_local.stop_pid(old):
            progress(f"stopped a local Triton left running (pid {old})")
        paths.pidfile.unlink(missing_ok=True)
    ports = (
        settings.SWITCHYARD_LOCAL_TRITON_HTTP_PORT,
        settings.SWITCHYARD_LOCAL_TRITON_GRPC_PORT,
        settings.SWITCHYARD_LOCAL_TRITON_METRICS_PORT,
    )
    busy = [p for p in ports if not _port_free(p)]
    if busy:
        listed = ", ".join(map(str, busy))
        which = f"port {listed} is" if len(busy) == 1 else f"ports {listed} are"
        raise RuntimeError(
            f"{which} in use on 127.0.0.1; stop what holds {'it' if len(busy) == 1 else 'them'} "
            "or set SWITCHYARD_LOCAL_TRITON_HTTP_PORT/_GRPC_PORT/_METRICS_PORT"
        )
    runtime = triton_local.ensure_runtime(settings.DATA_DIR, progress=progress)
    if preload:
        models = triton_local.write_demo_repository(paths.model_repository)
        progress(f"starting tritonserver with models {', '.join(models)}")
    else:
        # An empty repository: what a restarted server serves is decided by model loads.
        shutil.rmtree(paths.model_repository, ignore_errors=True)
        paths.model_repository.mkdir(parents=True)
        models = []
        progress("starting tritonserver with an empty model repository")
    proc = triton_local.start_triton(
        runtime,
        paths.model_repository,
        http_port=ports[0],
        grpc_port=ports[1],
        metrics_port=ports[2],
        load_models=models,
        log_path=paths.log,
    )
    paths.pidfile.parent.mkdir(parents=True, exist_ok=True)
    paths.pidfile.write_text(str(proc.pid))
    register(proc.http_url, proc.grpc_url, proc.metrics_url, paths.model_repository, paths.log)
    progress(f"local Triton ready at {proc.http_url} (pid {proc.pid}, log {paths.log})")
    return proc


def down() -> bool:
    """Stop the local Triton named in the pidfile. False when none was running."""
    paths = LocalPaths.from_settings()
    if not paths.pidfile.exists():
        return False
    pid = int(paths.pidfile.read_text().strip() or 0)
    stopped = bool(pid) and triton_local.stop_pid(pid)
    paths.pidfile.unlink(missing_ok=True)
    # After a hard kill nothing is left to stop, but its shared-memory files may be.
    triton_local.remove_stale_shm_files()
    return stopped


# --------------------------------------------------------------------------------------------
# vLLM on the local cluster
# --------------------------------------------------------------------------------------------


def vllm_pidfile(server_name: str) -> Path:
    return host_pidfile(settings.DATA_DIR, server_name)


def register_vllm(http_url: str, adapters_dir: Path, log_path: Path | None = None,
                  name: str = VLLM_SERVER_NAME) -> InferenceServer:
    """Record a local vLLM server (its model repository is where LoRA adapters are placed)."""
    cluster, _ = Cluster.objects.get_or_create(
        name=CLUSTER_NAME, defaults={"kind": Cluster.Kind.LOCAL}
    )
    node = cluster.nodes.filter(name="localhost").first()
    server, _ = InferenceServer.objects.update_or_create(
        cluster=cluster, name=name,
        defaults={"node": node, "runtime": InferenceServer.Runtime.VLLM, "http_url": http_url,
                  "metrics_url": f"{http_url}/metrics", "model_repository": str(adapters_dir),
                  "log_path": str(log_path or "")},
    )
    return server


def up_vllm(progress: Callable[[str], None] = print) -> vllm_local.VLLMProcess:
    """Start the local vLLM serving SmolLM2 (LoRA on), register it, record its pidfile."""
    paths = LocalPaths.from_settings()
    pidfile = vllm_pidfile(VLLM_SERVER_NAME)
    stop_from_pidfile(pidfile)
    runtime = vllm_local.ensure_runtime(settings.DATA_DIR, progress=progress)
    model_dir = vllm_local.ensure_base_model(runtime, settings.DATA_DIR, progress=progress)
    progress("starting vLLM (about 30 s)")
    log = paths.root / "logs" / "vllm.log"
    proc = vllm_local.start_vllm(runtime, model_dir, served_model_name=VLLM_BASE_MODEL, log_path=log)
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(json.dumps({"pid": proc.pid, "model_dir": str(model_dir), "http_url": proc.http_url}))
    register_vllm(proc.http_url, paths.root / "vllm" / "adapters", log)
    progress(f"local vLLM ready at {proc.http_url} (pid {proc.pid})")
    return proc


def down_vllm() -> bool:
    """Stop every local vLLM server named by a pidfile (the first one, and rolled ones)."""
    run = LocalPaths.from_settings().root / "run"
    return any([stop_from_pidfile(p) for p in sorted(run.glob("vllm-*.json"))])


# --------------------------------------------------------------------------------------------
# nginx: the local cluster's traffic router
# --------------------------------------------------------------------------------------------


def nginx_prefix() -> Path:
    """The local nginx's prefix (SWITCHYARD_LOCAL_NGINX_DIR); its routes live in
    ``<prefix>/switchyard``, the directory the traffic router writes."""
    default = settings.DATA_DIR / "local" / "nginx"
    return Path(getattr(settings, "SWITCHYARD_LOCAL_NGINX_DIR", default))


def nginx_status_port() -> int:
    return int(getattr(settings, "SWITCHYARD_LOCAL_NGINX_STATUS_PORT", 8190))


def run_nginx(stop: threading.Event, progress: Callable[[str], None] = print) -> None:
    """Start the local nginx and keep it running until ``stop`` is set: when it dies it is
    started again from the last good configuration (``local.nginx_supervisor``).
    RuntimeError, with nginx's log, when the first start fails."""
    supervisor = nginx_supervisor.NginxSupervisor(
        nginx_prefix(), status_port=nginx_status_port(), progress=progress
    )
    proc = supervisor.start()
    progress(
        f"local nginx ready (pid {proc.pid}, status {proc.status_url}, routes in "
        f"{proc.conf_dir}, log {proc.error_log})"
    )
    supervisor.run(stop)


def nginx_state() -> dict[str, object] | None:
    """What the local nginx's supervisor last wrote (state, pid, restarts, last exit)."""
    return nginx_supervisor.read_state(nginx_prefix())


def down_nginx() -> bool:
    """Stop a local nginx left running on the configured prefix. False when none was."""
    return nginx_supervisor.stop_leftover(nginx_prefix()) is not None
