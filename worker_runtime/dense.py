"""Full-precision linear layers on the fastest matmul kernel torch has for a decode-sized batch.

Decode multiplies a few rows of activations by every weight matrix, so its speed is the rate at
which the kernel streams weights from memory. On CPU, torch's default ``F.linear`` (MKL) reaches
about half of the machine's read bandwidth for 1-32 rows, and its second thread adds almost
nothing; oneDNN's inner product (``torch.ops.mkldnn._linear_pointwise``, the op torch's compiler
uses for CPU linears) reads the same fp32 weights, unpacked, at close to the full bandwidth and
scales with threads (figures in docs/benchmarks.md). For larger batches (prefill) MKL is as fast or
faster, and for small weights its lower per-call cost wins, so :class:`Linear` takes oneDNN only up
to :data:`ONEDNN_MAX_ROWS` rows, for weights of :data:`ONEDNN_MIN_WEIGHT_BYTES` or more, only on
CPU, and only for dtypes where oneDNN has a kernel on this machine (probed: the 2-core AVX2 build
machine has one for fp32, none for bf16).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

ONEDNN_MAX_ROWS = 32
# oneDNN costs ~20 us more per call than MKL; streaming a weight at its bandwidth saves that from ~1 MB up.
ONEDNN_MIN_WEIGHT_BYTES = 1 << 20


@functools.cache
def onednn_linear_available(dtype: torch.dtype) -> bool:
    """Whether oneDNN's CPU inner product runs for ``dtype`` here (probed once per dtype)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        x, w = torch.ones(1, 64, dtype=dtype), torch.ones(16, 64, dtype=dtype)
        out = torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return bool((out == 64).all())
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for 2-D ``x``, on oneDNN where that is the faster kernel."""
    if (
        x.device.type == "cpu"
        and x.dim() == 2
        and x.shape[0] <= ONEDNN_MAX_ROWS
        and weight.nbytes >= ONEDNN_MIN_WEIGHT_BYTES
        and onednn_linear_available(x.dtype)
    ):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose forward picks the kernel by batch size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_linear(x, self.weight, self.bias)
