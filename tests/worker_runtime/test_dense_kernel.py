"""The CPU fp32 kernel (worker_runtime/kernels/dense_matmul.c): exact to fp32 rounding, and where
``dense_linear`` takes it; the fp16 / bf16-weight kernels (f16_matmul.c, bf16_matmul.c): bit for bit the
fp32 kernel on the widened weights, and where ``dense_linear`` takes them.

Exact means within kernel_checks.RELATIVE_BOUND (1e-6 of the sum of magnitudes) of the float64
``x @ w.T + bias``, as for the int8 kernel. The build, its cache and the fallbacks are
test_kernel_loader.py's; the engine on this kernel against transformers is test_parity.py's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker_runtime import dense
from worker_runtime.dense import (
    KERNEL_16BIT_MAX_ROWS,
    KERNEL_MAX_ROWS,
    ONEDNN_MIN_WEIGHT_BYTES,
    Linear,
    dense_linear,
    kernel_takes,
    weight_dtype,
)
from worker_runtime.kernels.dense_matmul import dense_matmul, kernel_enabled

from .kernel_checks import SHAPES, assert_exact_to_rounding

# Every decode batch up to 32 rows (each tail of the 4-row tiles), then prefill sizes around 64-row panels.
ROWS = [*range(33), 63, 64, 65, 130]
BIG = (1024, 512)  # 2 MiB of fp32: a weight dense_linear hands to a fast kernel

pytestmark = pytest.mark.skipif(not kernel_enabled(), reason="fp32 CPU kernel not buildable here")


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("k,n", SHAPES)
def test_kernel_equals_the_float64_reference_for_every_batch_size(threads, k, n, bias):
    generator = torch.Generator().manual_seed(k * n + threads)
    w = torch.randn(n, k, generator=generator)
    b = torch.randn(n, generator=generator) if bias else None
    for rows in ROWS:
        x = torch.randn(rows, k, generator=generator)
        assert_exact_to_rounding(dense_matmul(x, w, b), x, w.double(), b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("k,n", SHAPES)
def test_16bit_kernels_equal_the_fp32_kernel_on_the_widened_weights_bit_for_bit(threads, k, n, dtype):
    if not kernel_enabled(dtype):
        pytest.skip(f"{dtype} kernel not buildable here")
    generator = torch.Generator().manual_seed(k * n + threads)
    w, b = torch.randn(n, k, generator=generator).to(dtype), torch.randn(n, generator=generator)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=generator)
        for bias in (None, b):
            assert torch.equal(dense_matmul(x, w, bias), dense_matmul(x, w.float(), bias)), rows


def test_strided_activations_are_read_right_and_shapes_that_do_not_fit_are_refused():
    w, b = torch.randn(301, 1000), torch.randn(301)
    x = torch.randn(3, 2000)[:, ::2]
    assert_exact_to_rounding(dense_matmul(x, w, b), x, w.double(), b)
    with pytest.raises(ValueError, match="does not fit"):
        dense_matmul(torch.randn(3, 999), w, b)
    with pytest.raises(ValueError, match="does not fit"):
        dense_matmul(torch.randn(3, 1000), w, b[:300])


@pytest.fixture
def kernel_rows(monkeypatch) -> list[int]:
    """The rows of each call ``dense_linear`` hands to our kernel, in order."""
    rows = []

    def recorded(x, weight, bias):
        rows.append(x.shape[0])
        return dense_matmul(x, weight, bias)

    monkeypatch.setattr(dense, "dense_matmul", recorded)
    return rows


def test_dense_linear_takes_the_kernel_for_few_rows_of_large_fp32_weights_only(kernel_rows):
    assert torch.zeros(BIG).nbytes >= ONEDNN_MIN_WEIGHT_BYTES > torch.zeros(BIG[0] // 4, BIG[1]).nbytes
    weight, bias = torch.randn(BIG) / BIG[1] ** 0.5, torch.randn(BIG[0])
    for rows in (1, 5, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 1):
        x = torch.randn(rows, BIG[1])
        torch.testing.assert_close(dense_linear(x, weight, bias), F.linear(x, weight, bias))
    assert kernel_rows == [1, 5, KERNEL_MAX_ROWS]
    x = torch.randn(1, BIG[1])
    dense_linear(x, weight[: BIG[0] // 4], None)  # small: MKL
    dense_linear(x.bfloat16(), weight.bfloat16(), None)
    assert not kernel_takes(x, weight, bias.double())
    strided = weight.T.contiguous().T  # not contiguous: the kernel would stream the wrong bytes
    torch.testing.assert_close(dense_linear(x, strided, None), F.linear(x, strided))
    assert kernel_rows == [1, 5, KERNEL_MAX_ROWS]


def test_linear_takes_the_kernel_in_inference_and_keeps_autograd_outside(kernel_rows):
    layer = Linear(BIG[1], BIG[0], bias=True)
    x = torch.randn(2, BIG[1])
    with torch.inference_mode():
        expected = F.linear(x, layer.weight, layer.bias)
        torch.testing.assert_close(layer(x), expected)
    assert kernel_rows == [2]
    y = layer(x)  # parameters require grad: F.linear, which autograd can follow
    assert kernel_rows == [2] and y.grad_fn is not None
    y.sum().backward()
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(BIG[0], -1))


def test_forced_torch_switch_takes_onednn_or_mkl(monkeypatch, kernel_rows):
    monkeypatch.setenv("MOTLEY_DENSE_KERNEL", "torch")
    weight, bias = torch.randn(BIG) / BIG[1] ** 0.5, torch.randn(BIG[0])
    x = torch.randn(1, BIG[1])
    torch.testing.assert_close(dense_linear(x, weight, bias), F.linear(x, weight, bias))
    assert kernel_rows == []
    monkeypatch.setenv("MOTLEY_DENSE_KERNEL", "auto")
    dense_linear(x, weight, bias)
    assert kernel_rows == [1]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_dense_linear_takes_the_16bit_kernels_for_any_weight_up_to_their_rows_then_widens(kernel_rows, dtype):
    """Up to KERNEL_16BIT_MAX_ROWS rows the result is the fp32 kernel's on the widened weight (what a stage
    that widened at load computed for up to KERNEL_MAX_ROWS rows), past them the widened weight's MKL
    product."""
    if not kernel_enabled(dtype):
        pytest.skip(f"{dtype} kernel not buildable here")
    small = (torch.randn(40, 24) / 24**0.5).to(dtype)  # far below ONEDNN_MIN_WEIGHT_BYTES: still ours
    x = torch.randn(3, 24)
    assert torch.equal(dense_linear(x, small, None), dense_matmul(x, small.float(), None))
    weight, bias = (torch.randn(BIG) / BIG[1] ** 0.5).to(dtype), torch.randn(BIG[0])
    for rows in (1, KERNEL_MAX_ROWS, KERNEL_16BIT_MAX_ROWS):
        x = torch.randn(rows, BIG[1])
        assert torch.equal(dense_linear(x, weight, bias), dense_matmul(x, weight.float(), bias))
    x = torch.randn(KERNEL_16BIT_MAX_ROWS + 1, BIG[1])
    assert torch.equal(dense_linear(x, weight, bias), F.linear(x, weight.float(), bias))
    assert kernel_rows == [3, 1, KERNEL_MAX_ROWS, KERNEL_16BIT_MAX_ROWS]
    assert weight_dtype(dtype, torch.device("cpu"), torch.float32) == dtype
    assert weight_dtype(dtype, torch.device("cpu"), dtype) == dtype
    assert weight_dtype(torch.float32, torch.device("cpu"), torch.float32) == torch.float32
