"""A request's sampling parameters, as the gateway submits them and the head's sampler applies them.

Torch-free so that the gateway, which builds them, imports no torch; the sampler itself (drawing the
next tokens from logits) is ``worker_runtime.sampling.sample``. ``logprobs`` and ``prompt_logprobs``
ask the last stage for log-probabilities (contracts/logprobs.py); they change nothing sampled.
``constraint`` restricts what is sampled to what a grammar allows (contracts/structured.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.structured import StructuredConstraint

MAX_LOGPROBS = 20  # alternatives per position, at most (OpenAI's top_logprobs limit)
LOGPROB_FIELDS = ("logprobs", "prompt_logprobs")


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 means greedy; ``top_k`` 0 and ``top_p`` 1.0 switch those filters off.
    ``logprobs``: the sampled tokens' log-probabilities with that many alternatives each (None: none);
    ``prompt_logprobs``: the prompt's too, from its second token, with that many alternatives."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    constraint: StructuredConstraint | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1 or any(
            not (value is None or (type(value) is int and 0 <= value <= MAX_LOGPROBS))
            for value in (self.logprobs, self.prompt_logprobs)
        ) or not (self.constraint is None or isinstance(self.constraint, StructuredConstraint)):
            raise ValueError(f"invalid sampling parameters: {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def scores(self) -> bool:
        """Whether the last stage returns log-probabilities for this request."""
        return self.logprobs is not None or self.prompt_logprobs is not None

    def to_header(self) -> dict:
        """The fields as a frame header carries them: the log-probability ones and the constraint only
        when set, so a request without them sends what it always sent."""
        header = dict(vars(self))
        for name in LOGPROB_FIELDS:
            if header[name] is None:
                del header[name]
        if (constraint := header.pop("constraint")) is not None:
            header["constraint"] = constraint.to_header()
        return header

    @classmethod
    def from_header(cls, raw: dict[str, Any]) -> SamplingParams:
        """The parameters of a header entry; raises ``TypeError`` or ``ValueError``."""
        if not isinstance(raw, dict):
            raise TypeError(f"sampling parameters are an object, not {type(raw).__name__}")
        constraint = raw.get("constraint")
        fields = {k: v for k, v in raw.items() if k != "constraint"}
        constraint = None if constraint is None else StructuredConstraint.from_header(constraint)
        return cls(**fields, constraint=constraint)
