"""The full-precision linear's kernel choice: same results as ``F.linear``, oneDNN only where it pays (where
our own fp32 kernel takes over: test_dense_kernel.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from worker_runtime.dense import (
    KERNEL_MAX_ROWS,
    ONEDNN_MAX_ROWS,
    ONEDNN_MIN_WEIGHT_BYTES,
    Linear,
    dense_linear,
    onednn_linear_available,
)

BIG = (1024, 512)  # 2 MiB of fp32: over ONEDNN_MIN_WEIGHT_BYTES
SMALL = (64, 32)


def kernels_used(fn) -> set[str]:
    with profile() as prof:
        fn()
    return {event.key for event in prof.key_averages()}


@pytest.mark.parametrize("rows", [1, 3, ONEDNN_MAX_ROWS, ONEDNN_MAX_ROWS + 1, 200])
@pytest.mark.parametrize("shape", [BIG, SMALL])
@pytest.mark.parametrize("with_bias", [False, True])
def test_dense_linear_matches_f_linear(rows, shape, with_bias):
    torch.manual_seed(rows)
    weight = torch.randn(shape) / shape[1] ** 0.5
    bias = torch.randn(shape[0]) if with_bias else None
    x = torch.randn(rows, shape[1])
    expected = F.linear(x.double(), weight.double(), None if bias is None else bias.double()).float()
    torch.testing.assert_close(dense_linear(x, weight, bias), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
    not onednn_linear_available(torch.float32), reason="no oneDNN fp32 inner product in this torch build"
)
def test_onednn_only_for_decode_sized_batches_of_large_weights():
    assert torch.zeros(BIG).nbytes >= ONEDNN_MIN_WEIGHT_BYTES > torch.zeros(SMALL).nbytes
    big, small = torch.randn(BIG), torch.randn(SMALL)
    onednn = "mkldnn::_linear_pointwise"
    assert onednn in kernels_used(lambda: dense_linear(torch.randn(KERNEL_MAX_ROWS + 1, BIG[1]), big, None))
    assert onednn not in kernels_used(
        lambda: dense_linear(torch.randn(ONEDNN_MAX_ROWS + 1, BIG[1]), big, None)
    )
    assert onednn not in kernels_used(lambda: dense_linear(torch.randn(4, SMALL[1]), small, None))


def test_linear_module_keeps_nn_linear_parameters_and_works_for_every_dtype():
    layer = Linear(BIG[1], BIG[0], bias=True)
    assert set(layer.state_dict()) == {"weight", "bias"}
    for dtype in (torch.float32, torch.bfloat16):
        layer = layer.to(dtype)
        x = torch.randn(2, BIG[1], dtype=dtype)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=2e-2, atol=2e-2)
