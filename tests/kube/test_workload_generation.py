"""A Deployment's ``metadata.generation`` as a real API server counts it (recording 09), and
the in-memory stand-in the domain tests use counting it the same way.

The real server bumps it for a change to ``metadata.annotations`` alone (Switchyard's
``switchyard.io/model-version`` and ``switchyard.io/hpa-replicas`` annotations), as for a
spec change, and not for a change to ``metadata.labels`` alone; an apply that changes nothing
writes nothing."""

from __future__ import annotations

from fleet.adapters import kube_workloads as kw
from fleet.adapters.kubernetes import KubeAccess
from tests.kube.replay import GOOD_TOKEN, RecordedApiServer, exchanges
from tests.kube.test_workload_world import FakeKube

GENERATION = "09-deployment-generation"
#: The applies of 09 (each followed by a GET) and what each changed.
APPLIES = {0: "created", 2: "metadata.annotations only", 4: "a pod-template annotation",
           6: "nothing", 8: "metadata.labels only"}


def test_the_api_server_bumps_the_generation_for_annotations_not_for_labels():
    applies = exchanges(GENERATION, *APPLIES)
    with RecordedApiServer(applies) as srv:
        access = KubeAccess(auth="token", url=srv.url, token=GOOD_TOKEN, timeout_s=5)
        generations = [kw.apply(access, e["request_body"])["metadata"]["generation"]
                       for e in applies]

    srv.assert_all_matched()
    assert dict(zip(APPLIES.values(), generations, strict=True)) == {
        "created": 1, "metadata.annotations only": 2, "a pod-template annotation": 3,
        "nothing": 3, "metadata.labels only": 3}


def test_the_stand_in_counts_generations_as_the_api_server_did():
    fake = FakeKube()
    for index in APPLIES:
        [apply, read] = exchanges(GENERATION, index, index + 1)
        applied = fake.apply(None, apply["request_body"])
        assert applied["metadata"]["generation"] == (
            apply["response_body"]["metadata"]["generation"]
        ), APPLIES[index]
        assert fake.read(None, "serving", "triton-fraud-v2")["metadata"]["generation"] == (
            read["response_body"]["metadata"]["generation"]
        )
