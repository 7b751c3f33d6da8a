"""The workload adapter's API calls, against what a real kube-apiserver answered.

Each test serves recorded exchanges (tests/kube/recorded) and asserts that every request the
adapter sent was one of them, so what it sends is what the real server took; the answers
(and the errors) are the real server's.
"""

from __future__ import annotations

import pytest

from fleet.adapters import kube_workloads as kw
from fleet.adapters.kubernetes import KubeAccess, KubeError
from tests.kube.replay import RecordedApiServer, exchanges
from tests.kube.test_workload_manifests import triton_spec, vllm_spec


def access(srv: RecordedApiServer) -> KubeAccess:
    return KubeAccess(auth="token", url=srv.url, token="switchyard-test-token", timeout_s=5)


def test_server_side_apply_of_the_triton_deployment_creates_it():
    with RecordedApiServer(exchanges("03-deployments", 34)) as srv:
        applied = kw.apply(access(srv), kw.deployment_manifest(triton_spec(3, 1)))

    srv.assert_all_matched()
    assert applied["metadata"]["generation"] == 1
    [owner] = applied["metadata"]["managedFields"]
    assert (owner["manager"], owner["operation"]) == ("switchyard", "Apply")
    # Only the fields Switchyard sent are its own: defaults the server filled in are not.
    owned = owner["fieldsV1"]["f:spec"]
    assert "f:replicas" in owned and "f:progressDeadlineSeconds" not in owned


def test_the_service_apply_is_the_same_kind_of_request_on_the_services_path():
    """Never recorded for a Service: the request is checked against the recorded Deployment
    apply, the answer is the replay server's refusal."""
    with RecordedApiServer([]) as srv, pytest.raises(KubeError):
        kw.apply(access(srv), kw.service_manifest(vllm_spec()))

    [sent] = srv.received
    deployment_apply = exchanges("03-deployments", 34)[0]
    assert (sent.method, sent.path) == ("PATCH", "/api/v1/namespaces/serving/services/vllm-llama")
    assert sent.query == {"fieldManager": ["switchyard"], "force": ["true"]}
    assert sent.content_type == deployment_apply["request_headers"]["Content-Type"]
    assert sent.body == kw.service_manifest(vllm_spec())


def test_applying_something_else_than_a_deployment_or_service_is_refused_before_any_call():
    with RecordedApiServer([]) as srv, pytest.raises(KubeError, match="cannot apply"):
        kw.apply(access(srv), {"kind": "Pod", "metadata": {"name": "x", "namespace": "y"}})
    assert srv.received == []


def test_scale_patches_the_replica_count_through_the_scale_subresource():
    with RecordedApiServer(exchanges("03-deployments", 16)) as srv:
        scaled = kw.scale(access(srv), "serving", "triton-fraud-v1", 3)

    srv.assert_all_matched()
    assert scaled["kind"] == "Scale"
    assert scaled["spec"] == {"replicas": 3}


def test_a_refused_scale_is_a_readable_permanent_error_naming_the_field():
    with RecordedApiServer(exchanges("03-deployments", 18)) as srv, \
            pytest.raises(KubeError) as refused:
        kw.scale(access(srv), "serving", "triton-fraud-v2", -1)

    srv.assert_all_matched()
    assert refused.value.kind == "invalid"
    assert refused.value.permanent
    assert refused.value.causes[0]["field"] == "spec.replicas"
    assert "must be greater than or equal to 0" in refused.value.message
    assert refused.value.message.startswith("scale Deployment serving/triton-fraud-v2: ")


def test_a_deployment_no_controller_has_seen_is_still_waiting():
    """The recorded server ran no controllers: the status stays {}."""
    with RecordedApiServer(exchanges("03-deployments", 7)) as srv:
        found = kw.read(access(srv), "serving", "triton-fraud-v1")

    srv.assert_all_matched()
    judged = kw.readiness(found)
    assert judged.state == kw.WAITING
    assert judged.observed["generation"] == 1
    assert judged.observed["desired"] == 2
    assert "generation 1" in judged.detail


@pytest.mark.parametrize(("recording", "index", "name", "kind", "text"), [
    ("06-auth-errors", 7, "triton-fraud-v1", "forbidden", "forbidden by RBAC (403)"),
    ("06-auth-errors", 1, "triton-fraud-v1", "unauthorized", "refused the credentials"),
    ("03-deployments", 28, "triton-fraud-v9", "not_found", "not found"),
])
def test_reading_fails_readably(recording, index, name, kind, text):
    with RecordedApiServer(exchanges(recording, index)) as srv, \
            pytest.raises(KubeError) as failed:
        kw.read(access(srv), "serving", name)

    srv.assert_all_matched()
    assert failed.value.kind == kind
    assert failed.value.permanent
    assert text in failed.value.message


def test_deleting_answers_whether_there_was_something_to_delete():
    with RecordedApiServer(exchanges("03-deployments", 35, 37, 38)) as srv:
        deployment = kw.delete_deployment(access(srv), "serving", "triton-fraud-v3")
        service = kw.delete_service(access(srv), "serving", "vllm-llama")
        again = kw.delete_deployment(access(srv), "serving", "vllm-llama")

    srv.assert_all_matched()
    assert (deployment, service, again) == (True, True, False)


def test_an_unreachable_api_server_is_a_transient_error():
    unreachable = KubeAccess(auth="token", url="http://127.0.0.1:1", token="t", timeout_s=2)

    with pytest.raises(KubeError) as failed:
        kw.read(unreachable, "serving", "triton-fraud-v1")

    assert failed.value.kind == "unreachable"
    assert not failed.value.permanent
