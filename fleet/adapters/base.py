"""Common types of the serving-engine adapters (Triton, vLLM).

Adapters talk HTTP to one inference server and translate its answers into these plain,
engine-neutral values. They are plain Python: no Django, no settings.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import httpx

T = TypeVar("T")


class AdapterError(Exception):
    """A failed call to an inference server.

    ``permanent`` is True when retrying the same call cannot help (bad request, unknown
    model, rejected config); False for transient failures (timeouts, connection errors, 5xx).
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


@dataclass(frozen=True)
class ModelState:
    """One model version as the server reports it (e.g. READY, UNAVAILABLE, LOADING)."""

    name: str
    version: str
    state: str
    reason: str = ""


@dataclass(frozen=True)
class ServerProbe:
    """Outcome of one health probe of an inference server.

    ``error`` is empty when every call of the probe succeeded; ``latency_ms`` is the wall
    time of the whole probe.
    """

    ready: bool
    live: bool
    version: str = ""
    models: list[ModelState] = field(default_factory=list)
    error: str = ""
    latency_ms: float = 0.0


@runtime_checkable
class ServerProbeAdapter(Protocol):
    """Anything that can probe a server; the modules ``fleet.adapters.triton`` and
    ``fleet.adapters.vllm`` satisfy it through their module-level ``probe``."""

    def probe(self, http_url: str, timeout: float) -> ServerProbe:
        """Probe the server at ``http_url``; never raise, answer within ``timeout`` s."""
        ...


class ProbeFailed(Exception):
    """Internal: a probe step failed at transport level (message is user-readable)."""


_tls: ssl.SSLContext | None = None
_tls_lock = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """The process's one TLS context for outgoing HTTPS (the system's CA bundle). Building one
    reads that bundle, about 25 ms of CPU: a health round over a thousand servers would pay it
    a thousand times."""
    global _tls
    with _tls_lock:
        if _tls is None:
            _tls = ssl.create_default_context()
        return _tls


def http_client(**options: Any) -> httpx.Client:
    """An httpx client on the shared TLS context (``verify`` may still be given)."""
    options.setdefault("verify", tls_context())
    return httpx.Client(**options)


def describe_http_error(exc: httpx.HTTPError, url: str, timeout: float) -> str:
    """Turn an httpx transport error into a short, readable sentence naming ``url``."""
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out after {timeout:.1f} s at {url}"
    if isinstance(exc, httpx.ConnectError):
        text = str(exc)
        if "refused" in text.lower() or "Errno 111" in text:
            return f"connection refused at {url}"
        return f"cannot connect to {url}: {text or type(exc).__name__}"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"not an HTTP answer from {url}: {exc}"
    return f"{type(exc).__name__} at {url}: {exc}"


class Deadline:
    """A wall-clock budget shared by the requests of one probe."""

    def __init__(self, seconds: float, *, margin: float = 0.0) -> None:
        """Budget of ``seconds`` (the figure reported in errors), ending ``margin`` s early."""
        self.seconds = seconds
        self.end = time.monotonic() + seconds - margin

    def remaining(self) -> float:
        """Seconds left (at least a millisecond, so httpx never gets 0 = no timeout)."""
        return max(self.end - time.monotonic(), 0.001)

    def expired(self) -> bool:
        """True once the budget is spent."""
        return time.monotonic() >= self.end


def request(
    client: httpx.Client,
    method: str,
    url: str,
    deadline: Deadline,
    *,
    json_body: object | None = None,
) -> tuple[int, bytes]:
    """Send one request within ``deadline``; return (status, body) or raise ProbeFailed.

    The body is streamed and the deadline checked between chunks, so a server that trickles
    bytes cannot hold the probe past its budget.
    """
    timeout = httpx.Timeout(deadline.remaining())
    try:
        with client.stream(method, url, json=json_body, timeout=timeout) as response:
            chunks = []
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if deadline.expired():
                    raise httpx.ReadTimeout("deadline", request=response.request)
            return response.status_code, b"".join(chunks)
    except httpx.HTTPError as exc:
        raise ProbeFailed(describe_http_error(exc, url, deadline.seconds)) from exc


def run_with_deadline(fn: Callable[[], T], timeout: float, on_timeout: Callable[[], T]) -> T:
    """Run ``fn`` in a daemon thread; return ``on_timeout()`` if it has not finished in time.

    A hard upper bound on the caller's wait whatever the server does; ``fn`` must bound its
    own requests (it does, through :func:`request`) so the thread ends soon afterwards.
    """
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="server-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if failure:
        raise failure[0]
    if result:
        return result[0]
    return on_timeout()


@dataclass(frozen=True)
class Call:
    """One request of a probe: what :func:`run_steps` (or an event loop) sends for it."""

    method: str
    url: str
    json_body: object | None = None


#: A probe as the requests it makes: it yields each Call, is sent back (status, body), has a
#: transport failure thrown into it as ProbeFailed, and returns the ServerProbe. The same steps
#: run on a blocking client (:func:`run_steps`) or on an event loop
#: (``fleet.adapters.metrics.fetcher``), so both probe a server alike.
ProbeSteps = Generator[Call, tuple[int, bytes], ServerProbe]


def run_steps(steps: ProbeSteps, client: httpx.Client, deadline: Deadline) -> ServerProbe:
    """Run a probe's steps with ``client``, each request within ``deadline``."""
    try:
        call = next(steps)
        while True:
            try:
                answer = request(client, call.method, call.url, deadline, json_body=call.json_body)
            except ProbeFailed as exc:
                call = steps.throw(exc)
                continue
            call = steps.send(answer)
    except StopIteration as done:
        return done.value


def timed_out(base: str, timeout: float, start: float) -> ServerProbe:
    """What a probe that ran out of time says."""
    return ServerProbe(ready=False, live=False, error=f"timed out after {timeout:.1f} s at {base}",
                       latency_ms=elapsed_ms(start))


def probe_within(
    http_url: str, timeout: float, steps: Callable[[str, float], ServerProbe]
) -> ServerProbe:
    """Run an engine's probe ``steps(base_url, start)`` with a hard deadline.

    Whatever the server does, the answer comes within ``timeout``: past it, a not-ready
    ServerProbe naming the URL and the time waited.
    """
    base = http_url.rstrip("/")
    start = time.monotonic()

    return run_with_deadline(lambda: steps(base, start), timeout,
                             lambda: timed_out(base, timeout, start))


def elapsed_ms(start: float) -> float:
    """Milliseconds since ``start`` (a ``time.monotonic()`` reading)."""
    return (time.monotonic() - start) * 1000.0


def parse_json(body: bytes, url: str) -> object:
    """Decode a JSON answer, or fail the probe naming the URL."""
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ProbeFailed(f"invalid JSON from {url}") from exc


# --------------------------------------------------------------------------------------------
# Model loads: artifact stores and server runtimes
# --------------------------------------------------------------------------------------------

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total)
READY = "READY"  # the state a runtime's ``status`` answers for a version it serves


@runtime_checkable
class ArtifactStore(Protocol):
    """Where model artifacts live (S3 and S3-compatible stores)."""

    def fetch(self, uri: str, *, sha256: str, size: int, progress: ProgressFn | None = None) -> Path:
        """Return a local path of the verified artifact, downloading it unless cached.

        Verifies size and sha256 while streaming. Raises AdapterError: permanent for a
        missing bucket or key, denied access, a size or digest mismatch; transient for
        connection errors and timeouts. Safe to call again: a cached digest is not fetched.
        """
        ...


@dataclass(frozen=True)
class LoadedVersion:
    """A model version a runtime has made ready, with the hash of the config it runs with."""

    model: str
    version: int
    config_hash: str
    config: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class ServerRuntime(Protocol):
    """Loads and unloads model versions on one inference server. Every call is idempotent."""

    def place(self, model: str, version: int, artifact: Path, *, folder: str | None = None) -> None:
        """Put the version's files where the server reads them (no-op when already there).

        ``model`` is the name on this server; ``folder``, where it differs, the name the
        artifact was built under (its top-level folder, for runtimes whose artifacts have
        one)."""
        ...

    def load(self, model: str, version: int, config: dict[str, object], timeout: float) -> LoadedVersion:
        """Make the version ready with ``config`` applied, keeping the model's other loaded
        versions; a no-op when it already runs with that config. Raises AdapterError with the
        server's explanation (and its log line, when the server has a log) on failure."""
        ...

    def unload(self, model: str, version: int, timeout: float) -> None:
        """Stop serving the version and wait until the server says so (no-op when not loaded)."""
        ...

    def remove(self, model: str, version: int) -> None:
        """Delete the version's placed files (no-op when absent)."""
        ...

    def status(self, model: str, version: int, timeout: float | None = None) -> str:
        """The version's state as the server reports it now: ``READY``, ``LOADING``,
        ``UNLOADING``, ``UNAVAILABLE``, or "" when the server does not list it. Raises
        AdapterError when the server cannot be asked."""
        ...

    def served(self, model: str, version: int, timeout: float | None = None) -> LoadedVersion:
        """The config the version runs with now and its hash, read from the server.

        Raises AdapterError (permanent) when the version is not loaded."""
        ...
