"""What every kernel of this package does on the Python side: get its function or say once why not,
honour the operator's switch back to torch's kernel, and pick the size of its thread team.

A kernel module calls :func:`load_function` once per process (under ``functools.cache``): where the
library cannot be built or this CPU lacks AVX2/FMA, one warning on the module's logger names the
reason and the torch kernel used instead, and the module answers None from then on.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch

from .build import KernelUnavailable, shared_library

log = logging.getLogger(__name__)

SWITCH_VALUES = ("", "auto", "torch")
# Below this many weight bytes a second thread costs more (waking it, ~2 us) than it saves.
MIN_PARALLEL_WEIGHT_BYTES = 1 << 16


def load_function(
    source: Path, symbol: str, argtypes: list, log: logging.Logger, kernel: str, fallback: str
) -> ctypes._CFuncPtr | None:
    """``symbol`` of ``source``'s library, or None after warning that ``kernel`` is unavailable and
    ``fallback`` is used. Every library exports ``motley_cpu_supported`` (tiled_matmul.h)."""
    try:
        library = shared_library(source)
    except KernelUnavailable as e:
        reason = str(e)
    else:
        if library.motley_cpu_supported():
            fn = getattr(library, symbol)
            fn.restype = None
            fn.argtypes = argtypes
            return fn
        reason = "this CPU lacks AVX2/FMA"
    log.warning("%s unavailable, using %s: %s", kernel, fallback, reason)
    return None


def switched_to_torch(switch: str) -> bool:
    """Whether the environment variable ``switch`` asks for torch's kernel instead of ours."""
    return _asks_for_torch(switch, os.environ.get(switch, ""))


@functools.cache
def _asks_for_torch(switch: str, value: str) -> bool:
    """A value the switch does not know warns once and means 'auto'."""
    if value not in SWITCH_VALUES:
        log.warning("%s=%r is neither 'auto' nor 'torch'; taking 'auto'", switch, value)
    return value == "torch"


def team_size(weight: torch.Tensor) -> int:
    """Threads for one call: torch's thread count, or 1 for a weight too small to be worth a second."""
    return torch.get_num_threads() if weight.nbytes >= MIN_PARALLEL_WEIGHT_BYTES else 1
