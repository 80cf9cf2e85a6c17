"""Exact layer partition and precision choice for one replica's devices.

Two searches, one per pipeline regime (see docs/planner.md, "Pipeline model"):

* ``bottleneck_partition`` minimises the slowest stage (several micro-batches in flight). It is a
  parametric search: for a candidate bottleneck tau, a dynamic programme over (device, layer
  boundary) finds the fewest layers below 16 bits that cover the model with every stage's step time
  <= tau and every stage within memory; tau is binary-searched over the finite set of stage times,
  so the result is exact. With ``exact_order`` the DP runs over (set of devices used, last device)
  as in Held-Karp, which covers every order of every subset of the devices. Otherwise the order is
  given and a device may be skipped (it then carries no stage).
  Among partitions within 1% of the best bottleneck it returns one with the fewest low-bit layers,
  with ``exact_order`` among those one with the fewest network hops (an order that leaves a node
  and comes back only when that is more than 1% faster or saves low-bit layers), and among those
  the smallest bottleneck.
* ``sum_partition`` minimises the sum of stage times (one micro-batch: the pipeline is a chain). The
  quality budget is handled by a Lagrange multiplier on the low-bit layer count; this is a heuristic
  (a duality gap is possible), used only as an alternative candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from controlplane.hardware.specs import DeviceSpec
from controlplane.planning.cost_model import CostModel
from controlplane.planning.plan import Placement
from controlplane.planning.precision import THROUGHPUT_TOLERANCE, low_bit_cost

INF = float("inf")
LAGRANGE_STEPS = 10  # bisection steps on the low-bit penalty of ``sum_partition``


@dataclass(frozen=True)
class Partition:
    stages: tuple[Placement, ...]
    objective_s: float  # the bottleneck (or the sum) of stage times the search minimised
    quantized: int


@dataclass(frozen=True)
class _Problem:
    """The prices one search needs, per device: M[i, j] = step time of [i, j) at each precision,
    and its two summaries, at 16 bits (``full``) and at the fastest low precision (``low``)."""

    devices: tuple[DeviceSpec, ...]
    bits: tuple[int, ...]
    matrices: tuple[dict[int, np.ndarray], ...]
    full: tuple[np.ndarray, ...]
    low: tuple[np.ndarray, ...]
    pins: tuple[tuple[int, int] | None, ...]
    num_layers: int

    def transitions(self, tau: float, weight: float = 1.0) -> list[np.ndarray]:
        """Per device, T[i, j] = fewest low-bit layers for it to take [i, j) within tau (inf: cannot),
        times ``weight``: a weight above any count of network hops lets the exact search add the hops
        to the same value and still rank every low-bit layer above them.

        Devices with the same prices share one array, so alike cards cost one computation.
        """
        size = self.num_layers + 1
        quantized = low_bit_cost(4, size) * weight
        shared: dict[tuple[int, int], np.ndarray] = {}
        result = []
        for full, low in zip(self.full, self.low):
            key = (id(full), id(low))
            if key not in shared:
                shared[key] = np.where(full <= tau, 0.0, np.where(low <= tau, quantized, INF))
            result.append(shared[key])
        return result


def _problem(cost: CostModel, devices: Sequence[DeviceSpec], bits: Sequence[int], micro_batch: float,
             pins: dict[str, tuple[int, int]]) -> _Problem:
    size = cost.num_layers + 1
    never = np.full((size, size), INF)
    summaries: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
    matrices, full, low = [], [], []
    for device in devices:
        per_bits = {b: cost.decode_matrix(device, b, micro_batch) for b in bits}
        pin = pins.get(device.name)
        if pin is not None:
            masked = {}
            for b, m in per_bits.items():
                only = np.full_like(m, INF)
                only[pin] = m[pin]
                masked[b] = only
            per_bits = masked
        key = tuple(id(m) for m in per_bits.values())
        if key not in summaries:
            lows = [m for b, m in per_bits.items() if b < 16]
            summaries[key] = (per_bits.get(16, never), np.minimum.reduce(lows) if lows else never)
        matrices.append(per_bits)
        full.append(summaries[key][0])
        low.append(summaries[key][1])
    return _Problem(tuple(devices), tuple(bits), tuple(matrices), tuple(full), tuple(low),
                    tuple(pins.get(d.name) for d in devices), cost.num_layers)


# -- fixed order ---------------------------------------------------------------------------------

def _ordered_rows(problem: _Problem, hops: Sequence[float], tau: float, track: bool):
    """Forward DP over the given order; each device takes one contiguous range or is skipped."""
    n = problem.num_layers + 1
    row = np.full(n, INF)
    row[0] = 0.0
    trace = []
    transitions = problem.transitions(tau)
    for index in range(len(problem.devices)):
        source = row
        if index > 0 and hops[index] > tau:
            source = np.full(n, INF)
            source[0] = row[0]
        table = source[:, None] + transitions[index]
        starts = table.argmin(axis=0)
        taken = table[starts, np.arange(n)]
        skipped = row if problem.pins[index] is None else np.full(n, INF)
        use = taken < skipped
        if track:
            trace.append((use, starts))
        row = np.where(use, taken, skipped)
    return row, trace


def _ordered_stages(problem: _Problem, trace, tau: float) -> tuple[Placement, ...]:
    stages = []
    end = problem.num_layers
    for index in range(len(problem.devices) - 1, -1, -1):
        use, starts = trace[index]
        if end > 0 and use[end]:
            start = int(starts[end])
            stages.append(_placement(problem, index, start, end, tau))
            end = start
    return tuple(reversed(stages))


# -- every order of every subset (Held-Karp) ------------------------------------------------------

@dataclass(frozen=True)
class _Links:
    """Between every two devices: the hop time and whether the hop crosses the network (1 or 0)."""

    seconds: np.ndarray
    crossings: np.ndarray

    @property
    def weight(self) -> float:
        """What one low-bit layer counts in the exact search's value: more than all hops together."""
        return float(len(self.seconds))


def _links(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float) -> _Links:
    """Every pair, once per search: the DP asks about each (last, next) pair at every tau."""
    count = len(devices)
    seconds, crossings = np.zeros((count, count)), np.zeros((count, count))
    for a in range(count):
        for b in range(count):
            if a != b:
                seconds[a, b] = cost.hop_s(devices[a], devices[b], micro_batch)
                crossings[a, b] = cost.crosses_network(devices[a], devices[b])
    return _Links(seconds, crossings)


def _subset_rows(problem: _Problem, links: _Links, tau: float, track: bool):
    """DP over (devices used, last device): row[j] = fewest low-bit layers covering [0, j) times
    ``links.weight``, plus the fewest network hops among such plans."""
    count = len(problem.devices)
    n = problem.num_layers + 1
    start_row = np.full(n, INF)
    start_row[0] = 0.0
    transitions = problem.transitions(tau, links.weight)
    rows: dict[tuple[int, int], np.ndarray] = {}
    parents: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for d in range(count):
        table = start_row[:, None] + transitions[d]
        starts = table.argmin(axis=0)
        rows[(1 << d, d)] = table[starts, np.arange(n)]
        if track:
            parents[(1 << d, d)] = (np.full(n, -1), starts)
    for mask in sorted(range(1, 1 << count), key=lambda m: (bin(m).count("1"), m)):
        for last in range(count):
            row = rows.get((mask, last))
            if row is None or not np.isfinite(row[:-1]).any():
                continue
            for d in range(count):
                if mask >> d & 1 or links.seconds[last, d] > tau:
                    continue
                table = (row + links.crossings[last, d])[:, None] + transitions[d]
                starts = table.argmin(axis=0)
                values = table[starts, np.arange(n)]
                key = (mask | 1 << d, d)
                old = rows.get(key)
                if old is None:
                    rows[key] = values
                    if track:
                        parents[key] = (np.full(n, last), starts)
                    continue
                better = values < old
                rows[key] = np.where(better, values, old)
                if track:
                    prev_last, prev_starts = parents[key]
                    parents[key] = (np.where(better, last, prev_last), np.where(better, starts, prev_starts))
    pinned = sum(1 << d for d in range(count) if problem.pins[d] is not None)
    final = {key: row[-1] for key, row in rows.items() if key[0] & pinned == pinned}
    return final, parents


def _subset_best(problem: _Problem, links: _Links, tau: float) -> float:
    final, _ = _subset_rows(problem, links, tau, track=False)
    return min(final.values(), default=INF)


def _subset_stages(problem: _Problem, links: _Links, tau: float) -> tuple[Placement, ...]:
    final, parents = _subset_rows(problem, links, tau, track=True)
    key = min(final, key=lambda k: (final[k], bin(k[0]).count("1"), k))
    stages = []
    end = problem.num_layers
    mask, last = key
    while last >= 0:
        prev_last, starts = parents[(mask, last)]
        start = int(starts[end])
        stages.append(_placement(problem, last, start, end, tau))
        mask, last, end = mask & ~(1 << last), int(prev_last[end]), start
    return tuple(reversed(stages))


# -- shared ---------------------------------------------------------------------------------------

def _placement(problem: _Problem, index: int, start: int, end: int, tau: float) -> Placement:
    """The highest precision that keeps this stage within tau (and memory)."""
    for b in problem.bits:
        if problem.matrices[index][b][start, end] <= tau:
            return Placement(problem.devices[index].name, start, end, b)
    raise AssertionError("reconstructed a stage that no precision allows")


def bottleneck_partition(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float, budget: int,
                         bits: Sequence[int], pins: dict[str, tuple[int, int]] | None = None,
                         exact_order: bool = False) -> Partition | None:
    """Minimal-bottleneck partition (see module doc); None when nothing fits within the budget."""
    problem = _problem(cost, devices, sorted(bits, reverse=True), micro_batch, pins or {})
    if exact_order:
        links = _links(cost, devices, micro_batch)
        weight = links.weight  # ``fewest`` is low-bit layers x weight + network hops

        def fewest(tau: float) -> float:
            return _subset_best(problem, links, tau)
    else:
        weight = 1.0
        chain = [0.0] + [cost.hop_s(devices[i - 1], devices[i], micro_batch) for i in range(1, len(devices))]

        def fewest(tau: float) -> float:
            return _ordered_rows(problem, chain, tau, track=False)[0][-1]
    # The optimum is a stage time or a hop time: binary search over exactly those values.
    hop_values = links.seconds.ravel() if exact_order else np.asarray(chain)
    candidates = np.unique(np.concatenate(
        [m[np.isfinite(m)] for m in {id(m): m for m in problem.full + problem.low}.values()] + [hop_values]))
    # Within the budget: at most ``budget`` low-bit layers, whatever the hops (fewer than ``weight``).
    best = _smallest(candidates, lambda tau: fewest(tau) < (budget + 1) * weight)
    if best is None:
        return None
    relaxed = candidates[candidates <= best / (1.0 - THROUGHPUT_TOLERANCE)][-1]
    target = fewest(relaxed)
    tau = best
    if fewest(best) > target:
        window = candidates[(candidates >= best) & (candidates <= relaxed)]
        tau = _smallest(window, lambda t: fewest(t) <= target)
    if exact_order:
        stages = _subset_stages(problem, links, tau)
    else:
        _, trace = _ordered_rows(problem, chain, tau, track=True)
        stages = _ordered_stages(problem, trace, tau)
    return Partition(stages, float(tau), int(target // weight))


def _smallest(candidates: np.ndarray, ok) -> float | None:
    """Smallest candidate for which the monotone predicate holds (binary search)."""
    lo, hi = 0, len(candidates) - 1
    if hi < 0 or not ok(candidates[hi]):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(candidates[lo])


def sum_partition(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float, budget: int,
                  bits: Sequence[int], pins: dict[str, tuple[int, int]] | None = None) -> Partition | None:
    """Minimal sum of stage times and hops over the given order (a device may be skipped)."""
    problem = _problem(cost, devices, sorted(bits, reverse=True), micro_batch, pins or {})
    n = problem.num_layers + 1
    hops = [0.0] + [cost.hop_s(devices[i - 1], devices[i], micro_batch) for i in range(1, len(devices))]

    quantized = low_bit_cost(4, n)
    lows = [b for b in problem.bits if b < 16]
    low_bits = []  # per device: the fastest low precision for each [i, j) (the higher one on a tie)
    for per_bits in problem.matrices:
        choice = np.full((n, n), lows[0] if lows else 16)
        best = per_bits[lows[0]] if lows else None
        for b in lows[1:]:
            choice = np.where(per_bits[b] < best, b, choice)
            best = np.minimum(best, per_bits[b])
        low_bits.append(choice)

    def solve(penalty: float):
        row = np.full(n, INF)
        row[0] = 0.0
        trace = []
        for index in range(len(devices)):
            penalised = problem.low[index] + penalty * quantized
            keep_full = problem.full[index] <= penalised
            priced = np.where(keep_full, problem.full[index], penalised)
            chosen = np.where(keep_full, 16, low_bits[index])
            entry = np.full(n, hops[index])
            entry[0] = 0.0
            table = (row + entry)[:, None] + priced
            starts = table.argmin(axis=0)
            taken = table[starts, np.arange(n)]
            skipped = row if problem.pins[index] is None else np.full(n, INF)
            use = taken < skipped
            trace.append((use, starts, chosen))
            row = np.where(use, taken, skipped)
        if not np.isfinite(row[-1]):
            return None
        stages, end = [], problem.num_layers
        for index in range(len(devices) - 1, -1, -1):
            use, starts, chosen = trace[index]
            if end > 0 and use[end]:
                start = int(starts[end])
                stages.append(Placement(devices[index].name, start, end, int(chosen[start, end])))
                end = start
        stages = tuple(reversed(stages))
        return stages, sum(s.end - s.start for s in stages if s.bits < 16)

    found = solve(0.0)
    if found is None:
        return None
    if found[1] > budget:
        # A penalty above any stage's time never buys a low-bit layer for speed, only to fit memory.
        lo, hi = 0.0, max(float(m[np.isfinite(m)].max(initial=0.0)) for m in problem.full + problem.low)
        probe = solve(hi)
        if probe is None or probe[1] > budget:
            return None
        found = probe
        for _ in range(LAGRANGE_STEPS):
            mid = (lo + hi) / 2
            probe = solve(mid)
            if probe[1] <= budget:
                hi, found = mid, probe
            else:
                lo = mid
    stages = found[0]
    total = sum(float(cost.decode_s(cost.device(s.device), s.start, s.end, s.bits, micro_batch))
                for s in stages)
    return Partition(stages, total, found[1])
