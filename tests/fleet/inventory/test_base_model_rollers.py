"""Which cluster kinds roll a vLLM server's process to a new base model: the ones whose app
registered a roller (the local app, for the local cluster), and no other."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.adapters.base import AdapterError
from fleet.inventory import runtimes
from fleet.models import Cluster, InferenceServer
from local import vllm as vllm_local
from local.vllm_roll import VLLMRollRuntime


def vllm_server(kind: str) -> InferenceServer:
    cluster = Cluster.objects.create(name=f"c-{kind}", kind=kind)
    return InferenceServer.objects.create(
        cluster=cluster, name="vllm-a", runtime=InferenceServer.Runtime.VLLM,
        http_url="http://127.0.0.1:9",
    )


def test_a_local_vllm_server_rolls_its_process_on_this_host(db, settings, tmp_path, monkeypatch):
    settings.DATA_DIR = tmp_path
    monkeypatch.setattr(vllm_local, "ensure_runtime", lambda data_dir: "vLLM runtime")  # no venv
    server = vllm_server(Cluster.Kind.LOCAL)

    runtime = runtimes.runtime_for(server)

    assert isinstance(runtime, VLLMRollRuntime)
    assert runtime.pidfile == Path(tmp_path) / "local" / "run" / "vllm-vllm-a.json"
    runtime.on_switch("http://127.0.0.1:18123", 4242)
    server.refresh_from_db()
    assert (server.http_url, server.metrics_url) == (
        "http://127.0.0.1:18123", "http://127.0.0.1:18123/metrics"
    )
    assert server.health == InferenceServer.Health.UNKNOWN


def test_a_base_model_on_a_cluster_kind_without_a_roller_fails_for_good(db):
    server = vllm_server(Cluster.Kind.STATIC)

    with pytest.raises(AdapterError, match="local clusters only") as refused:
        runtimes.runtime_for(server)
    assert refused.value.permanent

