"""The grammar that makes a model call a tool: ``tool_choice`` "required" or a named function.

As vLLM does, the call is forced with a grammar applied as a token mask where the head samples (a
``StructuredConstraint`` of kind "grammar": Lark in llguidance's syntax). The grammar is the model's own
call format (tools/formats.py) around one JSON schema per function, ``{"name": <the name>, <its
arguments key>: <its parameters>}``, so the model writes what it was trained to write and the parser
reads it as any call: the ``%json`` rule compiles each schema, separators fixed to the ``", "`` and
``": "`` that the templates render (no free whitespace for a model to wander in). A marker or closing
tag that is an added token of the tokenizer is named by its id (``<[id]>``): llguidance matches an
added token only as itself, never as the string it stands for.

"required" allows several calls where ``parallel_tool_calls`` does, a named function exactly one.
``tool_constraint`` makes it the request's constraint, compiled here as every constraint is (a
function's ``parameters`` that do not compile: a 400 naming ``tools``); a request that also asks a
``response_format`` or ``structured_outputs`` is refused, since its output can match only one grammar.
"""

from __future__ import annotations

import json
import re

from contracts.structured import ConstraintError, StructuredConstraint
from controlplane.gateway.openai.errors import bad_request
from controlplane.gateway.openai.tools.calling import ToolCalling
from controlplane.gateway.openai.tools.formats import ToolFormat

JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
MISTRAL_ID = {"type": "string", "pattern": "^[A-Za-z0-9]{9}$"}  # Mistral's template writes one back


def _layout(fmt: ToolFormat) -> tuple[str, str, str, str, str]:
    """The format's text before the calls, before a call, after a call, between calls, after the calls."""
    marker = fmt.markers[0]
    return {
        "hermes": ("", marker + "\n", "\n" + fmt.closer, "\n", ""),
        "mistral": (marker + " [", "", "", ", ", "]"),
        "llama3_json": ("", "", "", "; ", ""),
    }[fmt.name]


def _lark(text: str, added: dict[str, int]) -> str:
    """``text`` as a Lark sequence: string literals, and the added tokens in it by id (llguidance
    matches an added token only as that token)."""
    parts = re.split("(" + "|".join(map(re.escape, added)) + ")", text) if added else [text]
    return " ".join(f"<[{added[p]}]>" if p in added else json.dumps(p) for p in parts if p)


def call_schema(fmt: ToolFormat, name: str, parameters: dict) -> dict:
    """The JSON schema of one call of ``name`` as ``fmt`` writes it."""
    key = fmt.arguments_keys[0]
    properties = {"name": {"const": name}, key: parameters} | ({"id": MISTRAL_ID} if fmt.mistral_ids else {})
    return {"type": "object", "properties": properties, "required": ["name", key],
            "additionalProperties": False, "x-guidance": JSON_STYLE}


def tool_choice_grammar(calling: ToolCalling) -> str | None:
    """The Lark grammar that forces the request's ``tool_choice``; None where nothing is forced."""
    request, fmt = calling.request, calling.format
    if request.choice not in ("required", "function"):
        return None
    names = [request.function] if request.choice == "function" else list(request.names)
    before, opens, closes, between, after = (_lark(t, calling.added_tokens) for t in _layout(fmt))
    several = request.choice == "required" and request.parallel
    calls = f"call ({between} call)*" if several else "call"
    rules = [
        " ".join(p for p in ("start:", before, calls, after) if p),
        " ".join(p for p in ("call:", opens, "body", closes) if p),
        "body: " + " | ".join(f"fn_{i}" for i in range(len(names))),
    ]
    rules += [f"fn_{i}: %json {json.dumps(call_schema(fmt, name, request.schema(name)))}"
              for i, name in enumerate(names)]
    return "\n".join(rules) + "\n"


def tool_constraint(calling: ToolCalling, asked: StructuredConstraint | None) -> StructuredConstraint | None:
    """The request's constraint once its ``tool_choice`` is forced (``asked``: its own, from
    ``response_format`` or ``structured_outputs``); raises the 400s."""
    grammar = tool_choice_grammar(calling)
    if grammar is None:
        return asked
    if asked is not None:
        raise bad_request("tool_choice 'required' or a named function forces the output's grammar; it cannot "
                          "be combined with response_format or structured_outputs", param="tool_choice",
                          code="invalid_value")
    try:
        constraint = StructuredConstraint("grammar", grammar)
    except ConstraintError as exc:
        raise bad_request(f"the tools make a grammar too large to force a call: {exc}", param="tools",
                          code="invalid_value") from None
    if (problem := constraint.problem()) is not None:
        raise bad_request(f"a function's parameters do not compile as a JSON schema: {problem}"[:2000],
                          param="tools", code="invalid_value")
    return constraint
