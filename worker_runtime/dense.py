"""Full-precision linear layers on the fastest matmul kernel at hand for a decode-sized batch.

Decode multiplies a few rows of activations by every weight matrix, so its speed is the rate at
which the kernel streams weights from memory. On CPU, torch's default ``F.linear`` (MKL) reaches
about half of the machine's read bandwidth for 1-32 rows, and its second thread adds almost
nothing; oneDNN's inner product (``torch.ops.mkldnn._linear_pointwise``, the op torch's compiler
uses for CPU linears) reads the same fp32 weights, unpacked, at about 80 % of the bandwidth and
scales with threads; this package's own fp32 kernel (``kernels.dense_matmul``) reads them at the
bandwidth for the fewest rows (figures in docs/benchmarks.md). For larger batches (prefill) MKL is
as fast or faster, and for small weights its lower per-call cost wins, so :class:`Linear` takes, for
weights of :data:`ONEDNN_MIN_WEIGHT_BYTES` or more on CPU: our kernel up to :data:`KERNEL_MAX_ROWS`
rows of fp32, oneDNN up to :data:`ONEDNN_MAX_ROWS` rows where it has a kernel for the dtype on this
machine (probed: the 2-core AVX2 build machine has one for fp32, none for bf16), MKL otherwise.

A CPU stage computing in fp32 keeps a 16-bit checkpoint's weights 16-bit (:func:`weight_dtype`): our fp16 /
bf16-weight kernels widen them in registers and read half the bytes of fp32 for the same results, at any
size of weight up to :data:`KERNEL_16BIT_MAX_ROWS` rows; past that (prefill) the weight is widened for the
call and takes MKL, which is then bound by its arithmetic and faster than our kernel.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from .kernels.dense_matmul import dense_matmul, kernel_enabled

# Our fp32 kernel is faster than oneDNN up to here (1.4-1.6x at 2-4 rows, ~1.05x at 16); from 24 rows on
# both are bound by their FMAs and oneDNN is as fast or faster.
KERNEL_MAX_ROWS = 16
ONEDNN_MAX_ROWS = 32
# Our 16-bit-weight kernels beat widening the weight for oneDNN up to here (1.1-1.7x at 16-32 rows of a 3.5 MB
# SmolLM2 gate/up); from 64 rows widening plus MKL is faster (1.2x, 1.8x at 128).
KERNEL_16BIT_MAX_ROWS = 32
# oneDNN costs ~20 us more per call than MKL; streaming a weight at its bandwidth saves that from ~1 MB up.
# Our kernel (~1.5 us more than MKL) keeps the same bound: smaller weights were not measured for it.
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
    """``F.linear(x, weight, bias)`` for 2-D ``x``, on our kernel or oneDNN where that is the faster one; a
    16-bit ``weight`` with fp32 ``x`` (:func:`weight_dtype`) computes as if widened to fp32 at load.

    Neither records autograd history (oneDNN's op has no backward either), so a call that must be
    differentiable stays on ``F.linear``; the engine runs under ``torch.inference_mode``."""
    cpu = x.device.type == "cpu" and x.dim() == 2 and not differentiable(x, weight, bias)
    if cpu and kernel_takes(x, weight, bias):
        return dense_matmul(x, weight, bias)
    if weight.dtype != x.dtype:  # a 16-bit weight kept for an fp32 stage: widened (exactly) for this call
        weight = weight.to(x.dtype)
    if (cpu and weight.nbytes >= ONEDNN_MIN_WEIGHT_BYTES and x.shape[0] <= ONEDNN_MAX_ROWS
            and onednn_linear_available(x.dtype)):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def differentiable(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether autograd must record this call."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))


def kernel_takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether one of our kernels can serve this call: fp32 ``x`` and bias, a weight it can stream as it lies
    (fp32 of at least ONEDNN_MIN_WEIGHT_BYTES, or 16-bit of any size), few enough rows for it, and the kernel
    built and not switched off."""
    wide = weight.dtype == torch.float32
    return (
        x.dtype == torch.float32
        and (bias is None or bias.dtype == torch.float32)
        and x.shape[0] <= (KERNEL_MAX_ROWS if wide else KERNEL_16BIT_MAX_ROWS)
        and (weight.nbytes >= ONEDNN_MIN_WEIGHT_BYTES or not wide)
        and weight.is_contiguous()
        and kernel_enabled(weight.dtype)
    )


def weight_dtype(checkpoint: torch.dtype, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype in which a stage computing in ``dtype`` on ``device`` keeps its full-precision weights, given
    the checkpoint's: a 16-bit checkpoint's own on a CPU computing in fp32 where our kernel for it runs (half
    the bytes a decode step streams and half the memory, for the same results), ``dtype`` otherwise."""
    if device.type == "cpu" and dtype == torch.float32 and checkpoint != dtype and kernel_enabled(checkpoint):
        return checkpoint
    return dtype


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose forward picks the kernel by batch size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_linear(x, self.weight, self.bias)
