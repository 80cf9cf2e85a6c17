"""Structured outputs asked of /v1/completions and /v1/chat/completions, as a StructuredConstraint
(contracts/structured.py) the sampler enforces (docs/gateway.md, "Structured outputs").

Two shapes, one at a time: OpenAI's ``response_format`` (``{"type": "text"}``, ``{"type":
"json_object"}``, ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``) and vLLM's
``structured_outputs`` object (its current shape: exactly one of ``json`` (a schema, as an object or
its JSON text), ``regex``, ``choice`` (a list of strings), ``grammar`` (Lark, llguidance's syntax) and
``json_object: true``). vLLM's older top-level ``guided_json``, ``guided_regex``, ``guided_choice`` and
``guided_grammar`` are read as the same ``structured_outputs`` keys. Every constraint is compiled here
(llguidance, without the model's tokenizer: its syntax, its schema), so a bad one is a 400 naming its
field before anything runs; the compile is cached per constraint.
"""

from __future__ import annotations

import json
from typing import Any

from contracts.structured import ConstraintError, StructuredConstraint
from controlplane.gateway.openai.errors import bad_request

VLLM_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
LEGACY_KEYS = {f"guided_{key}": key for key in VLLM_KEYS}


def _invalid(message: str, param: str, code: str = "invalid_value"):
    return bad_request(message, param=param, code=code)


def _object(value: Any, param: str) -> dict:
    if not isinstance(value, dict):
        raise _invalid(f"'{param}' must be an object", param, "invalid_type")
    return value


def _checked(kind: str, spec: str, param: str) -> StructuredConstraint:
    """The constraint, once it is well formed and compiles; else the 400 naming ``param``."""
    try:
        constraint = StructuredConstraint(kind, spec)
    except ConstraintError as exc:
        raise _invalid(f"'{param}' is invalid: {exc}", param) from None
    if (problem := constraint.problem()) is not None:
        raise _invalid(f"'{param}' does not compile: {problem}"[:2000], param)
    return constraint


def _schema_text(value: Any, param: str) -> str:
    """A JSON schema given as an object or as its JSON text, as text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise _invalid(f"'{param}' is not JSON: {exc}", param) from None
    return json.dumps(_object(value, param))


def _response_format(value: Any) -> StructuredConstraint | None:
    response_format = _object(value, "response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredConstraint("json_object", "")
    if kind != "json_schema":
        raise _invalid("'response_format.type' must be 'text', 'json_object' or 'json_schema'",
                       "response_format.type")
    described = _object(response_format.get("json_schema"), "response_format.json_schema")
    if not isinstance(described.get("name", ""), str):
        param = "response_format.json_schema.name"
        raise _invalid(f"'{param}' must be a string", param, "invalid_type")
    if not isinstance(described.get("strict", False), (bool, type(None))):
        raise _invalid("'response_format.json_schema.strict' must be a boolean",
                       "response_format.json_schema.strict", "invalid_type")
    param = "response_format.json_schema.schema"
    return _checked("json_schema", _schema_text(described.get("schema"), param), param)


def _structured_outputs(value: dict, name: str) -> StructuredConstraint:
    asked = {key: spec for key, spec in value.items() if spec not in (None, False)}
    if len(asked) != 1 or not set(asked) <= {*VLLM_KEYS, "json_object"}:
        keys = [*VLLM_KEYS, "json_object"]
        raise _invalid(f"'{name}' takes exactly one of {keys}; got {sorted(asked)}", name)
    ((key, spec),) = asked.items()
    return _vllm(key, spec, f"{name}.{key}")


def _vllm(key: str, spec: Any, param: str) -> StructuredConstraint:
    """One key of vLLM's ``structured_outputs`` and its value; ``param``: the field a 400 names."""
    if key == "json_object":
        if spec is not True:
            raise _invalid(f"'{param}' must be true", param, "invalid_type")
        return StructuredConstraint("json_object", "")
    if key == "json":
        return _checked("json_schema", _schema_text(spec, param), param)
    if key == "choice":
        if not isinstance(spec, list) or not spec or not all(isinstance(c, str) for c in spec):
            raise _invalid(f"'{param}' must be a non-empty list of strings", param, "invalid_type")
        return _checked("choice", json.dumps(spec), param)
    if not isinstance(spec, str) or not spec:
        raise _invalid(f"'{param}' must be a non-empty string", param, "invalid_type")
    return _checked(VLLM_KEYS[key], spec, param)


def structured_constraint(body: dict) -> StructuredConstraint | None:
    """What the request's output must match (None: anything); raises OpenAIError (400) naming the field."""
    asked = [name for name in ("response_format", "structured_outputs", *LEGACY_KEYS)
             if body.get(name) is not None]
    if len(asked) > 1:
        raise _invalid(f"give one of {asked}, not several", asked[1])
    if not asked:
        return None
    (name,) = asked
    if name == "response_format":
        return _response_format(body[name])
    if name == "structured_outputs":
        return _structured_outputs(_object(body[name], name), name)
    return _vllm(LEGACY_KEYS[name], body[name], name)
