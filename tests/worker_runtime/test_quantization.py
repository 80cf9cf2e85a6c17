"""int8 / int4 weight-only quantization: exact kernels, bounded logits error, measured agreement.

Bounds, on a 4-layer demo-format model (hidden 256, random N(0, 0.02) weights, the hardest case for
min-max int4 since random weights have no slack) over 16 fixed prompts x 32 positions, error
normalized by the std of the fp32 logits:
    int8            max <= 0.15, mean <= 0.025, next-token agreement >= 0.93 (measured 0.099 / 0.015 / 0.959)
    int4 group 128  max <= 1.5,  mean <= 0.27,  agreement >= 0.48            (measured 1.19 / 0.219 / 0.531)
    int4 group 32   max <= 1.2,  mean <= 0.2,   agreement >= 0.6             (measured 1.09 / 0.174 / 0.645)
A change that makes any of these worse fails here.
"""

from __future__ import annotations

import pytest
import torch

from contracts.precision import Precision
from worker_runtime import Batch, QuantizationError, Stage
from worker_runtime.make_demo_model import parse_args, write_demo_model
from worker_runtime.quantize import Int4Linear, Int8Linear, quantize_int4_rows, quantize_int8_rows

CPU = torch.device("cpu")
BOUNDS = {  # (bits, group): (max error / std, mean error / std, min agreement)
    (8, 128): (0.15, 0.025, 0.93),
    (4, 128): (1.5, 0.27, 0.48),
    (4, 32): (1.2, 0.2, 0.6),
}


def dequantized_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    q, sz = quantize_int4_rows(w, group)
    scale = sz[..., 0].float().T.repeat_interleave(group, 1)
    zero = sz[..., 1].float().T.repeat_interleave(group, 1)
    return (q.float() - 8) * scale + zero, scale


def test_int8_rounds_each_weight_to_the_nearest_step_and_the_kernel_matches_it():
    rng = torch.Generator().manual_seed(0)  # inputs of their own: not the order the suite runs in
    w = torch.randn(96, 80, generator=rng)
    q, scales = quantize_int8_rows(w)
    deq = q.float() * scales.float()[:, None]
    assert ((deq - w).abs() <= scales.float()[:, None] / 2 + 1e-6).all()
    layer = Int8Linear(80, 96, True, CPU, torch.float32)
    layer.load_rows(0, w[:64]), layer.load_rows(64, w[64:])  # row blocks, as loading does
    layer.bias.data = torch.randn(96, generator=rng)
    x = torch.randn(5, 80, generator=rng)
    expected = x.bfloat16().float() @ deq.T + layer.bias
    torch.testing.assert_close(layer(x), expected, atol=0.05, rtol=0.01)
    assert layer(x).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_int8_rounds_each_group_to_its_nearest_step_on_our_kernel_and_dequantized(dtype, monkeypatch):
    """The int8 head's format: a scale per 32 weights of a row. Our CPU kernel (fp32 and bf16 stages)
    and the dequantizing fallback (where that kernel is switched off) both compute x @ dequantized.T."""
    w = torch.randn(96, 128, generator=torch.Generator().manual_seed(0))
    w[:, :32] *= 50  # one group of outliers per row, which a per-row scale would spread over the row
    q, scales = quantize_int8_rows(w, 32)
    assert scales.shape == (96, 4)
    step = scales.float().repeat_interleave(32, 1)
    deq = q.float() * step
    assert ((deq - w).abs() <= step / 2 + 1e-6).all()
    assert (deq - w)[:, 32:].abs().max() < (quantize_int8_rows(w)[1].float().min() / 4)
    x = torch.randn(5, 128)
    expected = x.to(dtype).float() @ deq.T
    for switch in ("auto", "torch"):
        monkeypatch.setenv("MOTLEY_INT8_KERNEL", switch)
        layer = Int8Linear(128, 96, False, CPU, dtype, group=32)
        layer.load_rows(0, w[:40]), layer.load_rows(40, w[40:])
        assert layer.cpu_kernel == (switch == "auto")
        out = layer(x.to(dtype))
        assert out.dtype == dtype
        # Error over the sum of magnitudes: our kernel on fp32 is off by fp32 rounding only, a bf16 product
        # (a bf16 stage, or the fallback's bf16 matmul) by bf16's.
        error = ((out.float() - expected).abs() / (x.abs() @ deq.abs().T)).max()
        assert error < (1e-6 if switch == "auto" and dtype == torch.float32 else 1e-2)


def test_grouped_int8_refuses_groups_the_kernel_cannot_take():
    with pytest.raises(QuantizationError, match="groups of 32"):
        Int8Linear(80, 16, False, CPU, torch.float32, group=32)
    with pytest.raises(QuantizationError, match="groups of 64"):
        Int8Linear(128, 16, False, CPU, torch.float32, group=64)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_rounds_each_group_to_the_nearest_step_and_the_kernel_matches_it(group):
    w = torch.randn(208, 256, generator=torch.Generator().manual_seed(group))
    deq, scale = dequantized_int4(w, group)
    assert ((deq - w).abs() <= scale * 0.5 + w.abs().amax() * 2**-8).all()
    layer = Int4Linear(256, 208, False, CPU, torch.float32, group_size=group)
    for start in (0, 40, 120):  # blocks not aligned to the 64-row packing, as fused q/k/v arrive
        layer.load_rows(start, w[start : {0: 40, 40: 120, 120: 208}[start]])
    layer.finish()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0)).bfloat16().float()
    # The kernel rounds its sums through bf16: within bf16's step (2**-8) of the summed |x * w|.
    assert ((layer(x) - x @ deq.T).abs() <= (x.abs() @ deq.abs().T) * 2**-8).all()


def test_int4_refuses_shapes_its_kernel_cannot_take():
    with pytest.raises(QuantizationError, match="multiple of 16"):
        Int4Linear(64, 40, False, CPU, torch.float32)
    with pytest.raises(QuantizationError, match="group size"):
        Int4Linear(48, 32, False, CPU, torch.float32)


@pytest.fixture(scope="module")
def demo_small(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_small")
    args = ["--layers", "4", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--intermediate", "512"]
    write_demo_model(parse_args([str(out), *args]))
    return out


def prompt_logits(path, bits: int, group: int = 128) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 700, (32,), generator=generator).tolist() for _ in range(16)]
    stage = Stage.load(path, 0, 4, precision=Precision(bits), group_size=group, kv_tokens=1024)
    return stage.forward(Batch.of_tokens(list(range(16)), prompts, [0] * 16), all_logits=True)


@pytest.mark.parametrize("bits,group", list(BOUNDS))
def test_quantized_logits_error_and_agreement_stay_within_bounds(demo_small, bits, group):
    reference = prompt_logits(demo_small, 16)
    quantized = prompt_logits(demo_small, bits, group)
    error = (quantized - reference).abs() / reference.std()
    agreement = (quantized.argmax(-1) == reference.argmax(-1)).float().mean().item()
    max_bound, mean_bound, min_agreement = BOUNDS[(bits, group)]
    print(f"int{bits} g{group}: max {error.max():.3f} mean {error.mean():.3f} agreement {agreement:.3f}")
    assert error.max() <= max_bound and error.mean() <= mean_bound and agreement >= min_agreement


@pytest.mark.parametrize("variant", ["qwen2_bias", "llama_linear_bias", "llama_dynamic_tied"])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_stages_run_every_variant(references, variant, bits):
    ref = references[variant]
    stages = [Stage.load(ref.path, 0, 1, precision=Precision(bits)),
              Stage.load(ref.path, 1, ref.num_layers, precision=Precision(bits))]
    hidden = stages[0].forward(Batch.of_tokens([0], [ref.prompt], [0]))
    logits = stages[1].forward(Batch.of_tokens([0], [ref.prompt], [0]).with_hidden(hidden), all_logits=True)
    error = (logits - ref.prefill_logits).abs().mean() / ref.prefill_logits.std()
    assert error < {8: 0.03, 4: 0.5}[bits]  # int4 on 64-wide layers has one group per row


def test_memory_report_gives_the_real_bytes_of_each_precision(demo_small):
    h, i, kv, vocab, layers = 256, 512, 128, 704, 4
    linears = [(h + 2 * kv, h), (h, h), (2 * i, h), (h, i)]  # (out, in) of wqkv, wo, w13, w2
    reports = {bits: Stage.load(demo_small, 0, 4, precision=Precision(bits), kv_tokens=16).memory()
               for bits in (16, 8, 4)}
    dense = layers * sum(n * k for n, k in linears) * 4 + vocab * h * 4
    norms = (2 * layers + 1) * h * 4
    embed = vocab * h * 4
    assert reports[16].weight_bytes_by_kind == {"float32": dense + norms + embed}
    assert reports[8].weight_bytes_by_kind == {
        "float32": norms + embed,
        # the head: a bf16 scale per 32 weights of a row, the layers one per row
        "int8": layers * sum(n * k + 2 * n for n, k in linears) + vocab * h + 2 * vocab * (h // 32),
    }
    int4 = (layers * sum(n * k // 2 + (k // 32) * n * 4 for n, k in linears)
            + vocab * h // 2 + (h // 32) * vocab * 4)
    assert reports[4].weight_bytes_by_kind == {"float32": norms + embed, "int4": int4}


def test_a_stage_mixing_two_precisions_equals_its_two_halves_chained(demo_small):
    """Layers [0, 2) at 16 bits and [2, 4) with the head at int4 in one stage compute exactly what a
    16-bit stage [0, 2) feeding an int4 stage [2, 4) computes, and hold the bytes of both."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 700, (12,), generator=generator).tolist() for _ in range(3)]
    batch = Batch.of_tokens([0, 1, 2], prompts, [0, 0, 0])
    mixed = Stage.load(demo_small, 0, 4, precision=Precision(16, 4, 2), kv_tokens=64)
    first = Stage.load(demo_small, 0, 2, kv_tokens=64)
    second = Stage.load(demo_small, 2, 4, precision=Precision(4), kv_tokens=64)
    chained = second.forward(batch.with_hidden(first.forward(batch)), all_logits=True)
    torch.testing.assert_close(mixed.forward(batch, all_logits=True), chained, rtol=0, atol=0)
    assert mixed.layer_bits == (16, 16, 4, 4) and mixed.head_bits == 4
    kinds = mixed.memory().weight_bytes_by_kind
    halves = [first.memory().weight_bytes_by_kind, second.memory().weight_bytes_by_kind]
    assert kinds == {k: sum(h.get(k, 0) for h in halves) for k in kinds} and set(kinds) == {"float32", "int4"}


@pytest.mark.parametrize("low_bits, low_from, match", [
    (4, None, "both are needed"), (None, 2, "both are needed"), (4, 0, "strictly inside"),
    (4, 4, "strictly inside"), (16, 2, "below bits"), (3, 2, "16, 8 or 4"),
])
def test_a_bad_precision_split_is_refused_by_name(demo_small, low_bits, low_from, match):
    with pytest.raises(ValueError, match=match):
        Stage.load(demo_small, 0, 4, precision=Precision(16, low_bits, low_from), kv_tokens=16)
