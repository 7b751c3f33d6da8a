"""The local cluster: registration, and ``up()``/``down()`` of a REAL tritonserver.

``up()`` runs on free ports in a temporary DATA_DIR whose ``runtimes`` is a link to the cached
Triton runtime, so nothing is rebuilt and the demo's own server (ports 8100-8102) is untouched.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from fleet.models import Cluster, InferenceServer, Node
from local import cluster as local_cluster
from local.triton import (
    SHM_DIR,
    TritonProcess,
    TritonRuntime,
    _alive,
    _group_members,
    _shm_files_mapped_by,
    shm_region_files,
)
from tests.fixtures.triton import switchyard_data_dir


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def processes_mentioning(text: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``text``."""
    return [
        proc.pid
        for proc in psutil.process_iter(["cmdline", "status"])
        if proc.info["status"] != psutil.STATUS_ZOMBIE
        and text in " ".join(proc.info["cmdline"] or [])
    ]


@pytest.fixture
def local_settings(settings, tmp_path: Path, triton_runtime: TritonRuntime) -> Path:
    """DATA_DIR in a temporary folder (runtimes linked to the cache) and three free ports."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "runtimes").symlink_to(switchyard_data_dir().resolve() / "runtimes")
    http, grpc, metrics = free_ports(3)
    settings.DATA_DIR = data_dir
    settings.SWITCHYARD_LOCAL_TRITON_HTTP_PORT = http
    settings.SWITCHYARD_LOCAL_TRITON_GRPC_PORT = grpc
    settings.SWITCHYARD_LOCAL_TRITON_METRICS_PORT = metrics
    return data_dir


@pytest.fixture
def started() -> Iterator[list[TritonProcess]]:
    """Collects what a test started; stops it whatever happens."""
    procs: list[TritonProcess] = []
    yield procs
    for proc in procs:
        proc.stop()


def test_register_is_idempotent(db, tmp_path: Path) -> None:
    args = ("http://127.0.0.1:18000", "127.0.0.1:18001", "http://127.0.0.1:18002/metrics",
            tmp_path / "models")

    first = local_cluster.register(*args)
    second = local_cluster.register(*args)

    assert first.pk == second.pk
    assert Cluster.objects.count() == 1
    cluster = Cluster.objects.get()
    assert (cluster.name, cluster.kind) == ("local", Cluster.Kind.LOCAL)
    assert Node.objects.filter(cluster=cluster).count() == 1
    assert InferenceServer.objects.count() == 1
    server = InferenceServer.objects.get()
    assert server.name == "triton-local"
    assert server.runtime == InferenceServer.Runtime.TRITON
    assert server.node is not None and server.node.cluster_id == cluster.pk
    assert (server.http_url, server.grpc_url, server.metrics_url) == args[:3]
    assert server.model_repository == str(tmp_path / "models")


def test_register_again_moves_the_server_to_new_urls(db, tmp_path: Path) -> None:
    local_cluster.register("http://127.0.0.1:18000", "127.0.0.1:18001",
                           "http://127.0.0.1:18002/metrics", tmp_path)

    local_cluster.register("http://127.0.0.1:19000", "127.0.0.1:19001",
                           "http://127.0.0.1:19002/metrics", tmp_path)

    server = InferenceServer.objects.get()
    assert server.http_url == "http://127.0.0.1:19000"
    assert server.grpc_url == "127.0.0.1:19001"


@pytest.mark.triton
def test_up_starts_and_registers_a_real_triton_and_down_stops_it(
    db, settings, local_settings: Path, started: list[TritonProcess]
) -> None:
    paths = local_cluster.LocalPaths.from_settings()
    messages: list[str] = []

    proc = local_cluster.up(progress=messages.append)
    started.append(proc)

    port = settings.SWITCHYARD_LOCAL_TRITON_HTTP_PORT
    assert proc.http_url == f"http://127.0.0.1:{port}"
    assert paths.pidfile.read_text().strip() == str(proc.pid)
    assert _alive(proc.pid)
    # The python-backend stubs' shared memory: compared by name, not by a before/after count
    # of /dev/shm, so servers that other test runs start meanwhile cannot disturb the check.
    owned_shm = _shm_files_mapped_by(_group_members(proc.pid))
    assert owned_shm, "expected the python backend to map /dev/shm regions"
    assert httpx.get(f"{proc.http_url}/v2/health/ready", timeout=5).status_code == 200
    index = httpx.post(f"{proc.http_url}/v2/repository/index", json={}, timeout=5).json()
    assert {(m["name"], m["version"], m["state"]) for m in index} >= {
        ("fraud-scorer", "1", "READY"), ("fraud-scorer", "2", "READY"), ("sentiment", "1", "READY")
    }
    server = InferenceServer.objects.get(cluster__name="local", name="triton-local")
    assert server.http_url == proc.http_url
    assert server.model_repository == str(paths.model_repository)
    assert paths.model_repository.is_relative_to(local_settings)
    assert any(proc.http_url in m for m in messages), messages

    assert local_cluster.down() is True

    assert not paths.pidfile.exists()
    if proc._popen is not None:
        proc._popen.wait(5)  # reap our child so it does not linger as a zombie
    assert not _alive(proc.pid)
    assert processes_mentioning(str(local_settings)) == [], "tritonserver or a stub still runs"
    assert owned_shm & shm_region_files() == set(), "shared memory left in /dev/shm"
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{proc.http_url}/v2/health/live", timeout=1)

    assert local_cluster.down() is False


@pytest.mark.triton
def test_down_after_a_hard_crash_removes_the_leftover_shared_memory(
    db, local_settings: Path, started: list[TritonProcess]
) -> None:
    """GIVEN a local Triton killed with SIGKILL (OOM killer) some time ago,
    WHEN down() runs, THEN the python-backend shm regions it left are removed."""
    proc = local_cluster.up(progress=lambda _: None)
    started.append(proc)
    owned_shm = _shm_files_mapped_by(_group_members(proc.pid))
    assert owned_shm
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        if proc._popen is not None:
            proc._popen.wait(5)
        deadline = time.monotonic() + 10
        while _group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert owned_shm <= shm_region_files(), "SIGKILL should leave the regions behind"
        old = time.time() - 3600  # the crash was an hour ago
        for name in owned_shm:
            os.utime(SHM_DIR / name, (old, old))

        local_cluster.down()

        assert owned_shm & shm_region_files() == set()
    finally:
        for name in owned_shm:  # never leave our leak behind, whatever down() did
            (SHM_DIR / name).unlink(missing_ok=True)


def test_down_without_a_pidfile_returns_false(local_settings: Path) -> None:
    assert local_cluster.down() is False


def test_down_with_a_stale_pidfile_removes_it_and_kills_nothing(local_settings: Path) -> None:
    paths = local_cluster.LocalPaths.from_settings()
    paths.pidfile.parent.mkdir(parents=True)
    paths.pidfile.write_text(str(os.getpid()))  # a live pid that is not a tritonserver

    assert local_cluster.down() is False

    assert not paths.pidfile.exists()


@pytest.mark.triton
def test_up_refuses_a_taken_http_port_with_a_clear_error(
    db, settings, local_settings: Path, started: list[TritonProcess]
) -> None:
    port = settings.SWITCHYARD_LOCAL_TRITON_HTTP_PORT
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen(1)

        with pytest.raises(RuntimeError) as excinfo:
            started.append(local_cluster.up(progress=lambda _: None))

    message = str(excinfo.value)
    assert str(port) in message
    assert "in use" in message
    assert "SWITCHYARD_LOCAL_TRITON_HTTP_PORT" in message
    assert not local_cluster.LocalPaths.from_settings().pidfile.exists()
    assert not InferenceServer.objects.exists()
    assert processes_mentioning(str(local_settings)) == []
