"""Health probe and LoRA-adapter runtime of a vLLM OpenAI-compatible server.

``probe()`` never raises and never waits longer than its timeout: an unreachable, slow or
broken server gives ``ServerProbe(ready=False, ..., error="<readable reason>")``. The module
itself satisfies :class:`fleet.adapters.base.ServerProbeAdapter`.

:class:`VLLMAdapterRuntime` loads and unloads LoRA adapter versions on one running server
(started with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); it satisfies
:class:`fleet.adapters.base.ServerRuntime`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

import httpx

from fleet.adapters.base import (
    READY,
    AdapterError,
    Call,
    Deadline,
    LoadedVersion,
    ModelState,
    ProbeFailed,
    ProbeSteps,
    ServerProbe,
    describe_http_error,
    elapsed_ms,
    http_client,
    parse_json,
    probe_within,
    run_steps,
)

ENGINE = "vllm"
ADAPTER_CONFIG = "adapter_config.json"
ENGINE_DEAD = "EngineCore encountered an issue"  # vLLM's EngineDeadError


def parse_models(payload: object) -> list[ModelState]:
    """Turn a ``GET /v1/models`` answer into ModelStates.

    Every listed model is served, hence READY; vLLM has no versions (``version=""``). A LoRA
    adapter names its base model in ``parent``: it is reported as ``reason="adapter of <base>"``.
    """
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ProbeFailed("GET /v1/models did not answer an OpenAI model list")
    models = []
    for entry in data:
        if not isinstance(entry, dict) or "id" not in entry:
            continue
        parent = entry.get("parent")
        models.append(
            ModelState(
                name=str(entry["id"]),
                version="",
                state="READY",
                reason=f"adapter of {parent}" if parent else "",
            )
        )
    return models


def probe_steps(base: str, start: float) -> ProbeSteps:
    """The probe as the requests it makes (``fleet.adapters.base.ProbeSteps``)."""
    live = ready = False
    version = ""
    models: list[ModelState] = []
    problems: list[str] = []
    try:
        # Any HTTP answer means the API process is up; 200 means the engine is healthy.
        status, _ = yield Call("GET", f"{base}/health")
        live = True
        ready = status == 200
        if not ready:
            problems.append(f"not ready (GET /health returned {status})")

        url = f"{base}/version"
        status, body = yield Call("GET", url)
        if status == 200:
            meta = parse_json(body, url)
            version = str(meta.get("version", "")) if isinstance(meta, dict) else ""
        else:
            problems.append(f"GET /version returned {status}")

        url = f"{base}/v1/models"
        status, body = yield Call("GET", url)
        if status == 200:
            models = parse_models(parse_json(body, url))
        else:
            problems.append(f"GET /v1/models returned {status}")
    except ProbeFailed as exc:
        return ServerProbe(
            ready=False,
            live=live,
            version=version,
            models=models,
            error=str(exc),
            latency_ms=elapsed_ms(start),
        )
    return ServerProbe(
        ready=ready,
        live=live,
        version=version,
        models=models,
        error="; ".join(problems),
        latency_ms=elapsed_ms(start),
    )


def _probe(
    base: str, timeout: float, headers: Mapping[str, str] | None, start: float
) -> ServerProbe:
    deadline = Deadline(timeout, margin=min(0.1, timeout * 0.1))
    with http_client(headers=dict(headers or {})) as client:
        return run_steps(probe_steps(base, start), client, deadline)


def probe(
    http_url: str, timeout: float = 2.0, *, headers: Mapping[str, str] | None = None
) -> ServerProbe:
    """Probe the vLLM server at ``http_url`` (e.g. "http://127.0.0.1:8000").

    Calls ``GET /health``, ``GET /version`` and ``GET /v1/models`` within a total of
    ``timeout`` seconds. Pass ``headers={"Authorization": "Bearer <key>"}`` for a server
    started with ``--api-key``. Transport failures give ``ready=False`` with a readable
    ``error``; HTTP error statuses are reported in ``error`` next to what was learned.
    """
    return probe_within(
        http_url, timeout, lambda base, start: _probe(base, timeout, headers, start)
    )


# --------------------------------------------------------------------------------------------
# LoRA adapter versions on one running server
# --------------------------------------------------------------------------------------------


def adapter_name(model: str, version: int) -> str:
    """The name a model version's LoRA adapter is served under (e.g. "support-bot-v3")."""
    return f"{model}-v{version}"


def _adapter_root(folder: Path) -> Path | None:
    """The folder holding ``adapter_config.json``: ``folder`` itself or its only subfolder."""
    if (folder / ADAPTER_CONFIG).is_file():
        return folder
    children = [p for p in folder.iterdir() if not p.name.startswith(".")]
    if len(children) == 1 and children[0].is_dir() and (children[0] / ADAPTER_CONFIG).is_file():
        return children[0]
    return None


def _error_message(body: bytes) -> str:
    """vLLM's explanation from an error answer (JSON ``error.message`` or plain text)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        payload = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
        if isinstance(error, str):
            return error[:500]
        if payload.get("detail"):
            return str(payload["detail"])[:500]
    return text[:500]


def _rejected(status: int, message: str) -> bool:
    """True when a failed load is the adapter's fault (retrying cannot help).

    vLLM answers 404 for a path without an adapter, 400 for a bad request, and 500 with the
    loader's exception (unreadable weights, rank above ``--max-lora-rank``, unknown target
    modules); a dead engine and gateway errors are the server's fault instead.
    """
    if status < 500:
        return True
    return status == 500 and ENGINE_DEAD not in message


class VLLMAdapterRuntime:
    """LoRA adapter versions on one vLLM server (a :class:`~fleet.adapters.base.ServerRuntime`).

    A version's artifact is a LoRA adapter folder (``adapter_config.json`` plus weights), or a
    ``.tar.gz`` of one; it is placed in ``adapters_dir/<model>-v<version>/`` (a path the server
    can read) and served under the name :func:`adapter_name`, next to the base model. Every
    call is idempotent. HTTP calls are bounded by ``timeout`` seconds (by the call's own
    ``timeout`` for load and unload). Pass ``headers`` for a server started with ``--api-key``.
    """

    def __init__(
        self,
        http_url: str,
        adapters_dir: Path,
        timeout: float = 30.0,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.http_url = http_url.rstrip("/")
        self.adapters_dir = Path(adapters_dir)
        self.timeout = timeout
        self.headers = dict(headers or {})

    # -- files --------------------------------------------------------------------------------

    def adapter_path(self, model: str, version: int) -> Path:
        """Where the version's adapter folder is placed."""
        return self.adapters_dir / adapter_name(model, version)

    def place(self, model: str, version: int, artifact: Path, *, folder: str | None = None) -> None:
        """Extract (or copy) the adapter into :meth:`adapter_path`; no-op when it is there.

        The folder appears whole or not at all (built in a temporary sibling, then renamed).
        An artifact that is not an adapter raises AdapterError(permanent=True).
        """
        dest = self.adapter_path(model, version)
        if (dest / ADAPTER_CONFIG).is_file():
            return
        artifact = Path(artifact)
        if not artifact.exists():
            raise AdapterError(f"artifact {artifact} does not exist", permanent=True)
        self.adapters_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=self.adapters_dir))
        try:
            unpacked = tmp / "unpacked"
            if artifact.is_dir():
                shutil.copytree(artifact, unpacked)
            else:
                try:
                    with tarfile.open(artifact, "r:*") as tar:
                        tar.extractall(unpacked, filter="data")
                except (tarfile.TarError, OSError, EOFError) as exc:
                    raise AdapterError(
                        f"artifact {artifact.name} is not a readable tar archive: {exc}",
                        permanent=True,
                    ) from exc
            root = _adapter_root(unpacked) if unpacked.is_dir() else None
            if root is None:
                raise AdapterError(
                    f"artifact {artifact.name} holds no LoRA adapter ({ADAPTER_CONFIG} missing)",
                    permanent=True,
                )
            try:
                root.rename(dest)
            except OSError:
                if not (dest / ADAPTER_CONFIG).is_file():  # not placed by a concurrent call
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def remove(self, model: str, version: int) -> None:
        """Delete the version's placed folder (no-op when absent)."""
        dest = self.adapter_path(model, version)
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        elif dest.exists():
            shutil.rmtree(dest)

    # -- server -------------------------------------------------------------------------------

    def _request(
        self, method: str, path: str, timeout: float, body: object | None = None
    ) -> httpx.Response:
        url = f"{self.http_url}{path}"
        try:
            return httpx.request(method, url, json=body, headers=self.headers, timeout=timeout)
        except httpx.HTTPError as exc:
            raise AdapterError(describe_http_error(exc, url, timeout)) from exc

    def served_models(self, timeout: float | None = None) -> list[ModelState]:
        """The base model and the adapters the server serves now (``GET /v1/models``)."""
        wait = self.timeout if timeout is None else timeout
        response = self._request("GET", "/v1/models", wait)
        if response.status_code != 200:
            raise AdapterError(
                f"GET /v1/models returned {response.status_code}: "
                f"{_error_message(response.content)}",
                permanent=400 <= response.status_code < 500,
            )
        try:
            return parse_models(response.json())
        except (ValueError, ProbeFailed) as exc:
            raise AdapterError(f"GET /v1/models at {self.http_url}: {exc}") from exc

    def _listed(self, name: str, timeout: float) -> bool:
        return any(m.name == name for m in self.served_models(timeout))

    def status(self, model: str, version: int, timeout: float | None = None) -> str:
        """READY when ``GET /v1/models`` lists the version's adapter, "" when it does not
        (a restarted server has forgotten every adapter loaded at runtime)."""
        wait = self.timeout if timeout is None else timeout
        return READY if self._listed(adapter_name(model, version), wait) else ""

    def served(self, model: str, version: int, timeout: float | None = None) -> LoadedVersion:
        """The LoadedVersion of a listed adapter (:meth:`loaded_version`); a permanent
        AdapterError when the server does not list it."""
        if not self.status(model, version, timeout):
            raise AdapterError(
                f"vLLM does not serve LoRA adapter {adapter_name(model, version)}", permanent=True
            )
        return self.loaded_version(model, version)

    def loaded_version(self, model: str, version: int) -> LoadedVersion:
        """The LoadedVersion describing the placed adapter (its hash covers name, path and
        the adapter's ``adapter_config.json``)."""
        name = adapter_name(model, version)
        path = self.adapter_path(model, version).resolve()
        try:
            adapter_config = json.loads((path / ADAPTER_CONFIG).read_text())
        except (OSError, ValueError) as exc:
            raise AdapterError(
                f"cannot read {path / ADAPTER_CONFIG}: {exc}", permanent=True
            ) from exc
        config = {"lora_name": name, "lora_path": str(path), "adapter_config": adapter_config}
        canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
        return LoadedVersion(
            model=model,
            version=version,
            config_hash=hashlib.sha256(canonical.encode()).hexdigest(),
            config=config,
        )

    def load(
        self, model: str, version: int, config: dict[str, object], timeout: float
    ) -> LoadedVersion:
        """Load the placed adapter (``POST /v1/load_lora_adapter``) and check it is listed.

        No-op when the server already lists it. vLLM has no per-adapter settings, so
        ``config`` is not sent; the hash describes the adapter itself. A path vLLM cannot
        load (missing, not an adapter, rank above ``--max-lora-rank``) raises
        AdapterError(permanent=True) with vLLM's message.
        """
        deadline = Deadline(timeout)
        name = adapter_name(model, version)
        if self._listed(name, deadline.remaining()):
            return self.loaded_version(model, version)
        path = self.adapter_path(model, version).resolve()
        response = self._request(
            "POST",
            "/v1/load_lora_adapter",
            deadline.remaining(),
            {"lora_name": name, "lora_path": str(path)},
        )
        if response.status_code != 200:
            message = _error_message(response.content)
            if "already been loaded" in message and self._listed(name, deadline.remaining()):
                return self.loaded_version(model, version)
            raise AdapterError(
                f"vLLM refused to load LoRA adapter {name} from {path} "
                f"({response.status_code}): {message}",
                permanent=_rejected(response.status_code, message),
            )
        if not self._listed(name, deadline.remaining()):
            raise AdapterError(f"vLLM accepted LoRA adapter {name} but does not list it")
        return self.loaded_version(model, version)

    def unload(self, model: str, version: int, timeout: float) -> None:
        """Unload the adapter (``POST /v1/unload_lora_adapter``) and check it is gone.

        No-op when the server does not list it.
        """
        deadline = Deadline(timeout)
        name = adapter_name(model, version)
        if not self._listed(name, deadline.remaining()):
            return
        response = self._request(
            "POST", "/v1/unload_lora_adapter", deadline.remaining(), {"lora_name": name}
        )
        if response.status_code != 200 and response.status_code != 404:
            raise AdapterError(
                f"vLLM refused to unload LoRA adapter {name} ({response.status_code}): "
                f"{_error_message(response.content)}",
                permanent=400 <= response.status_code < 500,
            )
        if self._listed(name, deadline.remaining()):
            raise AdapterError(f"vLLM still lists LoRA adapter {name} after unloading it")
