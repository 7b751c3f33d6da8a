"""Checking a version's ``triton_config`` against Triton's ``ModelConfig`` when it is registered.

A version is immutable once registered and loaded long after, so its config is checked up front
against the protobuf schema Triton itself parses (``inference.ModelConfig`` from tritonclient):
unknown fields, wrong types, values out of range. The load merges the config over the model's
``config.pbtxt`` with ``json_format.ParseDict`` (``fleet.adapters.triton_model_config``), so what
passes here is what the load can send. Each problem names its path, such as
``triton_config.instance_group[0].kind``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2

FIELD = "triton_config"
# protobuf's own "at Type.field[0]" suffix: the path is named by the caller instead.
_WHERE = re.compile(r' at "?[A-Z]\w*(?:\.\w+|\[[^\]]*\])*"?$')
# Set by Switchyard at load time: the versions of the model served together.
SET_AT_LOAD = frozenset({"version_policy", "versionPolicy"})


def problems(config: Any, *, model_name: str | None, backend: str) -> list[str]:
    """What is wrong with ``config`` for a Triton version of ``model_name`` (empty: nothing).

    Messages start with the path at fault. Besides the schema: the model's name, if given,
    must be the model's own (Triton needs the name of the repository folder); the backend,
    if given, the version's; ``version_policy`` is left to Switchyard; instance counts are at
    least 1, since they are what a load asks of the tenant's quota.
    """
    if not isinstance(config, Mapping):
        return [f"{FIELD}: must be a JSON object (Triton model config)"]
    found = list(_schema_problems(config, model_config_pb2.ModelConfig.DESCRIPTOR, FIELD))
    if found:
        return found
    try:
        json_format.ParseDict(dict(config), model_config_pb2.ModelConfig())
    except json_format.ParseError as exc:  # anything the walk does not see (oneof clashes)
        return [f"{FIELD}: {_reason(exc)}"]
    for key in SET_AT_LOAD & set(config):
        found.append(
            f"{FIELD}.{key}: set by Switchyard when a version is loaded (the versions served "
            "together); leave it out"
        )
    name = config.get("name")
    if name and model_name is not None and name != model_name:
        found.append(f"{FIELD}.name: must be the model's name, {model_name!r}, or left out")
    given_backend = config.get("backend")
    if given_backend and given_backend != backend:
        found.append(f"{FIELD}.backend: {given_backend!r} differs from the version's backend {backend!r}")
    groups = config.get("instance_group") or config.get("instanceGroup") or []
    for index, group in enumerate(groups):
        count = group.get("count")
        if count is not None and int(count) < 1:
            found.append(
                f"{FIELD}.instance_group[{index}].count: must be at least 1 (instances count "
                "against the tenant's quota)"
            )
    return found


def _schema_problems(value: Mapping[str, Any], message: Descriptor, path: str) -> Iterator[str]:
    """Unknown fields and wrong shapes, with their paths, walking the message descriptor."""
    by_json = {f.json_name: f for f in message.fields}
    for key, item in value.items():
        field = message.fields_by_name.get(key) or by_json.get(key)
        where = f"{path}.{key}"
        if field is None:
            yield f"{where}: not a field of Triton's {message.name}"
            continue
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if is_map:
            if not isinstance(item, Mapping):
                yield f"{where}: must be an object"
                continue
            value_field = field.message_type.fields_by_name["value"]
            for map_key, map_item in item.items():
                if "\x00" in str(map_key):
                    yield f"{where}: NUL characters are not allowed in names"
                    continue
                yield from _field_problems(map_item, value_field, f"{where}[{map_key}]")
        elif _is_repeated(field):
            if not isinstance(item, list):
                yield f"{where}: must be a list"
                continue
            for index, element in enumerate(item):
                yield from _field_problems(element, field, f"{where}[{index}]")
        else:
            yield from _field_problems(item, field, where)


def _field_problems(value: Any, field: FieldDescriptor, path: str) -> Iterator[str]:
    if field.message_type is not None:
        if not isinstance(value, Mapping):
            yield f"{path}: must be an object (Triton's {field.message_type.name})"
            return
        yield from _schema_problems(value, field.message_type, path)
        return
    if value is None:
        yield f"{path}: must not be null"
        return
    if isinstance(value, str) and "\x00" in value:
        yield f"{path}: NUL characters are not allowed"
        return
    # One scalar at a time, in a message of the field's own type, so the message names this path.
    probe = message_factory.GetMessageClass(field.containing_type)()
    try:
        json_format.ParseDict({field.name: [value] if _is_repeated(field) else value}, probe)
    except json_format.ParseError as exc:
        yield f"{path}: {_reason(exc)}"


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _reason(exc: Exception) -> str:
    """protobuf's message without its ``Failed to parse x field:`` chain and ``at ...`` suffix."""
    text = str(exc).splitlines()[0]
    while text.startswith("Failed to parse ") and " field: " in text:
        text = text.split(" field: ", 1)[1]
    text = _WHERE.sub("", text.rstrip("."))
    return text or "invalid"
