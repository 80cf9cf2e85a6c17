"""A request's sampling parameters, as the gateway submits them and the head's sampler applies them.

Torch-free so that the gateway, which builds them, imports no torch; the sampler itself (drawing the
next tokens from logits) is ``worker_runtime.sampling.sample``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 means greedy; ``top_k`` 0 and ``top_p`` 1.0 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"invalid sampling parameters: {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
