"""A Triton model repository on a local directory, as Switchyard fills it.

:class:`ModelRepository` places a version artifact into ``<repo>/<model>/<version>/`` (safely
extracted, precompiled, moved in with a rename) and removes it again; its working files live
beside the repository (staging folders for atomic renames, per-model lock files, markers of
replaced versions). :func:`tree_hash` tells whether a version folder's content changed, and
:func:`safe_extract` unpacks an artifact without letting it write outside its folder.

Plain Python: no Django, no settings, no server calls.
"""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import re
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from filelock import FileLock, Timeout
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from fleet.adapters.base import AdapterError, Deadline

CONFIG_NAME = "config.pbtxt"
IGNORED_NAMES = frozenset({"__pycache__"})
IGNORED_SUFFIXES = (".pyc",)
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def check_names(model: str, version: int) -> None:
    """Refuse model names that are not one plain folder name, and versions below 1."""
    if not isinstance(model, str) or not MODEL_NAME_RE.match(model) or ".." in model:
        raise AdapterError(f"invalid model name {model!r}", permanent=True)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise AdapterError(f"invalid version {version!r} of {model}", permanent=True)


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


class ModelRepository:
    """The local directory a tritonserver serves its models from.

    Working files live next to it, in ``<parent>/.<repository name>.switchyard/`` (staging
    folders for atomic renames, per-model lock files, markers of replaced versions); when the
    repository is a mount point of its own they live inside it, in ``.switchyard/``, so that
    renames stay on one filesystem. Calls on one model are serialised across threads and
    processes of this host by a lock file (:meth:`model_lock`); calls on different models run
    in parallel.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path).resolve()

    def place(
        self, model: str, version: int, artifact: Path, *, folder: str | None = None,
        deadline: Deadline,
    ) -> None:
        """Put ``<folder>/<version>/`` of ``artifact`` into the repository as
        ``<model>/<version>/`` (idempotent), holding the model's lock within ``deadline``; the
        whole contract is :meth:`fleet.adapters.triton_runtime.TritonServerRuntime.place`'s.

        A version folder with other content than the one there is replaced, and its
        :meth:`replaced_marker` makes the next load reload it. Raises a permanent AdapterError
        for a missing or unreadable artifact, unsafe members or an artifact without the version.
        """
        check_names(model, version)
        artifact = Path(artifact)
        if not artifact.exists():
            raise AdapterError(f"artifact {artifact} does not exist", permanent=True)
        with self.model_lock(model, deadline):
            staging = Path(tempfile.mkdtemp(prefix="place-", dir=self.work_dir("staging")))
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
        target = self.path / model / str(version)
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
            marker = self.replaced_marker(model, version)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()

    def _install_config(self, model: str, source: Path, staging: Path, *, built: str) -> None:
        """Copy the artifact's config.pbtxt into the repository if the model has none.

        A config naming the model it was ``built`` as is renamed to ``model``, the folder's
        name, which Triton needs; any other text is copied as it is (a load reports what is
        wrong with it)."""
        target = self.path / model / CONFIG_NAME
        if target.exists() or not source.is_file():
            return
        staged = staging / CONFIG_NAME
        shutil.copyfile(source, staged)
        if built != model:
            _rename_config(staged, built, model)
        staged.replace(target)

    def remove(self, model: str, version: int, *, deadline: Deadline) -> None:
        """Delete ``<repo>/<model>/<version>/`` (no-op when absent).

        The model folder (with its config.pbtxt) goes too once no version folder is left.
        The files are renamed away first, so the server never sees a half-deleted version.
        Removing the files of a loaded version does not unload it: unload it first.
        """
        check_names(model, version)
        with self.model_lock(model, deadline):
            model_dir = self.path / model
            target = model_dir / str(version)
            self.replaced_marker(model, version).unlink(missing_ok=True)
            if target.exists() or target.is_symlink():
                trash = Path(tempfile.mkdtemp(prefix="remove-", dir=self.work_dir("staging")))
                target.rename(trash / "version")
                shutil.rmtree(trash, ignore_errors=True)
            if model_dir.is_dir() and not any(_is_version_dir(p) for p in model_dir.iterdir()):
                trash = Path(tempfile.mkdtemp(prefix="remove-", dir=self.work_dir("staging")))
                model_dir.rename(trash / "model")
                shutil.rmtree(trash, ignore_errors=True)

    def work_dir(self, *parts: str) -> Path:
        """A folder for working files on the repository's filesystem (created on demand)."""
        repo = self.path
        repo.mkdir(parents=True, exist_ok=True)
        base = repo.parent / f".{repo.name}.switchyard"
        if repo.stat().st_dev != repo.parent.stat().st_dev:
            base = repo / ".switchyard"
        folder = base.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def replaced_marker(self, model: str, version: int) -> Path:
        """Marker file: the version's files were replaced since it was last loaded."""
        return self.work_dir("replaced") / f"{model}@{version}"

    @contextlib.contextmanager
    def model_lock(self, model: str, deadline: Deadline) -> Iterator[None]:
        """Exclusive lock on ``model`` among threads and processes of this host."""
        lock = FileLock(self.work_dir("locks") / f"{model}.lock")
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
