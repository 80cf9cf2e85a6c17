"""What every kernel of this package does on the Python side: get its function or say once why not,
honour the operator's switch back to torch's kernel, and pick the size of its thread team.

A kernel module describes its kernel once as a :class:`Kernel`. The function is built and loaded on
first use, once per process; where the library cannot be built or this CPU lacks AVX2/FMA, one
warning names the reason and the torch kernel used instead, and the kernel stays unavailable.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import kernel_switch
from .build import KernelUnavailable, shared_library

log = logging.getLogger(__name__)

SWITCH_VALUES = ("", "auto", "torch")
# Below this many weight bytes a second thread costs more (waking it, ~2 us) than it saves.
MIN_PARALLEL_WEIGHT_BYTES = 1 << 16


@dataclass(frozen=True)
class Kernel:
    """One exported function of a kernel library (every library also exports ``motley_cpu_supported``,
    tiled_matmul.h), with what the warning and the switch need."""

    source: Path
    symbol: str
    argtypes: list
    name: str  # for the warning, e.g. "fp32 CPU kernel"
    fallback: str  # what is used instead, for the warning
    switch: str  # the environment variable that can ask for torch's kernel
    restype: type | None = None  # what the function returns (ctypes), if anything
    needs: str = "AVX2/FMA"  # the CPU features motley_cpu_supported checks, for the warning

    @functools.cached_property
    def function(self) -> ctypes._CFuncPtr | None:
        """The loaded function, or None after one warning saying why not."""
        try:
            library = shared_library(self.source)
        except KernelUnavailable as e:
            reason = str(e)
        else:
            if library.motley_cpu_supported():
                fn = getattr(library, self.symbol)
                fn.restype = self.restype
                fn.argtypes = self.argtypes
                return fn
            reason = f"this CPU lacks {self.needs}"
        log.warning("%s unavailable, using %s: %s", self.name, self.fallback, reason)
        return None

    def enabled(self) -> bool:
        """Whether to use this kernel now: not switched off, and built (on the first call)."""
        return not switched_to_torch(self.switch) and self.function is not None


def switched_to_torch(switch: str) -> bool:
    """Whether the environment variable ``switch`` asks for torch's kernel instead of ours."""
    return _asks_for_torch(switch, kernel_switch(switch))


@functools.cache
def _asks_for_torch(switch: str, value: str) -> bool:
    """A value the switch does not know warns once and means 'auto'."""
    if value not in SWITCH_VALUES:
        log.warning("%s=%r is neither 'auto' nor 'torch'; taking 'auto'", switch, value)
    return value == "torch"


def team_size(weight: torch.Tensor) -> int:
    """Threads for one call: torch's thread count, or 1 for a weight too small to be worth a second."""
    return torch.get_num_threads() if weight.nbytes >= MIN_PARALLEL_WEIGHT_BYTES else 1
