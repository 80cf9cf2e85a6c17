"""Sampling: greedy, temperature, top-k, top-p, and seeds that do not depend on batching."""

from __future__ import annotations

import pytest
import torch

from worker_runtime import SamplingParams, Stage, generate, sample


def logits_rows(n: int, vocab: int = 50) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(n)) * 3


def test_greedy_and_top_k_1_take_the_argmax():
    logits = logits_rows(4)
    params = [SamplingParams(), SamplingParams(temperature=2.0, top_k=1, seed=3)] * 2
    assert torch.equal(sample(logits, params, [0, 1, 2, 3]), logits.argmax(-1))


def test_a_seeded_row_does_not_depend_on_its_batch_mates():
    logits = logits_rows(6)
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(6)]
    batched = sample(logits, params, [10] * 6)
    alone = [int(sample(logits[i : i + 1], [params[i]], [10])) for i in range(6)]
    assert batched.tolist() == alone
    mixed = [SamplingParams()] + params[1:]
    assert sample(logits, mixed, [10] * 6).tolist()[1:] == alone[1:]


def test_sampling_follows_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    draws = lambda p: torch.tensor([int(sample(logits, [p], [pos])) for pos in range(3000)])  # noqa: E731
    plain = draws(SamplingParams(temperature=1.0, seed=7))
    frequencies = torch.bincount(plain, minlength=6).float() / len(plain)
    torch.testing.assert_close(frequencies, logits[0].softmax(-1), atol=0.03, rtol=0)
    assert set(draws(SamplingParams(temperature=1.0, top_k=2, seed=7)).tolist()) == {0, 1}
    probs = logits[0].softmax(-1)  # 0.61, 0.22, 0.14, ...: top_p 0.7 keeps the first two
    assert probs[0] < 0.7 < probs[:2].sum()
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.7, seed=7)).tolist()) == {0, 1}
    hot = draws(SamplingParams(temperature=0.25, seed=7))
    assert (hot == 0).float().mean() > 0.95


def test_invalid_parameters_are_refused():
    for bad in (dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_seeded_generation_is_reproducible_across_batch_compositions(checkpoints):
    stages = [Stage.load(checkpoints["qwen2_bias"], 0, 5)]
    params = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=1234)
    alone = generate(stages, [[5, 6, 7]], params, max_new_tokens=16)[0]
    others = [SamplingParams(temperature=0.7, seed=s) for s in (1, 2)]
    batched = generate(stages, [[9, 9], [5, 6, 7], list(range(20, 40))], [others[0], params, others[1]], 16)
    assert batched[1] == alone
    other_seed = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=99)
    assert generate(stages, [[5, 6, 7]], other_seed, 16)[0] != alone
