"""Base-model versions on a local vLLM server: roll the server process.

vLLM serves one base model per process and cannot swap it in place, so loading a new
base-model version starts a new server process for it, and only once that one answers
``/health`` is the old process retired (``on_switch`` tells the caller where the new one
listens). Unloading stops the process. A JSON pidfile per server records which process
serves which model folder; it makes every call idempotent and lets another process (a new
worker, ``local_cluster down``) find and stop the server. ``roll_runtime_for`` is the
local cluster's roller, which the local app registers with the product
(``fleet.inventory.runtimes.register_base_model_roller``) in its ``ready()``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from fleet.adapters.base import READY, AdapterError, LoadedVersion
from fleet.adapters.triton_repository import safe_extract
from local import processes
from local import vllm as vllm_local

if TYPE_CHECKING:
    from fleet.models import InferenceServer

SwitchFn = Callable[[str, int], None]  # (new http_url, new pid)


def read_pidfile(pidfile: Path) -> dict[str, object]:
    try:
        data = json.loads(pidfile.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stop_from_pidfile(pidfile: Path, timeout: float = 15.0) -> bool:
    """Stop the server a pidfile names (if it still runs) and remove the pidfile."""
    pid = read_pidfile(pidfile).get("pid")
    stopped = isinstance(pid, int) and vllm_local.stop_pid(pid, timeout)
    pidfile.unlink(missing_ok=True)
    return stopped


class VLLMRollRuntime:
    """ServerRuntime for base-model versions on a vLLM server this machine runs."""

    def __init__(
        self,
        runtime: vllm_local.VLLMRuntime,
        models_dir: Path,
        pidfile: Path,
        log_dir: Path,
        *,
        on_switch: SwitchFn,
        enable_lora: bool = True,
    ) -> None:
        self.runtime = runtime
        self.models_dir = Path(models_dir)
        self.pidfile = Path(pidfile)
        self.log_dir = Path(log_dir)
        self.on_switch = on_switch
        self.enable_lora = enable_lora

    def model_dir(self, model: str, version: int) -> Path:
        return self.models_dir / f"{model}-v{version}"

    def place(self, model: str, version: int, artifact: Path, *, folder: str | None = None) -> None:
        """Unpack the model folder (a .tar.gz holding one folder, or a folder) once."""
        final = self.model_dir(model, version)
        if (final / "config.json").exists():
            return
        self.models_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{model}-v{version}-", dir=self.models_dir))
        try:
            if Path(artifact).is_dir():
                shutil.copytree(artifact, work / "model")
            else:
                safe_extract(Path(artifact), work)
            found = sorted(p.parent for p in work.rglob("config.json"))
            if not found:
                raise AdapterError(
                    f"artifact of {model} v{version} holds no model folder (no config.json)",
                    permanent=True,
                )
            shutil.rmtree(final, ignore_errors=True)
            found[0].rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _config(self, model: str, version: int, http_url: str) -> dict[str, object]:
        return {"served_model_name": model, "model_dir": str(self.model_dir(model, version)),
                "http_url": http_url, "enable_lora": self.enable_lora}

    @staticmethod
    def _hash(config: Mapping[str, object]) -> str:
        stable = {k: v for k, v in config.items() if k != "http_url"}
        return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()

    def load(
        self, model: str, version: int, config: Mapping[str, object], timeout: float
    ) -> LoadedVersion:
        """Start a server for the version; retire the old one once the new one is ready."""
        folder = self.model_dir(model, version)
        if not (folder / "config.json").exists():
            raise AdapterError(f"{model} v{version} is not placed at {folder}", permanent=True)
        current = read_pidfile(self.pidfile)
        pid = current.get("pid")
        if current.get("model_dir") == str(folder) and isinstance(pid, int) and processes.alive(pid):
            served = self._config(model, version, str(current.get("http_url", "")))
            return LoadedVersion(model, version, self._hash(served), served)
        try:
            proc = vllm_local.start_vllm(
                self.runtime, folder, served_model_name=model,
                log_path=self.log_dir / f"vllm-{model}-v{version}.log",
                enable_lora=self.enable_lora, ready_timeout=timeout,
            )
        except RuntimeError as exc:
            raise AdapterError(f"vLLM did not start for {model} v{version}: {exc}", permanent=True) from exc
        served = self._config(model, version, proc.http_url)
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.write_text(json.dumps({"pid": proc.pid, **served}))
        self.on_switch(proc.http_url, proc.pid)
        if isinstance(pid, int) and pid != proc.pid:
            with contextlib.suppress(OSError):
                vllm_local.stop_pid(pid)
        return LoadedVersion(model, version, self._hash(served), served)

    def status(self, model: str, version: int, timeout: float | None = None) -> str:
        """READY while the pidfile's live process serves this version's folder, else ""."""
        current = read_pidfile(self.pidfile)
        pid = current.get("pid")
        serving = current.get("model_dir") == str(self.model_dir(model, version))
        return READY if serving and isinstance(pid, int) and processes.alive(pid) else ""

    def served(self, model: str, version: int, timeout: float | None = None) -> LoadedVersion:
        """What the running process serves (a permanent AdapterError when it is not this
        version)."""
        if not self.status(model, version):
            raise AdapterError(f"no vLLM process serves {model} v{version}", permanent=True)
        http_url = str(read_pidfile(self.pidfile).get("http_url", ""))
        config = self._config(model, version, http_url)
        return LoadedVersion(model, version, self._hash(config), config)

    def unload(self, model: str, version: int, timeout: float) -> None:
        """Stop the server when it serves this version (no-op otherwise)."""
        if read_pidfile(self.pidfile).get("model_dir") == str(self.model_dir(model, version)):
            stop_from_pidfile(self.pidfile, timeout=min(timeout, 30.0))

    def remove(self, model: str, version: int) -> None:
        shutil.rmtree(self.model_dir(model, version), ignore_errors=True)


def host_pidfile(data_dir: Path, server_name: str) -> Path:
    """The pidfile of the vLLM server ``server_name`` that this host runs from ``data_dir``."""
    return Path(data_dir) / "local" / "run" / f"vllm-{server_name}.json"


def for_host_server(data_dir: Path, server_name: str, *, on_switch: SwitchFn) -> VLLMRollRuntime:
    """The roll runtime of the vLLM server ``server_name`` that this host runs from
    ``data_dir``: model folders in ``local/vllm/models``, logs in ``local/logs``."""
    root = Path(data_dir) / "local"
    return VLLMRollRuntime(
        vllm_local.ensure_runtime(Path(data_dir)),
        root / "vllm" / "models",
        host_pidfile(data_dir, server_name),
        root / "logs",
        on_switch=on_switch,
    )


def roll_runtime_for(server: InferenceServer, *, on_switch: SwitchFn) -> VLLMRollRuntime:
    """The roller of a local-cluster vLLM server (a ``BaseModelRoller``): its process runs on
    this host, from the settings' data folder."""
    return for_host_server(settings.DATA_DIR, server.name, on_switch=on_switch)
