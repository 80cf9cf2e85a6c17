"""A chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, and the tool parts of its
messages (an assistant's ``tool_calls``, a ``tool`` message's ``tool_call_id``), checked field by field:
each rule answers a 400 naming the field.

Messages reach the chat template as transformers passes them (the OpenAI shapes), except that a call's
``function.arguments``, a JSON string in OpenAI's API, is given to the template as the object it
encodes, as vLLM does: templates write it with ``tojson``, which would otherwise quote the string.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from controlplane.gateway.openai.errors import bad_request

MAX_TOOLS = 128  # OpenAI's limit
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[dict, ...]  # each {"type": "function", "function": {"name", "description"?, "parameters"?}}
    choice: str  # "none" | "auto" | "required" | "function" (the one named by ``function``)
    function: str | None = None  # tool_choice's named function
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    def schema(self, name: str) -> dict:
        """The named function's parameters (an empty object's schema where it declares none)."""
        function = next(t["function"] for t in self.tools if t["function"]["name"] == name)
        return function.get("parameters") or {"type": "object", "properties": {}}


def _function(tool: Any, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise bad_request(f"{where} must be an object with type 'function'", param=f"{where}.type",
                          code="invalid_value")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise bad_request(f"{where}.function must be an object", param=f"{where}.function",
                          code="invalid_type")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad_request(f"{where}.function.name must be 1-64 letters, digits, '_' or '-'",
                          param=f"{where}.function.name", code="invalid_value")
    out: dict[str, Any] = {"name": name}
    if (description := function.get("description")) is not None:
        if not isinstance(description, str):
            raise bad_request(f"{where}.function.description must be a string",
                              param=f"{where}.function.description", code="invalid_type")
        out["description"] = description
    if (parameters := function.get("parameters")) is not None:
        if not isinstance(parameters, dict):
            raise bad_request(f"{where}.function.parameters must be a JSON schema (an object)",
                              param=f"{where}.function.parameters", code="invalid_type")
        out["parameters"] = parameters
    return {"type": "function", "function": out}


def _choice(body: dict, names: list[str]) -> tuple[str, str | None]:
    choice = body.get("tool_choice")
    if choice is None:
        return ("auto" if names else "none"), None
    if isinstance(choice, str) and choice in CHOICES:
        if choice == "required" and not names:
            raise bad_request("tool_choice 'required' needs 'tools'", param="tool_choice",
                              code="invalid_value")
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise bad_request(
            "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
            "{\"name\": …}}", param="tool_choice", code="invalid_value")
    if name not in names:
        raise bad_request(f"tool_choice names the function {name!r}, which is not in 'tools'",
                          param="tool_choice.function.name", code="invalid_value")
    return "function", name


def tool_request(body: dict) -> ToolRequest | None:
    """The request's tools and choice; None where it has no tools (or ``tool_choice`` "none" without
    them)."""
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise bad_request(f"'{legacy}' is deprecated and not supported; use 'tools'", param=legacy,
                              code="unsupported_parameter")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or len(tools) > MAX_TOOLS):
        raise bad_request(f"'tools' must be a list of at most {MAX_TOOLS} tools", param="tools",
                          code="invalid_type")
    parsed = [_function(tool, i) for i, tool in enumerate(tools or [])]
    names = [t["function"]["name"] for t in parsed]
    if len(set(names)) != len(names):
        raise bad_request("'tools' names a function twice", param="tools", code="invalid_value")
    choice, function = _choice(body, names)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls",
                          code="invalid_type")
    if not parsed:
        return None
    return ToolRequest(tools=tuple(parsed), choice=choice, function=function, parallel=parallel)


def _arguments(call: Any, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_request(f"{where} must be a call: type 'function', function.name and function.arguments",
                          param=f"{where}.function", code="invalid_value")
    arguments = function.get("arguments", "{}")
    try:
        decoded = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        raise bad_request(f"{where}.function.arguments must be a string of a JSON object",
                          param=f"{where}.function.arguments", code="invalid_value")
    out = {"type": "function", "function": {"name": function["name"], "arguments": decoded}}
    if isinstance(call.get("id"), str):
        out = {"id": call["id"], **out}
    return out


def message_tool_fields(message: dict, index: int) -> dict:
    """A message's tool fields as its template reads them: an assistant's ``tool_calls``, a ``tool``
    message's ``tool_call_id``, any message's ``name``."""
    out: dict[str, Any] = {}
    where = f"messages[{index}]"
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if message["role"] == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise bad_request(f"{where}.tool_call_id must be the id of the call it answers",
                              param=f"{where}.tool_call_id", code="invalid_value")
        out["tool_call_id"] = message["tool_call_id"]
    calls = message.get("tool_calls")
    if calls is not None and message["role"] == "assistant":
        if not isinstance(calls, list):
            raise bad_request(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls",
                              code="invalid_type")
        out["tool_calls"] = [_arguments(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
    return out
