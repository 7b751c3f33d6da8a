"""A fleet simulator for scale work: one asyncio process serving many simulated Triton and
vLLM servers on 127.0.0.1, in the spirit of KWOK's simulated nodes.

Each server listens on a port of its own, so a dead one refuses connections as a real one
does, and Switchyard reaches it through an ``http_url`` and ``metrics_url`` like any other:

* Triton: ``GET /v2/health/live``, ``/v2/health/ready``, ``/v2`` (server metadata),
  ``POST /v2/repository/index``, ``GET /v2/models/<m>/versions/<v>`` and ``GET /metrics``
  (the metrics a real Triton answers on its metrics port; the simulator answers them on the
  same port);
* vLLM: ``GET /health``, ``/version``, ``/v1/models`` and ``/metrics``.

``/metrics`` is the real servers' text (:mod:`local.fleetsim_metrics`), its counters moving
with each served model version's :class:`~local.fleetsim_metrics.Traffic`. A server is in one
of the :data:`STATES`: ``ok``; ``slow`` (every answer comes after ``delay_s``); ``hung``
(connections are accepted, requests never answered); ``dead`` (the port refuses connections
and open connections are closed at their next request); ``unready`` (alive, health says not
ready). A small control API on its own port shows and changes servers while it runs:

* ``GET /control/servers``: every server (index, kind, URLs, state, models, traffic);
* ``POST /control/servers/<i>`` (or ``/control/servers/all``) with any of ``{"state": "hung",
  "delay_s": 2, "models": ["m:1", "m:2"], "traffic": {"rps": 50, "latency_ms": 8}}``.

It binds 127.0.0.1 only and always stops by itself (``seconds``). Start it with
``manage.py fleet_sim``, ``python -m local.fleetsim``, or :class:`FleetThread` in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from local.fleetsim_metrics import PAGES, TRITON_VERSION, VLLM_VERSION, Series, Traffic

HOST = "127.0.0.1"
KINDS = ("triton", "vllm")
STATES = ("ok", "slow", "hung", "dead", "unready")
MAX_SECONDS = 24 * 3600
MAX_SERVERS = 5000


@dataclass
class SimServer:
    """One simulated server: where it listens, what it serves and how it behaves."""

    index: int
    kind: str
    port: int
    traffic: Traffic
    state: str = "ok"
    delay_s: float = 3.0
    series: list[Series] = field(default_factory=list)
    listener: asyncio.AbstractServer | None = field(default=None, repr=False)

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.http_url}/metrics"

    def serve(self, models: list[tuple[str, str]]) -> None:
        """Serve exactly ``models`` ((name, version) pairs): ones already served keep their
        counters, new ones start at 0, others vanish (a load and an unload)."""
        keep = {(s.model, s.version): s for s in self.series}
        self.series = [keep.get(m) or Series(self.kind, m[0], m[1], self.traffic) for m in models]

    def describe(self) -> dict[str, Any]:
        """The server as the control API shows it."""
        return {
            "index": self.index, "kind": self.kind, "http_url": self.http_url,
            "metrics_url": self.metrics_url, "state": self.state, "delay_s": self.delay_s,
            "models": [f"{s.model}:{s.version}" if s.version else s.model for s in self.series],
            "traffic": asdict(self.traffic),
        }


@dataclass
class FleetConfig:
    """What to serve: ``triton`` and ``vllm`` servers, ``models`` per server (Triton: each
    with ``versions``), the same traffic on every model version, and servers by index that
    start in another state than ``ok``."""

    triton: int = 1
    vllm: int = 0
    models: int = 1
    versions: int = 1
    model_prefix: str = "model"
    traffic: Traffic = field(default_factory=Traffic)
    states: dict[int, str] = field(default_factory=dict)
    delay_s: float = 3.0
    base_port: int = 0  # 0: the system picks free ports
    control_port: int = 0
    seconds: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.triton + self.vllm <= MAX_SERVERS or min(self.triton, self.vllm) < 0:
            raise ValueError(f"serve between 1 and {MAX_SERVERS} servers")
        if self.models < 1 or self.versions < 1:
            raise ValueError("models and versions must be >= 1")
        if not 0 < self.seconds <= MAX_SECONDS:
            raise ValueError(f"seconds must be within (0, {MAX_SECONDS}]")
        for index, state in self.states.items():
            if state not in STATES or not 0 <= index < self.triton + self.vllm:
                raise ValueError(f"server {index}: no such server or state {state!r}")

    def models_of(self, kind: str) -> list[tuple[str, str]]:
        """The (model, version) pairs a ``kind`` server serves at start (vLLM: no versions)."""
        names = [f"{self.model_prefix}-{k}" for k in range(self.models)]
        if kind == "vllm":
            return [(name, "") for name in names]
        return [(name, str(v)) for name in names for v in range(1, self.versions + 1)]


def _parse_models(value: object) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not all(isinstance(m, str) and m for m in value):
        raise ValueError("models must be a list of \"name\" or \"name:version\" strings")
    return [(m.partition(":")[0], m.partition(":")[2]) for m in value]


class Fleet:
    """The simulated servers and the asyncio servers that answer for them."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.servers: list[SimServer] = []
        self.by_port: dict[int, SimServer] = {}
        self.stopping = asyncio.Event()
        self.control_url = ""
        self._runners: list[web.AppRunner] = []
        self._handler_factory: web.Server | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen for every server (a dead one's port is closed again) and the control API."""
        cfg = self.config
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a hung request ends when its client gives up, so hung servers
        # scraped every second for an hour do not pile up waiting handlers.
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               handler_cancellation=True)
        await runner.setup()
        self._runners.append(runner)
        self._handler_factory = runner.server
        kinds = ["triton"] * cfg.triton + ["vllm"] * cfg.vllm
        for index, kind in enumerate(kinds):
            port = cfg.base_port + index if cfg.base_port else 0
            server = SimServer(index, kind, port, cfg.traffic, delay_s=cfg.delay_s)
            server.serve(cfg.models_of(kind))
            await self._listen(server)
            server.state = cfg.states.get(index, "ok")
            if server.state == "dead":
                await self._close(server)
            self.servers.append(server)
        control = web.Application()
        control.router.add_get("/control/servers", self._control_list)
        control.router.add_post("/control/servers/{which}", self._control_change)
        crunner = web.AppRunner(control, access_log=None, handle_signals=False)
        await crunner.setup()
        self._runners.append(crunner)
        site = web.TCPSite(crunner, HOST, cfg.control_port)
        await site.start()
        self.control_url = f"http://{HOST}:{crunner.addresses[0][1]}"

    async def _listen(self, server: SimServer) -> None:
        loop = asyncio.get_running_loop()
        assert self._handler_factory is not None
        listener = await loop.create_server(self._handler_factory, HOST, server.port,
                                            reuse_address=True, backlog=512)
        server.port = listener.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        server.listener = listener
        self.by_port[server.port] = server

    async def _close(self, server: SimServer) -> None:
        if server.listener is not None:
            server.listener.close()
            server.listener = None

    async def run(self) -> None:
        """Serve until ``seconds`` have passed or :meth:`stop` is called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), self.config.seconds)
        await self.close()

    def stop(self) -> None:
        """Make :meth:`run` return (from the fleet's own loop)."""
        self.stopping.set()

    async def close(self) -> None:
        """Stop listening, end hung requests and close every connection."""
        self.stopping.set()  # hung requests end now
        for server in self.servers:
            await self._close(server)
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()

    def describe(self) -> dict[str, Any]:
        """Where the control API and every server are, as the control API answers it."""
        return {"control_url": self.control_url, "pid": os.getpid(),
                "seconds": self.config.seconds,
                "servers": [s.describe() for s in self.servers]}

    # -- changes -----------------------------------------------------------------------------
    async def change(self, server: SimServer, body: dict[str, Any]) -> None:
        """Apply a control request's ``body`` to ``server``; ValueError naming what is wrong."""
        unknown = set(body) - {"state", "delay_s", "models", "traffic"}
        if unknown:
            raise ValueError(f"unknown fields: {', '.join(sorted(unknown))}")
        state = body.get("state", server.state)
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")
        delay = float(body.get("delay_s", server.delay_s))
        if not 0 <= delay <= 600:
            raise ValueError("delay_s must be within [0, 600]")
        models = _parse_models(body["models"]) if "models" in body else None
        traffic = server.traffic
        if "traffic" in body:
            if not isinstance(body["traffic"], dict):
                raise ValueError("traffic must be an object")
            traffic = traffic.with_changes(body["traffic"])
        server.delay_s = delay
        if traffic != server.traffic:
            now = time.monotonic()
            server.traffic = traffic
            for series in server.series:
                series.retune(traffic, now)
        if models is not None:
            server.serve(models)
        if state == "dead" and server.listener is not None:
            await self._close(server)
        elif state != "dead" and server.listener is None:
            await self._listen(server)
        server.state = state

    async def _control_list(self, request: web.Request) -> web.Response:
        return web.json_response(self.describe())

    async def _control_change(self, request: web.Request) -> web.Response:
        which = request.match_info["which"]
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            if which == "all":
                targets = self.servers
            elif which.isdigit() and int(which) < len(self.servers):
                targets = [self.servers[int(which)]]
            else:
                return web.json_response({"error": f"no server {which}"}, status=404)
            for server in targets:
                await self.change(server, body)
        except (TypeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response([s.describe() for s in targets])

    # -- the simulated servers' answers --------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        server = self.by_port.get(sockname[1]) if sockname else None
        if server is None or server.state == "dead":
            if request.transport is not None:
                request.transport.close()
            raise web.HTTPServiceUnavailable
        if server.state == "hung":
            await self.stopping.wait()
            if request.transport is not None:
                request.transport.close()
            raise web.HTTPServiceUnavailable
        if server.state == "slow":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), server.delay_s)
        answer = (_triton if server.kind == "triton" else _vllm)(server, request)
        if answer is None:
            return web.json_response({"error": f"{request.method} {request.path}: not found"},
                                     status=404)
        return answer


def _metrics(server: SimServer) -> web.Response:
    text = PAGES[server.kind](server.series)
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


def _triton(server: SimServer, request: web.Request) -> web.Response | None:
    method, path = request.method, request.path
    ready = server.state != "unready"
    if method == "GET" and path == "/metrics":
        return _metrics(server)
    if method == "GET" and path == "/v2/health/live":
        return web.Response(status=200)
    if method == "GET" and path == "/v2/health/ready":
        return web.Response(status=200 if ready else 400)
    if method == "GET" and path == "/v2":
        return web.json_response({"name": "triton", "version": TRITON_VERSION, "extensions": [
            "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
            "schedule_policy", "model_configuration", "system_shared_memory",
            "cuda_shared_memory", "binary_tensor_data", "parameters", "statistics", "trace",
            "logging"]})
    if method == "POST" and path == "/v2/repository/index":
        return web.json_response([{"name": s.model, "version": s.version, "state": "READY"}
                                  for s in server.series])
    if method == "GET" and path.startswith("/v2/models/"):
        parts = path.split("/")  # "", v2, models, <m>, versions, <v>
        for s in server.series:
            if len(parts) == 6 and parts[3:] == [s.model, "versions", s.version]:
                return web.json_response({
                    "name": s.model, "versions": [s.version], "platform": "python",
                    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
                    "outputs": [{"name": "SCORE", "datatype": "FP32", "shape": [1]}]})
    return None


def _vllm(server: SimServer, request: web.Request) -> web.Response | None:
    method, path = request.method, request.path
    if method != "GET":
        return None
    if path == "/metrics":
        return _metrics(server)
    if path == "/health":
        return web.Response(status=200 if server.state != "unready" else 503)
    if path == "/version":
        return web.json_response({"version": VLLM_VERSION})
    if path == "/v1/models":
        return web.json_response({"object": "list", "data": [
            {"id": s.model, "object": "model", "created": int(s.created), "owned_by": "vllm",
             "root": s.model, "parent": None, "max_model_len": 2048, "permission": []}
            for s in server.series]})
    return None


# -- running it --------------------------------------------------------------------------------
async def serve(config: FleetConfig, on_ready: Any = None) -> None:
    """Start the fleet, call ``on_ready(fleet)`` and serve until ``config.seconds`` pass."""
    fleet = Fleet(config)
    try:
        await fleet.start()
        if on_ready is not None:
            on_ready(fleet)
        await fleet.run()
    finally:
        await fleet.close()


class FleetThread:
    """The fleet on an event loop of its own in a daemon thread (tests, benchmarks)::

        with FleetThread(FleetConfig(triton=3, seconds=60)) as fleet:
            fleet.servers[0].metrics_url
    """

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.fleet: Fleet | None = None
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="fleetsim", daemon=True)

    def _main(self) -> None:
        def ready(fleet: Fleet) -> None:
            self.fleet = fleet
            self._ready.set()

        try:
            self.loop.run_until_complete(serve(self.config, ready))
        except BaseException as exc:  # handed to the starting thread
            self._error = exc
        finally:
            self._ready.set()
            self.loop.close()

    def __enter__(self) -> Fleet:
        self._thread.start()
        self._ready.wait(60)
        if self.fleet is None:
            raise RuntimeError(f"the fleet simulator did not start: {self._error!r}")
        return self.fleet

    def __exit__(self, *exc: object) -> None:
        if self.fleet is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.fleet.stop)
        self._thread.join(30)

    def call(self, coro: Any, timeout: float = 10.0) -> Any:
        """Run ``coro`` on the fleet's loop from another thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def _states(spec: str, state: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        out.update(dict.fromkeys(range(int(lo), int(hi or lo) + 1), state))
    return out


DESCRIPTION = "Serve simulated Triton and vLLM servers on 127.0.0.1 for scale tests and benchmarks."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The simulator's command-line options (``python -m local.fleetsim``, ``fleet_sim``)."""
    p.add_argument("--triton", type=int, default=10, help="Triton servers (default 10)")
    p.add_argument("--vllm", type=int, default=0, help="vLLM servers (default 0)")
    p.add_argument("--models", type=int, default=1, help="models per server")
    p.add_argument("--versions", type=int, default=1, help="versions per Triton model")
    p.add_argument("--model-prefix", default="model", help="model names: <prefix>-<k>")
    p.add_argument("--rps", type=float, default=10.0, help="requests/s per model version")
    p.add_argument("--error-rate", type=float, default=0.0, help="share of requests failing")
    p.add_argument("--latency-ms", type=float, default=20.0, help="median request latency")
    p.add_argument("--spread", type=float, default=0.3, help="sigma of log latency")
    p.add_argument("--ttft-ms", type=float, default=50.0, help="vLLM median time to 1st token")
    p.add_argument("--output-tokens", type=int, default=64, help="vLLM tokens per answer")
    for state in ("slow", "hung", "dead", "unready"):
        p.add_argument(f"--{state}", default="", metavar="I,J-K",
                       help=f"indexes of servers that start {state}")
    p.add_argument("--delay-s", type=float, default=3.0, help="how late slow servers answer")
    p.add_argument("--base-port", type=int, default=0,
                   help="server i listens on base-port + i (default: free ports)")
    p.add_argument("--control-port", type=int, default=0, help="control API port")
    p.add_argument("--seconds", type=float, default=300.0,
                   help=f"stop after this long (at most {MAX_SECONDS})")
    p.add_argument("--json", action="store_true", help="print the servers as one JSON object")


def config_from(args: argparse.Namespace) -> FleetConfig:
    traffic = Traffic(rps=args.rps, error_rate=args.error_rate, latency_ms=args.latency_ms,
                      spread=args.spread, ttft_ms=args.ttft_ms, output_tokens=args.output_tokens)
    states: dict[int, str] = {}
    for state in ("slow", "hung", "dead", "unready"):
        states.update(_states(getattr(args, state), state))
    return FleetConfig(triton=args.triton, vllm=args.vllm, models=args.models,
                       versions=args.versions, model_prefix=args.model_prefix,
                       traffic=traffic, states=states, delay_s=args.delay_s,
                       base_port=args.base_port, control_port=args.control_port,
                       seconds=args.seconds)


def announce(fleet: Fleet, as_json: bool, out: Any = None) -> None:
    """Print where each server is: one JSON object, or a line per server."""
    out = out or sys.stdout
    if as_json:
        out.write(json.dumps(fleet.describe()) + "\n")
    else:
        out.write(f"fleet simulator: {len(fleet.servers)} servers for "
                  f"{fleet.config.seconds:g} s; control {fleet.control_url}/control/servers\n")
        for s in fleet.servers:
            out.write(f"{s.index:5d} {s.kind:6s} {s.state:7s} {s.http_url} {s.metrics_url}\n")
    out.flush()


def run(args: argparse.Namespace, out: Any = None) -> int:
    """Serve the fleet the parsed options describe until its time is up, printing where each
    server is to ``out`` (standard output); the exit status."""
    try:
        config = config_from(args)
    except ValueError as exc:
        sys.stderr.write(f"fleet simulator: {exc}\n")
        return 2
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    # A runner of its own, not a process-wide loop policy: the command may run inside a test.
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=loop_factory) as rn:
        rn.run(serve(config, lambda fleet: announce(fleet, args.json, out)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=DESCRIPTION)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
