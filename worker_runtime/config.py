"""A stage worker's settings: environment variables, each defined here once with its type and default
(docs/configuration.md), read when asked (a switch set in a running process counts from then on).

- ``KERNEL_SWITCHES``: ``torch`` sends that kind of layer to torch's kernel instead of motley's (for
  operators who suspect one); unset, empty or ``auto``: motley's where it can run (worker_runtime/kernels).
- ``MOTLEY_KERNEL_CACHE``: where the C kernels are built, else ``$XDG_CACHE_HOME/motley/kernels``, else
  ``~/.cache/motley/kernels`` (kernels/build.py).
- ``MOTLEY_WEIGHT_CACHE`` (``contracts.names.WEIGHT_CACHE_ENV``): the folder where quantized layers are
  kept for the next process that loads them; the agent sets it for its stages (weight_cache.py).
"""

from __future__ import annotations

from pathlib import Path

from contracts.env import env_path, env_str
from contracts.names import WEIGHT_CACHE_ENV

KERNEL_SWITCHES = ("MOTLEY_DENSE_KERNEL", "MOTLEY_16BIT_KERNEL", "MOTLEY_INT8_KERNEL", "MOTLEY_INT4_KERNEL",
                   "MOTLEY_DECODE_KERNEL")


def kernel_switch(name: str) -> str:
    """The value of one of ``KERNEL_SWITCHES`` ("" when unset)."""
    if name not in KERNEL_SWITCHES:
        raise KeyError(f"{name} is not a kernel switch ({', '.join(KERNEL_SWITCHES)})")
    return env_str(name, "")


def kernel_cache_dir() -> Path:
    if configured := env_str("MOTLEY_KERNEL_CACHE", ""):
        return Path(configured)
    return env_path("XDG_CACHE_HOME", Path.home() / ".cache") / "motley" / "kernels"


def weight_cache_dir() -> str | None:
    return env_str(WEIGHT_CACHE_ENV, "") or None
