"""TritonServerRuntime against the REAL local Triton (the session's ``local_triton``).

Every model here is a copy of a demo model under a new name made for the test (the demo
models fraud-scorer v1/v2 and sentiment v1 are left alone and checked READY at the end). Every
load has a timeout: a broken load can hang for more than 90 s.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import re
import socket
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleet.adapters.base import AdapterError, LoadedVersion, ServerRuntime
from fleet.adapters.triton_model_config import config_difference, config_hash
from fleet.adapters.triton_repository import tree_hash
from fleet.adapters.triton_runtime import TritonServerRuntime
from local.triton import DEMO_MODELS_DIR, TritonProcess

pytestmark = pytest.mark.triton

LOAD_TIMEOUT = 60.0
ONE_CPU = {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
TWO_CPU = {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
DEMO_READY = {("fraud-scorer", "1"), ("fraud-scorer", "2"), ("sentiment", "1")}
SYNTAX_ERROR_LINE = 4
BROKEN_MODEL = b'''"""A model whose source does not compile."""

class TritonPythonModel:
    def initialize(self, args:
        pass
'''
SLOW_INIT_MODEL = b'''import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(4)

    def execute(self, requests):
        return []
'''
FAILING_INIT_MODEL = b'''class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights missing: boom")

    def execute(self, requests):
        return []
'''


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def demo_config(model: str, *, base: str = "fraud-scorer") -> str:
    """The demo model's config.pbtxt renamed to ``model`` (name must match the folder)."""
    text = (DEMO_MODELS_DIR / base / "config.pbtxt").read_text()
    return text.replace(f'name: "{base}"', f'name: "{model}"')


def demo_model_py(version: int, *, base: str = "fraud-scorer") -> bytes:
    """The demo model's ``<version>/model.py``."""
    return (DEMO_MODELS_DIR / base / str(version) / "model.py").read_bytes()


def write_artifact(
    path: Path,
    members: dict[str, bytes],
    *,
    links: dict[str, str] | None = None,
) -> Path:
    """A deterministic .tar.gz of ``members`` (name -> bytes) and symlinks (name -> target)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz, tarfile.open(
        fileobj=gz, mode="w", format=tarfile.PAX_FORMAT
    ) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    path.write_bytes(buffer.getvalue())
    return path


def model_artifact(
    path: Path,
    model: str,
    versions: dict[int, bytes],
    *,
    config: str | None = None,
) -> Path:
    """A version artifact laid out like ``local.demo.artifact()``."""
    members = {f"{model}/config.pbtxt": (config or demo_config(model)).encode()}
    for version, source in versions.items():
        members[f"{model}/{version}/model.py"] = source
    return write_artifact(path, members)


def index(server: TritonProcess) -> list[dict]:
    """The server's repository index, read without the adapter."""
    response = httpx.post(f"{server.http_url}/v2/repository/index", json={}, timeout=10)
    response.raise_for_status()
    return response.json()


def success_count(server: TritonProcess, model: str, version: int) -> int:
    """Successful inferences of a version since it was (re)loaded: a reload resets it to 0."""
    url = f"{server.http_url}/v2/models/{model}/versions/{version}/stats"
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    return response.json()["model_stats"][0]["inference_stats"]["success"]["count"]


def infer(server: TritonProcess, model: str, version: int, times: int = 1) -> None:
    """Run ``times`` successful inferences of a fraud-scorer copy."""
    body = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    url = f"{server.http_url}/v2/models/{model}/versions/{version}/infer"
    for _ in range(times):
        response = httpx.post(url, json=body, timeout=10)
        assert response.status_code == 200, response.text


def log_size(server: TritonProcess) -> int:
    """The server log's size: an offset for :func:`log_since`."""
    return server.log_path.stat().st_size


def log_since(server: TritonProcess, offset: int) -> str:
    """What the server logged after ``offset``."""
    time.sleep(0.2)  # let the server flush what it logged about the last call
    with server.log_path.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", "replace")


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def files_under(folder: Path) -> set[str]:
    """Relative paths of everything under ``folder``."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_models_guard(local_triton: TritonProcess) -> Iterator[None]:
    """After the module: the demo models other tests rely on are still READY."""
    yield
    entries = index(local_triton)
    ready = {(e["name"], e.get("version")) for e in entries if e.get("state") == "READY"}
    assert ready >= DEMO_READY, f"demo models not READY any more: {DEMO_READY - ready}"


@pytest.fixture
def runtime(local_triton: TritonProcess, demo_models_guard: None) -> TritonServerRuntime:
    """The adapter on the session's server, reading its log."""
    return TritonServerRuntime(
        local_triton.http_url,
        local_triton.model_repository,
        log_path=local_triton.log_path,
        timeout=LOAD_TIMEOUT,
    )


@pytest.fixture
def model(request: pytest.FixtureRequest, runtime: TritonServerRuntime) -> Iterator[str]:
    """A model name of this test's own; unloaded and removed afterwards."""
    name = "adapter-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    yield name
    for version, state in runtime.loaded_versions(name).items():
        if state != "UNAVAILABLE":
            with contextlib.suppress(AdapterError):
                runtime.unload(name, version, timeout=30)
    folder = runtime.model_repository / name
    if folder.is_dir():
        for version_dir in folder.iterdir():
            if version_dir.name.isdigit():
                runtime.remove(name, int(version_dir.name))


@pytest.fixture
def offline(tmp_path: Path) -> TritonServerRuntime:
    """A runtime on a fresh repository whose server port is closed."""
    return TritonServerRuntime(f"http://127.0.0.1:{closed_port()}", tmp_path / "repo", timeout=5)


# --------------------------------------------------------------------------------------------
# place / remove (files only)
# --------------------------------------------------------------------------------------------


def test_runtime_satisfies_the_protocol(offline: TritonServerRuntime) -> None:
    assert isinstance(offline, ServerRuntime)


def test_place_moves_the_version_in_and_writes_config(
    offline: TritonServerRuntime, tmp_path: Path
) -> None:
    artifact = model_artifact(tmp_path / "m.tar.gz", "m", {1: demo_model_py(1)})
    offline.place("m", 1, artifact)
    repo = offline.model_repository
    assert (repo / "m" / "1" / "model.py").read_bytes() == demo_model_py(1)
    assert (repo / "m" / "config.pbtxt").read_text() == demo_config("m")
    # Precompiled, so the python backend has no reason to write into the folder on load.
    assert list((repo / "m" / "1" / "__pycache__").glob("model.*.pyc"))
    # Nothing left behind in the staging area.
    staging = repo.parent / f".{repo.name}.switchyard" / "staging"
    assert list(staging.iterdir()) == []


def test_place_is_idempotent_and_replaces_changed_content(
    offline: TritonServerRuntime, tmp_path: Path
) -> None:
    artifact = model_artifact(tmp_path / "m.tar.gz", "m", {1: demo_model_py(1)})
    offline.place("m", 1, artifact)
    version_dir = offline.model_repository / "m" / "1"
    before = (version_dir.stat().st_ino, (version_dir / "model.py").stat().st_mtime_ns)

    offline.place("m", 1, artifact)
    assert (version_dir.stat().st_ino, (version_dir / "model.py").stat().st_mtime_ns) == before

    changed = model_artifact(tmp_path / "m2.tar.gz", "m", {1: demo_model_py(2)})
    offline.place("m", 1, changed)
    assert (version_dir / "model.py").read_bytes() == demo_model_py(2)
    assert version_dir.stat().st_ino != before[0]


def test_place_keeps_an_existing_config(offline: TritonServerRuntime, tmp_path: Path) -> None:
    repo = offline.model_repository
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    offline.place("m", 2, model_artifact(tmp_path / "m.tar.gz", "m", {2: demo_model_py(2)}))
    assert (repo / "m" / "config.pbtxt").read_text() == 'name: "m"\nbackend: "python"\n'
    assert (repo / "m" / "2" / "model.py").is_file()


def test_place_accepts_a_directory(offline: TritonServerRuntime, tmp_path: Path) -> None:
    source = tmp_path / "unpacked"
    (source / "m" / "3").mkdir(parents=True)
    (source / "m" / "config.pbtxt").write_text(demo_config("m"))
    (source / "m" / "3" / "model.py").write_bytes(demo_model_py(1))
    offline.place("m", 3, source)
    placed = offline.model_repository / "m" / "3"
    assert tree_hash(placed) == tree_hash(source / "m" / "3")
    assert (source / "m" / "3" / "model.py").is_file()  # the source is copied, not moved


def test_place_without_the_version_is_permanent(
    offline: TritonServerRuntime, tmp_path: Path
) -> None:
    artifact = model_artifact(tmp_path / "m.tar.gz", "m", {1: demo_model_py(1)})
    with pytest.raises(AdapterError) as info:
        offline.place("m", 2, artifact)
    assert info.value.permanent
    assert "m/2/" in info.value.message


def test_place_rejects_a_file_that_is_not_an_archive(
    offline: TritonServerRuntime, tmp_path: Path
) -> None:
    bogus = tmp_path / "m.tar.gz"
    bogus.write_bytes(b"not a tarball")
    with pytest.raises(AdapterError) as info:
        offline.place("m", 1, bogus)
    assert info.value.permanent


@pytest.mark.parametrize(
    ("members", "links", "named"),
    [
        ({"m/1/model.py": b"x = 1\n", "m/../../evil.txt": b"pwned"}, {}, "m/../../evil.txt"),
        ({"m/1/model.py": b"x = 1\n", "m/1/../../../evil.txt": b"pwned"}, {}, "evil.txt"),
        ({"m/1/model.py": b"x = 1\n"}, {"m/1/evil": "../../../../evil.txt"}, "m/1/evil"),
        ({"m/1/model.py": b"x = 1\n"}, {"m/1/abs": "/etc/passwd"}, "m/1/abs"),
    ],
)
def test_place_rejects_members_leaving_the_archive(
    offline: TritonServerRuntime,
    tmp_path: Path,
    members: dict[str, bytes],
    links: dict[str, str],
    named: str,
) -> None:
    artifact = write_artifact(tmp_path / "artifact.tar.gz", members, links=links)
    before = files_under(tmp_path)
    with pytest.raises(AdapterError) as info:
        offline.place("m", 1, artifact)
    assert info.value.permanent
    assert named in info.value.message
    after = files_under(tmp_path)
    written = {p for p in after - before if ".switchyard" not in p}
    # Only the (empty) repository folder itself may have appeared; no evil.txt anywhere.
    assert written <= {"repo"}, written
    assert not list(tmp_path.parent.glob("evil.txt"))
    assert not list(tmp_path.rglob("evil.txt"))


def test_place_rejects_an_absolute_member(offline: TritonServerRuntime, tmp_path: Path) -> None:
    target = tmp_path / "outside" / "evil.txt"
    artifact = write_artifact(
        tmp_path / "abs.tar.gz", {"m/1/model.py": b"x = 1\n", str(target): b"pwned"}
    )
    with pytest.raises(AdapterError) as info:
        offline.place("m", 1, artifact)
    assert info.value.permanent
    assert "absolute" in info.value.message
    assert not target.exists()
    assert not (offline.model_repository / "m").exists()


def test_remove_deletes_versions_then_the_model(
    offline: TritonServerRuntime, tmp_path: Path
) -> None:
    versions = {1: demo_model_py(1), 2: demo_model_py(2)}
    artifact = model_artifact(tmp_path / "m.tar.gz", "m", versions)
    offline.place("m", 1, artifact)
    offline.place("m", 2, artifact)
    repo = offline.model_repository
    offline.remove("m", 1)
    assert not (repo / "m" / "1").exists()
    assert (repo / "m" / "2").is_dir()
    offline.remove("m", 1)  # no-op
    offline.remove("m", 2)
    assert not (repo / "m").exists()
    offline.remove("m", 2)  # no-op on an absent model


# --------------------------------------------------------------------------------------------
# Unreachable server, bad input: no server needed to fail
# --------------------------------------------------------------------------------------------


def test_unreachable_server_is_transient(offline: TritonServerRuntime, tmp_path: Path) -> None:
    offline.place("m", 1, model_artifact(tmp_path / "m.tar.gz", "m", {1: demo_model_py(1)}))
    started = time.monotonic()
    with pytest.raises(AdapterError) as info:
        offline.load("m", 1, ONE_CPU, timeout=5)
    assert not info.value.permanent
    assert "connection refused" in info.value.message
    assert offline.http_url in info.value.message
    with pytest.raises(AdapterError) as info:
        offline.unload("m", 1, timeout=5)
    assert not info.value.permanent
    with pytest.raises(AdapterError) as info:
        offline.loaded_versions("m")
    assert not info.value.permanent
    assert time.monotonic() - started < 10


def test_loading_a_version_not_placed_is_permanent(offline: TritonServerRuntime) -> None:
    with pytest.raises(AdapterError) as info:
        offline.load("m", 7, ONE_CPU, timeout=5)
    assert info.value.permanent
    assert "not placed" in info.value.message


def test_config_difference_accepts_server_defaults_only() -> None:
    requested = {
        "name": "m",
        "backend": "python",
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"a": {"string_value": "1"}},
    }
    served = {
        "name": "m",
        "platform": "",
        "backend": "python",
        "version_policy": {"specific": {"versions": [1]}},
        "max_batch_size": 0,
        "optimization": {
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": {"enable": True},
            "output_pinned_memory": {"enable": True},
        },
        "instance_group": [{"name": "m_0", "kind": "KIND_CPU", "count": 1, "gpus": []}],
        "default_model_filename": "model.py",
        "parameters": {"a": {"string_value": "1"}},
    }
    assert config_difference(requested, served) == ""
    assert config_hash(served) == config_hash({**served, "version_policy": {"all": {}}})
    extra = {**served, "parameters": {**served["parameters"], "b": {"string_value": "2"}}}
    assert "parameters.b" in config_difference(requested, extra)
    batching = {**served, "max_batch_size": 8}
    assert "max_batch_size" in config_difference(requested, batching)
    bigger = {**served, "instance_group": [{**served["instance_group"][0], "count": 2}]}
    assert "count" in config_difference(requested, bigger)


# --------------------------------------------------------------------------------------------
# The real server: load, no-op, second version, instance count, unload, remove
# --------------------------------------------------------------------------------------------


def test_place_load_and_noop(
    runtime: TritonServerRuntime, local_triton: TritonProcess, model: str, tmp_path: Path
) -> None:
    runtime.place(model, 1, model_artifact(tmp_path / "a.tar.gz", model, {1: demo_model_py(1)}))
    loaded = runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    assert isinstance(loaded, LoadedVersion)
    assert (loaded.model, loaded.version) == (model, 1)
    assert re.fullmatch(r"[0-9a-f]{64}", loaded.config_hash)
    assert loaded.config["name"] == model
    assert loaded.config_hash == config_hash(runtime.read_config(model, 1))
    assert runtime.loaded_versions(model) == {1: "READY"}

    infer(local_triton, model, 1, times=3)
    offset = log_size(local_triton)
    started = time.monotonic()
    again = runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    elapsed = time.monotonic() - started
    assert again.config_hash == loaded.config_hash
    # Not reloaded: the stats survive (a reload resets them) and the log has no new "loading".
    assert success_count(local_triton, model, 1) == 3
    assert f"loading: {model}:1" not in log_since(local_triton, offset)
    assert elapsed < 1.0

    # The same config spelled differently (the base config's own instance group) is no-op too.
    assert runtime.load(model, 1, {}, timeout=LOAD_TIMEOUT).config_hash == loaded.config_hash
    assert success_count(local_triton, model, 1) == 3


def test_two_versions_instance_count_unload_and_remove(
    runtime: TritonServerRuntime, local_triton: TritonProcess, model: str, tmp_path: Path
) -> None:
    artifact = model_artifact(
        tmp_path / "a.tar.gz", model, {1: demo_model_py(1), 2: demo_model_py(2)}
    )
    runtime.place(model, 1, artifact)
    first = runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    infer(local_triton, model, 1, times=2)

    # v2 joins; v1 keeps serving untouched (not reloaded: its stats survive).
    runtime.place(model, 2, artifact)
    second = runtime.load(model, 2, ONE_CPU, timeout=LOAD_TIMEOUT)
    assert runtime.loaded_versions(model) == {1: "READY", 2: "READY"}
    assert success_count(local_triton, model, 1) == 2
    assert second.config_hash == first.config_hash
    infer(local_triton, model, 2)

    # Two instances: a new hash; Triton scales in place (stats survive), both versions.
    scaled = runtime.load(model, 1, TWO_CPU, timeout=LOAD_TIMEOUT)
    assert scaled.config_hash != first.config_hash
    assert runtime.read_config(model, 1)["instance_group"][0]["count"] == 2
    assert scaled.config["instance_group"][0]["count"] == 2
    assert success_count(local_triton, model, 1) == 2
    assert runtime.loaded_versions(model) == {1: "READY", 2: "READY"}

    # Unload v2: v1 stays READY and is not reloaded.
    runtime.unload(model, 2, timeout=LOAD_TIMEOUT)
    assert runtime.loaded_versions(model) == {1: "READY", 2: "UNAVAILABLE"}
    assert success_count(local_triton, model, 1) == 2
    assert runtime.read_config(model, 1)["instance_group"][0]["count"] == 2

    # Unloading again is a no-op: nothing is sent (nothing logged about the model).
    offset = log_size(local_triton)
    runtime.unload(model, 2, timeout=LOAD_TIMEOUT)
    assert model not in log_since(local_triton, offset)

    # Unload the last version: the model has no READY version left.
    runtime.unload(model, 1, timeout=LOAD_TIMEOUT)
    assert "READY" not in runtime.loaded_versions(model).values()
    runtime.unload(model, 1, timeout=LOAD_TIMEOUT)

    runtime.remove(model, 2)
    assert not (runtime.model_repository / model / "2").exists()
    assert (runtime.model_repository / model / "1").is_dir()
    runtime.remove(model, 1)
    assert not (runtime.model_repository / model).exists()


def test_replaced_files_are_reloaded(
    runtime: TritonServerRuntime, local_triton: TritonProcess, model: str, tmp_path: Path
) -> None:
    runtime.place(model, 1, model_artifact(tmp_path / "a.tar.gz", model, {1: demo_model_py(1)}))
    runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    infer(local_triton, model, 1, times=2)
    patched = demo_model_py(1) + b"\n# patched build\n"
    runtime.place(model, 1, model_artifact(tmp_path / "b.tar.gz", model, {1: patched}))
    offset = log_size(local_triton)
    runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    assert f"loading: {model}:1" in log_since(local_triton, offset)
    assert success_count(local_triton, model, 1) == 0  # a fresh instance
    # Loaded once with the new files, the next load is a no-op again.
    infer(local_triton, model, 1)
    runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    assert success_count(local_triton, model, 1) == 1


# --------------------------------------------------------------------------------------------
# The real server: failures
# --------------------------------------------------------------------------------------------


def test_syntax_error_names_file_and_line(
    runtime: TritonServerRuntime, model: str, tmp_path: Path
) -> None:
    runtime.place(model, 1, model_artifact(tmp_path / "a.tar.gz", model, {1: BROKEN_MODEL}))
    with pytest.raises(AdapterError) as info:
        runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    assert info.value.permanent
    assert "SyntaxError" in info.value.message
    assert f"model.py, line {SYNTAX_ERROR_LINE}" in info.value.message
    assert runtime.loaded_versions(model).get(1) == "UNAVAILABLE"


def test_exception_in_initialize_carries_the_traceback(
    runtime: TritonServerRuntime, model: str, tmp_path: Path
) -> None:
    runtime.place(model, 1, model_artifact(tmp_path / "a.tar.gz", model, {1: FAILING_INIT_MODEL}))
    with pytest.raises(AdapterError) as info:
        runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    assert info.value.permanent
    assert "weights missing: boom" in info.value.message
    assert f"{model}/1/model.py" in info.value.message


def test_broken_config_shows_the_server_log(
    runtime: TritonServerRuntime, model: str, tmp_path: Path
) -> None:
    config = demo_config(model).replace("max_batch_size: 0", "max_batch_size: -3")
    artifact = model_artifact(tmp_path / "a.tar.gz", model, {1: demo_model_py(1)}, config=config)
    runtime.place(model, 1, artifact)
    with pytest.raises(AdapterError) as info:
        runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    message = info.value.message
    assert info.value.permanent
    assert "failed to poll from model repository" in message  # all the HTTP answer says
    assert "server log" in message
    assert "'max_batch_size' must be non-negative" in message  # only the log says this


def test_unparsable_config_names_file_and_line(
    runtime: TritonServerRuntime, model: str, tmp_path: Path
) -> None:
    config = demo_config(model).replace("output [", "output [[")
    artifact = model_artifact(tmp_path / "a.tar.gz", model, {1: demo_model_py(1)}, config=config)
    runtime.place(model, 1, artifact)
    with pytest.raises(AdapterError) as info:
        runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT)
    assert info.value.permanent
    assert f"config.pbtxt of {model}" in info.value.message  # not its path: tenants read it
    line = next(n for n, text in enumerate(config.splitlines(), 1) if "output [[" in text)
    assert f"line {line}" in info.value.message


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"instance_groups": [{"count": 2}]}, "instance_groups"),
        ({"instance_group": [{"cnt": 2, "kind": "KIND_CPU"}]}, "cnt"),
        ({"max_batch_size": "eight"}, "max_batch_size"),
    ],
)
def test_bad_override_key_is_permanent(
    runtime: TritonServerRuntime,
    local_triton: TritonProcess,
    model: str,
    tmp_path: Path,
    override: dict,
    key: str,
) -> None:
    runtime.place(model, 1, model_artifact(tmp_path / "a.tar.gz", model, {1: demo_model_py(1)}))
    offset = log_size(local_triton)
    with pytest.raises(AdapterError) as info:
        runtime.load(model, 1, override, timeout=LOAD_TIMEOUT)
    assert info.value.permanent
    assert key in info.value.message
    assert model not in log_since(local_triton, offset)  # refused before reaching the server


def test_load_not_ready_in_time_names_the_state(
    runtime: TritonServerRuntime, model: str, tmp_path: Path
) -> None:
    runtime.place(model, 1, model_artifact(tmp_path / "a.tar.gz", model, {1: SLOW_INIT_MODEL}))
    started = time.monotonic()
    with pytest.raises(AdapterError) as info:
        runtime.load(model, 1, ONE_CPU, timeout=1.5)
    assert time.monotonic() - started < 3.0
    assert not info.value.permanent
    assert "not READY after 1.5 s: state LOADING" in info.value.message
    # The server goes on loading; once READY, the same load is a no-op.
    deadline = time.monotonic() + 30
    while runtime.loaded_versions(model).get(1) != "READY" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert runtime.load(model, 1, ONE_CPU, timeout=LOAD_TIMEOUT).version == 1


def test_concurrent_loads_of_one_model_keep_both_versions(
    runtime: TritonServerRuntime, local_triton: TritonProcess, model: str, tmp_path: Path
) -> None:
    artifact = model_artifact(
        tmp_path / "a.tar.gz", model, {1: demo_model_py(1), 2: demo_model_py(2)}
    )
    runtime.place(model, 1, artifact)
    runtime.place(model, 2, artifact)
    other = TritonServerRuntime(
        local_triton.http_url, local_triton.model_repository, timeout=LOAD_TIMEOUT
    )
    errors: list[BaseException] = []

    def load(adapter: TritonServerRuntime, version: int) -> None:
        try:
            adapter.load(model, version, ONE_CPU, timeout=LOAD_TIMEOUT)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=load, args=(runtime, 1)),
        threading.Thread(target=load, args=(other, 2)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LOAD_TIMEOUT * 2)
    assert errors == []
    assert runtime.loaded_versions(model) == {1: "READY", 2: "READY"}
