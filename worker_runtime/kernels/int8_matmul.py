"""The int8-weight x fp32-activation matmul of ``int8_matmul.c`` (AVX2/FMA), the CPU int8 layers' kernel.

torch's only weight-only int8 CPU kernel, ``torch._weight_int8pack_mm``, takes bf16 activations and,
on CPUs without native bf16 arithmetic, reads int8 weights at 9-13 GB/s, half the rate at which
oneDNN reads fp32 weights: int8 then read a quarter of the bytes at half the speed. This kernel
widens each int8 weight to fp32 in registers and, at decode, reads the weights at the machine's
memory bandwidth; with many rows (prefill) it is bound by its FMAs and still ahead of torch's
(figures in docs/benchmarks.md). Activations, accumulation and output stay fp32, so its results are
also closer to the exact product than the bf16 kernel's.

``MOTLEY_INT8_KERNEL=torch`` makes layers built afterwards use torch's kernel (for operators who
suspect this one). Otherwise the library is built on first use, and where it cannot be (no gcc, a
compile error, no torch libgomp, a CPU without AVX2/FMA) one warning says why and torch's kernel is
used.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .loader import Kernel, team_size

KERNEL = Kernel(
    source=Path(__file__).with_name("int8_matmul.c"),
    symbol="motley_int8_matmul",
    argtypes=[ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int],
    name="int8 CPU kernel",
    fallback="torch._weight_int8pack_mm",
    switch="MOTLEY_INT8_KERNEL",
)


def kernel_enabled() -> bool:
    """Whether int8 layers built now should use this kernel on CPU (builds it on the first call)."""
    return KERNEL.enabled()


def int8_matmul(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``(x @ weight.T) * scales + bias`` for fp32 ``x`` [m, k], int8 ``weight`` [n, k], bf16 ``scales`` [n]
    and an fp32 ``bias`` [n] or None, all on CPU; returns fp32 [m, n]. Needs :func:`kernel_enabled`."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    bias_ptr = None if bias is None else bias.data_ptr()
    pointers = (x.data_ptr(), weight.data_ptr(), scales.data_ptr(), bias_ptr, y.data_ptr())
    KERNEL.function(*pointers, m, k, n, team_size(weight))
    return y
