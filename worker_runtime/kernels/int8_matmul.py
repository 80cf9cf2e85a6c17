"""The int8-weight x fp32-activation matmuls of ``int8_matmul.c`` (per-row scales, the CPU int8 layers'
kernel) and ``int8_grouped_matmul.c`` (a scale per 32 weights, the int8 output head's), AVX2/FMA.

torch's only weight-only int8 CPU kernel, ``torch._weight_int8pack_mm``, takes bf16 activations and,
on CPUs without native bf16 arithmetic, reads int8 weights at 9-13 GB/s, half the rate at which
oneDNN reads fp32 weights: int8 then read a quarter of the bytes at half the speed. These kernels
widen each int8 weight to fp32 in registers and, at decode, read the weights at the machine's
memory bandwidth; with many rows (prefill) they are bound by their FMAs and still ahead of torch's
(figures in docs/benchmarks.md). Activations, accumulation and output stay fp32, so their results are
also closer to the exact product than the bf16 kernel's. torch has no group-wise int8 kernel at all.

``MOTLEY_INT8_KERNEL=torch`` makes layers built afterwards use torch's kernels (for operators who
suspect ours; a grouped head then dequantizes its weights on every call). Otherwise a library is
built on first use, and where it cannot be (no gcc, a compile error, no torch libgomp, a CPU without
AVX2/FMA) one warning says why and torch's kernel is used.
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
GROUPED_KERNEL = Kernel(
    source=Path(__file__).with_name("int8_grouped_matmul.c"),
    symbol="motley_int8_grouped_matmul",
    argtypes=KERNEL.argtypes,
    name="grouped int8 CPU kernel",
    fallback="weights dequantized on every call",
    switch="MOTLEY_INT8_KERNEL",
)
GROUP = 32  # the weights per scale int8_grouped_matmul.c is compiled for


def kernel_enabled(grouped: bool = False) -> bool:
    """Whether int8 layers (``grouped``: int8 heads) built now should use our kernel on CPU (builds it on
    the first call)."""
    return (GROUPED_KERNEL if grouped else KERNEL).enabled()


def int8_matmul(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``(x @ weight.T) * scales + bias`` for fp32 ``x`` [m, k], int8 ``weight`` [n, k], bf16 ``scales`` [n]
    and an fp32 ``bias`` [n] or None, all on CPU; returns fp32 [m, n]. Needs :func:`kernel_enabled`.

    ``scales`` [n, k / 32] instead: one per group of 32 weights of a row (needs ``kernel_enabled(True)``),
    ``x @ (weight * scales).T + bias``."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    grouped = scales.dim() == 2
    if grouped and (k % GROUP or scales.shape != (n, k // GROUP)):
        raise ValueError(f"grouped int8: scales {tuple(scales.shape)} for weights {tuple(weight.shape)}; "
                         f"the kernel takes one per {GROUP} weights")
    y = torch.empty(m, n, dtype=torch.float32)
    bias_ptr = None if bias is None else bias.data_ptr()
    pointers = (x.data_ptr(), weight.data_ptr(), scales.data_ptr(), bias_ptr, y.data_ptr())
    (GROUPED_KERNEL if grouped else KERNEL).function(*pointers, m, k, n, team_size(weight))
    return y
