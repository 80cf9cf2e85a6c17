"""The tool-call parsers against an independent reference: each real template (Qwen 2.5, Llama 3.1,
Mistral v3) renders an assistant message with tool calls, and the parser reads the rendered reply back
to the same calls, whole and streamed in random pieces. The rendering itself is checked against
transformers' apply_chat_template."""

from __future__ import annotations

import json
import random
import re

import pytest

from controlplane.gateway.openai.textstream import IncrementalDetokenizer
from controlplane.gateway.openai.tokenization import ModelTokenizer
from controlplane.gateway.openai.tools.formats import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    format_of,
    renders_tools,
)
from controlplane.gateway.openai.tools.parser import ToolCallParser, assemble, parse_tool_calls
from tests.support.tool_templates import FAMILIES

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "units": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}},
]
WEATHER = ("get_weather", {"city": "Paris", "units": "celsius"})
SEARCH = ("search", {"query": 'a "quoted" }{ text, with ; and ]', "limit": 3,
                     "filters": {"tags": ["x", "y"], "exact": True, "none": None}})
CASES = [  # family, calls, content before them (the templates that render it)
    ("qwen2_5", [WEATHER, SEARCH], "Let me look that up."),
    ("qwen2_5", [SEARCH], None),
    ("llama3_1", [SEARCH], None),  # its template renders one call a message
    ("mistral_v3", [WEATHER, SEARCH], None),
]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _assistant(family: str, calls, content) -> dict:
    ids = [f"abcdefgh{i}" if family == "mistral_v3" else f"call_{i}" for i in range(len(calls))]
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}}
        for i, (name, arguments) in zip(ids, calls, strict=True)]}


def _reply(tokenizer: ModelTokenizer, family: str, calls, content) -> str:
    """What the model writes for that message: the conversation's rendering past the prompt's,
    up to the end-of-turn token."""
    prompt = tokenizer.render_chat(USER, tools=TOOLS)
    whole = tokenizer.render_chat(USER + [_assistant(family, calls, content)], add_generation_prompt=False,
                                  tools=TOOLS)
    assert whole.startswith(prompt)
    return whole[len(prompt):].split(FAMILIES[family][2])[0]


def _readable(calls: list[dict]) -> list[tuple[str, object]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_each_template_names_its_format_and_the_demo_template_has_no_tools():
    assert [format_of(FAMILIES[f][0]) for f in ("qwen2_5", "llama3_1", "mistral_v3")] == [
        HERMES, LLAMA3_JSON, MISTRAL]
    assert all(renders_tools(template) for template, _, _ in FAMILIES.values())
    from worker_runtime.make_demo_model import CHAT_TEMPLATE

    assert not renders_tools(CHAT_TEMPLATE)


@pytest.mark.parametrize(("family", "calls", "content"), CASES)
def test_rendered_calls_parse_back_whole_and_streamed(tool_models, family, calls, content):
    tokenizer = ModelTokenizer.load(tool_models[family])
    fmt = format_of(tokenizer.chat_template)
    reply = _reply(tokenizer, family, calls, content)
    parsed_content, parsed = parse_tool_calls(fmt, reply)
    assert parsed_content == content
    assert _readable(parsed) == [(name, arguments) for name, arguments in calls]
    id_shape = r"[A-Za-z0-9]{9}" if family == "mistral_v3" else r"call_[A-Za-z0-9]{24}"
    assert all(re.fullmatch(id_shape, c["id"]) and c["type"] == "function" for c in parsed)
    for seed in range(25):
        rng, parser, fragments, at = random.Random(seed), ToolCallParser(fmt), [], 0
        while at < len(reply):
            size = rng.randint(1, 9)
            fragments += parser.push(reply[at:at + size])
            at += size
        fragments += parser.finish()
        streamed_content, streamed = assemble(fragments)
        assert streamed_content == content and _readable(streamed) == _readable(parsed)
        firsts = [f for f in fragments if "tool_calls" in f and "id" in f["tool_calls"][0]]
        assert [f["tool_calls"][0]["function"]["name"] for f in firsts] == [name for name, _ in calls]
        first_call = fragments.index(firsts[0])
        assert all("content" in f for f in fragments[:first_call])
        assert all("content" not in f for f in fragments[first_call:])


@pytest.mark.parametrize("family", ["llama3_1", "mistral_v3"])
def test_special_token_markers_reach_the_parser_through_the_detokenizer(tool_models, family):
    """Llama's <|python_tag|> and Mistral's [TOOL_CALLS] are special tokens, which decoding skips:
    the markers a format names are kept."""
    tokenizer = ModelTokenizer.load(tool_models[family])
    fmt = format_of(tokenizer.chat_template)
    reply = fmt.markers[0] + json.dumps([{"name": "search", "arguments": SEARCH[1]}] if family == "mistral_v3"
                                        else {"name": "search", "parameters": SEARCH[1]})
    ids = tokenizer.tokenizer.encode(reply, add_special_tokens=False).ids
    marker = tokenizer.tokenizer.token_to_id(fmt.markers[0])
    assert ids[0] == marker
    plain = IncrementalDetokenizer(tokenizer.tokenizer)
    kept = IncrementalDetokenizer(tokenizer.tokenizer, keep=(marker,))
    assert "".join(plain.push(i) for i in ids) + plain.flush() == reply[len(fmt.markers[0]):]
    text = "".join(kept.push(i) for i in ids) + kept.flush()
    assert text == reply and _readable(parse_tool_calls(fmt, text)[1]) == [SEARCH]


def test_rendering_matches_transformers_apply_chat_template(tool_models):
    """The gateway's Jinja sandbox renders tools and calls as transformers does (its tojson)."""
    from transformers import PreTrainedTokenizerFast

    for family, (_, _, eos) in FAMILIES.items():
        ours = ModelTokenizer.load(tool_models[family])
        theirs = PreTrainedTokenizerFast(tokenizer_file=str(tool_models[family] / "tokenizer.json"),
                                         bos_token=ours.bos_token, eos_token=eos)
        calls = [SEARCH] if family == "llama3_1" else [WEATHER, SEARCH]
        messages = USER + [_assistant(family, calls, None)]
        for conversation in (USER, messages):
            expected = theirs.apply_chat_template(conversation, tools=TOOLS, tokenize=False,
                                                  chat_template=ours.chat_template)
            assert ours.render_chat(conversation, tools=TOOLS, add_generation_prompt=False) == expected


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), [
    (HERMES, "Just text, no call.", "Just text, no call.", []),
    (HERMES, "Hello <tool_c", "Hello <tool_c", []),  # a marker's start that never completed
    (HERMES, "Hi <tool_call> not json", "Hi <tool_call> not json", []),  # a marker with no call
    (HERMES, '<tool_call>\n{"arguments": {}}\n</tool_call>', '<tool_call>\n{"arguments": {}}\n</tool_call>',
     []),
    (HERMES, '<tool_call>\n{"name": "search"}\n</tool_call>', None, [("search", {})]),
    (LLAMA3_JSON, '{"answer": 42}', '{"answer": 42}', []),  # JSON that is not a call stays text
    (LLAMA3_JSON, 'The answer is {"a": 1}', 'The answer is {"a": 1}', []),
    (LLAMA3_JSON, '<|python_tag|>{"name": "search", "parameters": {"q": 1}}; {"name": "get_weather", '
                  '"parameters": {}}', None, [("search", {"q": 1}), ("get_weather", {})]),
])
def test_edge_cases(fmt, text, content, calls):
    got_content, got = parse_tool_calls(fmt, text)
    assert got_content == content and _readable(got) == calls


def test_without_parallel_calls_only_the_first_is_kept():
    text = ('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b"}\n</tool_call>')
    assert [c["function"]["name"] for c in parse_tool_calls(HERMES, text, parallel=False)[1]] == ["a"]


def test_text_that_may_start_a_marker_is_held_until_decided():
    parser = ToolCallParser(HERMES)
    assert parser.push("Sure <tool") == [{"content": "Sure"}]
    assert parser.push("box is") == [{"content": " <toolbox is"}]
    assert parser.push(" \n<tool_") == []
    out = parser.push('call>\n{"name": "a", "arg')
    assert [f["tool_calls"][0]["function"] for f in out] == [{"name": "a", "arguments": ""}]
    assert parser.push('uments": {"x": 1}}') == [
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"x": 1}'}}]}]
