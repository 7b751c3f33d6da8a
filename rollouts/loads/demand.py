"""What a load asks of its server: the quota (units, memory) a version takes with a config, and the config the server gets."""

from __future__ import annotations

from typing import Any

from rollouts.models import ModelLoad, ModelVersion


def demand_of(version: ModelVersion, device_class: str, config: dict[str, Any]) -> tuple[int, int]:
    """(units, memory MiB) a version running with ``config``: GPUs, or model instances on CPU
    nodes (the instance groups' counts)."""
    if device_class == "cpu":
        groups = (config or {}).get("instance_group") or [{}]
        instances = sum(int(g.get("count", 1)) for g in groups if isinstance(g, dict)) or 1
        return instances, version.estimated_gpu_memory_mib * instances
    return version.gpus, version.estimated_gpu_memory_mib


def demand(version: ModelVersion, device_class: str) -> tuple[int, int]:
    """(units, memory MiB) a version asks for: GPUs, or model instances on CPU nodes."""
    return demand_of(version, device_class, dict(version.triton_config or {}))


def is_lora(version: ModelVersion) -> bool:
    return version.runtime == ModelVersion.Runtime.VLLM and bool(version.adapter_of)


def config_of(load: ModelLoad) -> dict[str, Any]:
    """The Triton config a load runs with: its override, else the version's."""
    if load.config_override is not None:
        return dict(load.config_override)
    return dict(load.version.triton_config or {})


def served_config(load: ModelLoad) -> dict[str, Any]:
    """:func:`config_of` as the server gets it: a config naming the model names it by its
    name on the server (Triton needs the name of the model's folder, which the tenant's slug
    qualifies)."""
    config = config_of(load)
    if config.get("name") == load.version.model.name:
        config["name"] = load.version.name_on(load.server)
    return config
