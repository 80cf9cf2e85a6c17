"""The quality budget: which precisions count as low-bit and how much throughput buys a 16-bit layer.

Precision is the equalizer: a slow or small card carries its share at 8 or 4 bits. The budget caps
the share of decoder layers below 16 bits; within it the partition search spends low-bit layers only
where they lower the bottleneck, and trades up to ``THROUGHPUT_TOLERANCE`` of throughput for fewer
of them.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

THROUGHPUT_TOLERANCE = 0.01  # plans within 1% of the best throughput count as equal: fewest low-bit wins


@lru_cache(maxsize=64)
def low_bit_cost(bits: int, size: int) -> np.ndarray:
    """C[i, j] = decoder layers below 16 bits when a stage holds [i, j) at ``bits`` (read-only)."""
    if bits >= 16:
        cost = np.zeros((size, size))
    else:
        index = np.arange(size)
        cost = np.maximum(index[None, :] - index[:, None], 0).astype(float)
    cost.setflags(write=False)
    return cost


def quantized_layers(stages) -> int:
    """Decoder layers of a replica's stages that run below 16 bits."""
    return sum(s.quantized_layers for s in stages)
