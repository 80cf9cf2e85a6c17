"""Token ids to the text a client sees, one token at a time: multi-byte safe, with stop strings."""

from __future__ import annotations

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Emits the text each new token adds, holding back bytes until they decode.

    A byte-level token may carry half of a UTF-8 character; decoding it alone yields U+FFFD. So
    each step decodes a short window of recent tokens twice (without and with the new ones) and
    emits the difference only once it no longer ends in a replacement character. The window (from
    ``_prefix``) keeps decoders that depend on context (leading spaces, byte fallback) exact.

    Special tokens are skipped, except those in ``keep`` (a tool-call format's markers): a kept token
    emits what came before it and then its own text, and the window starts after it.
    """

    def __init__(self, tokenizer: Tokenizer, keep: tuple[int, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._keep = frozenset(keep)
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0  # tokens already turned into emitted text

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        if token_id in self._keep:
            before = self._advance(final=True)
            self._ids.append(token_id)
            self._prefix = self._read = len(self._ids)
            return before + self._tokenizer.id_to_token(token_id)
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """What is left at the end (an incomplete character comes out as U+FFFD, as in a full decode)."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and (final or not after.endswith(REPLACEMENT)):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""


class StopStrings:
    """Cuts the text at the first stop string, holding back a tail that could begin one.

    ``push(text)`` returns ``(text safe to send, stopped)``; once stopped, the stop string and
    everything after it are never sent (OpenAI's behaviour).
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        self._pending += text
        hits = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            out, self._pending = self._pending[: min(hits)], ""
            return out, True
        cut = max(0, len(self._pending) - self._hold)
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
