"""Fixtures of the benchmark tests: the model-load world on the session's real Triton, with
its metrics page known, so each level has the server's own view beside the client's."""

from __future__ import annotations

import pytest

from tests.rollouts.triton_world import make_world


@pytest.fixture
def world(settings, tmp_path, moto_s3, make_s3_store, local_triton, redis_prefix):
    settings.SWITCHYARD_BENCHMARK_LEASE_S = 5
    settings.DATA_DIR = tmp_path / "data"
    for w in make_world(settings, tmp_path, moto_s3, make_s3_store, local_triton):
        w.server.metrics_url = local_triton.metrics_url
        w.server.grpc_url = local_triton.grpc_url
        w.server.save(update_fields=["metrics_url", "grpc_url"])
        yield w
