"""Model loads on an NVIDIA Triton Inference Server in explicit model-control mode.

:class:`TritonServerRuntime` implements :class:`fleet.adapters.base.ServerRuntime` for one
tritonserver whose model repository is a local directory: ``place`` unpacks a version artifact
into the repository, ``load`` / ``unload`` drive Triton's repository API (``tritonclient.http``)
and ``remove`` deletes placed files. Every call is idempotent. The repository's files are
``fleet.adapters.triton_repository``'s, the configs a load sends and compares
``fleet.adapters.triton_model_config``'s.

Facts about Triton 2.51 this module is built on (measured; see ``shared/design/TRITON.md``):

* Triton keeps **one config per model**. A load names the versions to serve through
  ``version_policy``; a version already loaded with an equal config (``version_policy``
  aside) and unchanged files is kept as is, one whose config differs only in instance count
  is scaled in place, any other difference reloads it (the old instance serves until the new
  one is ready). A failed reload leaves the old instance serving.
* "Unchanged files" is judged **per version folder, by modification time**: the python
  backend writes ``<version>/__pycache__/model.cpython-3XX.pyc`` the first time it imports
  ``model.py``, and that write alone makes the *next* load of the model reload that version
  (loading v2 reloaded v1; changing the instance count became a full reload). ``place``
  therefore precompiles the ``.py`` files of a version before moving it into the
  repository; this helps when the backend stub runs the same Python minor as this process
  (true of the local runtime). Elsewhere, run the server with ``PYTHONDONTWRITEBYTECODE=1``.
* An override load with an identical config and unchanged files is a no-op on the server
  too; :meth:`TritonServerRuntime.load` still decides no-ops itself
  (``config_difference``) so that it does not have to send anything.
* The per-version config read back (``GET /v2/models/<m>/versions/<v>/config``) keeps the
  ``version_policy`` of the load that (re)created that version: after loading v2 next to v1,
  v1 still reports ``specific [1]``. Hashes therefore leave ``version_policy`` out.
* A load whose config.pbtxt (or override) Triton rejects while polling the repository answers
  a generic HTTP 500 "failed to poll from model repository"; the cause is only in the server
  log, which is why a ``log_path`` makes the errors readable.

Plain Python: no Django, no settings.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import tritonclient.http as triton_http
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from fleet.adapters.base import AdapterError, Deadline, LoadedVersion
from fleet.adapters.triton_model_config import (
    config_difference,
    config_hash,
    config_message,
    effective_config,
)
from fleet.adapters.triton_repository import CONFIG_NAME, ModelRepository, check_names

log = logging.getLogger(__name__)
T = TypeVar("T")

READY = "READY"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
UNAVAILABLE = "UNAVAILABLE"
POLL_INTERVAL = 0.02  # Triton settles in ~0.1 s steps: do not add a step of our own
# After a load call that succeeded, how long a version that is not READY (and not LOADING) is
# given to become READY before the load is reported as failed.
SETTLE_SECONDS = 2.0
LOG_LINES = 8
LOG_LINE_CHARS = 2000
GENERIC_POLL_FAILURE = "failed to poll from model repository"
TRITON_LOG_ERROR_RE = re.compile(r"^E\d{4} |libprotobuf ERROR")

# --------------------------------------------------------------------------------------------
# The runtime
# --------------------------------------------------------------------------------------------


class TritonServerRuntime:
    """Loads and unloads model versions on one tritonserver (explicit model-control mode).

    ``http_url`` is the server's HTTP endpoint ("http://127.0.0.1:8000"; "https://" uses
    TLS), ``model_repository`` the local directory it serves from, ``log_path`` its log file
    when this process can read it (its lines explain the server's generic errors), and
    ``timeout`` the default budget in seconds of ``load`` / ``unload`` and the bound of every
    other server call.

    The repository's files and working files are its :class:`ModelRepository`'s
    (``fleet.adapters.triton_repository``). Calls on one model are serialised across threads
    and processes of this host by the repository's lock file; calls on different models run in
    parallel.
    """

    def __init__(
        self,
        http_url: str,
        model_repository: Path,
        *,
        log_path: Path | None = None,
        timeout: float = 60,
    ) -> None:
        """Bind the runtime to one server and its repository; no call is made yet."""
        url = http_url.strip().rstrip("/")
        self.http_url = url
        self.ssl = url.startswith("https://")
        self._address = re.sub(r"^https?://", "", url)
        self.repository = ModelRepository(model_repository)
        self.model_repository = self.repository.path
        self.log_path = Path(log_path) if log_path is not None else None
        self.timeout = float(timeout)

    def __repr__(self) -> str:
        """The server URL and repository, for logs."""
        return f"TritonServerRuntime({self.http_url!r}, {str(self.model_repository)!r})"

    # -- place / remove -----------------------------------------------------------------------

    def place(self, model: str, version: int, artifact: Path, *, folder: str | None = None) -> None:
        """Put ``<folder>/<version>/`` of ``artifact`` into the repository as
        ``<model>/<version>/`` (idempotent).

        ``artifact`` is a .tar.gz (or a directory) holding ``<folder>/config.pbtxt`` and
        ``<folder>/<version>/...``; ``folder`` is the name the model was built under (default:
        ``model``), which may differ from its name on this server (a tenant-qualified one). It is extracted safely into a staging folder next to the
        repository, and the version folder is moved into ``<repo>/<model>/<version>/`` with a
        rename. A version folder with the same content (:func:`tree_hash`) is left untouched;
        one with other content is replaced (two renames: the old folder out, the new one in),
        and the next :meth:`load` of that version reloads it even if its config is unchanged.

        ``<repo>/<model>/config.pbtxt`` is written from the artifact only when the repository
        has none for the model. An existing one is kept even if the artifact's differs: it is
        only the base of the config that :meth:`load` sends, and the config sent at load time
        (base plus that version's overrides) is what the server runs.

        Raises a permanent AdapterError for a missing or unreadable artifact, unsafe members
        (absolute paths, ``..``, links leading outside) or an artifact without the version.
        """
        with self._writable():
            self.repository.place(
                model, version, artifact, folder=folder, deadline=Deadline(self.timeout)
            )



    def remove(self, model: str, version: int) -> None:
        """Delete ``<repo>/<model>/<version>/`` (no-op when absent).

        The model folder (with its config.pbtxt) goes too once no version folder is left.
        The files are renamed away first, so the server never sees a half-deleted version.
        Removing the files of a loaded version does not unload it: call :meth:`unload` first.
        """
        with self._writable():
            self.repository.remove(model, version, deadline=Deadline(self.timeout))

    @contextlib.contextmanager
    def _writable(self) -> Iterator[None]:
        """The server's model repository as this host sees it: a path that is no directory,
        or one without the rights, is the server's settings at fault (permanent)."""
        try:
            yield
        except (NotADirectoryError, FileNotFoundError, PermissionError) as exc:
            if not str(exc.filename or "").startswith(str(self.repository.path)):
                raise
            # The path stays in the operators' log: the error is read by the load's tenant,
            # and a server's repository is for platform admins only.
            log.warning("model repository %s cannot be written: %s (%s)",
                        self.repository.path, exc.strerror, exc.filename)
            raise AdapterError(
                f"the server's model repository cannot be written ({exc.strerror}): a platform "
                "admin must check the server's model_repository",
                permanent=True,
            ) from None

    # -- load / unload ------------------------------------------------------------------------

    def load(
        self,
        model: str,
        version: int,
        config: Mapping[str, object],
        timeout: float | None = None,
    ) -> LoadedVersion:
        """Make ``version`` READY with ``config`` applied, keeping the other READY versions.

        The config sent is the repository's ``config.pbtxt`` (parsed into Triton's
        ``ModelConfig``) with ``config`` merged on top by ``json_format.ParseDict``: scalars
        replace, nested messages merge field by field, lists and maps (``instance_group``,
        ``parameters``) replace wholesale. ``version_policy`` is set by the runtime to
        ``specific`` [every version READY now, plus this one] (one given in ``config`` is
        ignored). Triton keeps one config per model: the versions kept are scaled in place if
        only the instance count differs and reloaded if anything else does.

        A version of the model still LOADING or UNLOADING (a call sent by a process that died
        goes on on the server) is waited for first, so that nothing is sent twice. No-op when
        the version is READY, its files were not replaced since, and the config it runs with
        (read back from the server) shows no difference from the config that would be sent
        (:func:`config_difference`). Otherwise the config is sent, the repository index is
        polled until the version is READY, and its config is read back.

        Returns the read-back config and its :func:`config_hash`. Raises AdapterError: a
        permanent one for a bad override key (named), an unreadable config.pbtxt, a version
        not placed, or a load the server refused (its message, plus the new lines of its log
        about the model when ``log_path`` is set); a transient one for connection errors and a
        version not READY within ``timeout`` (``self.timeout`` when None), naming its state.
        """
        check_names(model, version)
        deadline = Deadline(self.timeout if timeout is None else timeout)
        with self.repository.model_lock(model, deadline):
            if not (self.model_repository / model / str(version)).is_dir():
                raise AdapterError(
                    f"{model} version {version} is not placed: no folder "
                    f"{self.model_repository / model / str(version)}",
                    permanent=True,
                )
            wanted = effective_config(self.model_repository / model / CONFIG_NAME, model, config)
            wanted_dict = json_format.MessageToDict(wanted, preserving_proto_field_name=True)
            states = self._settled_index(model, deadline)
            marker = self.repository.replaced_marker(model, version)
            if states.get(version, ("", ""))[0] == READY and not marker.exists():
                served = self._read_config(model, version, deadline)
                if not config_difference(wanted_dict, served):
                    return LoadedVersion(model, version, config_hash(served), served)
            keep = sorted({v for v, (state, _) in states.items() if state == READY} | {version})
            wanted.version_policy.specific.versions[:] = keep
            payload = json_format.MessageToDict(wanted, preserving_proto_field_name=True)
            log_from = self._send_load(
                model, payload, deadline, action=f"loading {model} version {version}"
            )
            self._wait_ready(model, version, deadline, log_from)
            served = self._read_config(model, version, deadline)
            marker.unlink(missing_ok=True)
            return LoadedVersion(model, version, config_hash(served), served)

    def unload(self, model: str, version: int, timeout: float | None = None) -> None:
        """Stop serving ``version`` and wait until the index shows it UNAVAILABLE (or absent).

        When other versions stay READY, the model is loaded again with their current config
        (read back from the server, so they are neither reloaded nor rescaled) and
        ``version_policy`` ``specific`` [those versions]; otherwise the model is unloaded.
        No-op when the version is not loaded; a version already UNLOADING is waited for.
        Raises AdapterError like :meth:`load`; transient when not done within ``timeout``.
        """
        check_names(model, version)
        deadline = Deadline(self.timeout if timeout is None else timeout)
        with self.repository.model_lock(model, deadline):
            states = self._settled_index(model, deadline)
            state = states.get(version, ("", ""))[0]
            if state in ("", UNAVAILABLE):
                return
            if state != UNLOADING:
                others = sorted(v for v, (s, _) in states.items() if s == READY and v != version)
                action = f"unloading {model} version {version}"
                if others:
                    kept = config_message(self._read_config(model, others[-1], deadline))
                    kept.version_policy.specific.versions[:] = others
                    payload = json_format.MessageToDict(kept, preserving_proto_field_name=True)
                    self._send_load(model, payload, deadline, action=action)
                else:
                    self._send_unload(model, deadline, action=action)
            self._wait_gone(model, version, deadline)

    # -- queries ------------------------------------------------------------------------------

    def status(self, model: str, version: int, timeout: float | None = None) -> str:
        """The version's state in the repository index ("" when the index does not list it)."""
        check_names(model, version)
        deadline = Deadline(self.timeout if timeout is None else timeout)
        return self._index(model, deadline).get(version, ("", ""))[0]

    def served(self, model: str, version: int, timeout: float | None = None) -> LoadedVersion:
        """The config ``version`` runs with now (read back from the server) and its hash.

        Triton keeps one config per model: loading another version changes the config of the
        versions kept beside it, which this reads. A permanent AdapterError when the version
        is not loaded.
        """
        check_names(model, version)
        deadline = Deadline(self.timeout if timeout is None else timeout)
        config = self._read_config(model, version, deadline)
        return LoadedVersion(model, version, config_hash(config), config)

    def loaded_versions(self, model: str) -> dict[int, str]:
        """Version -> state (READY, LOADING, UNLOADING, UNAVAILABLE) from the repository index.

        Every version the index lists for the model, loaded or not; {} for a model never
        loaded (or unknown).
        """
        states = self._index(model, Deadline(self.timeout))
        return {version: state for version, (state, _) in sorted(states.items())}

    def read_config(self, model: str, version: int) -> dict[str, Any]:
        """The config ``version`` of ``model`` runs with, as the server answers it.

        ``GET /v2/models/<model>/versions/<version>/config``. Raises a permanent AdapterError
        when the version is not loaded.
        """
        return self._read_config(model, version, Deadline(self.timeout))



    # -- internals: server calls --------------------------------------------------------------

    @contextlib.contextmanager
    def _client(self, deadline: Deadline) -> Iterator[triton_http.InferenceServerClient]:
        """A client whose every request is bounded by what is left of ``deadline``."""
        remaining = deadline.remaining()
        client = triton_http.InferenceServerClient(
            self._address,
            connection_timeout=remaining,
            network_timeout=remaining,
            ssl=self.ssl,
        )
        try:
            yield client
        finally:
            with contextlib.suppress(Exception):
                client.close()

    def _call(
        self,
        deadline: Deadline,
        action: str,
        fn: Callable[[triton_http.InferenceServerClient], T],
        *,
        model: str = "",
        log_from: int | None = None,
    ) -> T:
        """Run ``fn`` with a fresh client, turning every failure into an AdapterError."""
        try:
            with self._client(deadline) as client:
                return fn(client)
        except InferenceServerException as exc:
            status = str(exc.status() or "")
            text = exc.message() or str(exc) or "no message"
            permanent = status.startswith("4") or GENERIC_POLL_FAILURE in text
            detail = f" (HTTP {status})" if status else ""
            message = f"{action} failed{detail}: {text.strip()}"
            raise AdapterError(
                message + self._log_excerpt(model, log_from), permanent=permanent
            ) from exc
        except TimeoutError as exc:
            raise AdapterError(
                f"{action}: no answer from {self.http_url} within {deadline.seconds:.1f} s",
                permanent=False,
            ) from exc
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            if exc.errno == errno.ECONNREFUSED:
                reason = "connection refused"
            raise AdapterError(
                f"{action}: cannot reach {self.http_url}: {reason}", permanent=False
            ) from exc
        except ValueError as exc:  # a non-JSON answer: not a Triton server
            raise AdapterError(
                f"{action}: unexpected answer from {self.http_url}: {exc}", permanent=False
            ) from exc

    def _index(self, model: str, deadline: Deadline) -> dict[int, tuple[str, str]]:
        """Version -> (state, reason) of ``model`` from ``POST /v2/repository/index``."""
        entries = self._call(
            deadline,
            "reading the repository index",
            lambda client: client.get_model_repository_index(),
        )
        states: dict[int, tuple[str, str]] = {}
        for entry in entries or []:
            if not isinstance(entry, dict) or entry.get("name") != model:
                continue
            version = str(entry.get("version", ""))
            if version.isdigit():
                states[int(version)] = (str(entry.get("state", "")), str(entry.get("reason", "")))
        return states

    def _settled_index(self, model: str, deadline: Deadline) -> dict[int, tuple[str, str]]:
        """The model's index once none of its versions is LOADING or UNLOADING.

        A load or unload sent by a process that died (a worker killed mid-load) goes on on the
        server; deciding while it runs would send a second one, or leave a version out of the
        set kept. Raises a transient AdapterError naming the state when it does not settle
        within ``deadline``.
        """
        while True:
            states = self._index(model, deadline)
            moving = {v: state for v, (state, _) in states.items() if state in (LOADING, UNLOADING)}
            if not moving:
                return states
            if deadline.expired():
                shown = ", ".join(f"version {v} {state}" for v, state in sorted(moving.items()))
                raise AdapterError(
                    f"{model} did not settle within {deadline.seconds:.1f} s: {shown}",
                    permanent=False,
                )
            time.sleep(min(POLL_INTERVAL, deadline.remaining()))

    def _read_config(self, model: str, version: int, deadline: Deadline) -> dict[str, Any]:
        """``GET /v2/models/<model>/versions/<version>/config`` within ``deadline``."""
        config = self._call(
            deadline,
            f"reading the config of {model} version {version}",
            lambda client: client.get_model_config(model, model_version=str(version)),
        )
        if not isinstance(config, dict):
            raise AdapterError(
                f"the config of {model} version {version} is not a JSON object", permanent=False
            )
        return config

    def _send_load(
        self, model: str, payload: dict[str, Any], deadline: Deadline, *, action: str
    ) -> int | None:
        """``load_model`` with ``payload`` as the config override; return the log offset.

        The request gets the budget less a reserve (a second at most) for reading the state
        afterwards. A request that times out is not an error yet: the server goes on loading,
        and the caller's wait for READY decides.
        """
        log_from = self._log_offset()
        body = json.dumps(payload, sort_keys=True)
        remaining = deadline.remaining()
        request_budget = Deadline(max(remaining - min(1.0, remaining / 4), 0.001))
        request_budget.seconds = deadline.seconds
        try:
            self._call(
                request_budget,
                action,
                lambda client: client.load_model(model, config=body),
                model=model,
                log_from=log_from,
            )
        except AdapterError as exc:
            if not isinstance(exc.__cause__, TimeoutError):
                raise
        return log_from

    def _send_unload(self, model: str, deadline: Deadline, *, action: str) -> None:
        """``unload_model``: every version of the model goes (Triton answers at once)."""
        log_from = self._log_offset()
        self._call(
            deadline,
            action,
            lambda client: client.unload_model(model),
            model=model,
            log_from=log_from,
        )

    def _wait_ready(
        self, model: str, version: int, deadline: Deadline, log_from: int | None
    ) -> None:
        """Poll the index until ``version`` is READY; raise naming its state otherwise.

        Each index read gets at least half a second, so the state can still be read (and
        named) when the load request used up the budget.
        """
        settle_end = None
        while True:
            states = self._index(model, Deadline(max(deadline.remaining(), 0.5)))
            state, reason = states.get(version, ("", ""))
            if state == READY:
                return
            now = time.monotonic()
            if state not in (LOADING, UNLOADING):
                settle_end = settle_end or now + SETTLE_SECONDS
            else:
                settle_end = None
            if deadline.expired() or (settle_end is not None and now >= settle_end):
                shown = state or "not in the repository index"
                why = f" ({reason})" if reason else ""
                waited = f" after {deadline.seconds:.1f} s" if deadline.expired() else ""
                raise AdapterError(
                    f"{model} version {version} is not READY{waited}: state {shown}{why}"
                    + self._log_excerpt(model, log_from),
                    permanent=False,
                )
            time.sleep(min(POLL_INTERVAL, deadline.remaining()))

    def _wait_gone(self, model: str, version: int, deadline: Deadline) -> None:
        """Poll the index until ``version`` is UNAVAILABLE or no longer listed."""
        while True:
            state, reason = self._index(model, deadline).get(version, ("", ""))
            if state in ("", UNAVAILABLE):
                return
            if deadline.expired():
                why = f" ({reason})" if reason else ""
                raise AdapterError(
                    f"{model} version {version} is still {state}{why} after "
                    f"{deadline.seconds:.1f} s",
                    permanent=False,
                )
            time.sleep(min(POLL_INTERVAL, deadline.remaining()))

    # -- internals: the server log ------------------------------------------------------------

    def _log_offset(self) -> int | None:
        """Size of the server log now (None without a readable log)."""
        if self.log_path is None:
            return None
        try:
            return self.log_path.stat().st_size
        except OSError:
            return None

    def _log_excerpt(self, model: str, since: int | None) -> str:
        """"\\nserver log: ..." with the lines about ``model`` written since ``since``.

        Error lines are preferred; without any, the last lines naming the model are shown.
        Lines not naming the model are left out: other models may be loading meanwhile.
        Triton writes the log line of a failure just before or after it answers, so a missing
        line is looked for again for up to half a second.
        """
        if self.log_path is None or since is None or not model:
            return ""
        mention = re.compile(rf"(?<![A-Za-z0-9_.-]){re.escape(model)}(?![A-Za-z0-9.-])")
        end = time.monotonic() + 0.5
        while True:
            lines = self._log_lines_since(since)
            about = [line for line in lines if mention.search(line)]
            chosen = [line for line in about if TRITON_LOG_ERROR_RE.search(line)] or about
            if chosen or time.monotonic() >= end:
                break
            time.sleep(0.05)
        if not chosen:
            return ""
        shown = [line[:LOG_LINE_CHARS] for line in chosen[-LOG_LINES:]]
        return f"\nserver log ({self.log_path}):\n" + "\n".join(f"  {line}" for line in shown)

    def _log_lines_since(self, since: int) -> list[str]:
        """Non-empty lines of the server log from byte ``since`` on (4 MiB at most)."""
        if self.log_path is None:
            return []
        try:
            with self.log_path.open("rb") as fh:
                size = fh.seek(0, 2)
                fh.seek(since if since <= size else 0)  # a shorter log was rotated
                text = fh.read(4 * 1024 * 1024).decode("utf-8", "replace")
        except OSError:
            return []
        return [line.rstrip() for line in text.splitlines() if line.strip()]
