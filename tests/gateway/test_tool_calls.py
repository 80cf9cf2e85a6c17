"""Tool calls through the gateway's views against a stand-in replica serving the demo checkpoint with
Qwen 2.5's template: the tools rendered into the prompt, the replica's reply read into ``tool_calls``
(whole and streamed as OpenAI's deltas), a conversation continued after a call, a forced call submitted
with its grammar, and the refusals."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

from contracts.structured import StructuredConstraint
from controlplane.gateway.openai.tokenization import ModelTokenizer
from controlplane.gateway.openai.tools.calling import tool_calling
from controlplane.gateway.openai.tools.grammar import tool_choice_grammar
from controlplane.gateway.openai.tools.parser import assemble
from controlplane.gateway.openai.tools.request import ToolRequest
from tests.gateway.fakes import Script
from tests.gateway.test_tool_requests import CALL, TOOL, USER
from tests.gateway.test_views import post, sse_events

pytestmark = pytest.mark.django_db(transaction=True)

REPLY = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _prompt(model, fake) -> str:
    ids = fake.submitted[0]["prompt_ids"]
    return ModelTokenizer.load(model).tokenizer.decode(ids, skip_special_tokens=False)


def _reply_tokens(model) -> list[int]:
    tokenizer = ModelTokenizer.load(model)
    return tokenizer.encode_prompt(REPLY, add_special_tokens=False) + [tokenizer.eos_token_ids[0]]


async def test_a_reply_with_a_call_is_tool_calls_and_the_tools_are_in_the_prompt(fake_pipeline, api_key,
                                                                                  tool_models):
    model = tool_models["qwen2_5"]
    fake = fake_pipeline({"r0": Script(tokens=_reply_tokens(model))}, model=model)
    body = {"model": "demo", "messages": [USER], "tools": [TOOL], "max_tokens": 100}
    response = await post(AsyncClient(), "/v1/chat/completions", body, api_key)
    assert response.status_code == 200, response.content
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    prompt = _prompt(model, fake)
    assert "<tools>\n" + json.dumps(TOOL) + "\n</tools>" in prompt


async def test_a_streamed_call_comes_as_openai_deltas(fake_pipeline, api_key, tool_models):
    model = tool_models["qwen2_5"]
    fake_pipeline({"r0": Script(tokens=_reply_tokens(model))}, model=model)
    body = {"model": "demo", "messages": [USER], "tools": [TOOL], "max_tokens": 100, "stream": True}
    events = await sse_events(await post(AsyncClient(), "/v1/chat/completions", body, api_key))
    choices = [e["choices"][0] for e in events]
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["delta"] for c in choices[1:]]
    content, calls = assemble([d for d in deltas if d])
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    with_calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert with_calls[0]["id"] == calls[0]["id"] and with_calls[0]["function"]["name"] == "get_weather"
    assert all("id" not in d and "name" not in d["function"] for d in with_calls[1:])
    assert len(with_calls) > 2  # the arguments came in pieces, as the tokens did
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["tool_calls"]


async def test_a_conversation_continues_after_a_call(fake_pipeline, api_key, tool_models):
    model = tool_models["qwen2_5"]
    sunny = ModelTokenizer.load(model).encode_prompt("Sunny.")
    fake = fake_pipeline({"r0": Script(tokens=sunny)}, model=model)
    messages = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": CALL["id"], "content": "22 C"}]
    body = {"model": "demo", "messages": messages, "tools": [TOOL], "max_tokens": 20}
    response = await post(AsyncClient(), "/v1/chat/completions", body, api_key)
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["message"] == {"role": "assistant", "content": "Sunny."}
    prompt = _prompt(model, fake)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n22 C\n</tool_response>" in prompt


async def test_a_model_without_tools_in_its_template_refuses_them(fake_pipeline, api_key):
    fake_pipeline({"r0": Script()})
    body = {"model": "demo", "messages": [USER], "tools": [TOOL]}
    response = await post(AsyncClient(), "/v1/chat/completions", body, api_key)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools"
    assert "does not support tools" in response.json()["error"]["message"]


async def test_streamed_log_probabilities_of_held_text_come_with_the_next_chunk(fake_pipeline, api_key,
                                                                                tool_models):
    model = tool_models["qwen2_5"]
    reply = _reply_tokens(model)
    fake_pipeline({"r0": Script(tokens=reply)}, model=model)
    body = {"model": "demo", "messages": [USER], "tools": [TOOL], "max_tokens": 100, "stream": True,
            "logprobs": True, "n": 2}
    events = await sse_events(await post(AsyncClient(), "/v1/chat/completions", body, api_key))
    for index in range(2):
        choices = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        entries = [entry for c in choices if c["logprobs"] for entry in c["logprobs"]["content"]]
        assert len(entries) == len(reply)  # every token's, once, the end token's included
        assert choices[-1]["finish_reason"] == "tool_calls"


async def test_a_forced_call_is_submitted_with_its_grammar(fake_pipeline, api_key, tool_models):
    model = tool_models["qwen2_5"]
    fake = fake_pipeline({"r0": Script(tokens=_reply_tokens(model))}, model=model)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("auto", named):
        body = {"model": "demo", "messages": [USER], "tools": [TOOL], "tool_choice": choice,
                "max_tokens": 100}
        response = await post(AsyncClient(), "/v1/chat/completions", body, api_key)
        assert response.json()["choices"][0]["finish_reason"] == "tool_calls"
    request = ToolRequest(tools=(TOOL,), choice="function", function="get_weather")
    grammar = tool_choice_grammar(tool_calling(ModelTokenizer.load(model), request, "demo"))
    forced = StructuredConstraint("grammar", grammar)
    assert [s["params"].constraint for s in fake.submitted] == [None, forced]


@pytest.mark.parametrize(("fields", "param"), [
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "nonsense"}}}]}, "tools"),
])
async def test_a_call_that_cannot_be_forced_is_a_400(fake_pipeline, api_key, tool_models, fields, param):
    fake = fake_pipeline({"r0": Script()}, model=tool_models["qwen2_5"])
    body = {"model": "demo", "messages": [USER], "tools": [TOOL], **fields}
    response = await post(AsyncClient(), "/v1/chat/completions", body, api_key)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert not fake.submitted
