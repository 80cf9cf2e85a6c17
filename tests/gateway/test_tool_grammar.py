"""The grammar that forces a tool call compiles with llguidance on each family's tokenizer, accepts the
calls each real template renders (what the parser reads), and refuses a call the request does not
allow (another function, arguments against the schema, a second call where one is asked)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from llguidance import LLMatcher, LLTokenizer

from controlplane.gateway.openai.tokenization import ModelTokenizer
from controlplane.gateway.openai.tools.calling import ToolCalling, tool_calling
from controlplane.gateway.openai.tools.grammar import tool_choice_grammar
from controlplane.gateway.openai.tools.request import ToolRequest
from tests.gateway.test_tool_parsers import SEARCH, TOOLS, WEATHER, _reply
from tests.support.tool_templates import FAMILIES

TWO_CALLS = {"qwen2_5": [WEATHER, SEARCH], "llama3_1": [SEARCH], "mistral_v3": [WEATHER, SEARCH]}


def _setup(model) -> tuple[ModelTokenizer, ToolCalling, LLTokenizer]:
    tokenizer = ModelTokenizer.load(model)
    calling = tool_calling(tokenizer, ToolRequest(tools=tuple(TOOLS), choice="auto"), "demo")
    return tokenizer, calling, LLTokenizer((model / "tokenizer.json").read_text())


def _accepts(grammar: str, lltokenizer: LLTokenizer, tokenizer: ModelTokenizer, text: str) -> bool:
    matcher = LLMatcher(lltokenizer, grammar)
    assert not matcher.is_error(), matcher.get_error()
    ids = tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
    return matcher.consume_tokens(ids) and matcher.is_accepting()


def _forced(calling: ToolCalling, choice: str, function: str | None = None, parallel: bool = True) -> str:
    request = replace(calling.request, choice=choice, function=function, parallel=parallel)
    return tool_choice_grammar(replace(calling, request=request))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_forcing_grammar_accepts_what_the_template_renders(tool_models, family):
    tokenizer, calling, lltokenizer = _setup(tool_models[family])
    assert tool_choice_grammar(calling) is None  # "auto" forces nothing
    calls = TWO_CALLS[family]
    several, one = _reply(tokenizer, family, calls, None), _reply(tokenizer, family, calls[:1], None)
    required = _forced(calling, "required")
    assert _accepts(required, lltokenizer, tokenizer, several)
    assert _accepts(required, lltokenizer, tokenizer, one)
    named = _forced(calling, "function", calls[0][0])
    assert _accepts(named, lltokenizer, tokenizer, one)
    other = "search" if calls[0][0] == "get_weather" else "get_weather"
    assert not _accepts(_forced(calling, "function", other), lltokenizer, tokenizer, one)
    if len(calls) > 1:  # one call only: named, or parallel calls off
        assert not _accepts(named, lltokenizer, tokenizer, several)
        assert not _accepts(_forced(calling, "required", parallel=False), lltokenizer, tokenizer, several)


def test_the_arguments_are_held_to_the_functions_schema(tool_models):
    tokenizer, calling, lltokenizer = _setup(tool_models["qwen2_5"])
    named = _forced(calling, "function", "get_weather")
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert _accepts(named, lltokenizer, tokenizer, good)
    for bad in ('{"name": "get_weather", "arguments": {"units": "celsius"}}',  # no city (required)
                '{"name": "get_weather", "arguments": {"city": "Oslo", "units": "kelvin"}}',  # no such unit
                '{"name": "get_weather", "arguments": {"city": 3}}'):
        assert not _accepts(named, lltokenizer, tokenizer, f"<tool_call>\n{bad}\n</tool_call>")
