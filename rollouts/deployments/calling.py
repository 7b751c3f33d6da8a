"""How a client calls a deployment: the URL to call (its route's once one is in force, a
server's until then), the model's inputs and outputs as the serving Triton reports them, and
a curl example that works as pasted.

Triton versions: the inputs come from the server's KServe v2 metadata
(``GET /v2/models/<model>/versions/<n>``), cached a few minutes since a loaded version does not
change; when the server cannot say, from the version's registered Triton config, and the guide
says so. vLLM versions speak the OpenAI API: the example is a chat completion under the name
the server serves the version as.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.cache import cache

from fleet.adapters import triton
from fleet.adapters.base import ProbeFailed
from fleet.adapters.routers.base import KSERVE_V2, OPENAI
from fleet.adapters.vllm import adapter_name
from fleet.models import Cluster, InferenceServer
from rollouts.models import Deployment, ModelLoad, ModelVersion, Route
from rollouts.traffic.routes import PRODUCTION_ALIAS

METADATA_CACHE_S = 300
METADATA_TIMEOUT_S = 2.0
MAX_EXAMPLE_VALUES = 4096  # beyond this the example names the shape and leaves the data to the caller

Metadata = Callable[[str, str, int], dict[str, Any]]


@dataclass
class CallGuide:
    """What the deployment page shows under "How to call it"."""

    base_url: str
    through: str  # "route" or "server"
    server: str
    protocol: str
    model: str  # the name a request names
    version: int
    endpoint: str  # where an inference is sent
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""  # "server" (its metadata), "config" (the registered config), "openai"
    note: str = ""  # why the server's own metadata is not shown
    curl: str = ""


def fetch_metadata(http_url: str, model: str, version: int) -> dict[str, Any]:
    """The server's metadata of a loaded version, cached (ProbeFailed when it cannot say)."""
    key = f"switchyard:metadata:{http_url}:{model}:{version}"
    found = cache.get(key)
    if found is None:
        found = triton.model_metadata(http_url, model, version, METADATA_TIMEOUT_S)
        cache.set(key, found, METADATA_CACHE_S)
    return found


def guide(deployment: Deployment, *, metadata: Metadata = fetch_metadata) -> CallGuide | None:
    """How to call ``deployment`` now, or None while no version is ready on its servers."""
    ready = list(
        ModelLoad.objects.filter(deployment=deployment, state=ModelLoad.State.READY,
                                 server__in=deployment.servers.all())
        .select_related("version", "server").order_by("-version__version", "server__name")
    )
    if not ready:
        return None
    route = Route.objects.filter(pk=deployment.pk, state=Route.State.IN_FORCE).exclude(url="").first()
    load = _serving(deployment, ready, route)
    version, server = load.version, load.server
    if server.runtime == InferenceServer.Runtime.VLLM:
        return _openai(deployment, version, server, route)
    return _kserve(deployment, version, server, route, metadata)


def _serving(deployment: Deployment, ready: list[ModelLoad], route: Route | None) -> ModelLoad:
    """The load whose version a client most likely reaches: the route's heaviest variant, else
    the version @production names, else the newest ready one."""
    wanted = None
    if route is not None:
        heaviest = max(route.split(), key=lambda row: row["weight"], default=None)
        wanted = heaviest["version"] if heaviest else None
    if wanted is None:
        alias = deployment.model.aliases.filter(name=PRODUCTION_ALIAS).select_related("version").first()
        wanted = alias.version.version if alias else None
    return next((load for load in ready if load.version.version == wanted), ready[0])


def _sticky(route: Route | None) -> str:
    if route is None or route.policy != Route.Policy.STICKY or not route.sticky_header:
        return ""
    return f" -H {shlex.quote(f'{route.sticky_header}: user-42')}"


def _kserve(deployment: Deployment, version: ModelVersion, server: InferenceServer,
            route: Route | None, metadata: Metadata) -> CallGuide:
    # Through an nginx route, by the model's own name (nginx rewrites it to the name on the
    # server); on the server itself, or through a Kubernetes route (an HTTPRoute or a
    # VirtualService passes the path through), by its name on the server.
    rewritten = route is not None and deployment.cluster.kind != Cluster.Kind.KUBERNETES
    model = deployment.model.name if rewritten else version.name_on(server)
    base = route.url if route is not None else server.http_url.rstrip("/")
    path = f"/v2/models/{model}" if route is not None else f"/v2/models/{model}/versions/{version.version}"
    found = CallGuide(base_url=base, through="route" if route else "server", server=server.name,
                      protocol=KSERVE_V2, model=model, version=version.version,
                      endpoint=f"{base}{path}/infer")
    try:
        meta = metadata(server.http_url, version.name_on(server), version.version)
        found.inputs, found.outputs = _tensors(meta.get("inputs")), _tensors(meta.get("outputs"))
        found.source = "server"
    except ProbeFailed as exc:
        found.note = f"{server.name} did not say ({exc}); shown from v{version.version}'s registered config"
        found.inputs, found.outputs = _from_config(version, "input"), _from_config(version, "output")
        found.source = "config"
    body = json.dumps(example_body(found))
    found.curl = (
        f"# the model's inputs and outputs\n"
        f"curl -s {base}{path}\n"
        f"# an inference\n"
        f"curl -s -X POST {found.endpoint}{_sticky(route)} "
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)}"
    )
    return found


def _openai(deployment: Deployment, version: ModelVersion, server: InferenceServer,
            route: Route | None) -> CallGuide:
    served = adapter_name(deployment.model.name, version.version) if version.adapter_of else deployment.model.name
    base = route.url if route is not None else server.http_url.rstrip("/")
    found = CallGuide(
        base_url=base, through="route" if route else "server", server=server.name,
        protocol=OPENAI, model=served, version=version.version,
        endpoint=f"{base}/v1/chat/completions", source="openai",
        inputs=[{"name": "messages", "datatype": "chat messages", "shape": "[{role, content}, …]"}],
        outputs=[{"name": "choices[0].message.content", "datatype": "text", "shape": ""}],
    )
    body = json.dumps(example_body(found))
    found.curl = (f"curl -s {found.endpoint}{_sticky(route)} "
                  f"-H 'Content-Type: application/json' -d {shlex.quote(body)}")
    return found


def _tensors(entries: Any) -> list[dict[str, Any]]:
    """KServe v2 tensor descriptions, kept to name, datatype and shape."""
    if not isinstance(entries, list):
        return []
    return [{"name": str(e.get("name", "")), "datatype": str(e.get("datatype", "")),
             "shape": [int(d) for d in e.get("shape", []) if isinstance(d, int | str) and str(d).lstrip("-").isdigit()]}
            for e in entries if isinstance(e, dict)]


def _from_config(version: ModelVersion, key: str) -> list[dict[str, Any]]:
    """Tensors as the registered config states them (``dims`` without the batch dimension,
    which a model with ``max_batch_size`` adds in front, as Triton's metadata shows it)."""
    config = version.triton_config or {}
    batch = [-1] if int(config.get("max_batch_size") or 0) > 0 else []
    return [{"name": str(t.get("name", "")),
             "datatype": str(t.get("data_type", "TYPE_FP32")).removeprefix("TYPE_"),
             "shape": batch + [int(d) for d in t.get("dims", []) if str(d).lstrip("-").isdigit()]}
            for t in config.get(key) or [] if isinstance(t, dict)]


EXAMPLE_VALUES = {"BYTES": "text", "BOOL": False}


def example_body(found: CallGuide) -> dict[str, Any]:
    """The JSON body of one inference the guide's model answers: a KServe v2 request with
    every input the model declares, or an OpenAI chat completion (the curl example's body,
    and what ``manage.py demo_traffic`` sends)."""
    if found.protocol == OPENAI:
        return {"model": found.model, "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 32}
    return {"inputs": [_example(tensor) for tensor in found.inputs]}


def _example(tensor: dict[str, Any]) -> dict[str, Any]:
    """One input of an inference request: variable dimensions (-1) as 1, filled with zeros
    (``"text"`` for BYTES, false for BOOL)."""
    shape = [d if d > 0 else 1 for d in tensor["shape"]] or [1]
    count = math.prod(shape)
    value = EXAMPLE_VALUES.get(tensor["datatype"], 0)
    data = [value] * count if count <= MAX_EXAMPLE_VALUES else []
    return {"name": tensor["name"], "shape": shape, "datatype": tensor["datatype"], "data": data}
