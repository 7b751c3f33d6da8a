"""Fixtures of the model-load tests."""

from __future__ import annotations

import pytest

from tests.rollouts.triton_world import make_world


@pytest.fixture
def world(settings, tmp_path, moto_s3, make_s3_store, local_triton):
    """A tenant with a cpu quota and a deployment on a server of ``local_triton`` (the
    session's Triton unless a module overrides it), with artifacts in a real S3 endpoint."""
    yield from make_world(settings, tmp_path, moto_s3, make_s3_store, local_triton)
