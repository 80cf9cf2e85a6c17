"""The tool-call formats motley reads, and which one a model writes, told by its chat template.

A template that renders tools also renders the assistant's past calls, in the format the model was
trained to write; so the template's text names the format:
- ``hermes`` (Qwen 2.5, Hermes): ``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``, one block
  per call; the template writes the literal ``<tool_call>``.
- ``mistral``: ``[TOOL_CALLS] [{"name": …, "arguments": {…}}, …]``; the template writes ``[TOOL_CALLS]``.
  Mistral's template refuses call ids that are not 9 alphanumeric characters, so its calls get such
  ids (as vLLM gives them) rather than ``call_…``.
- ``llama3_json`` (Llama 3.1-3.3): ``{"name": …, "parameters": {…}}`` as the whole reply, optionally after
  ``<|python_tag|>``, several separated by ``;``; the template writes ``"parameters": ``.

The first that matches wins, in that order. A template that does not reference ``tools`` has no tool
support; one that does but matches none of these writes calls motley cannot read.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from functools import lru_cache

from jinja2 import meta

from controlplane.gateway.openai.tokenization import template_environment

ALPHANUMERIC = string.ascii_letters + string.digits


def openai_call_id() -> str:
    """OpenAI's shape: ``call_`` and 24 alphanumeric characters."""
    return "call_" + "".join(secrets.choice(ALPHANUMERIC) for _ in range(24))


def mistral_call_id() -> str:
    """Mistral's template accepts only 9 alphanumeric characters."""
    return "".join(secrets.choice(ALPHANUMERIC) for _ in range(9))


@dataclass(frozen=True)
class ToolFormat:
    name: str
    markers: tuple[str, ...]  # text that opens the calls (a special token's text where it is one)
    signature: str  # what in the template's text names this format
    closer: str = ""  # text that closes each call
    arguments_keys: tuple[str, ...] = ("arguments",)  # the call object's key for its arguments
    json_start: bool = False  # a reply whose first non-space character is '{' opens the calls too
    mistral_ids: bool = False

    def call_id(self) -> str:
        return mistral_call_id() if self.mistral_ids else openai_call_id()


HERMES = ToolFormat("hermes", ("<tool_call>",), "<tool_call>", closer="</tool_call>")
MISTRAL = ToolFormat("mistral", ("[TOOL_CALLS]",), "[TOOL_CALLS]", mistral_ids=True)
LLAMA3_JSON = ToolFormat("llama3_json", ("<|python_tag|>",), '"parameters": ',
                         arguments_keys=("parameters", "arguments"), json_start=True)
FORMATS = (HERMES, MISTRAL, LLAMA3_JSON)


@lru_cache(maxsize=16)
def renders_tools(chat_template: str) -> bool:
    """Whether the template reads the ``tools`` variable (transformers passes it; a template that never
    reads it would silently drop the tools)."""
    ast = template_environment().parse(chat_template)
    return "tools" in meta.find_undeclared_variables(ast)


def format_of(chat_template: str) -> ToolFormat | None:
    """The format the template renders calls in (see the module's docstring), or None."""
    return next((f for f in FORMATS if f.signature in chat_template), None)
