"""Chaining stages in one process: the reference loop that a multi-process pipeline must reproduce.

The multi-process pipeline sends the same :class:`~worker_runtime.stage.Batch` from stage to stage
over the network; here the hand-off is a function call, which makes this the ground truth for tests
and the engine the benchmark measures.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from contracts.sampling import SamplingParams

from .sampling import sample
from .stage import Batch, Stage


def run_stages(stages: Sequence[Stage], batch: Batch, all_logits: bool = False) -> torch.Tensor:
    """One step through all stages in order; returns the last stage's logits."""
    out = stages[0].forward(batch, all_logits=all_logits and len(stages) == 1)
    for stage in stages[1:]:
        out = stage.forward(batch.with_hidden(out), all_logits=all_logits and stage is stages[-1])
    return out


def free_sequences(stages: Sequence[Stage], seq_ids: Sequence[int]) -> None:
    for stage in stages:
        for seq_id in seq_ids:
            stage.kv.free(seq_id)


def generate(
    stages: Sequence[Stage],
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
    max_new_tokens: int = 32,
    seq_ids: Sequence[int] | None = None,
    stop_tokens: Sequence[int] = (),
) -> list[list[int]]:
    """Prefill all prompts in one ragged batch, then decode them together; returns the new tokens.

    A sequence stops at ``max_new_tokens`` or at a stop token; its cache space is freed as soon as it stops.
    """
    seq_ids = list(seq_ids) if seq_ids is not None else list(range(len(prompts)))
    params = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
    lengths = [len(p) for p in prompts]
    batch = Batch.of_tokens(seq_ids, [list(p) for p in prompts], [0] * len(prompts))
    try:
        logits = run_stages(stages, batch)
        outputs: list[list[int]] = [[] for _ in prompts]
        active = list(range(len(prompts)))
        while True:
            positions = [lengths[i] + len(outputs[i]) for i in active]
            tokens = sample(logits, [params[i] for i in active], positions).tolist()
            for i, token in zip(active, tokens):
                outputs[i].append(token)
            finished = [
                i for i in active if len(outputs[i]) >= max_new_tokens or outputs[i][-1] in stop_tokens
            ]
            free_sequences(stages, [seq_ids[i] for i in finished])
            active = [i for i in active if i not in finished]
            if not active:
                return outputs
            batch = Batch.of_tokens(
                [seq_ids[i] for i in active],
                [[outputs[i][-1]] for i in active],
                [lengths[i] + len(outputs[i]) - 1 for i in active],
            )
            logits = run_stages(stages, batch)
    finally:
        free_sequences(stages, seq_ids)
