"""The CPU fp32 kernel (worker_runtime/kernels/dense_matmul.c): exact to fp32 rounding, and where
``dense_linear`` takes it.

Exact means within kernel_checks.RELATIVE_BOUND (1e-6 of the sum of magnitudes) of the float64
``x @ w.T + bias``, as for the int8 kernel. The build, its cache and the fallbacks are
test_kernel_loader.py's; the engine on this kernel against transformers is test_parity.py's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker_runtime import dense
from worker_runtime.dense import KERNEL_MAX_ROWS, ONEDNN_MIN_WEIGHT_BYTES, Linear, dense_linear, kernel_takes
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
