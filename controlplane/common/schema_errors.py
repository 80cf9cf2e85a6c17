"""The API's error answers, in its OpenAPI schema: drf-spectacular documents only successes.

Every operation can answer 400 (a bad body or query), 401 (no or bad credentials), 403 (a plain user
changing placement, anyone but staff reading the audit trail) and 404 (no such object, or an unknown
``?format=``); one that writes 409 (a conflict with the current state, a delete of a row still in use),
413 (a body over the limit) and 415 (a body that is not JSON or a form); registration 429 (too many
attempts); every one in the shape ``controlplane.common.errors`` renders. Said in the schema, a client
generated from it (and the schema fuzz tests, tests/fuzz/) knows them.
"""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"description": "machine-readable, e.g. invalid, not_found, permission_denied",
                         "oneOf": [{"type": "string"}, {"type": "object"}]},
                "message": {"type": "string", "description": "what is wrong, in words a person can act on"},
                "details": {"description": "DRF's error detail, by field"},
            },
        }
    },
}
# 404 anywhere: DRF answers an unknown ``?format=`` with it.
ALWAYS = {"400": "invalid request", "401": "not authenticated", "403": "not allowed", "404": "not found"}
LIMITED = {"/api/v1/agents/register/": {"429": "too many registration attempts from this address"}}
WRITES = {"409": "conflicts with the current state", "413": "request body too large",
          "415": "unsupported media type"}


def add_error_responses(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: an ``Error`` component and each operation's error answers."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    reference = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            statuses = {**ALWAYS, **(WRITES if method in ("post", "put", "patch", "delete") else {}),
                        **LIMITED.get(path, {})}
            responses = operation.setdefault("responses", {})
            for code, description in statuses.items():
                responses.setdefault(code, {"description": description, "content": reference})
    return result
