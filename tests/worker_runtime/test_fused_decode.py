"""The fused decode step (worker_runtime/kernels/decode_layers.c through fused_decode.py): the same logits and
the same KV cache as the stage's torch ops, for every precision, model variant and thread count, for batch-1
and batched decode; which stages and steps it takes; and its switch.

Its agreement with transformers is test_parity.py's (fp32 stages decode on it there), and with the
quantized references test_quantization.py's; here the reference is the torch-op path of the very same
loaded weights, so the bound is fp32 rounding of a different summation order.
"""

from __future__ import annotations

import pytest
import torch

from contracts.model_config import ModelConfig
from worker_runtime import Batch, Stage
from worker_runtime.fused_decode import fused_layers
from worker_runtime.kernels import decode_layers, loader

pytestmark = pytest.mark.skipif(not decode_layers.kernel_enabled(), reason="fused decode not buildable here")

BOUND = 2e-5  # of the logits' scale; the paths differ only in fp32 summation order


def torch_ops(stage: Stage) -> Stage:
    """The same stage with decode on torch ops (what ``MOTLEY_DECODE_KERNEL=torch`` gives)."""
    stage.fused = None
    return stage


def decode(stage: Stage, prompts: list[list[int]], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill ``prompts`` (equally long), then ``steps`` batched decode steps feeding back token ``7 + t``;
    returns the logits of every step [1 + steps, batch, vocab] and the stage's K cache."""
    ids = list(range(len(prompts)))
    length = len(prompts[0])
    logits = [stage(Batch.of_tokens(ids, prompts, [0] * len(ids)))]
    for t in range(steps):
        tokens = [[(7 + t + i) % stage.config.vocab_size] for i in ids]
        logits.append(stage(Batch.of_tokens(ids, tokens, [length + t] * len(ids))))
    return torch.stack(logits), stage.kv.k.clone()


def assert_same(fused: torch.Tensor, reference: torch.Tensor) -> None:
    scale = reference.abs().max().item()
    assert (fused - reference).abs().max().item() <= BOUND * scale


@pytest.mark.parametrize("bits", [16, 8, 4])
@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "llama_linear_bias", "llama_dynamic_tied", "qwen2_bias",
                                     "llama_wide"])
def test_fused_steps_equal_the_torch_ops(checkpoints, threads, variant, bits):
    path = checkpoints[variant]
    layers = ModelConfig.from_file(path).num_layers
    fused, reference = Stage.load(path, 0, layers, bits=bits), torch_ops(Stage.load(path, 0, layers, bits=bits))
    assert fused.fused is not None
    prompts = [[3, 9, 27, 81, 5]]
    for got, expected in zip(decode(fused, prompts, 12), decode(reference, prompts, 12)):
        assert_same(got, expected)


@pytest.mark.parametrize("bits", [16, 4])
def test_batched_decode_of_sequences_in_step_and_a_long_context(checkpoints, threads, bits):
    """Four sequences of 80 positions: several rows per matmul, and attention long enough to be shared
    between threads."""
    path = checkpoints["llama_wide"]
    fused = Stage.load(path, 0, 2, bits=bits)
    reference = torch_ops(Stage.load(path, 0, 2, bits=bits))
    prompts = [[(11 * i + j) % 250 + 1 for j in range(80)] for i in range(4)]
    for got, expected in zip(decode(fused, prompts, 6), decode(reference, prompts, 6)):
        assert_same(got, expected)


def test_a_middle_stage_takes_hidden_states_and_leaves_its_input_alone(checkpoints):
    path = checkpoints["llama_gqa_llama3"]
    fused, reference = Stage.load(path, 1, 3), torch_ops(Stage.load(path, 1, 3))
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randn(4, 64, generator=generator)
    for stage in (fused, reference):
        stage(Batch(seq_ids=[0], start_positions=[0], lengths=[4], hidden=prompt))
    hidden = torch.randn(1, 64, generator=generator)
    given = hidden.clone()
    step = Batch(seq_ids=[0], start_positions=[4], lengths=[1], hidden=hidden)
    assert_same(fused(step), reference(step))
    assert torch.equal(hidden, given)


def test_ragged_steps_and_prefill_run_on_torch_ops_with_the_same_cache(checkpoints):
    """Sequences of different lengths need a mask: the fused path declines them, and the torch ops that run
    instead read the K/V the fused steps wrote."""
    path = checkpoints["llama_gqa_llama3"]
    fused, reference = Stage.load(path, 0, 4), torch_ops(Stage.load(path, 0, 4))
    outputs = []
    for stage in (fused, reference):
        stage(Batch.of_tokens([0], [[5, 6, 7]], [0]))
        stage(Batch.of_tokens([0], [[8]], [3]))  # fused on `fused`
        stage(Batch.of_tokens([1], [[9, 10]], [0]))
        outputs.append(stage(Batch.of_tokens([0, 1], [[11], [12]], [4, 2])))  # ragged: torch ops
    assert_same(*outputs)


def test_stages_it_cannot_serve_keep_torch_ops(checkpoints, monkeypatch):
    path = checkpoints["llama_gqa_llama3"]
    assert Stage.load(path, 0, 2, dtype=torch.bfloat16).fused is None  # the C path is fp32 only
    monkeypatch.setenv("MOTLEY_DECODE_KERNEL", "torch")
    assert Stage.load(path, 0, 2).fused is None
    monkeypatch.setenv("MOTLEY_DECODE_KERNEL", "auto")
    stage = Stage.load(path, 0, 2)
    assert stage.fused is not None
    monkeypatch.setenv("MOTLEY_INT8_KERNEL", "torch")  # an int8 layer on torch's kernel: not fusable
    assert fused_layers(Stage.load(path, 0, 2, bits=8)) is None
    assert loader.switched_to_torch("MOTLEY_INT8_KERNEL")
