"""Whether a chat request's tools can be served by its model, and how each choice's output is read.

``tool_calling`` checks the model's chat template (tools/formats.py): one that does not read ``tools``
refuses them (400 naming ``tools``), as does one whose call format motley does not read. Where a
format's marker is a special token of the tokenizer (Llama's ``<|python_tag|>``, Mistral's
``[TOOL_CALLS]``), the detokenizer keeps its text, which it otherwise skips, so the parser sees it.
``tool_choice`` "none": the tools are neither rendered nor read back, so the model answers in text.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.gateway.openai.errors import bad_request
from controlplane.gateway.openai.tokenization import ModelTokenizer
from controlplane.gateway.openai.tools.formats import FORMATS, ToolFormat, format_of, renders_tools
from controlplane.gateway.openai.tools.parser import ToolCallParser, parse_tool_calls
from controlplane.gateway.openai.tools.request import ToolRequest


@dataclass(frozen=True)
class ToolCalling:
    request: ToolRequest
    format: ToolFormat
    added_tokens: dict[str, int]  # the format's markers and closer that are added tokens: their ids

    @property
    def keep_token_ids(self) -> tuple[int, ...]:
        """The tokens whose text the detokenizer keeps for the parser (the markers')."""
        return tuple(i for text, i in self.added_tokens.items() if text in self.format.markers)


def tool_calling(tokenizer: ModelTokenizer, tools: ToolRequest | None, model: str) -> ToolCalling | None:
    """The request's tool calling on this model, None without it; raises the 400 of a model that
    cannot take tools."""
    if tools is None or tools.choice == "none":
        return None
    template = tokenizer.chat_template
    if not renders_tools(template):
        raise bad_request(f"model {model!r} does not support tools: its chat template does not define them",
                          param="tools", code="unsupported_parameter")
    fmt = format_of(template)
    if fmt is None:
        known = ", ".join(f.name for f in FORMATS)
        raise bad_request(f"model {model!r}'s chat template writes tool calls in a format motley does not "
                          f"read (it reads {known})", param="tools", code="unsupported_parameter")
    added = tokenizer.tokenizer.get_added_tokens_decoder()
    ids = {text: tokenizer.tokenizer.token_to_id(text) for text in (*fmt.markers, fmt.closer) if text}
    return ToolCalling(request=tools, format=fmt,
                       added_tokens={text: i for text, i in ids.items() if i is not None and i in added})


class ChoiceOutput:
    """One choice's output as the client gets it: its text as it comes, or read for tool calls."""

    def __init__(self, calling: ToolCalling | None) -> None:
        self.calling = calling
        self.parser = ToolCallParser(calling.format, parallel=calling.request.parallel) if calling else None

    def chunks(self, text: str, finish_reason: str | None) -> list[tuple[dict, str | None]]:
        """The (delta, finish_reason) of each streamed chunk that a piece of text makes; none where the
        parser holds it all back (the last piece always makes one, with the reason)."""
        if self.parser is None:
            return [({"role": "assistant", "content": text}, finish_reason)]
        fragments = self.parser.push(text)
        if finish_reason is None:
            return [(f, None) for f in fragments]
        fragments += self.parser.finish()
        reason = "tool_calls" if self.parser.calls and finish_reason == "stop" else finish_reason
        last = fragments.pop() if fragments else {}
        return [(f, None) for f in fragments] + [(last, reason)]

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The whole reply's message and finish reason."""
        if self.calling is None:
            return {"role": "assistant", "content": text}, finish_reason
        content, calls = parse_tool_calls(self.calling.format, text, parallel=self.calling.request.parallel)
        if not calls:
            return {"role": "assistant", "content": content or ""}, finish_reason
        return ({"role": "assistant", "content": content, "tool_calls": calls},
                "tool_calls" if finish_reason == "stop" else finish_reason)
