"""The CPU int4 kernel (worker_runtime/kernels/int4_matmul.c): exact to fp32 rounding on the weights
``quantize_int4_rows`` makes, on its AVX2 code and (where the CPU has it) its AVX-512 code, and its switch.

Exact means within kernel_checks.RELATIVE_BOUND of the float64 ``x @ dequant(w).T + bias``, with
dequant(w) = (q - 8) * scale + zero computed here in float64 from the quantizer's own output (not from
the kernel's layout); torch's bf16 kernel is ~6e-4 off on the same measure. The build, its cache and the
fallbacks are test_kernel_loader.py's.
"""

from __future__ import annotations

import functools

import pytest
import torch

from worker_runtime.kernels import int4_matmul
from worker_runtime.quantize import Int4Linear, quantize_int4_rows

from .kernel_checks import assert_exact_to_rounding

CPU = torch.device("cpu")
# Decode batches (1-5: each tail of the 4- and 8-row tiles), 16, and prefill sizes around 64-row panels.
ROWS = [1, 2, 3, 4, 5, 16, 64, 65, 130]
# (in_features, out_features, group): SmolLM2-135M's layers (qkv, o, gate_up, down) at each group size
# their input allows, then every group size on one tile, on three (not split evenly by two threads) and
# on a longer input.
SHAPES = [
    (576, 960, 32), (576, 576, 64), (576, 3072, 32), (1536, 576, 128), (1536, 576, 256),
    (256, 16, 32), (256, 16, 256), (768, 48, 64), (768, 48, 128), (1536, 64, 32), (1536, 64, 256),
]
ISAS = [False, True] if int4_matmul.kernel_enabled() and int4_matmul.avx512_available() else [False]

pytestmark = pytest.mark.skipif(not int4_matmul.kernel_enabled(), reason="int4 CPU kernel not buildable here")


@functools.cache
def loaded(k: int, n: int, group: int, bias: bool) -> tuple[Int4Linear, torch.Tensor]:
    """A layer loaded in row blocks not aligned to its 16-row tiles (as fused q/k/v arrive), and its
    weights dequantized in float64 from the quantizer's output."""
    generator = torch.Generator().manual_seed(k * n + group)
    w = torch.randn(n, k, generator=generator) * torch.rand(n, 1, generator=generator) + 0.1
    layer = Int4Linear(k, n, bias, CPU, torch.float32, group_size=group)
    assert layer.cpu_kernel and layer.group_size == group
    for start in range(0, n, 40):
        layer.load_rows(start, w[start : start + 40])
    layer.finish()
    if bias:
        layer.bias.data = torch.randn(n, generator=generator)
    q, scales_and_zeros = quantize_int4_rows(w, group)
    scale, zero = (scales_and_zeros[..., i].double().T.repeat_interleave(group, 1) for i in (0, 1))
    return layer, (q.double() - 8) * scale + zero


@pytest.mark.parametrize("avx512", ISAS, ids=lambda wide: "avx512" if wide else "avx2")
@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("k,n,group", SHAPES)
def test_kernel_equals_the_float64_reference_for_every_batch_size(threads, k, n, group, bias, avx512):
    layer, deq = loaded(k, n, group, bias)
    generator = torch.Generator().manual_seed(threads)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=generator)
        y = int4_matmul.int4_matmul(x, layer.weight, layer.scales_and_zeros, group, layer.bias, avx512)
        assert_exact_to_rounding(y, x, deq, layer.bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_layer_takes_any_leading_dims_and_keeps_its_dtype(dtype):
    """A bf16 stage's activations and bias are cast to fp32 for the kernel and its output back to bf16."""
    fp32_layer, deq = loaded(768, 48, 64, True)
    layer = Int4Linear(768, 48, True, CPU, dtype, group_size=64)
    layer.load_state_dict(fp32_layer.state_dict())
    x = torch.randn(2, 3, 768).to(dtype)
    y = layer(x)
    assert y.shape == (2, 3, 48) and y.dtype == dtype
    if dtype == torch.float32:
        assert_exact_to_rounding(y.view(6, 48), x.view(6, 768), deq, layer.bias)
    else:  # the output's own rounding to bf16: half a unit of its 8 significant bits
        reference = x.view(6, 768).double() @ deq.T + layer.bias.double()
        assert ((y.view(6, 48).double() - reference).abs() <= reference.abs() * 2**-8 + 1e-5).all()


def test_no_rows_give_no_outputs():
    layer, _ = loaded(256, 16, 32, False)
    assert layer(torch.empty(0, 256)).shape == (0, 16)


def test_forced_torch_switch_takes_torch_kernel(monkeypatch):
    monkeypatch.setenv("MOTLEY_INT4_KERNEL", "torch")
    layer = Int4Linear(576, 960, True, CPU, torch.float32, group_size=32)
    assert not layer.cpu_kernel
    layer.load_rows(0, torch.randn(960, 576))
    layer.finish()
    layer.bias.data = torch.randn(960)
    x = torch.randn(1, 576)
    packed = torch._weight_int4pack_mm_for_cpu(x.bfloat16(), layer.weight, 32, layer.scales_and_zeros)
    torch.testing.assert_close(layer(x), packed.float() + layer.bias)
