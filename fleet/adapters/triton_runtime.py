"""Model loads on an NVIDIA Triton Inference Server in explicit model-control mode.

:class:`TritonServerRuntime` implements :class:`fleet.adapters.base.ServerRuntime` for one
tritonserver whose model repository is a local directory: ``place`` unpacks a version artifact
into the repository, ``load`` / ``unload`` drive Triton's repository API (``tritonclient.http``)
and ``remove`` deletes placed files. Every call is idempotent.

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
  (:func:`config_difference`) so that it does not have to send anything.
* The per-version config read back (``GET /v2/models/<m>/versions/<v>/config``) keeps the
  ``version_policy`` of the load that (re)created that version: after loading v2 next to v1,
  v1 still reports ``specific [1]``. Hashes therefore leave ``version_policy`` out.
* A load whose config.pbtxt (or override) Triton rejects while polling the repository answers
  a generic HTTP 500 "failed to poll from model repository"; the cause is only in the server
  log, which is why a ``log_path`` makes the errors readable.

Plain Python: no Django, no settings.
"""

from __future__ import annotations

import compileall
import contextlib
import errno
import hashlib
import json
import re
import shutil
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import tritonclient.http as triton_http
from filelock import FileLock, Timeout
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from fleet.adapters.base import AdapterError, Deadline, LoadedVersion

T = TypeVar("T")

READY = "READY"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
UNAVAILABLE = "UNAVAILABLE"
CONFIG_NAME = "config.pbtxt"
POLL_INTERVAL = 0.02  # Triton settles in ~0.1 s steps: do not add a step of our own
# After a load call that succeeded, how long a version that is not READY (and not LOADING) is
# given to become READY before the load is reported as failed.
SETTLE_SECONDS = 2.0
LOG_LINES = 8
LOG_LINE_CHARS = 2000
GENERIC_POLL_FAILURE = "failed to poll from model repository"
IGNORED_NAMES = frozenset({"__pycache__"})
IGNORED_SUFFIXES = (".pyc",)
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
TRITON_LOG_ERROR_RE = re.compile(r"^E\d{4} |libprotobuf ERROR")

# Fields Triton fills in when the requested config leaves them unset (path -> accepted value).
# "*" stands for any list index. Used by config_difference() to tell server defaults apart from
# a config that really differs.


def _any(value: object) -> bool:
    """Accept any value Triton fills in."""
    return True


_ANY: Callable[[object], bool] = _any
SERVER_FILLED: dict[tuple[str, ...], Callable[[object], bool]] = {
    ("backend",): _ANY,
    ("platform",): _ANY,
    ("runtime",): _ANY,
    ("default_model_filename",): _ANY,
    ("instance_group", "*", "name"): _ANY,
    ("instance_group", "*", "kind"): lambda value: value in ("KIND_CPU", "KIND_GPU"),
    ("instance_group", "*", "count"): lambda value: value == 1,
    ("instance_group", "*", "gpus"): _ANY,
    ("optimization", "input_pinned_memory", "enable"): lambda value: value is True,
    ("optimization", "output_pinned_memory", "enable"): lambda value: value is True,
}


# --------------------------------------------------------------------------------------------
# Config helpers (pure functions)
# --------------------------------------------------------------------------------------------


def normalize_config(config: Mapping[str, object]) -> dict[str, Any]:
    """A Triton model config (JSON as the server answers it) in canonical protobuf-JSON form.

    Round-trips through ``model_config_pb2.ModelConfig``: fields at their default value are
    dropped, int64 values become strings, enums their names, field names stay snake_case.
    Unknown fields (a server newer than the client library) are dropped.
    """
    msg = model_config_pb2.ModelConfig()
    json_format.ParseDict(dict(config), msg, ignore_unknown_fields=True)
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def config_hash(config: Mapping[str, object]) -> str:
    """sha256 of the canonical JSON of a model config, ``version_policy`` left out.

    The config is normalised first (:func:`normalize_config`), so the raw answer of
    ``GET /v2/models/<m>/versions/<v>/config`` and its normalised form hash the same.
    ``version_policy`` names the set of versions served together, not how this version runs
    (and Triton reports a stale one for versions kept across loads), so it is not hashed.
    """
    canonical = normalize_config(config)
    canonical.pop("version_policy", None)
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def config_difference(requested: Mapping[str, object], served: Mapping[str, object]) -> str:
    """Where the served config differs from the requested one ("" when it does not).

    Both are compared in normalised form (:func:`normalize_config`), ``version_policy`` left
    out. The rule: every field set in ``requested`` must have the same value in ``served``
    (lists element by element with equal length; maps key by key); a field set only in
    ``served`` is accepted only when it is one Triton fills in itself, with the value it
    fills in (:data:`SERVER_FILLED`: instance-group names, kinds and devices, a count of 1,
    pinned-memory defaults, the backend's default file name). Anything else set only on the
    server (a parameter, a batching option left from an earlier override) is a difference:
    a load that would remove it must reach the server.

    Sound in the direction that matters: "no difference" means the server runs what was
    asked. A server filling in more than listed (auto-completed inputs of some backends)
    makes the comparison report a difference, which costs a reload, never a wrong no-op.
    """
    want = normalize_config(requested)
    have = normalize_config(served)
    want.pop("version_policy", None)
    have.pop("version_policy", None)
    return _difference(want, have, ())


def _difference(want: object, have: object, path: tuple[str, ...]) -> str:
    """The first difference between normalised ``want`` and ``have`` at ``path`` ("" if none)."""
    where = ".".join(path) or "<config>"
    if isinstance(want, dict) and isinstance(have, dict):
        for key, value in want.items():
            if key not in have:
                return f"{'.'.join((*path, key))}: requested {value!r}, server has none"
            found = _difference(value, have[key], (*path, key))
            if found:
                return found
        for key, value in have.items():
            if key not in want:
                found = _server_filled(value, (*path, key))
                if found:
                    return found
        return ""
    if isinstance(want, list) and isinstance(have, list):
        if len(want) != len(have):
            return f"{where}: requested {len(want)} entries, server has {len(have)}"
        for index, (w, h) in enumerate(zip(want, have, strict=True)):
            found = _difference(w, h, (*path, str(index)))
            if found:
                return found
        return ""
    if want != have:
        return f"{where}: requested {want!r}, server has {have!r}"
    return ""


def _server_filled(value: object, path: tuple[str, ...]) -> str:
    """"" if ``value`` at ``path`` (absent from the request) is a default Triton fills in."""
    if isinstance(value, dict):
        for key, sub in value.items():
            found = _server_filled(sub, (*path, key))
            if found:
                return found
        return ""
    if isinstance(value, list) and path[-1:] != ("gpus",):
        for index, sub in enumerate(value):
            found = _server_filled(sub, (*path, str(index)))
            if found:
                return found
        return ""
    pattern = tuple("*" if part.isdigit() else part for part in path)
    accept = SERVER_FILLED.get(pattern)
    if accept is not None and accept(value):
        return ""
    return f"{'.'.join(path)}: server has {value!r}, not requested"


# --------------------------------------------------------------------------------------------
# Files: safe extraction, content hashes
# --------------------------------------------------------------------------------------------


def tree_hash(folder: Path) -> str:
    """sha256 over the relative paths and contents of the files under ``folder``.

    ``__pycache__`` folders and ``*.pyc`` files are skipped: Triton's python backend writes
    them next to ``model.py`` when it imports it. Symlinks count by their target text.
    """
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if IGNORED_NAMES.intersection(rel.parts) or path.name.endswith(IGNORED_SUFFIXES):
            continue
        if path.is_symlink():
            digest.update(f"L {rel.as_posix()} -> {path.readlink()}\n".encode())
        elif path.is_file():
            digest.update(f"F {rel.as_posix()} {path.stat().st_size}\n".encode())
            with path.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
        elif path.is_dir():
            digest.update(f"D {rel.as_posix()}\n".encode())
    return digest.hexdigest()


def _unsafe_member_reason(member: tarfile.TarInfo) -> str:
    """Why a tar member must not be extracted ("" when it is a plain, contained entry)."""
    name = member.name
    posix = PurePosixPath(name)
    if not name or posix.is_absolute() or name.startswith("\\") or re.match(r"^[A-Za-z]:", name):
        return "an absolute path"
    if ".." in posix.parts or "\\" in name:
        return "a path that leaves the archive ('..' or a backslash)"
    if member.issym():
        target = PurePosixPath(member.linkname)
        joined = PurePosixPath(*posix.parts[:-1], *target.parts)
        if target.is_absolute() or _escapes(joined):
            return f"a symlink pointing outside the archive ({member.linkname})"
    elif member.islnk():
        target = PurePosixPath(member.linkname)
        if target.is_absolute() or _escapes(target):
            return f"a hard link pointing outside the archive ({member.linkname})"
    elif not (member.isfile() or member.isdir()):
        return "a device, fifo or other special file"
    return ""


def _escapes(path: PurePosixPath) -> bool:
    """True if the relative ``path`` climbs above its start once '..' parts are applied."""
    depth = 0
    for part in path.parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def safe_extract(archive: Path, dest: Path) -> None:
    """Extract the .tar(.gz) ``archive`` into the empty folder ``dest``.

    Every member is checked before anything is written: absolute paths, ``..`` parts, links
    leading outside the archive and special files are refused with a permanent AdapterError
    naming the member. Extraction then runs with tarfile's ``data`` filter as a second guard.
    """
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                reason = _unsafe_member_reason(member)
                if reason:
                    raise AdapterError(
                        f"unsafe artifact {archive.name}: member {member.name!r} is {reason}",
                        permanent=True,
                    )
            tar.extractall(dest, members=members, filter="data")
    except AdapterError:
        raise
    except tarfile.FilterError as exc:
        raise AdapterError(f"unsafe artifact {archive.name}: {exc}", permanent=True) from exc
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise AdapterError(
            f"artifact {archive.name} is not a readable .tar.gz: {exc}", permanent=True
        ) from exc


def precompile(folder: Path, final: Path) -> None:
    """Write ``__pycache__`` for the ``.py`` files under ``folder`` (to live at ``final``).

    Triton reloads a version whose folder changed since it was loaded, and the python backend
    writes the bytecode cache on its first import: a cache written beforehand (valid because
    renames keep the sources' mtimes) keeps that write from happening. Files that do not
    compile are skipped; the server reports them when it loads the version.
    """
    if not any(folder.rglob("*.py")):
        return
    with contextlib.suppress(Exception):
        compileall.compile_dir(folder, ddir=str(final), quiet=2, workers=1)


def _check_links_inside(folder: Path, root: Path, label: str) -> None:
    """Refuse symlinks under ``folder`` whose target resolves outside ``root``."""
    root = root.resolve()
    for path in folder.rglob("*"):
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            raise AdapterError(
                f"unsafe artifact {label}: {path.relative_to(folder)} links outside the model "
                f"folder (to {path.readlink()})",
                permanent=True,
            )


def _rename_config(path: Path, built: str, model: str) -> None:
    """Rewrite ``name: "<built>"`` in the config.pbtxt at ``path`` to ``model`` (a config that
    does not parse, or names another model, is left for the load to report)."""
    msg = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(path.read_text(encoding="utf-8"), msg)
    except (text_format.ParseError, UnicodeDecodeError):
        return
    if msg.name == built:
        msg.name = model
        path.write_text(text_format.MessageToString(msg), encoding="utf-8")


def _is_version_dir(path: Path) -> bool:
    """True for a numeric sub-folder of a model folder (a version, as Triton sees it)."""
    return path.is_dir() and path.name.isdigit()


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

    Working files live next to the repository, in ``<parent>/.<repository name>.switchyard/``
    (staging folders for atomic renames, per-model lock files, markers of replaced versions);
    when the repository is a mount point of its own they live inside it, in ``.switchyard/``,
    so that renames stay on one filesystem. Calls on one model are serialised across threads
    and processes of this host by a lock file; calls on different models run in parallel.
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
        self.model_repository = Path(model_repository).resolve()
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
        self._check_names(model, version)
        artifact = Path(artifact)
        if not artifact.exists():
            raise AdapterError(f"artifact {artifact} does not exist", permanent=True)
        with self._model_lock(model, Deadline(self.timeout)):
            staging = Path(tempfile.mkdtemp(prefix="place-", dir=self._work_dir("staging")))
            try:
                built = folder or model
                if artifact.is_dir():
                    root = artifact
                else:
                    root = staging / "unpacked"
                    root.mkdir()
                    safe_extract(artifact, root)
                _check_links_inside(root / built, root / built, artifact.name)
                source = root / built / str(version)
                if not source.is_dir() or source.is_symlink():
                    found = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
                    raise AdapterError(
                        f"artifact {artifact.name} has no {built}/{version}/ folder "
                        f"(top level: {', '.join(found) or 'empty'})",
                        permanent=True,
                    )
                self._install_version(model, version, source, staging, copy=artifact.is_dir())
                self._install_config(model, root / built / CONFIG_NAME, staging, built=built)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def _install_version(
        self, model: str, version: int, source: Path, staging: Path, *, copy: bool
    ) -> None:
        """Rename ``source`` into the repository unless an identical folder is there."""
        target = self.model_repository / model / str(version)
        if target.is_dir() and tree_hash(target) == tree_hash(source):
            return
        if copy:
            staged = staging / "version"
            shutil.copytree(
                source, staged, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            staged = source
        precompile(staged, target)
        target.parent.mkdir(parents=True, exist_ok=True)
        replaced = target.exists() or target.is_symlink()
        if replaced:
            target.rename(staging / "previous")
        staged.rename(target)
        if replaced:
            marker = self._replaced_marker(model, version)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()

    def _install_config(self, model: str, source: Path, staging: Path, *, built: str) -> None:
        """Copy the artifact's config.pbtxt into the repository if the model has none.

        A config naming the model it was ``built`` as is renamed to ``model``, the folder's
        name, which Triton needs; any other text is copied as it is (a load reports what is
        wrong with it)."""
        target = self.model_repository / model / CONFIG_NAME
        if target.exists() or not source.is_file():
            return
        staged = staging / CONFIG_NAME
        shutil.copyfile(source, staged)
        if built != model:
            _rename_config(staged, built, model)
        staged.replace(target)

    def remove(self, model: str, version: int) -> None:
        """Delete ``<repo>/<model>/<version>/`` (no-op when absent).

        The model folder (with its config.pbtxt) goes too once no version folder is left.
        The files are renamed away first, so the server never sees a half-deleted version.
        Removing the files of a loaded version does not unload it: call :meth:`unload` first.
        """
        self._check_names(model, version)
        with self._model_lock(model, Deadline(self.timeout)):
            model_dir = self.model_repository / model
            target = model_dir / str(version)
            self._replaced_marker(model, version).unlink(missing_ok=True)
            if target.exists() or target.is_symlink():
                trash = Path(tempfile.mkdtemp(prefix="remove-", dir=self._work_dir("staging")))
                target.rename(trash / "version")
                shutil.rmtree(trash, ignore_errors=True)
            if model_dir.is_dir() and not any(_is_version_dir(p) for p in model_dir.iterdir()):
                trash = Path(tempfile.mkdtemp(prefix="remove-", dir=self._work_dir("staging")))
                model_dir.rename(trash / "model")
                shutil.rmtree(trash, ignore_errors=True)

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
        self._check_names(model, version)
        deadline = Deadline(self.timeout if timeout is None else timeout)
        with self._model_lock(model, deadline):
            if not (self.model_repository / model / str(version)).is_dir():
                raise AdapterError(
                    f"{model} version {version} is not placed: no folder "
                    f"{self.model_repository / model / str(version)}",
                    permanent=True,
                )
            wanted = self._effective_config(model, config)
            wanted_dict = json_format.MessageToDict(wanted, preserving_proto_field_name=True)
            states = self._settled_index(model, deadline)
            marker = self._replaced_marker(model, version)
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
        self._check_names(model, version)
        deadline = Deadline(self.timeout if timeout is None else timeout)
        with self._model_lock(model, deadline):
            states = self._settled_index(model, deadline)
            state = states.get(version, ("", ""))[0]
            if state in ("", UNAVAILABLE):
                return
            if state != UNLOADING:
                others = sorted(v for v, (s, _) in states.items() if s == READY and v != version)
                action = f"unloading {model} version {version}"
                if others:
                    kept = self._config_message(self._read_config(model, others[-1], deadline))
                    kept.version_policy.specific.versions[:] = others
                    payload = json_format.MessageToDict(kept, preserving_proto_field_name=True)
                    self._send_load(model, payload, deadline, action=action)
                else:
                    self._send_unload(model, deadline, action=action)
            self._wait_gone(model, version, deadline)

    # -- queries ------------------------------------------------------------------------------

    def status(self, model: str, version: int, timeout: float | None = None) -> str:
        """The version's state in the repository index ("" when the index does not list it)."""
        self._check_names(model, version)
        deadline = Deadline(self.timeout if timeout is None else timeout)
        return self._index(model, deadline).get(version, ("", ""))[0]

    def served(self, model: str, version: int, timeout: float | None = None) -> LoadedVersion:
        """The config ``version`` runs with now (read back from the server) and its hash.

        Triton keeps one config per model: loading another version changes the config of the
        versions kept beside it, which this reads. A permanent AdapterError when the version
        is not loaded.
        """
        self._check_names(model, version)
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

    # -- internals: configs -------------------------------------------------------------------

    def _effective_config(
        self, model: str, overrides: Mapping[str, object]
    ) -> model_config_pb2.ModelConfig:
        """config.pbtxt of the model with ``overrides`` merged on top (no version_policy)."""
        msg = model_config_pb2.ModelConfig()
        path = self.model_repository / model / CONFIG_NAME
        if path.is_file():
            try:
                text_format.Parse(path.read_text(encoding="utf-8"), msg)
            except text_format.ParseError as exc:
                detail = re.sub(r"^\d+:\d+ : ", "", str(exc))
                raise AdapterError(
                    f"config.pbtxt of {model} is not a valid Triton model config (line {exc.GetLine()}, "
                    f"column {exc.GetColumn()}): {detail}",
                    permanent=True,
                ) from exc
            except UnicodeDecodeError as exc:
                raise AdapterError(f"config.pbtxt of {model} is not UTF-8 text: {exc}", permanent=True) from exc
        if not isinstance(overrides, Mapping):
            raise AdapterError(
                f"config overrides for {model} must be a JSON object, not "
                f"{type(overrides).__name__}",
                permanent=True,
            )
        extra = {k: v for k, v in overrides.items() if k not in ("version_policy", "versionPolicy")}
        try:
            json_format.ParseDict(extra, msg, ignore_unknown_fields=False)
        except json_format.ParseError as exc:
            raise AdapterError(
                f"invalid config override for {model}: {str(exc).splitlines()[0]}", permanent=True
            ) from exc
        if not msg.name:
            msg.name = model
        elif msg.name != model:
            raise AdapterError(
                f"config of {model} names the model {msg.name!r}: Triton needs the name of "
                "its folder",
                permanent=True,
            )
        msg.ClearField("version_policy")
        return msg

    @staticmethod
    def _config_message(config: Mapping[str, object]) -> model_config_pb2.ModelConfig:
        """A read-back config as a ModelConfig without its version_policy."""
        msg = model_config_pb2.ModelConfig()
        json_format.ParseDict(dict(config), msg, ignore_unknown_fields=True)
        msg.ClearField("version_policy")
        return msg

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

    # -- internals: names, files, locks -------------------------------------------------------

    @staticmethod
    def _check_names(model: str, version: int) -> None:
        """Refuse model names that are not one plain folder name, and versions below 1."""
        if not isinstance(model, str) or not MODEL_NAME_RE.match(model) or ".." in model:
            raise AdapterError(f"invalid model name {model!r}", permanent=True)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise AdapterError(f"invalid version {version!r} of {model}", permanent=True)

    def _work_dir(self, *parts: str) -> Path:
        """A folder for working files on the repository's filesystem (created on demand)."""
        repo = self.model_repository
        repo.mkdir(parents=True, exist_ok=True)
        base = repo.parent / f".{repo.name}.switchyard"
        if repo.stat().st_dev != repo.parent.stat().st_dev:
            base = repo / ".switchyard"
        folder = base.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _replaced_marker(self, model: str, version: int) -> Path:
        """Marker file: the version's files were replaced since it was last loaded."""
        return self._work_dir("replaced") / f"{model}@{version}"

    @contextlib.contextmanager
    def _model_lock(self, model: str, deadline: Deadline) -> Iterator[None]:
        """Exclusive lock on ``model`` among threads and processes of this host."""
        lock = FileLock(self._work_dir("locks") / f"{model}.lock")
        try:
            lock.acquire(timeout=deadline.remaining(), poll_interval=0.05)
        except Timeout:
            raise AdapterError(
                f"another operation on {model} held its lock for {deadline.seconds:.1f} s",
                permanent=False,
            ) from None
        try:
            yield
        finally:
            lock.release()
