"""Triton model configs: the config a load sends (the repository's config.pbtxt with a
version's overrides merged on top, by ``json_format.ParseDict``) and how a config read back
from the server compares with the one requested: its hash, its differences, and the fields the
server fills in itself. Pure functions over protobuf and JSON: no server calls.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from fleet.adapters.base import AdapterError

# Fields Triton fills in when the requested config leaves them unset (path -> accepted value).
# "*" stands for any list index. Used by config_difference() to tell server defaults apart from
# a config that really differs.


def _any(value: object) -> bool:
    """Accept any value Triton fills in."""
    return True


_ANY: Callable[[object], bool] = _any
SERVER_FILLED: dict[tuple[str, ...], Callable[[object], bool]] = {
    ("backend",): _ANY,
    ("platform",): _ANY,
    ("runtime",): _ANY,
    ("default_model_filename",): _ANY,
    ("instance_group", "*", "name"): _ANY,
    ("instance_group", "*", "kind"): lambda value: value in ("KIND_CPU", "KIND_GPU"),
    ("instance_group", "*", "count"): lambda value: value == 1,
    ("instance_group", "*", "gpus"): _ANY,
    ("optimization", "input_pinned_memory", "enable"): lambda value: value is True,
    ("optimization", "output_pinned_memory", "enable"): lambda value: value is True,
}


def normalize_config(config: Mapping[str, object]) -> dict[str, Any]:
    """A Triton model config (JSON as the server answers it) in canonical protobuf-JSON form.

    Round-trips through ``model_config_pb2.ModelConfig``: fields at their default value are
    dropped, int64 values become strings, enums their names, field names stay snake_case.
    Unknown fields (a server newer than the client library) are dropped.
    """
    msg = model_config_pb2.ModelConfig()
    json_format.ParseDict(dict(config), msg, ignore_unknown_fields=True)
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def config_hash(config: Mapping[str, object]) -> str:
    """sha256 of the canonical JSON of a model config, ``version_policy`` left out.

    The config is normalised first (:func:`normalize_config`), so the raw answer of
    ``GET /v2/models/<m>/versions/<v>/config`` and its normalised form hash the same.
    ``version_policy`` names the set of versions served together, not how this version runs
    (and Triton reports a stale one for versions kept across loads), so it is not hashed.
    """
    canonical = normalize_config(config)
    canonical.pop("version_policy", None)
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def config_difference(requested: Mapping[str, object], served: Mapping[str, object]) -> str:
    """Where the served config differs from the requested one ("" when it does not).

    Both are compared in normalised form (:func:`normalize_config`), ``version_policy`` left
    out. The rule: every field set in ``requested`` must have the same value in ``served``
    (lists element by element with equal length; maps key by key); a field set only in
    ``served`` is accepted only when it is one Triton fills in itself, with the value it
    fills in (:data:`SERVER_FILLED`: instance-group names, kinds and devices, a count of 1,
    pinned-memory defaults, the backend's default file name). Anything else set only on the
    server (a parameter, a batching option left from an earlier override) is a difference:
    a load that would remove it must reach the server.

    Sound in the direction that matters: "no difference" means the server runs what was
    asked. A server filling in more than listed (auto-completed inputs of some backends)
    makes the comparison report a difference, which costs a reload, never a wrong no-op.
    """
    want = normalize_config(requested)
    have = normalize_config(served)
    want.pop("version_policy", None)
    have.pop("version_policy", None)
    return _difference(want, have, ())


def _difference(want: object, have: object, path: tuple[str, ...]) -> str:
    """The first difference between normalised ``want`` and ``have`` at ``path`` ("" if none)."""
    where = ".".join(path) or "<config>"
    if isinstance(want, dict) and isinstance(have, dict):
        for key, value in want.items():
            if key not in have:
                return f"{'.'.join((*path, key))}: requested {value!r}, server has none"
            found = _difference(value, have[key], (*path, key))
            if found:
                return found
        for key, value in have.items():
            if key not in want:
                found = _server_filled(value, (*path, key))
                if found:
                    return found
        return ""
    if isinstance(want, list) and isinstance(have, list):
        if len(want) != len(have):
            return f"{where}: requested {len(want)} entries, server has {len(have)}"
        for index, (w, h) in enumerate(zip(want, have, strict=True)):
            found = _difference(w, h, (*path, str(index)))
            if found:
                return found
        return ""
    if want != have:
        return f"{where}: requested {want!r}, server has {have!r}"
    return ""


def _server_filled(value: object, path: tuple[str, ...]) -> str:
    """"" if ``value`` at ``path`` (absent from the request) is a default Triton fills in."""
    if isinstance(value, dict):
        for key, sub in value.items():
            found = _server_filled(sub, (*path, key))
            if found:
                return found
        return ""
    if isinstance(value, list) and path[-1:] != ("gpus",):
        for index, sub in enumerate(value):
            found = _server_filled(sub, (*path, str(index)))
            if found:
                return found
        return ""
    pattern = tuple("*" if part.isdigit() else part for part in path)
    accept = SERVER_FILLED.get(pattern)
    if accept is not None and accept(value):
        return ""
    return f"{'.'.join(path)}: server has {value!r}, not requested"


def effective_config(
    config_file: Path, model: str, overrides: Mapping[str, object]
) -> model_config_pb2.ModelConfig:
    """The model's ``config_file`` (its config.pbtxt in the repository) with ``overrides`` merged
    on top (no version_policy): the config a load of ``model`` sends. A permanent AdapterError
    for an unreadable config.pbtxt or a bad override key (named)."""
    msg = model_config_pb2.ModelConfig()
    path = config_file
    if path.is_file():
        try:
            text_format.Parse(path.read_text(encoding="utf-8"), msg)
        except text_format.ParseError as exc:
            detail = re.sub(r"^\d+:\d+ : ", "", str(exc))
            raise AdapterError(
                f"config.pbtxt of {model} is not a valid Triton model config (line {exc.GetLine()}, "
                f"column {exc.GetColumn()}): {detail}",
                permanent=True,
            ) from exc
        except UnicodeDecodeError as exc:
            raise AdapterError(f"config.pbtxt of {model} is not UTF-8 text: {exc}", permanent=True) from exc
    if not isinstance(overrides, Mapping):
        raise AdapterError(
            f"config overrides for {model} must be a JSON object, not "
            f"{type(overrides).__name__}",
            permanent=True,
        )
    extra = {k: v for k, v in overrides.items() if k not in ("version_policy", "versionPolicy")}
    try:
        json_format.ParseDict(extra, msg, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise AdapterError(
            f"invalid config override for {model}: {str(exc).splitlines()[0]}", permanent=True
        ) from exc
    if not msg.name:
        msg.name = model
    elif msg.name != model:
        raise AdapterError(
            f"config of {model} names the model {msg.name!r}: Triton needs the name of "
            "its folder",
            permanent=True,
        )
    msg.ClearField("version_policy")
    return msg


def config_message(config: Mapping[str, object]) -> model_config_pb2.ModelConfig:
    """A read-back config as a ModelConfig without its version_policy."""
    msg = model_config_pb2.ModelConfig()
    json_format.ParseDict(dict(config), msg, ignore_unknown_fields=True)
    msg.ClearField("version_policy")
    return msg
