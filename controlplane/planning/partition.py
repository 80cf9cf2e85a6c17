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
* ``sum_partition`` minimises the sum of stage times and hops (one micro-batch: the pipeline is a
  chain) over the given order, where a device may be skipped. A dynamic programme over (last device
  used, layer boundary, low-bit layers so far, at most the budget) is exact: a plan's sum adds up
  along the chain, and the state holds all that the rest of the plan depends on (the last device
  sets the next hop, the count what the budget still allows). Among minimal plans it returns one
  with the fewest low-bit layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel, device_key
from controlplane.planning.plan import Placement
from controlplane.planning.precision import THROUGHPUT_TOLERANCE, low_bit_cost
from controlplane.planning.split_prices import SLACK, SplitPrices

INF = float("inf")
ENUMERATE_LIMIT = 4096  # stage times in a window of tau the search lists and binary-searches directly


@dataclass(frozen=True)
class Partition:
    stages: tuple[Placement, ...]
    objective_s: float  # what the search minimised: the bottleneck, or the sum of stage times and hops
    quantized: int


@dataclass(frozen=True)
class _Problem:
    """The prices one search needs, per device: M[i, j] = step time of [i, j) at each precision,
    and its two summaries, at 16 bits (``full``) and at the fastest low precision (``low``); and,
    when 16 bits and a lower precision are both allowed, ``SplitPrices`` per low precision for
    stages whose last layers run below 16 bits."""

    devices: tuple[DeviceSpec, ...]
    bits: tuple[int, ...]
    matrices: tuple[dict[int, np.ndarray], ...]
    full: tuple[np.ndarray, ...]
    low: tuple[np.ndarray, ...]
    splits: tuple[dict[int, SplitPrices], ...]
    pins: tuple[tuple[int, int] | None, ...]
    num_layers: int

    def transitions(self, tau: float, weight: float = 1.0) -> list[np.ndarray]:
        """Per device, T[i, j] = fewest low-bit layers for it to take [i, j) within tau (inf: cannot),
        times ``weight``: a weight above any count of network hops lets the exact search add the hops
        to the same value and still rank every low-bit layer above them.

        With splits, the lowest precision needs the fewest (it saves the most bytes per layer).
        Devices with the same prices share one array, so alike cards cost one computation.
        """
        lengths = low_bit_cost(4, self.num_layers + 1)
        shared: dict[tuple[int, ...], np.ndarray] = {}
        result = []
        for full, low, splits in zip(self.full, self.low, self.splits):
            key = (id(full), id(low), *map(id, splits.values()))
            if key not in shared:
                if splits:
                    shared[key] = splits[min(splits)].fewest(tau) * weight
                else:
                    shared[key] = np.where(full <= tau, 0.0, np.where(low <= tau, lengths * weight, INF))
            result.append(shared[key])
        return result

    def bounds(self) -> tuple[float, float]:
        """Below the optimum bottleneck, and at or above every finite stage time here.

        Below: with at most one stage per device, some stage holds at least L / devices layers,
        and no stage of that many layers is faster than the fastest such range at the fastest
        precision (one precision: a split stage reads more). A pinned device's prices hide every
        other range, so with pins: half the fastest stage time. Above: the slowest stage of one
        precision, or of a split when one fits only split.
        """
        values = np.concatenate([m[np.isfinite(m)] for m in self.full + self.low] + [np.zeros(1)])
        slowest = [p.slowest for p in {id(p): p for s in self.splits for p in s.values()}.values()]
        fewest_layers = 1 if any(self.pins) else -(-self.num_layers // len(self.devices))
        ranges = [np.diagonal(m, fewest_layers) for m in {id(m): m for m in self.low + self.full}.values()]
        floor = float(np.concatenate(ranges).min()) * (1.0 if fewest_layers > 1 else 0.5)
        return (floor * (1.0 - 1e-9) if np.isfinite(floor) else 0.0), max([float(values.max()), *slowest])

    def prices_between(self, lo: float, hi: float, limit: int | None) -> np.ndarray | None:
        """Every stage time in (lo, hi] the transitions can step at (with repeats), or None if more
        than ``limit``."""
        found, seen = [], set()
        for full, low, splits in zip(self.full, self.low, self.splits):
            sources = [splits[min(splits)]] if splits else [full, low]
            for source in sources:
                if id(source) in seen:
                    continue
                seen.add(id(source))
                left = None if limit is None else limit - sum(map(len, found))
                if isinstance(source, SplitPrices):
                    values = source.between(lo, hi, left)
                else:
                    values = source[(source > lo) & (source <= hi)]
                if values is None or (left is not None and len(values) > left):
                    return None
                found.append(values)
        return np.concatenate(found) if found else np.zeros(0)


def _problem(cost: CostModel, devices: Sequence[DeviceSpec], bits: Sequence[int], micro_batch: float,
             pins: dict[str, tuple[int, int]], splits: bool = True) -> _Problem:
    size = cost.num_layers + 1
    never = np.full((size, size), INF)
    summaries: dict[tuple, tuple[np.ndarray, np.ndarray, dict[int, SplitPrices]]] = {}
    matrices, full, low, split_prices = [], [], [], []
    lows = [b for b in bits if b < 16] if splits and 16 in bits else []
    for device in devices:
        per_bits = {b: cost.decode_matrix(device, b, micro_batch) for b in bits}
        pin = pins.get(device.name)
        if pin is not None:
            per_bits = {b: _only(m, pin) for b, m in per_bits.items()}
        key = (*(id(m) for m in per_bits.values()), pin)
        if key not in summaries:
            lowest = [m for b, m in per_bits.items() if b < 16]
            summaries[key] = (per_bits.get(16, never), np.minimum.reduce(lowest) if lowest else never,
                              {b: _split_prices(cost, device, b, micro_batch, pin, len(devices) <= 2)
                               for b in lows})
        matrices.append(per_bits)
        full.append(summaries[key][0])
        low.append(summaries[key][1])
        split_prices.append(summaries[key][2])
    return _Problem(tuple(devices), tuple(bits), tuple(matrices), tuple(full), tuple(low),
                    tuple(split_prices), tuple(pins.get(d.name) for d in devices), cost.num_layers)


def _split_prices(cost: CostModel, device: DeviceSpec, low_bits: int, micro_batch: float,
                  pin: tuple[int, int] | None, ends_only: bool) -> SplitPrices:
    """Shared by every search of the request; with one or two devices a stage starts at the first
    layer or ends at the last, so only those ranges are priced."""
    return cost.remember(("split prices", device_key(device), low_bits, micro_batch, pin, ends_only),
                         lambda: SplitPrices(cost, device, low_bits, micro_batch, pin, ends_only))


def _only(prices: np.ndarray, pin: tuple[int, int]) -> np.ndarray:
    """``prices`` with every stage but the pinned range [start, end) made impossible."""
    only = np.full_like(prices, INF)
    only[pin] = prices[pin]
    only.setflags(write=False)
    return only


# -- fixed order ---------------------------------------------------------------------------------

def _ordered_rows(problem: _Problem, hops: Sequence[float], tau: float, track: bool):
    """Forward DP over the given order; each device takes one contiguous range or is skipped."""
    n = problem.num_layers + 1
    row = np.full(n, INF)
    row[0] = 0.0
    trace = []
    transitions = problem.transitions(tau)
    for index in range(len(problem.devices)):
        if index == 0:  # nothing before it: its range starts at layer 0
            starts, taken = np.zeros(n, dtype=int), transitions[0][0]
        else:
            source = row
            if hops[index] > tau:
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
    """Every pair, once per search: the Held-Karp DP asks about each (last, next) pair at every tau."""
    count = len(devices)
    crossings = np.zeros((count, count))
    for a in range(count):
        for b in range(count):
            crossings[a, b] = a != b and cost.crosses_network(devices[a], devices[b])
    return _Links(_hop_seconds(cost, devices, micro_batch), crossings)


def _hop_seconds(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float) -> np.ndarray:
    """H[a, b] = the hop of a micro-batch's hidden states from device a to b (0 on the diagonal)."""
    count = len(devices)
    seconds = np.zeros((count, count))
    for a in range(count):
        for b in range(count):
            if a != b:
                seconds[a, b] = cost.hop_s(devices[a], devices[b], micro_batch)
    return seconds


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
    """The stage the DP priced: 16 bits if that keeps it within tau (and memory); else the split
    with the fewest low-bit layers, at the highest low precision that needs no more; else the
    highest precision that fits."""
    name = problem.devices[index].name
    within = tau * (1.0 + SLACK)
    full = problem.matrices[index].get(16)
    if full is not None and full[start, end] <= within:
        return Placement(name, start, end, 16)
    splits = problem.splits[index]
    if splits:
        needs = {b: prices.fewest(tau)[start, end] for b, prices in splits.items()}
        fewest = min(needs.values())
        if fewest < end - start:
            low_bits = max(b for b, need in needs.items() if need == fewest)
            return Placement(name, start, end, 16, low_bits, end - int(fewest))
    for b in problem.bits:
        if problem.matrices[index][b][start, end] <= within:
            return Placement(name, start, end, b)
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
    # The optimum is a stage time or a hop time: search exactly those values.
    hops = links.seconds.ravel() if exact_order else np.asarray(chain)
    lo, hi = problem.bounds()
    hi = max(hi, float(hops.max()))
    # Within the budget: at most ``budget`` low-bit layers, whatever the hops (fewer than ``weight``).
    best = _smallest(problem, hops, lo, hi, lambda tau: fewest(tau) < (budget + 1) * weight)
    if best is None:
        return None
    relaxed = best / (1.0 - THROUGHPUT_TOLERANCE)
    target = fewest(relaxed)
    tau = best
    if fewest(best) > target:
        tau = _smallest(problem, hops, best, relaxed, lambda t: fewest(t) <= target)
    if exact_order:
        stages = _subset_stages(problem, links, tau)
    else:
        _, trace = _ordered_rows(problem, chain, tau, track=True)
        stages = _ordered_stages(problem, trace, tau)
    return Partition(stages, float(tau), int(target // weight))


def _smallest(problem: _Problem, hops: np.ndarray, lo: float, hi: float, ok) -> float | None:
    """Smallest stage or hop time in (lo, hi] for which the monotone predicate holds (None: none).

    ``ok`` changes only at such times. While the window holds more than ``ENUMERATE_LIMIT`` of
    them, bisect it (geometrically: times span orders of magnitude); then binary-search the times
    themselves. Alike layers give many stages the same time, so the count includes repeats.
    """
    while True:
        narrow = hi <= lo * (1.0 + 1e-9)  # only repeats of one time left: list them all
        values = problem.prices_between(lo, hi, None if narrow else ENUMERATE_LIMIT)
        if values is not None:
            return _first(np.unique(np.concatenate([values, hops[(hops > lo) & (hops <= hi)]])), ok)
        middle = math.sqrt(lo * hi) if lo > 0 else hi / 2
        if ok(middle):
            hi = middle
        else:
            lo = middle


def _first(candidates: np.ndarray, ok) -> float | None:
    """First of the sorted candidates for which the monotone predicate holds (binary search)."""
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


# -- fixed order, sum of stage times and hops (one micro-batch) -----------------------------------

def sum_partition(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float, budget: int,
                  bits: Sequence[int], pins: dict[str, tuple[int, int]] | None = None) -> Partition | None:
    """Minimal sum of stage times and hops over the given order (see module doc), with the fewest
    low-bit layers among minimal plans; None when nothing fits within the budget."""
    problem = _problem(cost, devices, sorted(bits, reverse=True), micro_batch, pins or {}, splits=False)
    hops = _hop_seconds(cost, devices, micro_batch)
    floors = _pinned_before(problem)
    values = _chain_values(problem, hops, floors, min(budget, problem.num_layers))
    first_last = max(floors[-1], 0)  # the last stage is on the last pinned device or after it
    ends = values[first_last:, :, -1]  # [last device, low-bit layers]
    best = float(ends.min())
    if not np.isfinite(best):
        return None
    count = int(np.flatnonzero((ends == best).any(axis=0))[0])
    last = first_last + int(ends[:, count].argmin())
    return Partition(_chain_stages(problem, values, hops, floors, last, count), best, count)


def _pinned_before(problem: _Problem) -> list[int]:
    """Per device, and once more past the last: the last pinned device before it (-1: none). A
    pinned device cannot be skipped, so no stage hands over from a device earlier than that."""
    floors, last = [], -1
    for index, pin in enumerate(problem.pins):
        floors.append(last)
        if pin is not None:
            last = index
    return floors + [last]


def _chain_values(problem: _Problem, hops: np.ndarray, floors: list[int], budget: int) -> np.ndarray:
    """V[k, c, j] = least sum of stage times and hops that covers [0, j) with exactly c low-bit
    layers and ends with a stage on device k (inf: none). The last device used is part of the state
    because the hop into the next stage depends on it, whichever devices were skipped between."""
    count, n = len(problem.devices), problem.num_layers + 1
    values = np.full((count, budget + 1, n), INF)
    bands: dict[tuple[int, int], np.ndarray] = {}  # alike devices share their price matrices
    for device in range(count):
        entry = _chain_entry(values, hops, floors[device], device)
        for matrix, counted in ((problem.full[device], 0), (problem.low[device], 1)):
            key = (id(matrix), counted)
            if key not in bands:
                bands[key] = _band(matrix, min(_longest(matrix), budget if counted else n))
            band = bands[key]
            if len(band):
                reached = (_windows(entry, len(band), counted) + band).min(axis=1)
                values[device] = np.minimum(values[device], reached)
    return values


def _chain_entry(values: np.ndarray, hops: np.ndarray, floor: int, device: int) -> np.ndarray:
    """E[c, i] = least time to cover [0, i) with c low-bit layers and hand layer i to ``device``:
    the best previous last device plus its hop, or the start (i = 0) when no pinned device must
    come first."""
    low = max(floor, 0)
    if low < device:
        entry = (values[low:device] + hops[low:device, device, None, None]).min(axis=0)
    else:
        entry = np.full(values.shape[1:], INF)
    if floor < 0:
        entry[0, 0] = 0.0
    return entry


def _longest(matrix: np.ndarray) -> int:
    """The most layers one stage can hold (0: none): the DP only looks this far back."""
    starts, ends = np.nonzero(np.isfinite(matrix))
    return int((ends - starts).max(initial=0))


def _band(matrix: np.ndarray, width: int) -> np.ndarray:
    """B[d - 1, j] = matrix[j - d, j], the stage of d layers ending at j, for d = 1..width (inf
    where j < d): stage times by length, so a step of the DP is one broadcast sum and one min."""
    lengths = np.arange(1, width + 1)[:, None]
    ends = np.arange(len(matrix))[None, :]
    return np.where(ends >= lengths, matrix[np.maximum(ends - lengths, 0), ends], INF)


def _windows(entry: np.ndarray, width: int, counted: int) -> np.ndarray:
    """W[c, d - 1, j] = entry[c - counted * d, j - d] (inf outside): for each state (c, j), the
    state a stage of d layers ending at j starts from; a low-bit stage (``counted`` = 1) adds its d
    layers to the count. A strided view of a padded copy: no per-state indexing."""
    rows, n = entry.shape
    padded = np.full((width + rows, width + n), INF)
    padded[width:, width:] = entry
    s0, s1 = padded.strides
    return np.lib.stride_tricks.as_strided(padded[width - counted:, width - 1:], shape=(rows, width, n),
                                           strides=(s0, -(counted * s0 + s1), s1), writeable=False)


def _chain_stages(problem: _Problem, values: np.ndarray, hops: np.ndarray, floors: list[int], last: int,
                  count: int) -> tuple[Placement, ...]:
    """Walks the DP back from (last device, count, all layers), redoing each state's minimum."""
    stages = []
    device, end = last, problem.num_layers
    while end > 0:
        entry = _chain_entry(values, hops, floors[device], device)
        start, bits = _chain_stage(problem, entry, device, count, end)
        stages.append(Placement(problem.devices[device].name, start, end, bits))
        count -= (end - start) * (bits < 16)
        end = start
        if end > 0:
            low = max(floors[device], 0)
            device = low + int((values[low:device, count, end] + hops[low:device, device]).argmin())
    return tuple(reversed(stages))


def _chain_stage(problem: _Problem, entry: np.ndarray, device: int, count: int, end: int) -> tuple[int, int]:
    """The start and precision of the stage ending at ``end`` on ``device`` that reaches ``count``
    low-bit layers the fastest: 16 bits on a tie, else the highest low precision as fast as any."""
    starts = np.arange(end)
    full = entry[count, :end] + problem.full[device][:end, end]
    before = count - (end - starts)
    low = np.where(before >= 0, entry[np.maximum(before, 0), starts] + problem.low[device][:end, end], INF)
    if full.min() <= low.min():
        return int(full.argmin()), 16
    start = int(low.argmin())
    fastest = problem.low[device][start, end]
    return start, next(b for b in problem.bits
                       if b < 16 and problem.matrices[device][b][start, end] == fastest)
