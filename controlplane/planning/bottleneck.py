"""The bottleneck search: the partition whose slowest stage is fastest (several micro-batches in flight).

A parametric search. For a candidate bottleneck tau, a dynamic programme over (device, layer
boundary) finds the fewest layers below 16 bits that cover the model with every stage's step time
<= tau and every stage within memory; tau is binary-searched over the finite set of stage and hop
times, so the result is exact. With ``exact_order`` the DP runs over (set of devices used, last
device) as in Held-Karp, which covers every order of every subset of the devices. Otherwise the
order is given and a device may be skipped (it then carries no stage).

Among partitions within 1% of the best bottleneck it returns one with the fewest low-bit layers,
with ``exact_order`` among those one with the fewest network hops (an order that leaves a node and
comes back only when that is more than 1% faster or saves low-bit layers), and among those the
smallest bottleneck.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel
from controlplane.planning.plan import Placement
from controlplane.planning.price_tables import INF, Hops, Partition, PriceTables, price_tables
from controlplane.planning.quality_budget import THROUGHPUT_TOLERANCE
from controlplane.planning.split_prices import SLACK

ENUMERATE_LIMIT = 4096  # stage times in a window of tau the search lists and binary-searches directly


def bottleneck_partition(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float, budget: int,
                         bits: Sequence[int], pins: dict[str, tuple[int, int]] | None = None,
                         exact_order: bool = False,
                         kl: dict[int, np.ndarray] | None = None) -> Partition | None:
    """Minimal-bottleneck partition (see module doc); None when nothing fits within the budget.
    With ``kl`` (measured KL prefix sums in units) the budget and ``quantized`` are KL units, not layers."""
    tables = price_tables(cost, devices, sorted(bits, reverse=True), micro_batch, pins or {}, kl=kl)
    if exact_order:
        links = Hops(cost, devices, micro_batch)
        weight = links.weight  # ``fewest`` is low-bit layers x weight + network hops

        def fewest(tau: float) -> float:
            return _subset_best(tables, links, tau)
    else:
        weight = 1.0
        chain = [0.0] + [cost.hop_s(devices[i - 1], devices[i], micro_batch) for i in range(1, len(devices))]

        def fewest(tau: float) -> float:
            return _ordered_rows(tables, chain, tau, track=False)[0][-1]
    # The optimum is a stage time or a hop time: search exactly those values.
    hop_times = links.seconds.ravel() if exact_order else np.asarray(chain)
    lo, hi = tables.bounds()
    hi = max(hi, float(hop_times.max()))
    # Within the budget: at most ``budget`` low-bit layers, whatever the hops (fewer than ``weight``).
    best = _smallest(tables, hop_times, lo, hi, lambda tau: fewest(tau) < (budget + 1) * weight)
    if best is None:
        return None
    relaxed = best / (1.0 - THROUGHPUT_TOLERANCE)
    target = fewest(relaxed)
    tau = best
    if fewest(best) > target:
        tau = _smallest(tables, hop_times, best, relaxed, lambda t: fewest(t) <= target)
    if exact_order:
        stages = _subset_stages(tables, links, tau)
    else:
        _, trace = _ordered_rows(tables, chain, tau, track=True)
        stages = _ordered_stages(tables, trace, tau)
    return Partition(stages, float(tau), int(target // weight))


def _smallest(tables: PriceTables, hop_times: np.ndarray, lo: float, hi: float, ok) -> float | None:
    """Smallest stage or hop time in (lo, hi] for which the monotone predicate holds (None: none).

    ``ok`` changes only at such times. While the window holds more than ``ENUMERATE_LIMIT`` of
    them, bisect it (geometrically: times span orders of magnitude); then binary-search the times
    themselves. Alike layers give many stages the same time, so the count includes repeats.
    """
    while True:
        narrow = hi <= lo * (1.0 + 1e-9)  # only repeats of one time left: list them all
        values = tables.prices_between(lo, hi, None if narrow else ENUMERATE_LIMIT)
        if values is not None:
            within = hop_times[(hop_times > lo) & (hop_times <= hi)]
            return _first(np.unique(np.concatenate([values, within])), ok)
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


# -- fixed order ---------------------------------------------------------------------------------

def _ordered_rows(tables: PriceTables, chain: Sequence[float], tau: float, track: bool):
    """Forward DP over the given order; each device takes one contiguous range or is skipped.
    ``chain[i]``: the hop into device i from device i - 1."""
    n = tables.num_layers + 1
    row = np.full(n, INF)
    row[0] = 0.0
    trace = []
    transitions = tables.transitions(tau)
    for index in range(len(tables.devices)):
        if index == 0:  # nothing before it: its range starts at layer 0
            starts, taken = np.zeros(n, dtype=int), transitions[0][0]
        else:
            source = row
            if chain[index] > tau:
                source = np.full(n, INF)
                source[0] = row[0]
            table = source[:, None] + transitions[index]
            starts = table.argmin(axis=0)
            taken = table[starts, np.arange(n)]
        skipped = row if tables.pins[index] is None else np.full(n, INF)
        use = taken < skipped
        if track:
            trace.append((use, starts))
        row = np.where(use, taken, skipped)
    return row, trace


def _ordered_stages(tables: PriceTables, trace, tau: float) -> tuple[Placement, ...]:
    stages = []
    end = tables.num_layers
    for index in range(len(tables.devices) - 1, -1, -1):
        use, starts = trace[index]
        if end > 0 and use[end]:
            start = int(starts[end])
            stages.append(_placement(tables, index, start, end, tau))
            end = start
    return tuple(reversed(stages))


# -- every order of every subset (Held-Karp) ------------------------------------------------------

def _subset_rows(tables: PriceTables, links: Hops, tau: float, track: bool):
    """DP over (devices used, last device): row[j] = fewest low-bit layers covering [0, j) times
    ``links.weight``, plus the fewest network hops among such plans."""
    count = len(tables.devices)
    n = tables.num_layers + 1
    start_row = np.full(n, INF)
    start_row[0] = 0.0
    transitions = tables.transitions(tau, links.weight)
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
    pinned = sum(1 << d for d in range(count) if tables.pins[d] is not None)
    final = {key: row[-1] for key, row in rows.items() if key[0] & pinned == pinned}
    return final, parents


def _subset_best(tables: PriceTables, links: Hops, tau: float) -> float:
    final, _ = _subset_rows(tables, links, tau, track=False)
    return min(final.values(), default=INF)


def _subset_stages(tables: PriceTables, links: Hops, tau: float) -> tuple[Placement, ...]:
    final, parents = _subset_rows(tables, links, tau, track=True)
    key = min(final, key=lambda k: (final[k], bin(k[0]).count("1"), k))
    stages = []
    end = tables.num_layers
    mask, last = key
    while last >= 0:
        prev_last, starts = parents[(mask, last)]
        start = int(starts[end])
        stages.append(_placement(tables, last, start, end, tau))
        mask, last, end = mask & ~(1 << last), int(prev_last[end]), start
    return tuple(reversed(stages))


def _placement(tables: PriceTables, index: int, start: int, end: int, tau: float) -> Placement:
    """The stage the DP priced: 16 bits if that keeps it within tau (and memory); else the split
    with the fewest low-bit layers, at the highest low precision that needs no more; else the
    highest precision that fits."""
    name = tables.devices[index].name
    within = tau * (1.0 + SLACK)
    full = tables.matrices[index].get(16)
    if full is not None and full[start, end] <= within:
        return Placement(name, start, end, 16)
    splits = tables.splits[index]
    if tables.kl is not None:
        return _least_kl_placement(tables, index, start, end, tau)
    if splits:
        needs = {b: prices.fewest(tau)[start, end] for b, prices in splits.items()}
        fewest = min(needs.values())
        if fewest < end - start:
            low_bits = max(b for b, need in needs.items() if need == fewest)
            return Placement(name, start, end, 16, low_bits, end - int(fewest))
    for b in tables.bits:
        if tables.matrices[index][b][start, end] <= within:
            return Placement(name, start, end, b)
    raise AssertionError("reconstructed a stage that no precision allows")


def _least_kl_placement(tables: PriceTables, index: int, start: int, end: int, tau: float) -> Placement:
    """The measured form of :func:`_placement`: the option with the least KL, as ``_kl_transitions``
    priced it (the higher precision on a tie)."""
    name, splits, options = tables.devices[index].name, tables.splits[index], []
    for b, prefix in tables.kl.items():
        if splits:
            tail = splits[b].fewest(tau)[start, end]
            if np.isfinite(tail):
                low_from = end - int(tail)
                stage = (Placement(name, start, end, b) if low_from == start
                         else Placement(name, start, end, 16) if low_from == end
                         else Placement(name, start, end, 16, b, low_from))
                options.append((prefix[end] - prefix[low_from], -b, stage))
        elif b in tables.matrices[index] and tables.matrices[index][b][start, end] <= tau:
            options.append((prefix[end] - prefix[start], -b, Placement(name, start, end, b)))
    if not options:
        raise AssertionError("reconstructed a stage that no precision allows")
    return min(options, key=lambda o: o[:2])[2]
