"""What a benchmark job asks for, checked, and the requests its runner sends.

Plain functions: the limits of a job (a bounded load that stops by itself), the checks of its
levels, Triton config overrides, request shapes and SLO (each refusal a DomainError naming
the field), the KServe v2 inputs made from a model's metadata, the streamed OpenAI requests
with their length distributions, and the runner's spec (:func:`spec_for`).
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import httpx
from django.conf import settings

from console.exceptions import DomainError
from fleet.adapters.vllm import adapter_name
from fleet.models import InferenceServer
from rollouts.models import BenchmarkJob, Deployment, ModelVersion

Protocol = BenchmarkJob.Protocol


#: Limits on what a job may ask for (a bounded load that stops by itself).
LIMITS = {
    "levels": 20, "concurrency": 512, "rate": 20_000.0, "duration_s": 600.0, "warmup_s": 120.0,
    "max_requests": 10_000_000, "refine_steps": 6, "configs": 8, "instance_count": 16,
    "max_batch_size": 1024, "max_queue_delay_microseconds": 1_000_000, "prompt_tokens": 8192,
    "output_tokens": 4096,
}


CONFIG_KEYS = ("instance_group", "dynamic_batching", "max_batch_size")


def positive_number(raw: object, field: str, upper: float, *, integer: bool = False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != raw:
        raise DomainError(f"a number, got {raw!r}"[:200], field=field)
    if integer and raw != int(raw):
        raise DomainError(f"a whole number, got {raw!r}"[:200], field=field)
    if not 0 < raw <= upper:
        raise DomainError(f"from {1 if integer else 0} to {upper:g}, got {raw!r}"[:200], field=field)
    return float(raw)


def _whole(raw: object, low: int, high: int) -> int | None:
    """``raw`` as a whole number from ``low`` to ``high`` (8 and 8.0 alike), else None."""
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != raw:
        return None
    if isinstance(raw, float) and not raw.is_integer():
        return None
    return int(raw) if low <= raw <= high else None


def at_least_zero(raw: object, field: str, upper: float, *, integer: bool = False) -> float:
    """0, or what :func:`positive_number` accepts."""
    if not isinstance(raw, bool) and raw == 0:
        return 0.0
    return positive_number(raw, field, upper, integer=integer)


def parse_levels(raw: object, mode: str) -> list[float]:
    if not isinstance(raw, list) or not raw:
        raise DomainError("a non-empty list of concurrencies or request rates", field="levels")
    if len(raw) > LIMITS["levels"]:
        raise DomainError(f"at most {LIMITS['levels']} levels", field="levels")
    integer = mode == BenchmarkJob.Mode.CONCURRENCY
    upper = LIMITS["concurrency"] if integer else LIMITS["rate"]
    values = sorted({positive_number(v, "levels", upper, integer=integer) for v in raw})
    return [int(v) if integer else v for v in values]


def parse_configs(raw: object, version: ModelVersion) -> list[dict[str, Any]]:
    """Triton config overrides: instance_group count, dynamic_batching (queue delay,
    preferred sizes) and max_batch_size; each merged over the version's own config."""
    if raw in (None, []):
        return []
    if not isinstance(raw, list):
        raise DomainError("a list of config overrides", field="configs")
    if version.runtime != ModelVersion.Runtime.TRITON:
        raise DomainError("config sweeps are for Triton versions", field="configs")
    if len(raw) > LIMITS["configs"]:
        raise DomainError(f"at most {LIMITS['configs']} configs", field="configs")
    parsed = []
    for i, item in enumerate(raw):
        where = f"configs[{i}]"
        if not isinstance(item, dict):
            raise DomainError("an object of config fields", field=where)
        unknown = sorted(set(item) - set(CONFIG_KEYS))
        if unknown:
            raise DomainError(f"unknown fields {', '.join(unknown)}; a sweep may set "
                              f"{', '.join(CONFIG_KEYS)}", field=where)
        out: dict[str, Any] = {}
        if "instance_group" in item:
            count = item["instance_group"]
            if isinstance(count, dict):
                count = count.get("count")
            positive_number(count, f"{where}.instance_group", LIMITS["instance_count"], integer=True)
            base = [dict(g) for g in (version.triton_config or {}).get("instance_group") or [{}]]
            # The kind stays the version's (left out: Triton's KIND_AUTO, a GPU where there is one).
            base[0]["count"] = int(count)
            out["instance_group"] = base[:1]
        if "max_batch_size" in item:
            out["max_batch_size"] = int(positive_number(
                item["max_batch_size"], f"{where}.max_batch_size", LIMITS["max_batch_size"], integer=True))
        if "dynamic_batching" in item:
            out["dynamic_batching"] = _dynamic_batching(item["dynamic_batching"], f"{where}.dynamic_batching")
        batch = out.get("max_batch_size", (version.triton_config or {}).get("max_batch_size", 0))
        if "dynamic_batching" in out and not batch:
            raise DomainError("dynamic batching needs max_batch_size above 0 (set it in the "
                              "same override)", field=where)
        parsed.append(out)
    return parsed


def _dynamic_batching(raw: object, field: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise DomainError("an object: max_queue_delay_microseconds, preferred_batch_size", field=field)
    out: dict[str, Any] = {}
    if "max_queue_delay_microseconds" in raw:
        delay = _whole(raw["max_queue_delay_microseconds"], 0, LIMITS["max_queue_delay_microseconds"])
        if delay is None:
            raise DomainError(f"microseconds from 0 to {LIMITS['max_queue_delay_microseconds']}",
                              field=f"{field}.max_queue_delay_microseconds")
        out["max_queue_delay_microseconds"] = delay
    if "preferred_batch_size" in raw:
        raw_sizes = raw["preferred_batch_size"]
        sizes = [_whole(s, 1, LIMITS["max_batch_size"]) for s in raw_sizes] \
            if isinstance(raw_sizes, list) and len(raw_sizes) <= 32 else [None]
        if None in sizes:
            raise DomainError(f"a list of batch sizes from 1 to {LIMITS['max_batch_size']}",
                              field=f"{field}.preferred_batch_size")
        out["preferred_batch_size"] = sizes
    unknown = sorted(set(raw) - {"max_queue_delay_microseconds", "preferred_batch_size"})
    if unknown:
        raise DomainError(f"unknown fields {', '.join(unknown)}", field=field)
    return out


def full_config(version: ModelVersion, override: dict[str, Any] | None) -> dict[str, Any]:
    """The version's config with ``override``'s fields put over it."""
    return {**(version.triton_config or {}), **(override or {})}


def level_name(mode: str, value: float | None) -> str:
    """A sweep's level in words, as every face names it (the job's page, its phase in the API,
    the CLI's ``benchmark wait``): "concurrency 4", or "200 req/s offered" in rate mode."""
    if value is None:
        return "\u2013"
    if mode == BenchmarkJob.Mode.CONCURRENCY:
        return f"concurrency {value:g}"
    return f"{value:g} req/s offered"


def config_label(override: dict[str, Any] | None) -> str:
    """A short name for a config: "default" or "2 instances, batch 8, delay 100 µs"."""
    if not override:
        return "default"
    parts = []
    if "instance_group" in override:
        count = override["instance_group"][0].get("count", 1)
        parts.append(f"{count} instance{'s' if count != 1 else ''}")
    if "max_batch_size" in override:
        parts.append(f"batch {override['max_batch_size']}")
    batching = override.get("dynamic_batching")
    if batching is not None:
        parts.append(f"delay {batching.get('max_queue_delay_microseconds', 0)} µs")
        if batching.get("preferred_batch_size"):
            parts.append(f"preferred {batching['preferred_batch_size']}")
    return ", ".join(parts)


def protocol_for(version: ModelVersion, server: InferenceServer, raw: object) -> str:
    default = Protocol.OPENAI_COMPLETIONS if server.runtime == InferenceServer.Runtime.VLLM \
        else Protocol.TRITON_HTTP
    protocol = raw or default
    if protocol not in Protocol.values:
        raise DomainError(f"one of {', '.join(Protocol.values)}", field="protocol")
    llm = protocol in (Protocol.OPENAI_COMPLETIONS, Protocol.OPENAI_CHAT)
    if llm != (server.runtime == InferenceServer.Runtime.VLLM):
        raise DomainError(f"{protocol} does not fit a {server.runtime} server", field="protocol")
    if protocol == Protocol.TRITON_GRPC and not server.grpc_url:
        raise DomainError(f"server {server.name} has no gRPC address recorded", field="protocol")
    return protocol


def parse_request(raw: object, protocol: str) -> dict[str, Any]:
    """What each request carries. Triton: ``inputs`` (KServe v2 JSON inputs; made from the
    model's metadata when left out). LLM: ``prompt_tokens`` and ``output_tokens`` as
    ``{"mean": n, "spread": s}`` (uniform in mean ± spread)."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise DomainError("an object", field="request")
    if protocol in (Protocol.OPENAI_COMPLETIONS, Protocol.OPENAI_CHAT):
        out: dict[str, Any] = {}
        for key in ("prompt_tokens", "output_tokens"):
            if key not in raw:
                continue
            value = raw[key]
            if not isinstance(value, dict):
                raise DomainError('{"mean": n, "spread": s}', field=f"request.{key}")
            mean = positive_number(value.get("mean"), f"request.{key}.mean", LIMITS[key], integer=True)
            spread = _whole(value.get("spread", 0), 0, int(mean) - 1)
            if spread is None:
                raise DomainError(f"a whole number from 0 to {int(mean) - 1}", field=f"request.{key}.spread")
            out[key] = {"mean": int(mean), "spread": spread}
        unknown = sorted(set(raw) - {"prompt_tokens", "output_tokens"})
        if unknown:
            raise DomainError(f"unknown fields {', '.join(unknown)}", field="request")
        return out
    inputs = raw.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(
            isinstance(i, dict) and {"name", "shape", "datatype", "data"} <= set(i) for i in inputs):
        raise DomainError("inputs: a list of {name, shape, datatype, data}", field="request.inputs")
    if len(json.dumps(inputs)) > 1_000_000:
        raise DomainError("at most 1 MB of inputs", field="request.inputs")
    return {"inputs": inputs}


def slo_for(deployment: Deployment, raw: object) -> dict[str, Any]:
    slo: dict[str, Any] = {"p99_ms": float(deployment.slo_p99_ms),
                           "error_rate": float(deployment.slo_error_rate) / 100.0}
    if raw in (None, {}):
        return slo
    if not isinstance(raw, dict):
        raise DomainError("an object: p99_ms, error_rate (a fraction), ttft_p99_ms, itl_p99_ms", field="slo")
    unknown = sorted(set(raw) - {"p99_ms", "error_rate", "ttft_p99_ms", "itl_p99_ms"})
    if unknown:
        raise DomainError(f"unknown fields {', '.join(unknown)}", field="slo")
    for key in ("p99_ms", "ttft_p99_ms", "itl_p99_ms"):
        if raw.get(key) is not None:
            slo[key] = positive_number(raw[key], f"slo.{key}", 3_600_000)
    if raw.get("error_rate") is not None:
        rate = raw["error_rate"]
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise DomainError("a fraction from 0 to 1", field="slo.error_rate")
        slo["error_rate"] = float(rate)
    return slo


def key_prefix() -> str:
    return f"{settings.SWITCHYARD_REDIS_PREFIX}:bench:"


def _zeros(datatype: str, count: int) -> list[Any]:
    if datatype == "BYTES":
        return ["switchyard"] * count
    if datatype == "BOOL":
        return [False] * count
    if datatype.startswith(("FP", "BF")):
        return [round(random.random(), 4) for _ in range(count)]
    return [1] * count


def inputs_from_metadata(metadata: dict[str, Any], max_batch_size: int = 0) -> list[dict[str, Any]]:
    """KServe v2 inputs for one request, from the model's metadata: variable dimensions
    (-1) are 1 for the batch dimension and 4 elsewhere, values are small and valid."""
    inputs = []
    for spec in metadata.get("inputs") or []:
        shape = [int(d) for d in spec.get("shape") or [1]]
        shape = [(1 if i == 0 and max_batch_size else 4) if d < 0 else d for i, d in enumerate(shape)]
        count = 1
        for d in shape:
            count *= d
        inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"],
                       "data": _zeros(spec["datatype"], count)})
    return inputs


WORDS = ["switchyard", "measures", "capacity", "with", "tokens", "from", "many", "short", "words", "so", "each", "prompt", "has", "about", "as", "many", "tokens", "as", "words", "the", "model", "reads"]


def llm_bodies(job: BenchmarkJob, model_name: str, count: int = 64) -> list[bytes]:
    """Streamed OpenAI requests with prompt and output lengths drawn from the job's
    distributions. ``min_tokens`` with ``ignore_eos`` keeps vLLM generating exactly the length
    asked for (vLLM 0.32 honours both: every answer has ``max_tokens`` tokens, finish reason
    ``length``); ``continuous_usage_stats`` puts the running token count in every chunk, so
    the engine knows how many tokens each chunk carries. A prompt word is about one token
    (about 1.05 with SmolLM2's tokenizer); chat requests add the model's chat template on top."""
    rng = random.Random(job.pk)
    prompt = job.request.get("prompt_tokens") or {"mean": 32, "spread": 8}
    output = job.request.get("output_tokens") or {"mean": 32, "spread": 0}
    bodies = []
    for _ in range(count):
        words = rng.randint(prompt["mean"] - prompt["spread"], prompt["mean"] + prompt["spread"])
        tokens = rng.randint(output["mean"] - output["spread"], output["mean"] + output["spread"])
        text = " ".join(rng.choice(WORDS) for _ in range(max(words, 1)))
        body: dict[str, Any] = {
            "model": model_name, "max_tokens": max(tokens, 1), "min_tokens": max(tokens, 1),
            "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if job.protocol == Protocol.OPENAI_CHAT:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        bodies.append(json.dumps(body).encode())
    return bodies


def served_name(job: BenchmarkJob) -> str:
    version = job.version
    if version.runtime == ModelVersion.Runtime.VLLM and version.adapter_of:
        return adapter_name(version.model.name, version.version)
    return version.name_on(job.server)


def spec_for(job: BenchmarkJob, run_id: str) -> dict[str, Any]:
    """What the runner process needs: target, plan, SLO, Redis keys, server view."""
    server = job.server
    name = served_name(job)
    triton = server.runtime == InferenceServer.Runtime.TRITON
    if job.is_llm:
        bodies = llm_bodies(job, name)
    else:
        inputs = job.request.get("inputs")
        if not inputs:
            config = full_config(job.version, (job.configs or [None])[job.config_index] if job.configs else None)
            url = f"{server.http_url.rstrip('/')}/v2/models/{name}/versions/{job.version.version}"
            metadata = httpx.get(url, timeout=settings.SWITCHYARD_PROBE_TIMEOUT_S).json()
            inputs = inputs_from_metadata(metadata, int(config.get("max_batch_size") or 0))
        bodies = [json.dumps({"inputs": inputs}).encode()]
    url = server.grpc_url if job.protocol == Protocol.TRITON_GRPC else server.http_url
    return {
        "run_id": run_id,
        "redis_url": settings.REDIS_URL,
        "prefix": key_prefix(),
        "target": {
            "kind": job.protocol, "url": url, "model": name,
            "version": str(job.version.version) if triton else "",
            "bodies": [base64.b64encode(b).decode() for b in bodies],
            "timeout_s": settings.SWITCHYARD_BENCHMARK_REQUEST_TIMEOUT_S,
        },
        "server": {
            "kind": "triton" if triton else "vllm",
            "metrics_url": server.metrics_url,
            # vLLM counts an adapter's requests under its base model (with the base's own
            # and other adapters' traffic: a benchmark server should carry nothing else).
            "metrics_model": (job.version.adapter_of or name) if not triton else name,
            "probe_url": server.http_url.rstrip("/") + ("/v2/health/ready" if triton else "/health"),
        },
        "plan": {"mode": job.mode, "levels": job.levels, "refine_steps": job.refine_steps,
                 "error_limit": job.error_limit},
        "slo": job.slo,
        "level": {"duration_s": job.duration_s, "warmup_s": job.warmup_s,
                  "max_requests": job.max_requests},
    }
