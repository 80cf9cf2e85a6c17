"""Choosing next tokens from last-stage logits, with per-sequence parameters and per-request seeds.

Each row draws its randomness from its own generator, seeded by (request seed, position), so a
request's tokens depend only on its seed and its logits, never on which other sequences shared the
batch or on how the scheduler split its steps. ``SamplingParams`` is the contract's
(``contracts.sampling``), which the gateway builds without torch.
"""

from __future__ import annotations

import torch

from contracts.sampling import SamplingParams


def _filtered_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature-scaled logits with everything outside each row's top-k / top-p set to -inf."""
    vocab = logits.shape[-1]
    temperature = torch.tensor([p.temperature for p in params], device=logits.device)[:, None]
    top_k = torch.tensor([p.top_k or vocab for p in params], device=logits.device)[:, None]
    top_p = torch.tensor([p.top_p for p in params], device=logits.device)[:, None]
    scaled = logits / temperature
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    probs = sorted_logits.softmax(dim=-1)
    # A token is dropped when the tokens ranked before it already cover top_p (the first always stays).
    dropped = (ranks >= top_k) | (probs.cumsum(dim=-1) - probs >= top_p)
    sorted_logits = sorted_logits.masked_fill(dropped, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)


def sample(logits: torch.Tensor, params: list[SamplingParams], positions: list[int]) -> torch.Tensor:
    """Next token of each row of ``logits`` [sequences, vocab]; ``positions`` are the tokens' positions.

    Sampling uses the exponential race (argmax of p / E, E ~ Exp(1)), which draws exactly from the
    filtered distribution with one independent noise vector per row.
    """
    if len(params) != logits.shape[0] or len(positions) != logits.shape[0]:
        raise ValueError("one SamplingParams and one position per row of logits")
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens
    chosen = [params[i] for i in rows]
    probs = _filtered_logits(logits[rows].float(), chosen).softmax(dim=-1)
    noise = torch.empty_like(probs, device="cpu")
    for j, (p, i) in enumerate(zip(chosen, rows)):
        generator = torch.Generator()
        seed = p.seed if p.seed is not None else int(torch.randint(0, 2**62, ()).item())
        generator.manual_seed((seed * 1_000_003 + positions[i]) % 2**63)
        noise[j].exponential_(generator=generator)
    tokens[rows] = (probs / noise.to(probs.device)).argmax(dim=-1)
    return tokens
