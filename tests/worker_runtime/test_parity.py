"""Chained stages of any partition reproduce transformers' fp32 logits (1e-4) and greedy tokens."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from worker_runtime import Batch, Stage, run_stages

from .checkpoints import VARIANTS
from .conftest import DECODE_STEPS

TOLERANCE = 1e-4


def partitions(num_layers: int) -> list[list[tuple[int, int]]]:
    """Every way to cut layers 0..n into contiguous non-empty stages."""
    result = []
    for cuts in itertools.product([False, True], repeat=num_layers - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [num_layers]
        result.append(list(zip(bounds, bounds[1:])))
    return result


def check_partition(ref, partition: list[tuple[int, int]], **load) -> list[Stage]:
    """The stages of ``partition`` (Stage.load's further keywords: ``load``) against ``ref``; returns them."""
    stages = [Stage.load(ref.path, a, b, kv_tokens=64, block_size=8, **load) for a, b in partition]
    n = len(ref.prompt)
    logits = run_stages(stages, Batch.of_tokens([5], [ref.prompt], [0]), all_logits=True)
    torch.testing.assert_close(logits, ref.prefill_logits, atol=TOLERANCE, rtol=0)
    tokens = []
    for step in range(1 + DECODE_STEPS):
        last = logits[-1:]
        torch.testing.assert_close(last[0], ref.step_logits[step], atol=TOLERANCE, rtol=0, msg=f"step {step}")
        tokens.append(int(last.argmax()))
        if step < DECODE_STEPS:
            logits = run_stages(stages, Batch.of_tokens([5], [[tokens[-1]]], [n + step]))
    assert tokens == ref.greedy_tokens
    return stages


@pytest.mark.parametrize("partition", partitions(4), ids=str)
def test_every_partition_of_the_gqa_llama3_model(references, partition):
    check_partition(references["llama_gqa_llama3"], partition)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "llama_gqa_llama3"])
def test_random_partitions_of_each_variant(references, variant):
    ref = references[variant]
    all_partitions = partitions(ref.num_layers)
    chosen = {0, len(all_partitions) - 1}  # the whole model in one stage, and one stage per layer
    chosen |= set(random.Random(variant).sample(range(len(all_partitions)), min(2, len(all_partitions))))
    for i in sorted(chosen):
        check_partition(ref, all_partitions[i])


def test_the_wide_model_on_onednn(references, monkeypatch):
    """The wide model's dense layers decode on our fp32 kernel above; here on oneDNN, as with the switch."""
    monkeypatch.setenv("MOTLEY_DENSE_KERNEL", "torch")
    check_partition(references["llama_wide"], [(0, 2)])


def test_single_layer_stages_are_both_ends_correctly(references):
    ref = references["qwen2_bias"]
    first, middle, last = (Stage.load(ref.path, a, b) for a, b in [(0, 1), (2, 3), (4, 5)])
    assert (first.is_first, first.is_last, last.is_last, middle.is_first) == (True, False, True, False)
    assert first.embed is not None and first.lm_head is None
    assert middle.embed is None and middle.norm is None and last.norm is not None


def test_hidden_states_are_contiguous_in_the_stated_dtype(references):
    ref = references["llama_gqa_llama3"]
    stage = Stage.load(ref.path, 0, 2, dtype=torch.bfloat16)
    hidden = stage.forward(Batch.of_tokens([1, 2], [ref.prompt, ref.prompt[:3]], [0, 0]))
    assert hidden.is_contiguous() and hidden.dtype == stage.hidden_dtype == torch.bfloat16
    assert hidden.shape == (len(ref.prompt) + 3, 64)
