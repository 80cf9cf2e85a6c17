"""The joint search of pipeline stages and tensor-parallel groups (docs/planner.md, "Tensor-parallel groups").

A *unit* is one card or a tensor-parallel group (``tensor_parallel.can_group``: two or more cards of
one node linked by NVLink or PCIe). A plan is a sequence of disjoint units, each taking one
contiguous range of layers [i, j) at 16 bits, or at 16 bits up to a layer s and a low precision from
it (s = i: all low; a group's ranks all the same), with at most the request's budget of low-bit
layers. Two objectives, as for pipelines of cards:

- ``bottleneck``: the slowest stage step or hop, for a micro-batch (the pipeline full);
- ``chain``: the sum of stage steps and hops and the return of the sampled tokens, for the whole
  batch as one micro-batch (what a token waits at batch 1).

A dynamic programme over (low-bit layers so far, layer boundary) extends a plan by one unit at a
time: ``V'[c, j] = min over i, s of op(E[c - (j - s), i], M[i, s, j])`` with ``op`` the max
(bottleneck) or the sum (chain), M the fastest low precision for each split, and E the previous
unit's values combined with the hop into it.

The space searched: with up to ``EXACT_DEVICES`` devices, every sequence of disjoint units over every
subset of the devices, every group of every node (a depth-first walk over sequences sharing the
values of their common prefixes; op never decreases a value, so what exceeds the best plan found is
dropped): exact, as ``tests/planning/test_exact_groups.py`` holds against
enumeration. Beyond that (the cap that keeps it tractable): each node contributes its k fastest
group-eligible cards as one group, the same k on every node for k = 2 .. the most a node has, the
other cards staying single, and the units are taken in topology order, each used or skipped with
the hop from the unit before it (as the fixed-order pipeline search). There the best plan of one
precision per stage (a subset of the space, a few thousand stages per unit instead of every split)
bounds the search of every split, and a value that cannot end within the bound, the rest of the
layers taken at the least time per layer of the units after it, is dropped (``_ceilings``): exact
over that space, as ``tests/planning/test_joint_ordered.py`` holds against enumeration. A unit's
stages are priced once per request for every unit of alike cards (``_signature``).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel, device_key
from controlplane.planning.mixed_ranks import lowest_matrix, lowest_placement
from controlplane.planning.ordering import speed, topology_order
from controlplane.planning.plan import Placement
from controlplane.planning.tensor_parallel import (
    can_group,
    group_link,
    group_matrix,
    group_placement,
    group_split_matrix,
    layout,
    split_cells,
)

EXACT_DEVICES = 4  # every subset and order up to this many devices in a replica's group of devices
INF = float("inf")
BOUND_SLACK = 1e-9  # relative: a plan within this of the bound is kept
Op = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Unit:
    """The stages a unit can take, flattened and sorted by end: [start, split) at 16 bits and
    [split, end) at ``low_bits`` (split = end: all at 16 bits; split = start: a group's ranks at the
    fastest assignment whose lowest precision is ``low_bits``, ``mixed_ranks``), with their step times
    (finite: they fit) and the low-bit layers each spends; ``bits``, the precisions allowed."""

    devices: tuple[DeviceSpec, ...]
    bits: tuple[int, ...]
    starts: np.ndarray
    splits: np.ndarray
    ends: np.ndarray
    low_bits: np.ndarray  # 0 where the stage is all at 16 bits
    seconds: np.ndarray
    spent: np.ndarray  # end - split

    @functools.cached_property
    def one_precision(self) -> Unit:
        """Its stages at one precision: a subset, so the best plan of such stages bounds the search's."""
        keep = (self.splits == self.starts) | (self.splits == self.ends)
        arrays = (self.starts, self.splits, self.ends, self.low_bits, self.seconds, self.spent)
        return Unit(self.devices, self.bits, *(a[keep] for a in arrays))

    @functools.cached_property
    def rate(self) -> float:
        """The least seconds per layer of any of its stages: no stage of it is faster per layer."""
        return float((self.seconds / (self.ends - self.starts)).min(initial=INF))


@dataclass(frozen=True)
class JointResult:
    stages: tuple[Placement, ...]
    objective_s: float
    quantized: int


def _low_prices(cost: CostModel, devices: tuple[DeviceSpec, ...], low: int, micro_batch: float) -> np.ndarray:
    """Per (i, s, j) of ``split_cells``: [i, s) at 16 bits, [s, j) at ``low``."""
    if len(devices) > 1:
        return group_split_matrix(cost, devices, low, micro_batch)
    i, s, j = np.unravel_index(split_cells(cost.num_layers), (cost.num_layers + 1,) * 3)
    return cost.split_times(devices[0], low, micro_batch, i, j, j - s)


def _unit(cost: CostModel, devices: tuple[DeviceSpec, ...], bits: Sequence[int], micro_batch: float,
          budget: int) -> Unit:
    """The unit's stages, priced once per request for every unit of alike cards (``_signature``)."""
    key = ("joint unit", _signature(cost, devices), tuple(bits), micro_batch, budget)
    return Unit(devices, tuple(bits), *cost.remember(key, lambda: _stages(cost, devices, bits, micro_batch,
                                                                          budget)))


def _signature(cost: CostModel, devices: tuple[DeviceSpec, ...]) -> tuple:
    """What a unit's prices depend on: its cards' figures in rank order, and a group's link."""
    cards = tuple(device_key(d) for d in devices)
    if len(devices) == 1:
        return cards
    link = group_link(cost, devices)
    return cards, link.kind, link.bandwidth_gbs, link.latency_us


def _stages(cost: CostModel, devices: tuple[DeviceSpec, ...], bits: Sequence[int], micro_batch: float,
            budget: int) -> tuple[np.ndarray, ...]:
    """``Unit``'s arrays, starts to spent (read-only)."""
    n = cost.num_layers + 1
    cells = split_cells(cost.num_layers)  # the split stages, then the ones at 16 bits
    i, s, j = np.unravel_index(cells, (n, n, n))
    whole = np.arange(n * n)
    i, s, j = np.concatenate([i, whole // n]), np.concatenate([s, whole % n]), np.concatenate([j, whole % n])
    prices, which = np.full(len(i), INF), np.zeros(len(i), dtype=np.int8)
    if 16 in bits:
        full = (cost.decode_matrix(devices[0], 16, micro_batch) if len(devices) == 1
                else group_matrix(cost, devices, 16, micro_batch))
        prices[len(cells):] = full.ravel()
    for b in sorted((b for b in bits if b < 16), reverse=True):  # the highest of equally fast ones
        low = np.full(len(i), INF)
        low[:len(cells)] = _low_prices(cost, devices, b, micro_batch)
        if len(devices) > 1:  # all low: the fastest assignment of precisions to ranks whose lowest is b
            whole = (s == i) & (j > i)
            fastest = lowest_matrix(cost, devices, b, bits, micro_batch)
            low[whole] = np.minimum(low[whole], fastest[i[whole], j[whole]])
        if 16 not in bits:  # no layer at 16 bits: the whole stage low
            low = np.where(s == i, low, INF)
        better = low < prices
        prices, which = np.where(better, low, prices), np.where(better, b, which)
    keep = np.flatnonzero(np.isfinite(prices) & (j - s <= budget) & (j > i))
    keep = keep[np.argsort(j[keep], kind="stable")]
    arrays = (i[keep], s[keep], j[keep], which[keep], prices[keep], j[keep] - s[keep])
    for array in arrays:
        array.setflags(write=False)
    return arrays


def candidate_groups(cost: CostModel, devices: Sequence[DeviceSpec]) -> list[tuple[DeviceSpec, ...]]:
    """Every group of the devices the search considers (see the module doc)."""
    if layout(cost.model) is None:
        return []
    by_node: dict[str, list[DeviceSpec]] = {}
    for d in topology_order(list(devices), cost.fleet):
        by_node.setdefault(d.node, []).append(d)
    if len(devices) <= EXACT_DEVICES:
        return [g for cards in by_node.values() for k in range(2, len(cards) + 1)
                for g in itertools.combinations(cards, k) if can_group(cost, g)]
    found = []
    for cards in by_node.values():
        fastest = sorted(cards, key=lambda d: -speed(d))
        found += [g for k in range(2, len(cards) + 1) if can_group(cost, g := tuple(fastest[:k]))]
    return found


def _start(budget: int, layers: int) -> np.ndarray:
    """V before any unit: nothing covered, nothing spent."""
    start = np.full((budget + 1, layers + 1), INF)
    start[0, 0] = 0.0
    return start


def _extend(entry: np.ndarray, unit: Unit, op: Op, ceiling: np.ndarray) -> np.ndarray:
    """V[c, j] = min over the unit's stages [i, j) of op(E[c - low layers, i], M), leaving out values
    above ``ceiling[j]`` (what a plan at boundary j may have reached and still win)."""
    value = np.full(entry.shape, INF)
    keep = np.flatnonzero(op(entry.min(axis=0)[unit.starts], unit.seconds) <= ceiling[unit.ends])
    if len(keep):
        ends = unit.ends[keep]
        offsets = np.concatenate([[0], np.flatnonzero(np.diff(ends)) + 1])
        rows = np.arange(entry.shape[0])[:, None] - unit.spent[keep][None, :]
        before = np.where(rows >= 0, entry[np.maximum(rows, 0), unit.starts[keep][None, :]], INF)
        reached = op(before, unit.seconds[keep][None, :])
        value[:, ends[offsets]] = np.minimum.reduceat(reached, offsets, axis=1)
    return np.where(value > ceiling[None, :], INF, value)


def _stage(cost: CostModel, entry: np.ndarray, value: np.ndarray, unit: Unit, op: Op, count: int, end: int,
           micro_batch: float) -> tuple[Placement, int, int]:
    """The stage ending at ``end`` that gave V[count, end]: (placement, its start, its low layers)."""
    target = value[count, end]
    for k in np.flatnonzero(unit.ends == end):
        before = count - int(unit.spent[k])
        if before >= 0 and op(entry[before, unit.starts[k]], unit.seconds[k]) == target:
            start, split, low = int(unit.starts[k]), int(unit.splits[k]), int(unit.low_bits[k])
            return _placement(cost, unit, start, split, end, low, micro_batch), start, end - split
    raise AssertionError("no stage reaches the value")  # pragma: no cover


def _placement(cost: CostModel, unit: Unit, start: int, split: int, end: int, low: int,
               micro_batch: float) -> Placement:
    """16 bits throughout (``low`` 0), ``low`` throughout (split at the start; on a group, the lowest
    precision of its ranks), or split."""
    bits, low_bits, low_from = (16, None, None) if low == 0 else (low, None, None) if split == start \
        else (16, low, split)
    if len(unit.devices) == 1:
        return Placement(unit.devices[0].name, start, end, bits, low_bits, low_from)
    if low and split == start:
        return lowest_placement(cost, unit.devices, start, end, low, unit.bits, micro_batch)
    return group_placement(cost, unit.devices, start, end, bits, micro_batch, low_bits, low_from)


def joint_partition(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float, budget: int,
                    bits: Sequence[int], objective: str) -> JointResult | None:
    """The best plan of the space above (its plans of single cards included); None when the devices form
    no group or nothing fits."""
    groups = candidate_groups(cost, devices)
    if not groups:
        return None
    op: Op = np.maximum if objective == "bottleneck" else np.add
    budget = min(budget, cost.num_layers)
    origin = _start(budget, cost.num_layers)
    units = {g: _unit(cost, g, bits, micro_batch, budget) for g in [(d,) for d in devices] + groups}
    hop = {(a.name, b.name): cost.hop_s(a, b, micro_batch) for a in devices for b in devices if a is not b}
    if len(devices) <= EXACT_DEVICES:
        return _exhaustive(cost, origin, units, hop, op, objective, micro_batch)
    sequences = [_sequence(cost, devices, [g for g in groups if len(g) == k])
                 for k in range(2, max(len(g) for g in groups) + 1) if any(len(g) == k for g in groups)]
    # Plans of one precision per stage are plans of the search too: the best of them bounds it from above.
    bound = INF
    for sequence in sequences:
        coarse = {key: units[key].one_precision for key in sequence}
        found = _ordered(cost, origin, coarse, hop, op, sequence, micro_batch, bound)
        bound = min(bound, INF if found is None else found.objective_s)
    best = None
    for sequence in sequences:
        found = _ordered(cost, origin, units, hop, op, sequence, micro_batch, bound)
        if found is not None and (best is None or (found.objective_s, found.quantized)
                                  < (best.objective_s, best.quantized)):
            best = found
            bound = min(bound, found.objective_s)
    return best


def _best(value: np.ndarray, extra: float = 0.0) -> tuple[float, int]:
    """(least value over the counts at the last boundary, fewest low-bit layers reaching it)."""
    last = value[:, -1] + extra
    best = float(last.min())
    return best, int(np.flatnonzero(last == best)[0]) if np.isfinite(best) else 0


def _exhaustive(cost, origin, units, hop, op, objective, micro_batch) -> JointResult | None:
    """Depth-first over every sequence of disjoint units; a node keeps (parent, unit, entry, value)."""
    keys = sorted(units, key=len, reverse=True)  # groups first: a good bound early
    best: tuple[float, int, int] | None = None  # (value, count, node)
    nodes: list[tuple[int, tuple, np.ndarray, np.ndarray, tuple]] = []

    def visit(parent: int, key: tuple, entry: np.ndarray, used: frozenset, first: tuple) -> None:
        nonlocal best
        bound = INF if best is None else best[0]  # op never decreases a value: beyond the best cannot win
        value = _extend(entry, units[key], op, np.full(entry.shape[1], bound))
        if not np.isfinite(value).any():
            return
        nodes.append((parent, key, entry, value, first))
        me = len(nodes) - 1
        back = 0.0 if objective == "bottleneck" else cost.return_s(key[0], first[0], micro_batch)
        total, count = _best(value, back)
        if np.isfinite(total) and (best is None or (total, count) < best[:2]):
            best = (total, count, me)
        for nxt in keys:
            if used.isdisjoint(d.name for d in nxt):
                step = hop[(key[0].name, nxt[0].name)]
                visit(me, nxt, op(value, step), used | {d.name for d in nxt}, first)

    for key in keys:
        visit(-1, key, origin, frozenset(d.name for d in key), key)
    if best is None:
        return None
    total, count, node = best
    stages, end = [], cost.num_layers
    while node >= 0:
        parent, key, entry, value, _ = nodes[node]
        placement, end, low = _stage(cost, entry, value, units[key], op, count, end, micro_batch)
        stages.append(placement)
        count -= low
        node = parent
    stages.reverse()
    return JointResult(tuple(stages), total, sum(s.quantized_layers for s in stages))


def _sequence(cost, devices, groups) -> list[tuple[DeviceSpec, ...]]:
    """Units in topology order: the groups at their first card, the other cards single."""
    sequence, seen = [], set()
    for d in topology_order(list(devices), cost.fleet):
        group = next((g for g in groups if d in g), None)
        if group is None:
            sequence.append((d,))
        elif group not in seen:
            seen.add(group)
            sequence.append(group)
    return sequence


def _ceilings(cost, units, sequence, op, bound: float) -> list[np.ndarray]:
    """Per unit of the sequence and boundary j, the most a plan may have reached at j, after that unit,
    and still end within ``bound``: the units after it take [j, L) no faster than their least rate per
    layer (the sum of their stages, or for the bottleneck the largest of at most that many stages), and
    none can finish it short of L. A relative slack keeps plans that the sums' rounding puts at the bound."""
    layers, limit = cost.num_layers, bound * (1.0 + BOUND_SLACK)
    left = layers - np.arange(layers + 1)
    ceilings = []
    for index in range(len(sequence)):
        after = [units[key] for key in sequence[index + 1:]]
        rate = min((u.rate for u in after), default=INF)
        if not np.isfinite(rate):  # nothing after it: only plans that end here
            ceilings.append(np.where(left > 0, -INF, limit))
        elif op is np.add:
            ceilings.append(limit - left * rate)
        else:
            ceilings.append(np.where(-(-left // len(after)) * rate <= limit, limit, -INF))
    return ceilings


def _ordered(cost, origin, units, hop, op, sequence, micro_batch, bound: float) -> JointResult | None:
    """The units of ``sequence`` each used or skipped, the hop into a unit from the unit before it in the
    sequence; values that cannot end within ``bound`` dropped (``_ceilings``)."""
    row = origin
    trace = []
    for index, (key, ceiling) in enumerate(zip(sequence, _ceilings(cost, units, sequence, op, bound))):
        entry = origin if index == 0 else np.minimum(
            op(row, hop[(sequence[index - 1][0].name, key[0].name)]), origin)
        taken = _extend(entry, units[key], op, ceiling)
        use = taken < row
        trace.append((entry, taken, use))
        row = np.where(use, taken, row)
    total, count = _best(row)
    if not np.isfinite(total):
        return None
    stages, end = [], cost.num_layers
    for index in range(len(sequence) - 1, -1, -1):
        entry, taken, use = trace[index]
        if end == 0:
            break
        if not use[count, end]:
            continue
        placement, end, low = _stage(cost, entry, taken, units[sequence[index]], op, count, end, micro_batch)
        stages.append(placement)
        count -= low
    stages.reverse()
    return JointResult(tuple(stages), total, sum(s.quantized_layers for s in stages))
