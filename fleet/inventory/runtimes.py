"""Which adapter serves which server: the one place that maps fleet rows to adapters.

A base-model version of vLLM rolls the server's process, which only a machine that can start
that process does. The app that runs servers of a cluster kind registers its roller for that
kind (``register_base_model_roller``, the ``local`` app for the local cluster in its
``ready()``); the product knows the interface, never the implementation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from fleet.adapters.base import AdapterError, ArtifactStore, ServerRuntime
from fleet.models import Cluster, InferenceServer


def artifact_store_for(cluster: Cluster) -> ArtifactStore:
    """An S3 store for the cluster's endpoint (or the default), caching by digest."""
    return _store(
        str(settings.SWITCHYARD_ARTIFACT_CACHE),
        cluster.s3_endpoint_url or settings.SWITCHYARD_S3_ENDPOINT_URL,
        cluster.s3_region or settings.SWITCHYARD_S3_REGION,
        settings.SWITCHYARD_S3_ACCESS_KEY_ID,
        settings.SWITCHYARD_S3_SECRET_ACCESS_KEY,
    )


@functools.lru_cache(maxsize=32)
def _store(
    cache_dir: str, endpoint: str | None, region: str, key_id: str | None, secret: str | None
) -> ArtifactStore:
    # One store per endpoint and credentials: a boto3 client costs ~80 ms to build and is
    # thread-safe, so every load of a worker shares it.
    from fleet.adapters.s3 import S3ArtifactStore

    return S3ArtifactStore(
        Path(cache_dir), endpoint_url=endpoint, region=region, access_key_id=key_id,
        secret_access_key=secret,
    )


class BaseModelRoller(Protocol):
    """Builds the runtime that rolls ``server``'s vLLM process to a new base-model version;
    ``on_switch(http_url, pid)`` is called once the new process answers, before the old one
    stops."""

    def __call__(
        self, server: InferenceServer, *, on_switch: Callable[[str, int], None]
    ) -> ServerRuntime: ...


# Cluster kind -> dotted path of its BaseModelRoller, imported on first use (so registering one
# loads nothing into a web process that never rolls a server).
_base_model_rollers: dict[str, str] = {}


def register_base_model_roller(cluster_kind: str, roller: str) -> None:
    """Roll the vLLM servers of clusters of ``cluster_kind`` with the ``BaseModelRoller`` at
    the dotted path ``roller``."""
    _base_model_rollers[cluster_kind] = roller


def base_model_roller(cluster_kind: str) -> BaseModelRoller | None:
    """The roller registered for ``cluster_kind``, or None when no app rolls its servers."""
    roller = _base_model_rollers.get(cluster_kind)
    return import_string(roller) if roller else None


def runtime_for(server: InferenceServer, *, lora: bool = False) -> ServerRuntime:
    """The runtime adapter that loads versions onto ``server``."""
    timeout = settings.SWITCHYARD_LOAD_TIMEOUT_S
    if server.runtime == InferenceServer.Runtime.TRITON:
        from fleet.adapters.triton_runtime import TritonServerRuntime

        if not server.model_repository:
            raise AdapterError(
                f"server {server.name} has no model repository folder recorded", permanent=True
            )
        return TritonServerRuntime(
            server.http_url,
            Path(server.model_repository),
            log_path=Path(server.log_path) if server.log_path else None,
            timeout=timeout,
        )
    if server.runtime == InferenceServer.Runtime.VLLM and lora:
        from fleet.adapters.vllm import VLLMAdapterRuntime

        adapters = Path(server.model_repository or settings.DATA_DIR / "vllm-adapters" / server.name)
        return VLLMAdapterRuntime(server.http_url, adapters, timeout=timeout)
    roller = base_model_roller(server.cluster.kind) if server.runtime == InferenceServer.Runtime.VLLM else None
    if roller is not None:
        return roller(server, on_switch=lambda url, pid: _moved(server.pk, url))
    raise AdapterError(
        f"base-model versions of vLLM roll the server process, which Switchyard does on local "
        f"clusters only (server {server.name} is in a {server.cluster.kind} cluster)",
        permanent=True,
    )


def _moved(server_id: int, http_url: str) -> None:
    """A rolled vLLM server listens somewhere new: point the server record there."""
    InferenceServer.objects.filter(pk=server_id).update(
        http_url=http_url, metrics_url=f"{http_url}/metrics",
        health=InferenceServer.Health.UNKNOWN, health_detail="restarted on a new process",
    )
