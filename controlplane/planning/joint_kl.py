"""The joint search (joint.py) under the measured quality budget (``max_kl``): fronts instead of counts.

``joint.py`` counts low-bit layers in a dense dimension of its values (at most the budget, a few dozen).
The measured budget counts KL in ``KL_UNITS`` (2^20) integer units, too many values for that, so here,
as in ``chain_kl.py``, each layer boundary keeps the **Pareto front** of (KL units spent, value): no kept
point is at least as good in both. A plan's KL and its value (the max of stage steps and hops, or their
sum) only grow along it, so a point dominated at a boundary is dominated in every completion: the
fronts are exact. A stage's KL is that of its low-bit layers at their precision (a split stage's tail, a
whole stage's layers; on a group whose ranks differ, at the lowest, ``mixed_ranks``), each precision
kept apart (8 and 4 bits cost different KL, so not only the fastest).

The space is ``joint.py``'s for up to ``EXACT_DEVICES`` devices: every sequence of disjoint units, depth
first, a branch dropped once it exceeds the best plan found, pins as there; the least value within the
budget, the least KL among plans of that value. Beyond that many devices no group is searched under
``max_kl`` (the pipeline search's plans stand). ``tests/planning/test_joint_kl.py`` holds it to
enumeration.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from controlplane.planning.joint_units import INF, Unit, low_prices, signature, stage_placement
from controlplane.planning.mixed_ranks import lowest_matrix
from controlplane.planning.quality_budget import KL_UNITS
from controlplane.planning.tensor_parallel import group_matrix, split_cells


class Front(NamedTuple):
    """Points sorted by boundary: boundary, KL units, value, the unit's stage that reached it (-1: the
    start) and the point of the previous unit's front it came from (-1: none)."""

    at: np.ndarray
    units: np.ndarray
    value: np.ndarray
    stage: np.ndarray
    came_from: np.ndarray

    def take(self, keep) -> Front:
        return Front(*(a[keep] for a in self))


def kl_unit(cost, devices, bits, micro_batch: float, kl: dict[int, np.ndarray]) -> Unit:
    """Every stage the unit can take with its step and its KL units (``Unit.spent``), each low precision
    apart, sorted by end; priced once per request for every unit of alike cards."""
    def make():
        n = cost.num_layers + 1
        cells = split_cells(cost.num_layers)
        i, s, j = np.unravel_index(cells, (n, n, n))
        parts = []
        if 16 in bits:
            full = (cost.decode_matrix(devices[0], 16, micro_batch) if len(devices) == 1
                    else group_matrix(cost, devices, 16, micro_batch))
            starts, ends = np.nonzero(np.isfinite(full))
            parts.append((starts, ends, ends, np.zeros(len(ends), dtype=int), full[starts, ends],
                          np.zeros(len(ends))))
        for b in sorted(kl, reverse=True):
            low = np.array(low_prices(cost, devices, b, micro_batch))
            whole = s == i
            if len(devices) > 1:  # all low: the fastest assignment of precisions to ranks, lowest b
                low[whole] = np.minimum(low[whole], lowest_matrix(cost, devices, b, bits, micro_batch)[
                    i[whole], j[whole]])
            spent = kl[b][j] - kl[b][s]
            keep = np.isfinite(low) & (whole | (16 in bits)) & (spent <= KL_UNITS)
            parts.append((i[keep], s[keep], j[keep], np.full(int(keep.sum()), b), low[keep], spent[keep]))
        arrays = [np.concatenate(a) for a in zip(*parts)]
        order = np.argsort(arrays[2], kind="stable")
        return tuple(a[order] for a in arrays)
    starts, splits, ends, low, seconds, spent = cost.remember(
        ("joint kl unit", signature(cost, devices), tuple(bits), micro_batch), make)
    return Unit(devices, tuple(bits), starts, splits, ends, low, seconds, spent)


def _extend(entry: Front, unit: Unit, op, bound: float) -> Front:
    """The Pareto front at each boundary after the unit's stages from the entry's points, within the
    budget and ``bound``."""
    starts = unit.starts
    first = np.searchsorted(entry.at, starts, side="left")
    counts = np.searchsorted(entry.at, starts, side="right") - first
    found = []
    for end in np.unique(unit.ends):
        stages = np.flatnonzero((unit.ends == end) & (counts > 0))
        if not len(stages):
            continue
        repeats = counts[stages]
        stage = np.repeat(stages, repeats)
        point = first[stage] + np.arange(len(stage)) - np.repeat(np.cumsum(repeats) - repeats, repeats)
        units = entry.units[point] + unit.spent[stage]
        value = op(entry.value[point], unit.seconds[stage])
        keep = (units <= KL_UNITS) & (value <= bound)
        front = Front(np.full(int(keep.sum()), end), units[keep], value[keep], stage[keep],
                      entry.came_from[point[keep]])
        order = np.lexsort((front.value, front.units))
        front = front.take(order)
        better = front.value < np.minimum.accumulate(np.concatenate([[INF], front.value[:-1]]))
        found.append(front.take(better))
    if not found:
        return Front(*(np.zeros(0),) * 5)
    return Front(*(np.concatenate(a) for a in zip(*found)))


def kl_partition(cost, devices, units: dict, hop, op, objective: str, micro_batch: float, pinned: frozenset):
    """(stages, value, KL units) of the best plan over every sequence of disjoint units (``units``: the
    ``kl_unit`` of each, pinned ones to their range), or None."""
    layers = cost.num_layers
    keys = sorted(units, key=len, reverse=True)  # groups first: a good bound early
    best: tuple[float, float, int, int] | None = None  # (value, units, node, point)
    nodes: list[tuple[int, tuple, Front]] = []

    def visit(parent: int, key: tuple, entry: Front, used: frozenset, first: tuple) -> None:
        nonlocal best
        front = _extend(entry, units[key], op, INF if best is None else best[0])
        if not len(front.at):
            return
        nodes.append((parent, key, front))
        me = len(nodes) - 1
        done = np.flatnonzero(front.at == layers)
        if len(done) and pinned <= used:
            back = 0.0 if objective == "bottleneck" else cost.return_s(key[0], first[0], micro_batch)
            totals = front.value[done] + back
            point = done[np.lexsort((front.units[done], totals))[0]]
            candidate = (float(front.value[point] + back), float(front.units[point]), me, int(point))
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        inner = np.flatnonzero(front.at < layers)
        for nxt in keys:
            if used.isdisjoint(d.name for d in nxt):
                step = hop[(key[0].name, nxt[0].name)]
                onward = Front(front.at[inner], front.units[inner], op(front.value[inner], step),
                               front.stage[inner], inner)
                visit(me, nxt, onward, used | {d.name for d in nxt}, first)

    start = Front(np.zeros(1, dtype=int), np.zeros(1), np.zeros(1), np.full(1, -1), np.full(1, -1))
    for key in keys:
        visit(-1, key, start, frozenset(d.name for d in key), key)
    if best is None:
        return None
    value, spent, node, point = best
    stages = []
    while node >= 0:
        parent, key, front = nodes[node]
        unit, k = units[key], int(front.stage[point])
        stages.append(stage_placement(cost, unit, int(unit.starts[k]), int(unit.splits[k]), int(unit.ends[k]),
                                      int(unit.low_bits[k]), micro_batch))
        node, point = parent, int(front.came_from[point])
    return tuple(reversed(stages)), value, spent
