"""The chain search under the measured quality budget (``max_kl``): least sum of stage times and hops.

``chain.sum_partition`` counts low-bit layers in its state (at most the budget, a few dozen). The
measured budget counts KL in ``KL_UNITS`` (2^20) integer units, too many values for a dense
dimension, so this DP keeps, per (last device used, layer boundary), the **Pareto front** of
(KL units spent, sum of stage times and hops): no kept point is at least as fast with no more KL
than another. The rest of the plan depends only on the last device (the next hop) and the KL
spent (what the budget still allows), and both terms add up along the chain, so a point that is
dominated at a state is dominated in every completion: the front is exact, and the search returns
the least sum of any plan over the order (devices may be skipped) whose KL is within the budget,
with the least KL among such plans. Each stage runs one precision, any allowed one (8 and 4 bits
cost different KL, so not only the fastest). A front holds at most one point per distinct KL
value; in practice a few dozen (tests/planning/test_measured_budget.py holds it to a brute force).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.chain import _pinned_before
from controlplane.planning.cost_model import CostModel
from controlplane.planning.plan import Placement
from controlplane.planning.price_tables import Hops, Partition, price_tables
from controlplane.planning.quality_budget import KL_UNITS

# A front: units, seconds, and how each point was reached: previous device (-1: the start), the point's
# index in that device's front at the stage's start, the stage's start and its bits.
_FIELDS = 6


def sum_partition_kl(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float, bits: Sequence[int],
                     kl: dict[int, np.ndarray],
                     pins: dict[str, tuple[int, int]] | None = None) -> Partition | None:
    """Least sum of stage times and hops over the given order within ``KL_UNITS`` of measured KL (see the
    module doc); ``quantized`` is the plan's KL in units. None when nothing fits within the budget."""
    tables = price_tables(cost, devices, sorted(bits, reverse=True), micro_batch, pins or {}, splits=False)
    hop_s = Hops(cost, devices, micro_batch).seconds
    floors = _pinned_before(tables)
    n, count = tables.num_layers + 1, len(devices)
    fronts: list[list[np.ndarray]] = [[np.zeros((_FIELDS, 0))] * n for _ in range(count)]
    options = [(16, None)] + [(b, kl[b]) for b in tables.bits if b < 16 and b in kl]
    for d in range(count):
        entry = _entry(fronts, hop_s, floors[d], d, n)
        if not entry.shape[1]:
            continue
        starts = entry[4].astype(int)
        for end in range(1, n):
            before = entry[:, starts < end]
            if not before.shape[1]:
                continue
            first = before[4].astype(int)
            found = []
            for b, prefix in options:
                matrix = tables.matrices[d].get(b)
                if matrix is None:
                    continue
                seconds = before[1] + matrix[first, end]
                units = before[0] + (0.0 if prefix is None else prefix[end] - prefix[first])
                point = np.stack([units, seconds, before[2], before[3], before[4], np.full(len(units), b)])
                found.append(point[:, np.isfinite(seconds) & (units <= KL_UNITS)])
            fronts[d][end] = _pareto(np.concatenate(found, axis=1))
    ends = [(k, i) for k in range(max(floors[-1], 0), count) for i in range(fronts[k][n - 1].shape[1])]
    if not ends:
        return None
    best = min(fronts[k][n - 1][1, i] for k, i in ends)
    k, i = min((key for key in ends if fronts[key[0]][n - 1][1, key[1]] <= best * (1 + 1e-12)),
               key=lambda key: (fronts[key[0]][n - 1][0, key[1]], fronts[key[0]][n - 1][1, key[1]]))
    units = float(fronts[k][n - 1][0, i])
    seconds = float(fronts[k][n - 1][1, i])
    return Partition(_stages(tables, fronts, k, i), seconds, int(units))


def _entry(fronts, hop_s: np.ndarray, floor: int, device: int, n: int) -> np.ndarray:
    """The points a stage on ``device`` can start from, each with the layer it starts at (row 4) and
    where it came from (rows 2, 3): a front of a device before it (not before the last pinned one) plus
    the hop, or the start (layer 0, nothing spent) when no pinned device must come first."""
    points = []
    if floor < 0:
        points.append(np.array([[0.0], [0.0], [-1.0], [-1.0], [0.0], [16.0]]))
    for k in range(max(floor, 0), device):
        for start in range(1, n - 1):
            front = fronts[k][start]
            if front.shape[1]:
                width = front.shape[1]
                points.append(np.stack([front[0], front[1] + hop_s[k, device], np.full(width, k),
                                        np.arange(width), np.full(width, start), np.zeros(width)]))
    if not points:
        return np.zeros((_FIELDS, 0))
    merged = np.concatenate(points, axis=1)
    # Per start layer only the Pareto points matter: prune each start's group.
    return np.concatenate([_pareto(merged[:, merged[4] == s]) for s in np.unique(merged[4])], axis=1)


def _pareto(points: np.ndarray) -> np.ndarray:
    """The points no other is at least as fast with no more units (one per units value), by units."""
    if points.shape[1] < 2:
        return points
    order = np.lexsort((points[1], points[0]))
    points = points[:, order]
    seconds = points[1]
    faster = np.concatenate([[True], seconds[1:] < np.minimum.accumulate(seconds)[:-1]])
    return points[:, faster]


def _stages(tables, fronts, device: int, index: int) -> tuple[Placement, ...]:
    stages, end = [], tables.num_layers
    while device >= 0:
        units, seconds, prev, prev_index, start, bits = fronts[device][end][:, index]
        stages.append(Placement(tables.devices[device].name, int(start), end, int(bits)))
        device, index, end = int(prev), int(prev_index), int(start)
    return tuple(reversed(stages))
