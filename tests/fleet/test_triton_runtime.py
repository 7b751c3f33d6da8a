"""The local Triton runtime: build, demo repository, start, inference, stop and cleanup.

These tests run a REAL tritonserver (from the nvidia-pytriton wheel, CPU only). One server is
shared by the session (``local_triton``); the stop tests start small servers of their own.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from local.triton import (
    MARKER_NAME,
    SHM_DIR,
    SHM_PREFIX,
    TritonProcess,
    TritonRuntime,
    ensure_runtime,
    remove_stale_shm_files,
    server_version,
    shm_region_files,
    start_triton,
    write_demo_repository,
)

pytestmark = pytest.mark.triton

REPO_ROOT = Path(__file__).resolve().parents[2]
FEATURES = [0.1, 0.5, 2.0]


def pids_in_group(pgid: int) -> set[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    found = set()
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                found.add(proc.pid)
    return found


def infer_fraud(client: httpx.Client, version: int) -> tuple[float, dict]:
    """POST one fraud-scorer inference to ``version``; return (seconds, JSON answer)."""
    body = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": FEATURES}]}
    started = time.perf_counter()
    response = client.post(f"/v2/models/fraud-scorer/versions/{version}/infer", json=body)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return elapsed, response.json()


def start_small_server(runtime: TritonRuntime, tmp_path: Path, models: list[str]) -> TritonProcess:
    """Start a server of our own on a fresh demo repository."""
    repository = tmp_path / "models"
    write_demo_repository(repository)
    return start_triton(runtime, repository, load_models=models, log_path=tmp_path / "triton.log")


def regions_of(server: TritonProcess) -> set[str]:
    """The shm regions of the server's stubs, each named on its stub's command line (a
    before/after look at /dev/shm would also count servers that other test runs start)."""
    regions = set()
    for pid in pids_in_group(server.pid):
        with contextlib.suppress(psutil.Error):
            regions.update(a for a in psutil.Process(pid).cmdline() if a.startswith(SHM_PREFIX))
    return regions


# -- session server ----------------------------------------------------------------------------


def test_server_is_ready_and_reports_version(local_triton: TritonProcess) -> None:
    assert local_triton.is_running()
    assert local_triton.http_url.startswith("http://127.0.0.1:")
    ready = httpx.get(f"{local_triton.http_url}/v2/health/ready", timeout=5)
    assert ready.status_code == 200
    assert server_version(local_triton.http_url) == "2.51.0"
    metrics = httpx.get(local_triton.metrics_url, timeout=5)
    assert metrics.status_code == 200
    assert 'nv_inference_request_success{model="fraud-scorer",version="2"}' in metrics.text
    host, port = local_triton.grpc_url.split(":")
    with socket.create_connection((host, int(port)), timeout=2):
        pass


def test_all_demo_models_and_versions_are_ready(local_triton: TritonProcess) -> None:
    index = httpx.post(f"{local_triton.http_url}/v2/repository/index", json={}, timeout=5)
    assert index.status_code == 200
    demo = [m for m in index.json() if m["name"] in ("fraud-scorer", "sentiment")]
    states = {(m["name"], m.get("version")): m.get("state") for m in demo}
    assert states == {
        ("fraud-scorer", "1"): "READY",
        ("fraud-scorer", "2"): "READY",
        ("sentiment", "1"): "READY",
    }


def test_fraud_scorer_versions_answer_differently(local_triton: TritonProcess) -> None:
    with httpx.Client(base_url=local_triton.http_url, timeout=10) as client:
        _, v1 = infer_fraud(client, 1)
        _, v2 = infer_fraud(client, 2)
    assert v1["model_version"] == "1"
    assert v2["model_version"] == "2"
    mean = sum(FEATURES) / len(FEATURES)
    assert v1["outputs"][0]["name"] == "SCORE"
    assert v1["outputs"][0]["data"][0] == pytest.approx(1 / (1 + math.exp(-mean)), rel=1e-5)
    expected_v2 = 1 / (1 + math.exp(-(mean + 0.5 * max(FEATURES))))
    assert v2["outputs"][0]["data"][0] == pytest.approx(expected_v2, rel=1e-5)


def test_fraud_scorer_v2_is_measurably_slower(local_triton: TritonProcess) -> None:
    timings: dict[int, list[float]] = {1: [], 2: []}
    with httpx.Client(base_url=local_triton.http_url, timeout=10) as client:
        for version in (1, 2):  # warm up the connection and both stubs
            infer_fraud(client, version)
        for _ in range(10):  # interleaved, so drift on the machine hits both alike
            for version in (1, 2):
                timings[version].append(infer_fraud(client, version)[0])
    median_v1 = statistics.median(timings[1])
    median_v2 = statistics.median(timings[2])
    # Configured delays: 4 ms (v1) and 12 ms (v2).
    assert median_v1 >= 0.004
    assert median_v2 - median_v1 >= 0.005, (median_v1, median_v2)


def test_sentiment_classifies_text(local_triton: TritonProcess) -> None:
    def label(text: str) -> str:
        body = {"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": [text]}]}
        response = httpx.post(
            f"{local_triton.http_url}/v2/models/sentiment/infer", json=body, timeout=10
        )
        assert response.status_code == 200, response.text
        output = response.json()["outputs"][0]
        assert output["name"] == "LABEL"
        assert output["datatype"] == "BYTES"
        return output["data"][0]

    assert label("Great product, I love it!") == "positive"
    assert label("terrible and slow") == "negative"
    assert label("a parcel arrived") == "neutral"


# -- runtime and repository ----------------------------------------------------------------------


def test_ensure_runtime_second_call_is_a_noop(triton_runtime: TritonRuntime) -> None:
    marker = triton_runtime.venv_dir / MARKER_NAME
    assert marker.is_file()
    mtime = marker.stat().st_mtime_ns
    data_dir = triton_runtime.venv_dir.parents[1]
    messages: list[str] = []
    started = time.monotonic()
    again = ensure_runtime(data_dir, progress=messages.append)
    assert time.monotonic() - started < 1.0
    assert again == triton_runtime
    assert messages == []
    assert marker.stat().st_mtime_ns == mtime
    assert triton_runtime.tritonserver.is_file()
    stub = triton_runtime.backend_dir / "python" / "triton_python_backend_stub"
    assert stub.resolve().parent.name == f"{sys.version_info.major}.{sys.version_info.minor}"
    env = triton_runtime.env({"PATH": "/usr/bin"})
    assert env["LD_LIBRARY_PATH"].split(":")[:2] == [
        str(triton_runtime.libs_dir),
        str(triton_runtime.python_libdir),
    ]
    assert env["PATH"] == f"{triton_runtime.venv_dir / 'bin'}:/usr/bin"


def test_write_demo_repository_is_idempotent(tmp_path: Path) -> None:
    names = write_demo_repository(tmp_path)
    assert names == ["fraud-scorer", "sentiment"]
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert [str(p.relative_to(tmp_path)) for p in files] == [
        "fraud-scorer/1/model.py",
        "fraud-scorer/2/model.py",
        "fraud-scorer/config.pbtxt",
        "sentiment/1/model.py",
        "sentiment/config.pbtxt",
    ]
    mtimes = {p: p.stat().st_mtime_ns for p in files}
    config = tmp_path / "fraud-scorer" / "config.pbtxt"
    original = config.read_text()
    config.write_text("broken")
    del mtimes[config]
    time.sleep(0.01)
    assert write_demo_repository(tmp_path) == names
    assert config.read_text() == original
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes


# -- stopping ----------------------------------------------------------------------------------


def test_stop_leaves_no_process_and_no_shm_files(
    triton_runtime: TritonRuntime, tmp_path: Path
) -> None:
    server = start_small_server(triton_runtime, tmp_path, ["fraud-scorer"])
    try:
        group = pids_in_group(server.pid)
        assert server.pid in group
        assert len(group) == 3  # the server and one stub per fraud-scorer version
        ours = regions_of(server)
        assert len(ours) >= 2
    finally:
        server.stop()
    assert not server.is_running()
    assert pids_in_group(server.pid) == set()
    assert ours.isdisjoint(shm_region_files())
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.http_url}/v2/health/live", timeout=2)
    server.stop()  # a second stop is harmless


def test_stop_cleans_up_after_a_crashed_server(
    triton_runtime: TritonRuntime, tmp_path: Path
) -> None:
    server = start_small_server(triton_runtime, tmp_path, ["sentiment"])
    try:
        ours = regions_of(server)
        assert ours
        # A hard kill of the server and its stub (as an OOM kill would): nothing of theirs
        # gets a chance to clean up, so their shm files stay behind.
        os.killpg(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (pids_in_group(server.pid) or server.is_running()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.is_running()
        assert ours & shm_region_files()
    finally:
        server.stop()
    assert pids_in_group(server.pid) == set()
    assert ours.isdisjoint(shm_region_files())


def test_stop_pid_from_another_process(triton_runtime: TritonRuntime, tmp_path: Path) -> None:
    server = start_small_server(triton_runtime, tmp_path, ["sentiment"])
    try:
        ours = regions_of(server)
        code = (
            "import sys; from local.triton import stop_pid; "
            "print(stop_pid(int(sys.argv[1]), 15)); print(stop_pid(int(sys.argv[1]), 15))"
        )
        result = subprocess.run(
            [sys.executable, "-c", code, str(server.pid)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["True", "False"]  # the second finds nothing to stop
        assert pids_in_group(server.pid) == set()
        assert ours.isdisjoint(shm_region_files())
    finally:
        server.stop()


def test_remove_stale_shm_files_spares_fresh_and_mapped_regions(
    local_triton: TritonProcess,
) -> None:
    in_use = regions_of(local_triton)
    assert in_use  # the session server's stubs map theirs
    stale = SHM_DIR / f"{SHM_PREFIX}test-stale-{os.getpid()}"
    fresh = SHM_DIR / f"{SHM_PREFIX}test-fresh-{os.getpid()}"
    try:
        stale.write_bytes(b"x")
        fresh.write_bytes(b"x")
        old = time.time() - 3600
        os.utime(stale, (old, old))
        for name in in_use:  # make the live regions look old too: being mapped must save them
            os.utime(SHM_DIR / name, (old, old))
        removed = remove_stale_shm_files(min_age=60)
        # (Leftovers of servers that other test runs killed may go too: they are stale.)
        assert stale.name in removed
        assert fresh.name not in removed
        assert not in_use & set(removed)
        assert not stale.exists()
        assert fresh.exists()
        assert in_use <= shm_region_files()
    finally:
        stale.unlink(missing_ok=True)
        fresh.unlink(missing_ok=True)
    assert triton_probe_ready(local_triton)


def triton_probe_ready(server: TritonProcess) -> bool:
    """True if the server still answers an inference (its shm regions are intact)."""
    body = {"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ["good"]}]}
    response = httpx.post(f"{server.http_url}/v2/models/sentiment/infer", json=body, timeout=10)
    return response.status_code == 200


def test_stop_pid_refuses_a_process_that_is_not_tritonserver() -> None:
    from local.triton import stop_pid

    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert stop_pid(sleeper.pid, 1) is False
        assert sleeper.poll() is None
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()


def test_start_failure_raises_with_the_log_tail(
    triton_runtime: TritonRuntime, tmp_path: Path
) -> None:
    write_demo_repository(tmp_path / "models")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(RuntimeError) as failure:
            start_triton(
                triton_runtime,
                tmp_path / "models",
                http_port=port,
                log_path=tmp_path / "triton.log",
                ready_timeout=30,
            )
    message = str(failure.value)
    assert "last lines of" in message
    assert str(tmp_path / "triton.log") in message
    assert "already in use" in message
    assert time.monotonic() - started < 25


def test_start_fails_when_a_requested_model_does_not_load(
    triton_runtime: TritonRuntime, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    write_demo_repository(repository)
    (repository / "sentiment" / "1" / "model.py").write_text("def broken(:\n")
    with pytest.raises(RuntimeError, match=r"models not ready: sentiment"):
        start_triton(
            triton_runtime,
            repository,
            load_models=["sentiment"],
            log_path=tmp_path / "triton.log",
            ready_timeout=30,
        )
