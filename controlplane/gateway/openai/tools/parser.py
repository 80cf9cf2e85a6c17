"""The model's tool calls read from its output as it streams, into OpenAI's deltas.

``ToolCallParser.push(text)`` takes the text as it comes and returns the delta fragments that are
decided: ``{"content": …}`` for plain text, ``{"tool_calls": [{"index", "id", "type", "function":
{"name", "arguments": ""}}]}`` once a call's name is read, then ``{"tool_calls": [{"index", "function":
{"arguments": …}}]}`` for each piece of its arguments as the model writes them (the raw JSON text of the
arguments value, so the pieces joined are that JSON; ``{}`` for a call written without arguments).
``finish()`` returns what was still held. A whole reply is parsed by the same code
(``parse_tool_calls``), so a streamed reply and a whole one always agree.

What is held back: text that could be the start of the format's marker (``<tool_c``), whitespace
until more text follows (the content before a call ends with its last non-space character), a call's
arguments until its name is read, and for Llama 3.x a reply that starts with ``{`` until it is known
to be a call. After a marker, text outside the call objects (the format's brackets, separators and
closing tags) is not content. A call object without a string ``name`` is not a call; when a marker
opened no call at all, everything from the marker on is content after all (at ``finish``). With
``parallel_tool_calls`` false, the calls after the first are dropped.
"""

from __future__ import annotations

import json
from typing import Any

from controlplane.gateway.openai.tools.formats import ToolFormat


def _held_prefix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that a marker starts with."""
    return max((k for m in markers for k in range(min(len(m) - 1, len(text)), 0, -1)
                if text.endswith(m[:k])), default=0)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class _CallObject:
    """One top-level JSON object after the marker, read a character at a time: the keys at its top
    level, its ``name``, and the raw text of its arguments value."""

    def __init__(self, arguments_keys: tuple[str, ...]) -> None:
        self.arguments_keys = arguments_keys
        self.depth, self.in_string, self.escape = 1, False, False
        self.phase = "key"  # key (before or in a key) | colon | value_wait | value
        self.token: list[str] = []  # the current key's or value's characters
        self.key: Any = None
        self.name: str | None = None
        self.arguments: str | None = None  # None until an arguments value starts
        self.arguments_open = False
        self.done = False

    def feed(self, c: str) -> None:
        if self.phase == "value_wait":
            if c.isspace():
                return
            self.phase, self.token = "value", []
            if self.key in self.arguments_keys and self.arguments is None:
                self.arguments, self.arguments_open = "", True
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
            self._append(c)
            if not self.in_string and self.depth == 1 and self.phase == "key":
                self.key, self.phase = _loads("".join(self.token)), "colon"
            return
        if self.depth == 1 and self.phase != "value":
            if c == "}":
                self.done = True
            elif self.phase == "colon" and c == ":":
                self.phase = "value_wait"
            elif self.phase == "key" and c == '"':
                self.in_string, self.token = True, [c]
            return
        if self.depth == 1 and c in ",}":
            self._end_value()
            self.done = c == "}"
            return
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
        self._append(c)

    def _append(self, c: str) -> None:
        self.token.append(c)
        if self.arguments_open:
            self.arguments += c

    def _end_value(self) -> None:
        if self.key == "name" and self.name is None:
            value = _loads("".join(self.token))
            self.name = value if isinstance(value, str) and value else None
        if self.arguments_open:
            self.arguments, self.arguments_open = self.arguments.rstrip(), False
        self.phase, self.token = "key", []


class ToolCallParser:
    def __init__(self, fmt: ToolFormat, *, parallel: bool = True) -> None:
        self.fmt, self.parallel = fmt, parallel
        self.calls = 0  # calls whose name was handed out
        self._held = ""  # before the marker: text not yet decided
        self._started = False  # a non-space character was read (Llama's '{' counts only first)
        self._marker: str | None = None  # set once the calls began
        self._before = ""  # the whitespace dropped before the marker
        self._section: list[str] = []  # everything after the marker
        self._object: _CallObject | None = None
        self._index: int | None = None  # the current object's call, once its name is read
        self._sent = 0  # characters of the current call's arguments handed out
        self._closed = False  # parallel calls off and one call is complete: the rest is dropped

    def push(self, text: str) -> list[dict]:
        out: list[dict] = []
        if self._marker is None:
            text = self._text(self._held + text, out)
            if text is None:
                return out
        self._section.append(text)
        for c in text:
            self._feed(c, out)
        if self._object is not None:
            self._arguments(out, final=False)
        return out

    def finish(self) -> list[dict]:
        out: list[dict] = []
        if self._marker is None:
            if self._held:
                out.append({"content": self._held})
        elif not self.calls:
            out.append({"content": self._before + self._marker + "".join(self._section)})
        elif self._object is not None and self._index is not None:
            self._arguments(out, final=True)
        self._held, self._object = "", None
        return out

    def _text(self, text: str, out: list[dict]) -> str | None:
        """Hand out the content that is decided; the text after the marker once the calls begin."""
        if self.fmt.json_start and not self._started:
            stripped = text.lstrip()
            if not stripped:
                self._held = text
                return None
            self._started = True
            if stripped[0] == "{":
                self._begin("", text[: len(text) - len(stripped)])
                return stripped
        hits = [(text.find(m), m) for m in self.fmt.markers if m in text]
        if hits:
            at, marker = min(hits)
            self._content(text[:at], out)
            self._begin(marker, text[len(text[:at].rstrip()):at])
            return text[at + len(marker):]
        cut = len(text) - _held_prefix(text, self.fmt.markers)
        cut = len(text[:cut].rstrip())
        self._content(text[:cut], out)
        self._held = text[cut:]
        return None

    @staticmethod
    def _content(text: str, out: list[dict]) -> None:
        if text := text.rstrip():
            out.append({"content": text})

    def _begin(self, marker: str, before: str) -> None:
        self._marker, self._before, self._held = marker, before, ""

    def _feed(self, c: str, out: list[dict]) -> None:
        if self._closed:
            return
        if self._object is None:
            if c == "{":
                self._object, self._index, self._sent = _CallObject(self.fmt.arguments_keys), None, 0
            return
        obj = self._object
        obj.feed(c)
        if obj.name is not None and self._index is None:
            self._index = self.calls
            self.calls += 1
            out.append({"tool_calls": [{"index": self._index, "id": self.fmt.call_id(), "type": "function",
                                        "function": {"name": obj.name, "arguments": ""}}]})
        if obj.done:
            if self._index is not None:
                self._arguments(out, final=True)
                self._closed = not self.parallel
            self._object = None

    def _arguments(self, out: list[dict], *, final: bool) -> None:
        """Hand out the current call's arguments read since the last time (trailing whitespace held
        while they are open; ``{}`` for a finished call that had none)."""
        obj = self._object
        if self._index is None or obj is None:
            return
        text = obj.arguments
        if text is None:
            text = "{}" if obj.done else ""
        elif obj.arguments_open and not final:
            text = text.rstrip()
        if piece := text[self._sent:]:
            self._sent += len(piece)
            out.append({"tool_calls": [{"index": self._index, "function": {"arguments": piece}}]})


def assemble(fragments: list[dict]) -> tuple[str | None, list[dict]]:
    """The content (None when empty) and the complete calls that the fragments make up."""
    content = "".join(f.get("content", "") for f in fragments)
    calls: dict[int, dict] = {}
    for fragment in fragments:
        for piece in fragment.get("tool_calls", ()):
            call = calls.setdefault(piece["index"], {"function": {"arguments": ""}})
            for key in ("id", "type"):
                if key in piece:
                    call[key] = piece[key]
            function = piece["function"]
            if "name" in function:
                call["function"]["name"] = function["name"]
            call["function"]["arguments"] += function["arguments"]
    ordered = [{"id": c["id"], "type": c["type"], "function": {"name": c["function"]["name"],
                                                               "arguments": c["function"]["arguments"]}}
               for _, c in sorted(calls.items())]
    return content or None, ordered


def parse_tool_calls(fmt: ToolFormat, text: str, *, parallel: bool = True) -> tuple[str | None, list[dict]]:
    """A whole reply's content (None when empty) and calls."""
    parser = ToolCallParser(fmt, parallel=parallel)
    return assemble(parser.push(text) + parser.finish())
