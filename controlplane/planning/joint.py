"""The joint search of pipeline stages and tensor-parallel groups (docs/planner.md, "Tensor-parallel groups").

A *unit* is one card or a tensor-parallel group (``tensor_parallel.can_group``: two or more cards of
one node linked by NVLink or PCIe). A plan is a sequence of disjoint units, each taking one
contiguous range of layers [i, j) at 16 bits, or at 16 bits up to a layer s and a low precision from
it (s = i: all low; on a group of up to four cards, each rank at its own precision, counted at the
lowest, ``mixed_ranks``), with at most the request's budget of low-bit layers. Two objectives, as for
pipelines of cards:

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
stages are priced once per request for every unit of alike cards (``joint_units``).

Pins: a pinned card's stage is its pinned range, alone or as a group's first rank (the stage's device,
which the pin names); no group holds two pinned cards, and a plan counts once every pinned card holds
its stage (in the ordered search a pinned unit is never skipped).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel
from controlplane.planning.joint_kl import kl_partition, kl_unit
from controlplane.planning.joint_units import Unit, stage_placement, unit_of
from controlplane.planning.ordering import speed, topology_order
from controlplane.planning.plan import Placement
from controlplane.planning.tensor_parallel import can_group, layout

EXACT_DEVICES = 4  # every subset and order up to this many devices in a replica's group of devices
INF = float("inf")
BOUND_SLACK = 1e-9  # relative: a plan within this of the bound is kept
Op = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class JointResult:
    stages: tuple[Placement, ...]
    objective_s: float
    quantized: int


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
            return stage_placement(cost, unit, start, split, end, low, micro_batch), start, end - split
    raise AssertionError("no stage reaches the value")  # pragma: no cover


def joint_partition(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float, budget: int,
                    bits: Sequence[int], objective: str, pins: dict[str, tuple[int, int]] | None = None,
                    kl: dict[int, np.ndarray] | None = None) -> JointResult | None:
    """The best plan of the space above (its plans of single cards included); None when the devices form
    no group or nothing fits. ``pins``: a pinned device's stage is the pinned range, on the card alone
    or as the first rank of a group (the stage's device, which the pin names), and every pinned device
    of ``devices`` holds one; beyond ``EXACT_DEVICES`` the units are taken in the order of ``devices``.
    ``kl``: the measured budget's KL prefix sums (``joint_kl``; ``quantized`` is then the plan's KL units,
    and beyond ``EXACT_DEVICES`` devices there is no plan)."""
    pins = {name: pin for name, pin in (pins or {}).items() if any(d.name == name for d in devices)}
    groups = _pinned_first(candidate_groups(cost, devices), pins)
    if not groups or (kl is not None and len(devices) > EXACT_DEVICES):
        return None
    op: Op = np.maximum if objective == "bottleneck" else np.add
    hop = {(a.name, b.name): cost.hop_s(a, b, micro_batch) for a in devices for b in devices if a is not b}
    if kl is not None:
        units = {g: kl_unit(cost, g, bits, micro_batch, kl) for g in [(d,) for d in devices] + groups}
        units = _pin(units, pins)
        found = kl_partition(cost, devices, units, hop, op, objective, micro_batch, frozenset(pins))
        return None if found is None else JointResult(found[0], found[1], int(found[2]))
    budget = min(budget, cost.num_layers)
    origin = _start(budget, cost.num_layers)
    units = {g: unit_of(cost, g, bits, micro_batch, budget) for g in [(d,) for d in devices] + groups}
    units = _pin(units, pins)
    if len(devices) <= EXACT_DEVICES:
        return _exhaustive(cost, origin, units, hop, op, objective, micro_batch, frozenset(pins))
    sequences = [_sequence(devices, [g for g in groups if len(g) == k])
                 for k in range(2, max(len(g) for g in groups) + 1) if any(len(g) == k for g in groups)]
    # Plans of one precision per stage are plans of the search too: the best of them bounds it from above.
    bound = INF
    for sequence in sequences:
        coarse = {key: units[key].one_precision for key in sequence}
        found = _ordered(cost, origin, coarse, hop, op, sequence, micro_batch, bound, pins)
        bound = min(bound, INF if found is None else found.objective_s)
    best = None
    for sequence in sequences:
        found = _ordered(cost, origin, units, hop, op, sequence, micro_batch, bound, pins)
        if found is not None and (best is None or (found.objective_s, found.quantized)
                                  < (best.objective_s, best.quantized)):
            best = found
            bound = min(bound, found.objective_s)
    return best


def _pinned_first(groups: list[tuple[DeviceSpec, ...]], pins) -> list[tuple[DeviceSpec, ...]]:
    """The groups pins allow: at most one pinned card each, put first (a pin names the stage's device)."""
    found = []
    for group in groups:
        pinned = tuple(d for d in group if d.name in pins)
        if len(pinned) <= 1:
            found.append(pinned + tuple(d for d in group if d.name not in pins))
    return found


def _pin(units: dict, pins) -> dict:
    """Each unit led by a pinned card kept to its pinned range."""
    return {g: u.pinned(*pins[g[0].name]) if g[0].name in pins else u for g, u in units.items()}


def _best(value: np.ndarray, extra: float = 0.0) -> tuple[float, int]:
    """(least value over the counts at the last boundary, fewest low-bit layers reaching it)."""
    last = value[:, -1] + extra
    best = float(last.min())
    return best, int(np.flatnonzero(last == best)[0]) if np.isfinite(best) else 0


def _exhaustive(cost, origin, units, hop, op, objective, micro_batch,
                pinned: frozenset) -> JointResult | None:
    """Depth-first over every sequence of disjoint units; a node keeps (parent, unit, entry, value); a plan
    counts once it uses every ``pinned`` device."""
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
        if np.isfinite(total) and pinned <= used and (best is None or (total, count) < best[:2]):
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


def _sequence(devices, groups) -> list[tuple[DeviceSpec, ...]]:
    """Units in the order of ``devices``: the groups at their first card there, the other cards single."""
    sequence, seen = [], set()
    for d in devices:
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


def _ordered(cost, origin, units, hop, op, sequence, micro_batch, bound: float, pins) -> JointResult | None:
    """The units of ``sequence`` each used or skipped (a pinned one used), the hop into a unit from the
    unit before it in the sequence; values that cannot end within ``bound`` dropped (``_ceilings``)."""
    row = origin
    trace = []
    for index, (key, ceiling) in enumerate(zip(sequence, _ceilings(cost, units, sequence, op, bound))):
        entry = origin if index == 0 else op(row, hop[(sequence[index - 1][0].name, key[0].name)])
        if not any(k[0].name in pins for k in sequence[:index]):  # or the plan starts here
            entry = np.minimum(entry, origin)
        taken = _extend(entry, units[key], op, ceiling)
        use = np.full(taken.shape, True) if key[0].name in pins else taken < row
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
