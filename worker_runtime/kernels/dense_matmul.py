"""The fp32 matmul of ``dense_matmul.c`` (AVX2/FMA), the CPU fp32 linears' kernel for a few rows.

At decode a linear reads its whole fp32 weight for a handful of activation rows, so its speed is the
rate at which it streams the weight. oneDNN's inner product, the fastest torch has for this, reads at
about 80 % of the machine's read bandwidth; this kernel, which prefetches the next weight rows as it
consumes the current ones (as the int8 kernel does), reads at the bandwidth for 1-4 rows and stays
ahead up to 16. From about 24 rows both are bound by their FMAs and oneDNN keeps up or wins, so
:func:`worker_runtime.dense.dense_linear` takes this kernel only for the rows where it was measured
faster (figures in docs/benchmarks.md). Results are exact to fp32 rounding, as oneDNN's are.

``MOTLEY_DENSE_KERNEL=torch`` makes later calls use oneDNN/MKL (for operators who suspect this
kernel). Otherwise the library is built on first use, and where it cannot be (no gcc, a compile error,
no torch libgomp, a CPU without AVX2/FMA) one warning says why and oneDNN/MKL are used.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .loader import Kernel, team_size

KERNEL = Kernel(
    source=Path(__file__).with_name("dense_matmul.c"),
    symbol="motley_dense_matmul",
    argtypes=[ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int],
    name="fp32 CPU kernel",
    fallback="oneDNN/MKL",
    switch="MOTLEY_DENSE_KERNEL",
)


def kernel_enabled() -> bool:
    """Whether fp32 linears on CPU may use this kernel now (builds it on the first call)."""
    return KERNEL.enabled()


def dense_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` for fp32 ``x`` [m, k], contiguous ``weight`` [n, k] and ``bias`` [n] or None,
    all on CPU; returns fp32 [m, n]. Needs :func:`kernel_enabled`."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape != (n, k) or (bias is not None and bias.shape != (n,)):  # C would read out of bounds
        bias_shape = None if bias is None else tuple(bias.shape)
        raise ValueError(f"x {tuple(x.shape)} does not fit weight {tuple(weight.shape)}, bias {bias_shape}")
    y = torch.empty(m, n, dtype=torch.float32)
    bias = None if bias is None else bias.contiguous()  # held: the kernel reads through its pointer
    bias_ptr = None if bias is None else bias.data_ptr()
    KERNEL.function(x.data_ptr(), weight.data_ptr(), bias_ptr, y.data_ptr(), m, k, n, team_size(weight))
    return y
