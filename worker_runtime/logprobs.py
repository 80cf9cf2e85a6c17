"""Log-probabilities of the last stage's logit rows, for the sequences that ask (contracts/logprobs.py).

Computed from the logits the step already has: a sequence's sampled rows, and for a scored prompt
the rows its prefill returns for every prompt position (``Batch.scored``), so a prompt's
log-probabilities cost no second pass. They are log-softmax of the raw logits in float32, before
temperature, top-k and top-p, as vLLM returns them by default: what the model thinks of each token,
whatever the request's sampling does with it.
"""

from __future__ import annotations

import torch

from contracts.sampling import SamplingParams

from .stage import Batch

FLOOR = -9999.0  # a token the model rules out: a number JSON can carry, as vLLM's


def batch_logprobs(logits: torch.Tensor, batch: Batch, params: list[SamplingParams],
                   sampled: torch.Tensor) -> list[list | None] | None:
    """Per sequence, None or its entries ``[logprob, [[id, logprob], ...]]``: one per scored row (its
    ``scored`` token), then one per sampled row (the token ``sampled`` there). None when no sequence
    asks. ``logits`` [rows, vocab]: every logit row of the batch; ``sampled``: the sampled rows' tokens.
    Raises ``ValueError`` for a scored token outside the vocabulary."""
    scored = batch.scored or [[] for _ in batch.seq_ids]
    if not any(p.scores for p in params) and not any(scored):
        return None
    out: list[list | None] = []
    row = pick = 0
    for p, rows, prompt, picks in zip(params, batch.rows(), scored, batch.sampled_rows()):
        if not (p.scores or prompt):
            out.append(None)
        else:
            targets = [*prompt, *sampled[pick:pick + picks].tolist()]
            tops = [p.prompt_logprobs or 0] * len(prompt) + [p.logprobs or 0] * picks
            out.append(_entries(logits[row:row + rows], targets, tops))
        row, pick = row + rows, pick + picks
    return out


def _entries(logits: torch.Tensor, targets: list[int], tops: list[int]) -> list[list]:
    vocab = logits.shape[-1]
    if any(not 0 <= t < vocab for t in targets):
        raise ValueError(f"scored token ids must be below the vocabulary size {vocab}")
    logp = torch.log_softmax(logits.float(), dim=-1).clamp(min=FLOOR)
    chosen = logp.gather(1, torch.tensor(targets, device=logp.device)[:, None])[:, 0].tolist()
    k = max(tops)
    values, ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
    values, ids = values.tolist(), ids.tolist()
    return [[lp, [[i, v] for i, v in zip(ids[r][:n], values[r][:n])]]
            for r, (lp, n) in enumerate(zip(chosen, tops))]
