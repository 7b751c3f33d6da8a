"""Request body parsers for the API that refuse hostile input before it reaches a serializer.

JSON bodies are checked in two steps. Before ``json.loads`` runs, one linear scan of the text
(strings skipped whole) measures how deep arrays and objects nest, so a body nested a thousand
levels deep is a 400 instead of a RecursionError. After parsing, a walk of the (now shallow)
value refuses NUL characters in any key or string, numbers beyond 64 bits and non-finite
floats (``1e400``), none of which any field stores. Form and multipart bodies get the NUL check.

Every refusal is a 400 in the API's error shape, keyed by the top-level field (``body`` when
the body itself is at fault), the message starting with the full path when it lies deeper:
``{"triton_config": ["triton_config.parameters[x].string_value: NUL characters are not allowed"]}``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_DEPTH = 64
MAX_INT = 2**64  # what no field of the API stores past; larger ones are refused whole
MAX_INT_DIGITS = 20  # longer digit strings are not converted at all (see _parse_int)
NUL = "\x00"
BODY = "body"

# A JSON string (escapes included) or one structural character; numbers and literals are
# skipped. On valid JSON this tokenizes exactly; on invalid JSON json.loads reports the error.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]', re.DOTALL)


class InputRefused(ValueError):
    """Input no field accepts; ``path`` is a list of keys and indices from the top."""

    def __init__(self, path: list[str | int], reason: str) -> None:
        super().__init__(reason)
        self.path = path
        self.reason = reason

    @property
    def field(self) -> str:
        return self.path[0] if self.path and isinstance(self.path[0], str) else BODY

    @property
    def where(self) -> str:
        return format_path(self.path)

    def as_dict(self) -> dict[str, list[str]]:
        if len(self.path) <= 1 and self.field != BODY:
            return {self.field: [self.reason]}
        return {self.field: [f"{self.where}: {self.reason}"]}


def format_path(path: list[str | int]) -> str:
    """``["triton_config", "instance_group", 0, "kind"]`` → ``triton_config.instance_group[0].kind``."""
    text = BODY if path and isinstance(path[0], int) else ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    text = text or BODY
    return text if len(text) <= 200 else f"{text[:200]}…"


def check_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """Raise InputRefused if arrays and objects in the JSON ``text`` nest deeper than ``limit``.

    Never recurses: one pass over the tokens, keeping the key or index of each open level.
    """
    if text.count("[") + text.count("{") <= limit:
        return
    stack: list[list[Any]] = []  # [kind, key or index] per open container
    last_string = ""
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            last_string = token
        elif token in "[{":
            if len(stack) >= limit:
                path = [entry[1] for entry in stack if entry[1] is not None]
                raise InputRefused(path, f"nested deeper than {limit} levels")
            stack.append([token, 0 if token == "[" else None])
        elif token in "]}":
            if stack:
                stack.pop()
        elif token == ":" and stack and stack[-1][0] == "{":
            try:
                stack[-1][1] = json.loads(last_string)
            except ValueError:
                stack[-1][1] = last_string.strip('"')
        elif token == "," and stack and stack[-1][0] == "[":
            stack[-1][1] += 1


class _OutOfRange(str):
    """A number kept as its text because it is beyond what any field stores."""


def _parse_int(text: str) -> int | _OutOfRange:
    # Digit strings are converted in quadratic time; beyond 64 bits none is needed.
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        return _OutOfRange(text)
    return int(text)


def _parse_float(text: str) -> float | _OutOfRange:
    value = float(text)
    return value if math.isfinite(value) else _OutOfRange(text)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def check_values(value: Any, path: list[str | int] | None = None) -> None:
    """Raise InputRefused for a NUL character, or a number no field stores, anywhere in ``value``.

    Recursive: call it on values whose depth was bounded first (:func:`check_depth`).
    """
    path = path or []
    if isinstance(value, _OutOfRange):
        raise InputRefused(path, f"the number {_abbreviate(value)} is out of range")
    if isinstance(value, str):
        if NUL in value:
            raise InputRefused(path, "NUL characters are not allowed")
        if not value.isascii() and not _encodable(value):
            raise InputRefused(path, "not valid Unicode text (a lone surrogate escape)")
    elif isinstance(value, bool):
        return
    elif isinstance(value, int):
        if not -MAX_INT < value < MAX_INT:
            raise InputRefused(path, f"the number {_abbreviate(str(value))} is out of range")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and (NUL in key or not _encodable(key)):
                shown = key.replace(NUL, "\\u0000").encode("utf-8", "backslashreplace").decode()
                reason = "NUL characters are not allowed" if NUL in key else "not valid Unicode text"
                raise InputRefused([*path, shown], f"{reason} in names")
            check_values(item, [*path, key])
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_values(item, [*path, index])


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _abbreviate(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}…{text[-6:]} ({len(text)} characters)"


def loads(text: str) -> Any:
    """``json.loads`` for untrusted text: depth, NUL and number checks; ValueError when invalid."""
    check_depth(text)
    value = json.loads(
        text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant
    )
    check_values(value)
    return value


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser with :func:`loads`: hostile bodies are a 400 naming the field."""

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = stream.read().decode(encoding)
        except LookupError:
            # The Content-Type named a charset that is no text encoding (``bz2_codec``,
            # ``rot13``) or none at all.
            raise ParseError(
                f"JSON parse error - charset {encoding[:40]!r} is not a text encoding"
            ) from None
        except (UnicodeError, ValueError) as exc:
            raise ParseError(f"JSON parse error - the body is not {encoding[:40]} text") from exc
        try:
            return loads(text)
        except InputRefused as exc:
            raise ParseError(exc.as_dict()) from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def _check_form(data: Any) -> None:
    for key, values in data.lists():
        for value in [key, *values]:
            if isinstance(value, str) and NUL in value:
                field = key.replace(NUL, "\\u0000")
                raise ParseError({field: ["NUL characters are not allowed"]})


class FormParser(parsers.FormParser):
    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        _check_form(data)
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        result = super().parse(stream, media_type, parser_context)
        _check_form(result.data)
        return result
