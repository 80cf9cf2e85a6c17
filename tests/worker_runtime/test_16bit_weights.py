"""CPU stages computing in fp32 over a 16-bit checkpoint keep its linear weights and embedding 16-bit
(worker_runtime/dense.py ``weight_dtype``; kernels f16_matmul.c / bf16_matmul.c): transformers' fp32 logits
as test_parity.py holds every stage to, the logits of the stage that widened its weights as they loaded
(``MOTLEY_16BIT_KERNEL=torch``) within fp32 rounding and its hidden states bit for bit where both run the same
kernel, half the bytes for those weights, and a tensor stored wider than its config says still widened.

The fused decode step over 16-bit weights against the torch ops is test_fused_decode.py's.
"""

from __future__ import annotations

import pytest
import torch

from worker_runtime import Batch, Stage
from worker_runtime.kernels.dense_matmul import kernel_enabled

from .checkpoints import make_checkpoint
from .conftest import VARIANTS_16BIT, reference
from .test_parity import check_partition

pytestmark = pytest.mark.skipif(not (kernel_enabled(torch.float16) and kernel_enabled(torch.bfloat16)),
                                reason="16-bit-weight CPU kernels not buildable here")

BOUND = 1e-5  # of the logits' scale: fp32 rounding where MKL served the widened stage (~2 ulp after 2 layers)


def widened(monkeypatch, path, start: int, end: int) -> Stage:
    """The stage as it loaded before 16-bit weights were kept: widened to fp32 as they load."""
    with monkeypatch.context() as patch:
        patch.setenv("MOTLEY_16BIT_KERNEL", "torch")
        return Stage.load(path, start, end, dtype=torch.float32)


def steps(stage: Stage, prompt_length: int, count: int = 6) -> list[torch.Tensor]:
    """A prompt's prefill, then ``count`` decode steps of two sequences, feeding back fixed tokens."""
    vocab = stage.config.vocab_size
    prompts = [[(7 * j + i) % vocab for j in range(prompt_length)] for i in range(2)]
    out = [stage(Batch.of_tokens([0, 1], prompts, [0, 0]))]
    for t in range(count):
        tokens = [[(3 + t) % vocab], [(5 + t) % vocab]]
        out.append(stage(Batch.of_tokens([0, 1], tokens, [prompt_length + t] * 2)))
    return out


@pytest.mark.parametrize("variant",
                         ["llama_dynamic_tied-float16", "qwen2_bias-bfloat16", "llama_wide-bfloat16"])
def test_kept_16bit_stages_reproduce_transformers(checkpoints_16bit, variant):
    ref = reference(checkpoints_16bit[variant])
    layers = ref.num_layers
    for stages in (check_partition(ref, [(0, layers)], dtype=torch.float32),
                   check_partition(ref, [(0, 1), (1, layers)], dtype=torch.float32)):
        dtype = stages[0].weight_dtype
        assert dtype == getattr(torch, variant.split("-")[1])
        assert stages[0].embed.weight.dtype == stages[0].layers[0].attention.wqkv.weight.dtype == dtype
        assert stages[-1].lm_head.weight.dtype == dtype
        assert stages[0].layers[0].attention_norm.weight.dtype == torch.float32 == stages[0].kv.k.dtype


@pytest.mark.parametrize("variant", [f"{v}-{d}" for v in VARIANTS_16BIT for d in ("float16", "bfloat16")])
@pytest.mark.parametrize("prompt_length", [11, 40])
def test_kept_16bit_stages_compute_what_the_widened_ones_did(checkpoints_16bit, monkeypatch, variant,
                                                             prompt_length):
    path = checkpoints_16bit[variant]
    layers = Stage.load(path, 0, 1).config.num_layers
    kept, old = Stage.load(path, 0, layers, dtype=torch.float32), widened(monkeypatch, path, 0, layers)
    assert kept.weight_dtype != torch.float32 and old.weight_dtype == torch.float32
    assert (kept.fused is None) == (old.fused is None)
    for got, expected in zip(steps(kept, prompt_length), steps(old, prompt_length)):
        assert (got - expected).abs().max().item() <= BOUND * expected.abs().max().item()


def test_hidden_states_are_bit_identical_where_both_run_the_same_kernel(checkpoints_16bit, monkeypatch):
    """llama_wide's decoder weights (1-4 MiB) ran on our fp32 kernel for up to 16 rows, and on MKL past 32
    (this prompt of 40 rows), so the kept stage's first layer gives the same bits in prefill and decode."""
    path = checkpoints_16bit["llama_wide-bfloat16"]
    kept, old = Stage.load(path, 0, 1, dtype=torch.float32), widened(monkeypatch, path, 0, 1)
    for got, expected in zip(steps(kept, 40), steps(old, 40)):
        assert torch.equal(got, expected)


def test_memory_reports_the_16bit_weights_at_half_the_bytes(checkpoints_16bit, monkeypatch):
    path = checkpoints_16bit["qwen2_bias-bfloat16"]
    kept, old = Stage.load(path, 0, 5, dtype=torch.float32), widened(monkeypatch, path, 0, 5)
    kept_kinds, old_kinds = kept.memory().weight_bytes_by_kind, old.memory().weight_bytes_by_kind
    small = sum(p.nbytes for name, p in kept.named_parameters() if "norm" in name or name.endswith("bias"))
    assert kept_kinds == {"bfloat16": (old_kinds["float32"] - small) // 2, "float32": small}
    assert kept.memory().kv_cache_bytes == old.memory().kv_cache_bytes


def test_a_tensor_stored_wider_than_the_config_says_is_widened_not_rounded(tmp_path, monkeypatch):
    """A config that says bfloat16 over fp32 tensors: the stage keeps them fp32, as it always did."""
    path = make_checkpoint("llama_dynamic_tied", tmp_path / "llama_dynamic_tied", config_dtype="bfloat16")
    stage = Stage.load(path, 0, 3, dtype=torch.float32)
    assert stage.weight_dtype == torch.bfloat16
    assert {p.dtype for p in stage.parameters()} == {torch.float32}
    old = widened(monkeypatch, path, 0, 3)
    for got, expected in zip(steps(stage, 11), steps(old, 11)):
        assert torch.equal(got, expected)
