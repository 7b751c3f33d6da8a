"""OpenAPI schema hooks: every operation states the errors it can answer, in one shape.

Views declare their successes; the errors come from a few places the whole API shares
(authentication, tenancy, validation, domain conflicts, throttling), so they are added here,
once, to every operation they apply to, rather than annotated view by view.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular import openapi

ERROR = "Error"
MIN_INTEGER = -(2**63)
MAX_INTEGER = 2**63 - 1
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "Every API error. `detail` says what went wrong when no one input is at fault; "
        "otherwise each key is the field at fault (`non_field_errors` for several together, "
        "`idempotency_key` for the header) with its messages."
    ),
    "properties": {
        "detail": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
        },
        "field": {"type": "string", "description": "The input at fault, when there is one"},
    },
    "additionalProperties": {
        "description": "Messages for this field (a list, or an object for nested inputs)",
    },
    "example": {"version": ["fraud-scorer has no version 9"]},
}

DESCRIPTIONS = {
    "400": "Bad input: the field at fault is named",
    "401": "No credentials, or a malformed, unknown, revoked or expired token",
    "403": "Too low a role in the tenant, or not a platform admin for fleet writes",
    "404": "No such object among those you can see (another tenant's objects are 404 too), "
           "or no such page",
    "409": "The request conflicts with the current state (in flight, in use, already "
           "exists differently)",
    "413": "The request body is too large",
    "415": "The request body is not JSON (or a form)",
    "429": "Too many requests: wait and retry",
}
METHODS = ("get", "post", "put", "patch", "delete")


class AutoSchema(openapi.AutoSchema):
    """Filters, ordering and pages apply to GET lists only: an operation that answers a list
    to a POST (``POST /loads/`` answers the loads it started) takes none of their parameters,
    and answers a plain list, not a page."""

    def get_filter_backends(self) -> list[Any]:
        return super().get_filter_backends() if self.method == "GET" else []

    def _get_paginator(self) -> Any:
        return super()._get_paginator() if self.method == "GET" else None


def _codes(method: str, operation: dict[str, Any]) -> set[str]:
    codes = {"401", "403", "404", "429"}
    has_query = any(p.get("in") == "query" for p in operation.get("parameters", []))
    if method != "get" or has_query or operation.get("requestBody"):
        codes.add("400")
    if method != "get":
        codes.add("409")
    if operation.get("requestBody"):
        codes |= {"413", "415"}
    return codes


def add_error_responses(result: dict[str, Any], generator: Any, request: Any,
                        public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the Error component on every error status each
    operation can answer, and request bodies that refuse keys they do not take."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas[ERROR] = ERROR_SCHEMA
    error_content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{ERROR}"}}}
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            responses = operation.setdefault("responses", {})
            for code in sorted(_codes(method, operation)):
                response = responses.setdefault(code, {"description": DESCRIPTIONS[code]})
                response.setdefault("content", error_content)
    # The serializers refuse unknown and read-only keys (400 naming them): say so.
    for name, schema in schemas.items():
        if name.endswith("Request") and schema.get("type") == "object":
            schema.setdefault("additionalProperties", False)
    _bound_integers(result)
    return result


def _bound_integers(node: Any) -> None:
    """Every whole number the API takes or gives fits in 64 bits (the JSON parser refuses
    larger ones, console/parsers.py): state it where a field sets no narrower bound."""
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
            node.setdefault("minimum", MIN_INTEGER)
            node.setdefault("maximum", MAX_INTEGER)
        for value in node.values():
            _bound_integers(value)
    elif isinstance(node, list):
        for value in node:
            _bound_integers(value)
