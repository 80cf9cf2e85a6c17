"""The prices the partition searches read: per device, every stage's step time, and every hop.

Both searches (``bottleneck`` and ``chain``) run dynamic programmes over layer boundaries whose
steps are table look-ups, never calls into the cost model: this module builds those tables once per
search from ``CostModel``'s matrices (one per device and precision, shared by alike devices and
pins) and ``SplitPrices`` (stages that run their last layers at a low precision), and prices the
hops between every two devices of the group.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel, device_key
from controlplane.planning.plan import Placement
from controlplane.planning.quality_budget import low_bit_cost
from controlplane.planning.split_prices import SplitPrices

INF = float("inf")


@dataclass(frozen=True)
class Partition:
    """What a search returns: the stages of one replica and what the search minimised."""

    stages: tuple[Placement, ...]
    objective_s: float  # what the search minimised: the bottleneck, or the sum of stage times and hops
    quantized: int


@dataclass(frozen=True)
class PriceTables:
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
    kl: dict[int, np.ndarray] | None = None  # measured budget: per low precision, KL prefix sums in units


    def transitions(self, tau: float, weight: float = 1.0) -> list[np.ndarray]:
        """Per device, T[i, j] = fewest low-bit layers for it to take [i, j) within tau (inf: cannot),
        times ``weight``: a weight above any count of network hops lets the exact search add the hops
        to the same value and still rank every low-bit layer above them.

        With splits, the lowest precision needs the fewest (it saves the most bytes per layer), unless
        calibration measured it slower than a higher one (``fastest_splits``). Devices with the same
        prices share one array, so alike cards cost one computation.
        """
        if self.kl is not None:
            return self._kl_transitions(tau, weight)
        lengths = low_bit_cost(4, self.num_layers + 1)
        shared: dict[tuple[int, ...], np.ndarray] = {}
        result = []
        for full, low, splits in zip(self.full, self.low, self.splits):
            key = (id(full), id(low), *map(id, splits.values()))
            if key not in shared:
                if splits:
                    first, *others = fastest_splits(splits)
                    fewest = first.fewest(tau)
                    for other in others:
                        fewest = np.minimum(fewest, other.fewest(tau))
                    shared[key] = fewest * weight
                else:
                    shared[key] = np.where(full <= tau, 0.0, np.where(low <= tau, lengths * weight, INF))
            result.append(shared[key])
        return result

    def _kl_transitions(self, tau: float, weight: float) -> list[np.ndarray]:
        """The measured form of :meth:`transitions`: T[i, j] = least measured KL (units) for the device
        to take [i, j) within tau, times ``weight``. A stage's low layers are its last ones, and KL
        only grows with the tail, so per precision the fewest low layers are also the least KL; the
        least over the precisions (not only the fastest) is the stage's cost."""
        n = self.num_layers + 1
        starts, ends = np.arange(n)[:, None], np.arange(n)[None, :]
        shared: dict[tuple[int, ...], np.ndarray] = {}
        result = []
        for full, matrices, splits in zip(self.full, self.matrices, self.splits):
            key = (id(full), *map(id, matrices.values()), *map(id, splits.values()))
            if key not in shared:
                cost = np.where(full <= tau, 0.0, INF)
                for b, prefix in self.kl.items():
                    if splits:
                        tail = splits[b].fewest(tau)
                        low_from = np.maximum(ends - np.where(np.isfinite(tail), tail, 0), 0).astype(int)
                        spent = prefix[ends] - prefix[low_from]
                        cost = np.minimum(cost, np.where(np.isfinite(tail), spent, INF))
                    elif b in matrices:
                        spent = prefix[ends] - prefix[starts]
                        cost = np.minimum(cost, np.where(matrices[b] <= tau, spent, INF))
                shared[key] = cost * weight
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
        for full, low, splits, matrices in zip(self.full, self.low, self.splits, self.matrices):
            if self.kl is not None:  # measured: any precision's stage can be the least KL within tau
                sources = list(splits.values()) if splits else [full, *matrices.values()]
            else:
                sources = fastest_splits(splits) if splits else [full, low]
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


def fastest_splits(splits: dict[int, SplitPrices]) -> list[SplitPrices]:
    """The split prices that can need the fewest low-bit layers: the lowest precision (it saves the
    most bytes per layer), and a higher one only where calibration measured it faster (a smaller
    factor) than every precision below it. Uncalibrated, just the lowest."""
    found: list[SplitPrices] = []
    for bits in sorted(splits):
        if not found or splits[bits].slowdown < min(p.slowdown for p in found):
            found.append(splits[bits])
    return found


def price_tables(cost: CostModel, devices: Sequence[DeviceSpec], bits: Sequence[int], micro_batch: float,
                 pins: dict[str, tuple[int, int]], splits: bool = True,
                 kl: dict[int, np.ndarray] | None = None) -> PriceTables:
    """The tables of one search over ``devices`` (``bits`` highest first); a pinned device can take
    only its pinned range. ``splits``: price stages that mix 16 bits and a low precision too.
    ``kl``: the measured budget's KL prefix sums (``quality_budget.kl_prefix_units``)."""
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
    return PriceTables(tuple(devices), tuple(bits), tuple(matrices), tuple(full), tuple(low),
                       tuple(split_prices), tuple(pins.get(d.name) for d in devices), cost.num_layers, kl)


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


class Hops:
    """Between every two devices of a search: ``seconds[a, b]``, the hop of a micro-batch's hidden
    states from a to b (0 on the diagonal), and ``crossings[a, b]``, whether it crosses the network
    (1 or 0; priced on first use: only the Held-Karp search reads it). Every pair is priced once per
    search: the DPs ask about each (last, next) pair many times."""

    def __init__(self, cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float) -> None:
        self._cost, self._devices = cost, tuple(devices)
        self.seconds = self._pairs(lambda a, b: cost.hop_s(a, b, micro_batch))

    @functools.cached_property
    def crossings(self) -> np.ndarray:
        return self._pairs(self._cost.crosses_network)

    @property
    def weight(self) -> float:
        """What one low-bit layer counts in the exact search's value: more than all hops together."""
        return float(len(self.seconds))

    def _pairs(self, price) -> np.ndarray:
        """P[a, b] = price(device a, device b) for a != b, 0 on the diagonal."""
        count = len(self._devices)
        table = np.zeros((count, count))
        for a in range(count):
            for b in range(count):
                if a != b:
                    table[a, b] = price(self._devices[a], self._devices[b])
        return table
