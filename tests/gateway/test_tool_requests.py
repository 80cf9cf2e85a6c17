"""Chat requests' tools, tool_choice, parallel_tool_calls and the tool parts of messages: what is
accepted, as the template gets it, and a 400 naming the field for everything else."""

from __future__ import annotations

import pytest

from controlplane.gateway.openai.errors import OpenAIError
from controlplane.gateway.openai.protocol import generation_request
from controlplane.gateway.openai.tools.request import ToolRequest

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "d",
                                         "parameters": {"type": "object"}}}
USER = {"role": "user", "content": "Weather?"}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def chat(**fields) -> dict:
    return {"model": "demo", "messages": [USER], **fields}


def test_tools_and_a_returning_conversation_are_accepted_as_the_template_reads_them():
    messages = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "22 C"}]
    request = generation_request(chat(tools=[TOOL], messages=messages, parallel_tool_calls=False), chat=True)
    assert request.tools == ToolRequest(tools=(TOOL,), choice="auto", parallel=False)
    assert request.messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert request.messages[2] == {"role": "tool", "content": "22 C", "tool_call_id": "call_1",
                                   "name": "get_weather"}
    choice = {"type": "function", "function": {"name": "get_weather"}}
    named = generation_request(chat(tools=[TOOL], tool_choice=choice), chat=True)
    assert (named.tools.choice, named.tools.function) == ("function", "get_weather")
    assert generation_request(chat(tool_choice="none"), chat=True).tools is None


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": "x"}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]},
     "tools[0].function.description"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": "x"}]}, "messages[1].tool_calls"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"type": "function"}]}]},
     "messages[1].tool_calls[0].function"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "f", "arguments": "not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [USER, {"role": "tool", "content": "22 C"}]}, "messages[1].tool_call_id"),
    ({"messages": [USER, {"role": "assistant", "content": None}]}, "messages[1].content"),
])
def test_bad_tool_fields_are_400s_naming_them(fields, param):
    with pytest.raises(OpenAIError) as refused:
        generation_request(chat(**fields), chat=True)
    assert refused.value.status == 400 and refused.value.body()["error"]["param"] == param


def test_completions_still_refuse_tools():
    with pytest.raises(OpenAIError) as refused:
        generation_request({"model": "demo", "prompt": "x", "tools": [TOOL]}, chat=False)
    assert refused.value.body()["error"]["param"] == "tools"
