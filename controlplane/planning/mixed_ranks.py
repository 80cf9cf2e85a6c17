"""Ranks of one tensor-parallel group at different precisions: a card may hold its share at int8 while
its partner holds bf16 (docs/planner.md, "Tensor-parallel groups").

A stage of one precision (no split) on a group of at most ``MIXED_RANKS`` cards may give each rank its own
precision among the allowed ones, an *assignment* (3^4 = 81 for four ranks and three precisions, each
priced over every [start, end)); larger groups and split stages hold one precision per segment on every
rank. Shares follow the assignment: a rank's speed is the parameters it reads per second at its precision
(``tensor_parallel.share_candidates``).

The quality budget counts a layer by the lowest precision any rank holds it at: it is below 16 bits if any
part of it is, and its measured KL is the whole layer's at that precision (the measurement quantizes all
of it, so this does not undercount). An assignment thus spends what the group's stage at its lowest
precision spends, and the search keeps, per [start, end) and lowest precision, the fastest assignment.
It wins where a card's low-bit kernels are measured slower than its 16-bit ones (its calibration at that
precision), so that card keeps 16 bits while its partner goes lower.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.plan import Placement
from controlplane.planning.tensor_parallel import group_matrix, group_placement

MIXED_RANKS = 4  # the largest group whose ranks may differ in precision


def assignments(devices: tuple[DeviceSpec, ...], lowest: int, bits: Sequence[int]) -> list[tuple[int, ...]]:
    """Every precision per rank (among ``bits``) whose lowest is ``lowest``, more bits first; only the
    uniform one beyond ``MIXED_RANKS`` ranks."""
    if len(devices) > MIXED_RANKS:
        return [(lowest,) * len(devices)]
    return [a for a in itertools.product(sorted(bits, reverse=True), repeat=len(devices)) if min(a) == lowest]


def lowest_matrix(cost, devices: tuple[DeviceSpec, ...], lowest: int, bits: Sequence[int],
                  micro_batch: float) -> np.ndarray:
    """M[i, j] = the fastest decode step of [i, j) on the group over the assignments whose lowest
    precision is ``lowest``; inf where none fits."""
    return np.minimum.reduce([group_matrix(cost, devices, a, micro_batch)
                              for a in assignments(devices, lowest, bits)])


def lowest_placement(cost, devices: tuple[DeviceSpec, ...], start: int, end: int, lowest: int,
                     bits: Sequence[int], micro_batch: float) -> Placement:
    """The group stage [start, end) at the assignment ``lowest_matrix`` priced it at (of equally fast
    ones, the first: the most bits)."""
    options = assignments(devices, lowest, bits)
    times = [group_matrix(cost, devices, a, micro_batch)[start, end] for a in options]
    return group_placement(cost, devices, start, end, options[int(np.argmin(times))], micro_batch)
