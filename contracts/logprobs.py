"""Log-probabilities as the pipeline returns them (contracts §2): the last stage computes them, the
head passes them to the client with each token.

One entry per scored position: ``[logprob, [[token_id, logprob], ...]]``, the log-probability of the
position's token (sampled, or the prompt's own with ``prompt_logprobs``) and the most likely
alternatives, most likely first. They are the model's distribution: log-softmax of the raw logits,
before temperature, top-k and top-p (as vLLM returns them by default). In the head's ``tokens`` frame
to a client, an item whose request asked carries a fourth element, ``{"logprob", "top"}`` for the
token, and ``"prompt"`` (one entry per prompt token from the second) with the request's first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenLogprob:
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_wire(cls, raw: Any) -> TokenLogprob:
        """An entry ``[logprob, [[id, logprob], ...]]``; raises ``TypeError`` or ``ValueError``."""
        logprob, top = raw
        return cls(float(logprob), tuple((int(t), float(p)) for t, p in top))


@dataclass(frozen=True)
class TokenLogprobs:
    """What a token event carries: its own entry, and with the first token the prompt's (from its
    second token) when they were asked for."""

    token: TokenLogprob
    prompt: tuple[TokenLogprob, ...] | None = None

    @classmethod
    def from_wire(cls, raw: Any) -> TokenLogprobs:
        """The fourth element of a ``tokens`` item; raises ``TypeError``, ``ValueError`` or ``KeyError``."""
        token = TokenLogprob.from_wire([raw["logprob"], raw["top"]])
        prompt = raw.get("prompt")
        return cls(token, None if prompt is None else tuple(TokenLogprob.from_wire(e) for e in prompt))


def item_logprobs(entries: list) -> dict[str, Any]:
    """The head's fourth element of a ``tokens`` item from the last stage's entries of one sequence:
    the prompt's first (when it scored them), the sampled token's last."""
    (logprob, top), prompt = entries[-1], entries[:-1]
    return {"logprob": logprob, "top": top, **({"prompt": prompt} if prompt else {})}
