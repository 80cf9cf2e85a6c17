"""The fused decode step (worker_runtime/kernels/decode_layers.c through fused_decode.py): the same logits and
the same KV cache as the stage's torch ops, for every precision, model variant and thread count, for batch-1,
batched and ragged decode and a sliding window (against transformers); which stages and steps it takes; and
its switch.

Its agreement with transformers is test_parity.py's (fp32 stages decode on it there), and with the
quantized references test_quantization.py's; here the reference is the torch-op path of the very same
loaded weights, so the bound is fp32 rounding of a different summation order.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from contracts.model_config import ModelConfig
from contracts.precision import Precision
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
@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "llama_linear_bias", "llama_dynamic_tied",
                                     "qwen2_bias", "llama_wide"])
def test_fused_steps_equal_the_torch_ops(checkpoints, threads, variant, bits):
    path = checkpoints[variant]
    layers = ModelConfig.from_file(path).num_layers
    precision = Precision(bits)
    fused, reference = (Stage.load(path, 0, layers, precision=precision),
                        torch_ops(Stage.load(path, 0, layers, precision=precision)))
    assert fused.fused is not None
    prompts = [[3, 9, 27, 81, 5]]
    for got, expected in zip(decode(fused, prompts, 12), decode(reference, prompts, 12)):
        assert_same(got, expected)


@pytest.mark.parametrize("variant", ["llama_dynamic_tied-float16", "qwen2_bias-bfloat16",
                                     "llama_wide-float16", "llama_wide-bfloat16"])
def test_fused_steps_over_16bit_weights_equal_the_torch_ops(checkpoints_16bit, threads, variant):
    """An fp32 CPU stage over a 16-bit checkpoint keeps its weights 16-bit and still decodes in one call,
    its 16-bit layers on the fp16 / bf16-weight kernels (a mixed stage's int8 layers beside them)."""
    path = checkpoints_16bit[variant]
    layers = ModelConfig.from_file(path).num_layers
    mixed = Precision(16, 8, layers - 1)
    for load in (dict(dtype=torch.float32), dict(dtype=torch.float32, precision=mixed)):
        fused, reference = Stage.load(path, 0, layers, **load), torch_ops(Stage.load(path, 0, layers, **load))
        assert fused.fused is not None and fused.layers[0].attention.wqkv.weight.dtype == fused.weight_dtype
        assert fused.weight_dtype == getattr(torch, variant.split("-")[1])
        prompts = [[3, 9, 27, 81, 5], [4, 8, 15, 16, 23]]
        for got, expected in zip(decode(fused, prompts, 8), decode(reference, prompts, 8)):
            assert_same(got, expected)


@pytest.mark.parametrize("bits", [16, 4])
def test_batched_decode_of_sequences_in_step_and_a_long_context(checkpoints, threads, bits):
    """Four sequences of 80 positions: several rows per matmul, and attention long enough to be shared
    between threads."""
    path = checkpoints["llama_wide"]
    fused = Stage.load(path, 0, 2, precision=Precision(bits))
    reference = torch_ops(Stage.load(path, 0, 2, precision=Precision(bits)))
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


def test_ragged_decode_is_fused_and_a_mixed_batch_reads_what_it_wrote(checkpoints, threads):
    """Sequences of different lengths each adding a token: fused (each attends to its own length); a batch
    mixing a prompt with a decode step runs on torch ops and reads the K/V the fused steps wrote."""
    path = checkpoints["llama_gqa_llama3"]
    fused, reference = Stage.load(path, 0, 4), torch_ops(Stage.load(path, 0, 4))
    outputs = []
    for stage in (fused, reference):
        stage(Batch.of_tokens([0, 1], [[5, 6, 7, 8, 9], [10, 11]], [0, 0]))
        steps = [stage(Batch.of_tokens([0, 1], [[12 + t], [20 + t]], [5 + t, 2 + t])) for t in range(4)]
        steps.append(stage(Batch.of_tokens([0, 2], [[30], [31, 32, 33]], [9, 0])))  # prefill + decode
        steps.append(stage(Batch.of_tokens([2, 0, 1], [[34], [35], [36]], [3, 10, 6])))
        outputs.append(steps)
    for got, expected in zip(*outputs):
        assert_same(got, expected)


def test_a_sliding_window_model_against_transformers(tmp_path, threads):
    """Mistral with a window of 6: each fused decode step attends to its last 6 positions only, as
    transformers' forward over the whole sequence does at every position."""
    torch.manual_seed(0)
    config = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=256, sliding_window=6, initializer_range=0.1)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    ids = [(7 * i + 3) % 250 + 1 for i in range(20)]
    expected = MistralForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()(
        torch.tensor([ids])).logits[0].detach()
    stage = Stage.load(tmp_path, 0, 2)
    assert stage.fused is not None and stage.config.sliding_window == 6
    got = [stage(Batch.of_tokens([0], [ids[:4]], [0]))[0]]
    got += [stage(Batch.of_tokens([0], [[token]], [4 + t]))[0] for t, token in enumerate(ids[4:])]
    torch.testing.assert_close(torch.stack(got), expected[3:], atol=1e-4, rtol=1e-4)


def test_stages_it_cannot_serve_keep_torch_ops(checkpoints, monkeypatch):
    path = checkpoints["llama_gqa_llama3"]
    assert Stage.load(path, 0, 2, dtype=torch.bfloat16).fused is None  # the C path is fp32 only
    monkeypatch.setenv("MOTLEY_DECODE_KERNEL", "torch")
    assert Stage.load(path, 0, 2).fused is None
    monkeypatch.setenv("MOTLEY_DECODE_KERNEL", "auto")
    stage = Stage.load(path, 0, 2)
    assert stage.fused is not None
    monkeypatch.setenv("MOTLEY_INT8_KERNEL", "torch")  # an int8 layer on torch's kernel: not fusable
    assert fused_layers(Stage.load(path, 0, 2, precision=Precision(8))) is None
    assert loader.switched_to_torch("MOTLEY_INT8_KERNEL")
