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
# The measured budget in whole units: ``max_kl`` is this many, each layer's KL rounds to the nearest unit
# (1e-6 of the budget), so the searches add integers and stay exact.
KL_UNITS = 2**20


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


def kl_prefix_units(sensitivity: dict[int, tuple[float, ...]], max_kl: float, bits) -> dict[int, np.ndarray]:
    """Per low precision, P[j] = measured KL of layers [0, j) at those bits, in units of max_kl / KL_UNITS
    (read-only): a stage's low tail [s, j) costs P[j] - P[s]."""
    unit = max(max_kl, 1e-300) / KL_UNITS
    prefix = {}
    for b in bits:
        if b < 16:
            # A layer over the whole budget counts just over it: the sums stay exact integers.
            per_layer = np.minimum(np.round(np.asarray(sensitivity[b], dtype=float) / unit), KL_UNITS + 1)
            units = np.concatenate([[0.0], np.cumsum(per_layer)])
            units.setflags(write=False)
            prefix[b] = units
    return prefix


def plan_kl(stages, sensitivity: dict[int, tuple[float, ...]]) -> float:
    """Sum of the measured KL of the decoder layers a replica's stages run below 16 bits (each layer at
    its own precision: a stage may run [low_from, end) lower than the rest)."""
    return sum(sum(sensitivity[bits][start:end])
               for s in stages for start, end, bits in s.segments if bits < 16)


def kl_units(stages, prefix: dict[int, np.ndarray]) -> float:
    """The low-bit layers' KL in the searches' units (``kl_prefix_units``): what the budget is checked in,
    so a plan the planner chose within ``max_kl`` is within it here too, whatever the rounding."""
    return float(sum(prefix[bits][end] - prefix[bits][start]
                     for s in stages for start, end, bits in s.segments if bits < 16))


def within_kl(stages, sensitivity: dict[int, tuple[float, ...]], max_kl: float, bits) -> bool:
    """Whether the stages' low-bit layers are within the measured budget, counted as the planner counts."""
    return kl_units(stages, kl_prefix_units(sensitivity, max_kl, bits)) <= KL_UNITS


def has_sensitivity(model, bits) -> bool:
    """Whether the model profile holds a measured KL for every layer at each allowed low precision."""
    return any(b < 16 for b in bits) and all(len(model.sensitivity.get(b, ())) == model.num_layers
                                             for b in bits if b < 16)
