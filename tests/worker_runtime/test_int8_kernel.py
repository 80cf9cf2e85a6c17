"""The CPU int8 kernel (worker_runtime/kernels/int8_matmul.c): exact to fp32 rounding, and its switch.

Exact means within kernel_checks.RELATIVE_BOUND of the float64 ``x @ (q * scales).T + bias``; torch's
bf16 kernel rounds the activations to 8 significant bits: 5.6e-4 to 7.0e-4 on the same measure. The
build, its cache and the fallbacks are test_kernel_loader.py's.
"""

from __future__ import annotations

import pytest
import torch

from worker_runtime.kernels import int8_matmul
from worker_runtime.quantize import Int8Linear

from .kernel_checks import SHAPES, assert_exact_to_rounding

CPU = torch.device("cpu")
# Every decode batch up to 32 rows (each tail of the 4-row tiles), then prefill sizes around 64-row panels.
ROWS = [*range(33), 63, 64, 65, 130, 257]

pytestmark = pytest.mark.skipif(not int8_matmul.kernel_enabled(), reason="int8 CPU kernel not buildable here")


def layer_of(k: int, n: int, bias: bool, seed: int) -> tuple[Int8Linear, torch.Tensor]:
    """A loaded layer and its dequantized weight in float64."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=generator)
    layer = Int8Linear(k, n, bias, CPU, torch.float32)
    layer.load_rows(0, w)
    if bias:
        layer.bias.data = torch.randn(n, generator=generator)
    return layer, layer.weight.double() * layer.scales.double()[:, None]


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("k,n", SHAPES)
def test_kernel_equals_the_float64_reference_for_every_batch_size(threads, k, n, bias):
    layer, deq = layer_of(k, n, bias, seed=k * n)
    assert layer.cpu_kernel
    generator = torch.Generator().manual_seed(threads)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=generator)
        assert_exact_to_rounding(layer(x), x, deq, layer.bias)
    x3 = torch.randn(2, 3, k, generator=generator)  # leading dims are flattened and restored
    assert layer(x3).shape == (2, 3, n)
    assert_exact_to_rounding(layer(x3).view(6, n), x3.view(6, k), deq, layer.bias)


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("k,n", [(32, 131), (768, 97), (2048, 45), (96, 301)])
def test_grouped_kernel_equals_the_float64_reference_for_every_batch_size(threads, k, n, bias):
    """The int8 head's kernel (a scale per 32 weights of a row), on shapes with odd outputs."""
    generator = torch.Generator().manual_seed(k * n)
    layer = Int8Linear(k, n, bias, CPU, torch.float32, group=int8_matmul.GROUP)
    layer.load_rows(0, torch.randn(n, k, generator=generator) * torch.rand(n, k, generator=generator) * 10)
    if bias:
        layer.bias.data = torch.randn(n, generator=generator)
    assert layer.cpu_kernel and layer.scales.shape == (n, k // 32)
    deq = layer.weight.double() * layer.scales.double().repeat_interleave(32, dim=1)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=generator)
        assert_exact_to_rounding(layer(x), x, deq, layer.bias)


def test_forced_torch_switch_takes_torch_kernel(monkeypatch):
    monkeypatch.setenv("MOTLEY_INT8_KERNEL", "torch")
    layer, _ = layer_of(768, 97, True, seed=1)
    assert not layer.cpu_kernel
    x = torch.randn(1, 768)
    expected = torch._weight_int8pack_mm(x.bfloat16(), layer.weight, layer.scales).float() + layer.bias
    torch.testing.assert_close(layer(x), expected)
