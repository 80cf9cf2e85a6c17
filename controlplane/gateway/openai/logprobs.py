"""A choice's ``logprobs`` in OpenAI's shapes, from the tokens' log-probabilities the pipeline returns.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
"refusal": null}``, ``top_logprobs`` the request's that many alternatives. Completions (OpenAI's legacy
shape): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, each ``top_logprobs`` entry a
map of the alternatives' text to their log-probabilities plus the chosen token's (up to ``logprobs`` + 1
entries, as OpenAI); with ``echo`` the prompt's tokens first, the first one's ``null`` (nothing
precedes it). A streamed choice carries the entries of the tokens its delta ends, ``text_offset``
counting on across the stream. Every token the pipeline generated has its entry, an end token's
included, as ``usage.completion_tokens`` counts them.

A token's text is its own decode with special tokens kept (a byte-level token that is part of a
character decodes to U+FFFD, as with vLLM); ``bytes`` are that text's UTF-8. The values are the
model's distribution before temperature and top-p (contracts/logprobs.py), as vLLM's by default.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer

from contracts.logprobs import TokenLogprob
from controlplane.gateway.serving.pipeline_client import TokenEvent

Scored = tuple[int, TokenLogprob | None]  # a token and its entry (None: the echoed prompt's first)


class ChoiceLogprobs:
    def __init__(self, tokenizer: Tokenizer, *, chat: bool) -> None:
        self.tokenizer, self.chat = tokenizer, chat
        self.offset = 0  # completions: the text offset of the next token

    def _text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def of(self, events: Iterable[TokenEvent], prompt: Iterable[Scored] = ()) -> dict:
        """The ``logprobs`` of a choice (or of a streamed delta) whose text ends ``events``; ``prompt``:
        the echoed prompt's tokens and entries, before them (completions)."""
        tokens = [*prompt, *((e.token_id, e.logprobs.token if e.logprobs else None) for e in events)]
        return self._chat(tokens) if self.chat else self._completion(tokens)

    def _chat(self, tokens: list[Scored]) -> dict:
        def one(token_id: int, logprob: float) -> dict:
            text = self._text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = [{**one(token_id, entry.logprob), "top_logprobs": [one(t, lp) for t, lp in entry.top]}
                   for token_id, entry in tokens if entry is not None]
        return {"content": content, "refusal": None}

    def _completion(self, tokens: list[Scored]) -> dict:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, entry in tokens:
            text = self._text(token_id)
            out["tokens"].append(text)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(entry.logprob)
            # the chosen token's last: where an alternative decodes to the same text, the chosen wins
            out["top_logprobs"].append({**{self._text(t): lp for t, lp in entry.top}, text: entry.logprob})
        return out


def echoed(prompt_ids: list[int], logprobs: tuple[TokenLogprob, ...] | None) -> list[Scored]:
    """The echoed prompt's tokens with their entries: none for the first, then the pipeline's."""
    entries = [None, *(logprobs or ())]
    return list(zip(prompt_ids, entries + [None] * (len(prompt_ids) - len(entries))))
