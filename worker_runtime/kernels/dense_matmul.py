"""The float-weight matmuls of ``dense_matmul.c`` (fp32 weights), ``f16_matmul.c`` and ``bf16_matmul.c``
(16-bit weights widened to fp32 in registers), AVX2/FMA, the CPU full-precision linears' kernels for a few
rows; activations, accumulation and output are fp32 in all three.

At decode a linear reads its whole weight for a handful of activation rows, so its speed is the rate at
which it streams the weight. oneDNN's inner product, the fastest torch has for fp32 weights, reads at
about 80 % of the machine's read bandwidth; these kernels, which prefetch the next weight rows as they
consume the current ones (as the int8 kernel does), read at the bandwidth for 1-4 rows and stay
ahead up to 16. From about 24 rows both are bound by their FMAs and oneDNN keeps up or wins, so
:func:`worker_runtime.dense.dense_linear` takes these kernels only for the rows where they were measured
faster (figures in docs/benchmarks.md). Results are exact to fp32 rounding, as oneDNN's are; the 16-bit
kernels' are bit for bit the fp32 kernel's on the widened weights (fp16/bf16 -> fp32 is exact), so a CPU
stage computing in fp32 can keep a 16-bit checkpoint's weights as they are and read half the bytes.

``MOTLEY_DENSE_KERNEL=torch`` makes later fp32 calls use oneDNN/MKL (for operators who suspect the fp32
kernel); ``MOTLEY_16BIT_KERNEL=torch`` makes stages built afterwards widen 16-bit weights to fp32 as they
load (the fp32 path). Otherwise a library is built on first use, and where it cannot be (no gcc, a compile
error, no torch libgomp, a CPU without AVX2/FMA, or F16C for fp16) one warning says why and the fallback
is used.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .loader import Kernel, team_size

ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
WIDENED = "16-bit weights widened to fp32 as they load"
KERNEL = Kernel(Path(__file__).with_name("dense_matmul.c"), "motley_dense_matmul", ARGTYPES,
                "fp32 CPU kernel", "oneDNN/MKL", "MOTLEY_DENSE_KERNEL")
F16_KERNEL = Kernel(Path(__file__).with_name("f16_matmul.c"), "motley_f16_matmul", ARGTYPES,
                    "fp16-weight CPU kernel", WIDENED, "MOTLEY_16BIT_KERNEL", needs="AVX2/FMA/F16C")
BF16_KERNEL = Kernel(Path(__file__).with_name("bf16_matmul.c"), "motley_bf16_matmul", ARGTYPES,
                     "bf16-weight CPU kernel", WIDENED, "MOTLEY_16BIT_KERNEL")


def kernel_for(dtype: torch.dtype) -> Kernel | None:
    """The kernel for weights of ``dtype``, or None for a dtype we have none for."""
    return {torch.float32: KERNEL, torch.float16: F16_KERNEL, torch.bfloat16: BF16_KERNEL}.get(dtype)


def kernel_enabled(dtype: torch.dtype = torch.float32) -> bool:
    """Whether linears with weights of ``dtype`` on CPU may use our kernel now (builds it on first call)."""
    kernel = kernel_for(dtype)
    return kernel is not None and kernel.enabled()


def dense_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` for fp32 ``x`` [m, k], contiguous ``weight`` [n, k] (fp32, fp16 or bf16) and
    fp32 ``bias`` [n] or None, all on CPU; returns fp32 [m, n]. Needs ``kernel_enabled(weight.dtype)``."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape != (n, k) or (bias is not None and bias.shape != (n,)):  # C would read out of bounds
        bias_shape = None if bias is None else tuple(bias.shape)
        raise ValueError(f"x {tuple(x.shape)} does not fit weight {tuple(weight.shape)}, bias {bias_shape}")
    y = torch.empty(m, n, dtype=torch.float32)
    bias = None if bias is None else bias.contiguous()  # held: the kernel reads through its pointer
    bias_ptr = None if bias is None else bias.data_ptr()
    pointers = (x.data_ptr(), weight.data_ptr(), bias_ptr, y.data_ptr())
    kernel_for(weight.dtype).function(*pointers, m, k, n, team_size(weight))
    return y
