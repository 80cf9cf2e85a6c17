"""The int4-weight x fp32-activation matmul of ``int4_matmul.c`` (AVX2/FMA, and AVX-512 where the CPU has
it), the CPU int4 layers' kernel, and the weight layout it reads.

torch's CPU int4 kernel, ``torch._weight_int4pack_mm_for_cpu``, takes bf16 activations and reads the
weights at about 12 GB/s at batch 1 on the 2-core build machine, a third of what memory gives. Ours
widens 8 (AVX-512: 16) weights with one AND and one convert and takes each group's scale and zero out of
the inner loop, so at decode it reads the weights about 1.4x faster; activations, accumulation and
output stay fp32 (docs/benchmarks.md, "Kernels"). The weights it computes with are exactly
``quantize_int4_rows``'s: ``(q - 8) * scale + zero``, bf16 scale and zero per group of a row.

``MOTLEY_INT4_KERNEL=torch`` makes layers built afterwards use torch's kernel (for operators who suspect
ours). Otherwise the library is built on first use, and where it cannot be (no gcc, a compile error, no
torch libgomp, a CPU without AVX2/FMA) one warning says why and torch's kernel is used.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from .build import shared_library
from .loader import Kernel, team_size

KERNEL = Kernel(
    source=Path(__file__).with_name("int4_matmul.c"),
    symbol="motley_int4_matmul",
    argtypes=[ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [ctypes.c_int] * 2,
    name="int4 CPU kernel",
    fallback="torch._weight_int4pack_mm_for_cpu",
    switch="MOTLEY_INT4_KERNEL",
    restype=ctypes.c_int,
)
TILE = 16  # output channels per tile of the layout: rows are packed 16 at a time


def kernel_enabled() -> bool:
    """Whether int4 layers built now should use our kernel on CPU (builds it on the first call)."""
    return KERNEL.enabled()


@functools.cache
def avx512_available() -> bool:
    """Whether the kernel runs its AVX-512 code on this CPU (it does wherever it can). Needs
    :func:`kernel_enabled`."""
    return bool(shared_library(KERNEL.source).motley_int4_wide_supported())


def tile_layout(q: torch.Tensor, scales_and_zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows in the kernel's layout (int4_matmul.c): from ``quantize_int4_rows``'s uint8 values ``q`` [r, k]
    and bf16 ``scales_and_zeros`` [k / group, r, 2], r a multiple of 16, the int32 weights
    [r / 16, k / 8, 16] (lane l of [c, p]: the weights 8p..8p+7 of row 16c + l, weight t in bits 4t..4t+3)
    and the int32 scales [r / 16, k / group, 16] (scale in the low half, zero in the high half)."""
    rows, k = q.shape
    pairs = (q[:, 0::2] | q[:, 1::2] << 4).view(rows // TILE, TILE, k // 8, 4)  # byte b: weights 2b, 2b+1
    weight = pairs.permute(0, 2, 1, 3).contiguous().view(torch.int32).view(rows // TILE, k // 8, TILE)
    groups = scales_and_zeros.shape[0]
    scales = scales_and_zeros.contiguous().view(torch.int32).view(groups, rows // TILE, TILE)
    return weight, scales.transpose(0, 1).contiguous()


def int4_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    bias: torch.Tensor | None,
    avx512: bool = True,
) -> torch.Tensor:
    """``x @ dequant(weight).T + bias`` for fp32 ``x`` [m, k], ``weight`` and ``scales`` in
    :func:`tile_layout`'s layout with ``group`` weights per scale, and an fp32 ``bias`` [n] or None, all
    on CPU; returns fp32 [m, n]. ``avx512=False`` keeps to the AVX2 code (for tests on CPUs with both).
    Needs :func:`kernel_enabled`."""
    x = x.contiguous()
    m, k = x.shape
    tiles = weight.shape[0]
    n = tiles * TILE
    if weight.shape != (tiles, k // 8, TILE) or k % group or scales.shape != (tiles, k // group, TILE):
        raise ValueError(f"int4: x {tuple(x.shape)} does not fit weight {tuple(weight.shape)}, "
                         f"scales {tuple(scales.shape)} in groups of {group}")
    y = torch.empty(m, n, dtype=torch.float32)
    bias_ptr = None if bias is None else bias.data_ptr()
    wide = avx512 and avx512_available()
    pointers = (x.data_ptr(), weight.data_ptr(), scales.data_ptr(), bias_ptr, y.data_ptr())
    if KERNEL.function(*pointers, m, k, n, group, wide, team_size(weight)):
        raise MemoryError(f"int4 kernel: no scratch memory for {m} x {k} activations")
    return y
