"""A structured-output constraint: what a request's output must match, as the gateway builds it and the
sampler enforces it (contracts §2, docs/gateway.md "Structured outputs").

``kind`` names the language of ``spec``: ``json_object`` (any JSON object; ``spec`` is ""),
``json_schema`` (the schema's JSON text), ``regex``, ``choice`` (a JSON list of the strings allowed) or
``grammar`` (a Lark grammar in llguidance's syntax, which may embed JSON schemas with ``%json {...}``).
``generated``: how many of the prompt's trailing tokens are output the constraint already matched (a
request resumed on another replica is submitted as prompt + tokens so far, generation.py), so the
sampler replays them into its matcher before it masks the next token.

:meth:`StructuredConstraint.grammar` is the one definition of how a constraint becomes an llguidance
grammar, for the gateway's compile check and the sampler's matcher alike. llguidance is imported only
there, so this module stays importable without it (the rest of contracts is standard library only).
JSON is generated compact (no whitespace between tokens), unless a schema's ``x-guidance`` options
say otherwise: a model left free to add whitespace can fill its tokens with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")
# A schema or grammar this long is no request's honest need; a prefill step's header carries one per
# constrained sequence (within the frames' 8 MiB), and the compile caches keep up to 64 of each.
MAX_SPEC_CHARS = 1 << 16
JSON_DEFAULTS = {"whitespace_flexible": False}  # llguidance's JSON options: compact output
ANY_OBJECT = '{"type": "object"}'


class ConstraintError(ValueError):
    """A constraint that is malformed or does not compile; the message says what is wrong."""


@dataclass(frozen=True)
class StructuredConstraint:
    kind: str
    spec: str
    generated: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"constraint kind must be one of {list(KINDS)}, not {self.kind!r}")
        if not isinstance(self.spec, str) or len(self.spec) > MAX_SPEC_CHARS:
            raise ConstraintError(f"a constraint's spec is a string of at most {MAX_SPEC_CHARS} characters")
        if type(self.generated) is not int or self.generated < 0:
            raise ConstraintError(f"generated must be a non-negative integer, not {self.generated!r}")
        if (self.kind == "json_object") != (self.spec == ""):
            raise ConstraintError("json_object has an empty spec, every other kind a non-empty one")
        if self.kind == "json_schema" and not isinstance(_json(self.spec), dict):
            raise ConstraintError("a json_schema spec is a JSON object")
        if self.kind == "choice":
            choices = _json(self.spec)
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise ConstraintError("a choice spec is a non-empty JSON list of strings")

    def to_header(self) -> dict[str, Any]:
        """The JSON-able form a frame header carries (``generated`` only when not 0)."""
        header: dict[str, Any] = {"kind": self.kind, "spec": self.spec}
        if self.generated:
            header["generated"] = self.generated
        return header

    @classmethod
    def from_header(cls, raw: Any) -> StructuredConstraint:
        """The constraint of a header entry; raises :class:`ConstraintError` naming what is wrong."""
        if not isinstance(raw, dict) or set(raw) - {"kind", "spec", "generated"}:
            raise ConstraintError(f"a constraint is an object of kind, spec and generated, not {raw!r}"[:200])
        return cls(raw.get("kind"), raw.get("spec"), raw.get("generated", 0))

    def grammar(self) -> str:
        """The llguidance grammar of this constraint (``generated`` aside): what ``LLMatcher`` compiles."""
        return _grammar(self.kind, self.spec)

    def problem(self) -> str | None:
        """Why the grammar does not compile (without a tokenizer: its syntax and schema), or None."""
        return _problem(self.kind, self.spec)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"the spec is not JSON: {exc}") from None


@lru_cache(maxsize=64)
def _grammar(kind: str, spec: str) -> str:
    from llguidance import LLMatcher, grammar_from

    if kind in ("json_object", "json_schema"):
        return LLMatcher.grammar_from_json_schema(spec or ANY_OBJECT, defaults=JSON_DEFAULTS)
    return grammar_from("lark" if kind == "grammar" else kind, spec)


@lru_cache(maxsize=64)
def _problem(kind: str, spec: str) -> str | None:
    from llguidance import LLMatcher

    try:
        grammar = _grammar(kind, spec)
    except ValueError as exc:
        return str(exc)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    return messages[0] if is_error else None
