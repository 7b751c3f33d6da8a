"""Validate objects Switchyard writes against the published schemas.

* Custom resources (Gateway API HTTPRoute, Istio VirtualService): the ``openAPIV3Schema`` of
  the CRD that was installed on the recorded server (``recorded/crds/``), with jsonschema.
  ``x-kubernetes-*`` extensions and CEL rules are not JSON Schema and are not checked here;
  the recorded 422 exchanges show the server enforcing those.
* Built-in kinds (Deployment, Service, Scale): the official client's models. Every field must
  parse into the model with the right type, and nothing may be dropped on the way (a field the
  model does not know is a field the API server would reject or prune).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes import client

from tests.kube.replay import CRDS


@cache
def crd_schema(relative: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of ``version`` in the CRD file ``relative`` (under recorded/crds)."""
    crd = yaml.safe_load((CRDS / relative).read_text())
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            return served["schema"]["openAPIV3Schema"]
    raise KeyError(f"{relative} serves no version {version}")


HTTPROUTE_V1BETA1 = ("gateway-api-v0.7.1/gateway.networking.k8s.io_httproutes.yaml", "v1beta1")
HTTPROUTE_V1 = ("gateway-api-v1.0.0/gateway.networking.k8s.io_httproutes.yaml", "v1")
VIRTUALSERVICE_V1 = ("istio-1.22.8/virtualservices.networking.istio.io.yaml", "v1")
DESTINATIONRULE_V1 = ("istio-1.22.8/destinationrules.networking.istio.io.yaml", "v1")


def validate_custom(obj: dict[str, Any], crd: tuple[str, str]) -> None:
    """Raise jsonschema.ValidationError when ``obj`` breaks the CRD's schema."""
    schema = crd_schema(*crd)
    jsonschema.Draft7Validator(schema).validate(obj)


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value


def validate_builtin(obj: dict[str, Any], model: type) -> None:
    """Raise AssertionError (or pydantic's ValidationError) when ``obj`` is not a valid
    ``model`` (e.g. ``client.V1Deployment``) as the official client defines it."""
    parsed = model.from_dict(obj)
    back = _strip_none(client.ApiClient().sanitize_for_serialization(parsed))
    assert back == _strip_none(obj), (
        f"fields the client's {model.__name__} does not know, or of the wrong shape:\n"
        f"sent:   {obj}\nparsed: {back}"
    )


def recorded_file(name: str) -> Path:
    return CRDS.parent / "recordings" / f"{name}.json"
