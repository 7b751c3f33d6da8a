"""The OpenAPI schema of a version's ``triton_config``: Triton's ``ModelConfig``, as JSON.

Written from the same protobuf descriptor that ``rollouts.registry.triton_config`` checks a config
against, so the request schema states what registering a version accepts: the fields of each
message (by their protobuf names; the camelCase JSON names are read too), their types and
ranges, enums by name, maps as objects, and at most one field of each ``oneof``. Switchyard's
own rules that a schema can state are here too: ``version_policy`` is left to Switchyard, and
an instance group counts at least one instance. The model's name and backend, if given, must
be the version's (said in the description). Answers give the config as it was registered.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2

from fleet.api.serializers import JSONObjectField
from rollouts.registry.triton_config import SET_AT_LOAD

FLOAT32_MAX = 3.4028234663852886e38
_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    # The API's JSON numbers stop at 64 bits, signed or not (console/parsers.py).
    FieldDescriptor.TYPE_UINT64: (0, 2**63 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**63 - 1),
}
# Switchyard's rules on top of Triton's, by message and field.
_MINIMUMS = {("inference.ModelInstanceGroup", "count"): 1}
_LEFT_TO_SWITCHYARD = {("inference.ModelConfig", name) for name in SET_AT_LOAD}


def component_name(message: Descriptor) -> str:
    """``inference.ModelOptimizationPolicy.Cuda`` → ``TritonModelOptimizationPolicyCuda``."""
    return "Triton" + message.full_name.removeprefix("inference.").replace(".", "")


class _Builder:
    """Builds one component per message, registering each once."""

    def __init__(self, auto_schema: Any) -> None:
        self.auto_schema = auto_schema

    def message(self, message: Descriptor) -> dict[str, Any]:
        component = ResolvedComponent(
            name=component_name(message), type=ResolvedComponent.SCHEMA, object=message.full_name,
        )
        registry = self.auto_schema.registry
        if component not in registry:
            registry.register(component)  # before the fields: a message may refer to itself
            component.schema = self._message_schema(message)
        return component.ref

    def _message_schema(self, message: Descriptor) -> dict[str, Any]:
        properties = {
            field.name: self.field(field)
            for field in message.fields
            if (message.full_name, field.name) not in _LEFT_TO_SWITCHYARD
        }
        schema: dict[str, Any] = {
            "type": "object",
            "description": f"Triton's {message.full_name.removeprefix('inference.')}",
            "properties": properties,
            "additionalProperties": False,
        }
        exclusive = [
            {"not": {"required": list(pair)}}
            for oneof in message.oneofs
            for pair in combinations([f.name for f in oneof.fields], 2)
        ]
        if exclusive:
            schema["allOf"] = exclusive
        return schema

    def field(self, field: FieldDescriptor) -> dict[str, Any]:
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
            schema: dict[str, Any] = {"type": "object", "additionalProperties": self.single(value)}
            if key.type != FieldDescriptor.TYPE_STRING:
                schema["propertyNames"] = {"pattern": "^[0-9]{1,18}$"}
            return schema
        if field.is_repeated:
            return {"type": "array", "items": self.single(field)}
        return self.single(field)

    def single(self, field: FieldDescriptor) -> dict[str, Any]:
        kind = field.type
        if field.message_type is not None:
            return self.message(field.message_type)
        if field.enum_type is not None:
            return {"type": "string", "enum": [value.name for value in field.enum_type.values]}
        if kind in _RANGES:
            low, high = _RANGES[kind]
            low = max(low, _MINIMUMS.get((field.containing_type.full_name, field.name), low))
            return {"type": "integer", "minimum": low, "maximum": high}
        if kind == FieldDescriptor.TYPE_FLOAT:
            return {"type": "number", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX}
        if kind == FieldDescriptor.TYPE_DOUBLE:
            return {"type": "number"}
        if kind == FieldDescriptor.TYPE_BOOL:
            return {"type": "boolean"}
        if kind == FieldDescriptor.TYPE_BYTES:
            return {"type": "string", "format": "byte"}
        return {"type": "string"}


class TritonConfigField(JSONObjectField):
    """A version's Triton model config (checked in full by the model: rollouts.registry.triton_config)."""


class TritonConfigFieldSchema(OpenApiSerializerFieldExtension):
    target_class = "rollouts.api.triton_schema.TritonConfigField"

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        if direction == "response":
            return {"type": "object", "description": "The Triton model config, as registered"}
        schema = dict(_Builder(auto_schema).message(model_config_pb2.ModelConfig.DESCRIPTOR))
        return {
            "allOf": [schema],
            "description": (
                "Merged over the model's config.pbtxt when the version is loaded (Triton "
                "versions only; vLLM versions leave it out). `name` and `backend`, if given, "
                "must be the model's name and the version's backend; `version_policy` is set by "
                "Switchyard. Fields go by their protobuf names (`max_batch_size`); the camelCase "
                "JSON names (`maxBatchSize`) are read too."
            ),
        }
