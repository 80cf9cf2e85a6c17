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
import functools
import logging
from pathlib import Path

import torch

from .loader import load_function, switched_to_torch, team_size

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("dense_matmul.c")
ENV_SWITCH = "MOTLEY_DENSE_KERNEL"


@functools.cache
def _kernel() -> ctypes._CFuncPtr | None:
    """The loaded kernel, or None after one warning saying why not (built and checked once per process)."""
    argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    return load_function(SOURCE, "motley_dense_matmul", argtypes, log, "fp32 CPU kernel", "oneDNN/MKL")


def kernel_enabled() -> bool:
    """Whether fp32 linears on CPU may use this kernel now (builds it on the first call)."""
    return not switched_to_torch(ENV_SWITCH) and _kernel() is not None


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
    _kernel()(x.data_ptr(), weight.data_ptr(), bias_ptr, y.data_ptr(), m, k, n, team_size(weight))
    return y
