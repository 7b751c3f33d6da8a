"""How to call a deployment: the inputs and outputs come from the serving Triton's own
metadata, and the example request, sent as the page shows it, is answered by that Triton."""

from __future__ import annotations

import json
import shlex

import httpx
import pytest

from fleet.adapters.base import ProbeFailed
from fleet.adapters.triton import model_metadata
from rollouts.deployments import calling
from rollouts.models import ModelLoad
from tests.rollouts.triton_world import load_once

pytestmark = pytest.mark.django_db(transaction=True)


def posted(curl: str) -> tuple[str, dict]:
    """The URL and JSON body of the example's inference request (its last line)."""
    words = shlex.split(curl.splitlines()[-1])
    return words[words.index("POST") + 1], json.loads(words[words.index("-d") + 1])


def test_the_guide_shows_what_the_server_reports_and_its_example_is_answered(world):
    version = world.version(1)
    assert load_once(world, version).state == ModelLoad.State.READY

    guide = calling.guide(world.deployment, metadata=lambda *args: model_metadata(*args))

    assert (guide.through, guide.source, guide.version) == ("server", "server", 1)
    assert guide.inputs == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}]
    assert guide.outputs == [{"name": "SCORE", "datatype": "FP32", "shape": [1]}]
    url, body = posted(guide.curl)
    assert url == f"{world.triton.http_url}/v2/models/{world.served}/versions/1/infer"
    answer = httpx.post(url, json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    assert [o["name"] for o in answer.json()["outputs"]] == ["SCORE"]


def test_without_the_servers_word_the_registered_config_is_shown_and_said(world):
    config = {"max_batch_size": 8, "input": [{"name": "IN", "data_type": "TYPE_BYTES", "dims": [2]}],
              "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}]}
    version = world.version(1)
    type(version).objects.filter(pk=version.pk).update(triton_config=config)
    ModelLoad.objects.create(tenant=world.tenant, deployment=world.deployment, server=world.server,
                             version=version, state=ModelLoad.State.READY, requested_by_label="t")

    def silent(*args):
        raise ProbeFailed("connection refused")

    guide = calling.guide(world.deployment, metadata=silent)

    assert guide.source == "config"
    assert "triton did not say (connection refused)" in guide.note
    assert guide.inputs == [{"name": "IN", "datatype": "BYTES", "shape": [-1, 2]}]
    _, body = posted(guide.curl)
    assert body == {"inputs": [{"name": "IN", "shape": [1, 2], "datatype": "BYTES",
                                "data": ["text", "text"]}]}


def test_a_version_not_loaded_reads_as_a_readable_refusal(world):
    with pytest.raises(ProbeFailed, match="returned 404: Request for unknown model"):
        model_metadata(world.triton.http_url, "no-such-model", 1, 2.0)


def test_nothing_ready_is_no_guide(world):
    assert calling.guide(world.deployment) is None
