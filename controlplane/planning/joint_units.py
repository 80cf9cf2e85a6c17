"""The units of the joint search (joint.py): a card or a tensor-parallel group, and every stage it can
take, priced once per request for every unit of alike cards (``signature``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel, device_key
from controlplane.planning.mixed_ranks import lowest_matrix, lowest_placement
from controlplane.planning.plan import Placement
from controlplane.planning.tensor_parallel import (
    group_link,
    group_matrix,
    group_placement,
    group_split_matrix,
    split_cells,
)

INF = float("inf")


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

    def pinned(self, start: int, end: int) -> Unit:
        """Only its stages of [start, end): the unit's first card is pinned to that range."""
        keep = (self.starts == start) & (self.ends == end)
        arrays = (self.starts, self.splits, self.ends, self.low_bits, self.seconds, self.spent)
        return Unit(self.devices, self.bits, *(a[keep] for a in arrays))

    @functools.cached_property
    def rate(self) -> float:
        """The least seconds per layer of any of its stages: no stage of it is faster per layer."""
        return float((self.seconds / (self.ends - self.starts)).min(initial=INF))


def low_prices(cost: CostModel, devices: tuple[DeviceSpec, ...], low: int, micro_batch: float) -> np.ndarray:
    """Per (i, s, j) of ``split_cells``: [i, s) at 16 bits, [s, j) at ``low``."""
    if len(devices) > 1:
        return group_split_matrix(cost, devices, low, micro_batch)
    i, s, j = np.unravel_index(split_cells(cost.num_layers), (cost.num_layers + 1,) * 3)
    return cost.split_times(devices[0], low, micro_batch, i, j, j - s)


def unit_of(cost: CostModel, devices: tuple[DeviceSpec, ...], bits: Sequence[int], micro_batch: float,
          budget: int) -> Unit:
    """The unit's stages, priced once per request for every unit of alike cards (``signature``)."""
    key = ("joint unit", signature(cost, devices), tuple(bits), micro_batch, budget)
    return Unit(devices, tuple(bits), *cost.remember(key, lambda: _stages(cost, devices, bits, micro_batch,
                                                                          budget)))


def signature(cost: CostModel, devices: tuple[DeviceSpec, ...]) -> tuple:
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
        low[:len(cells)] = low_prices(cost, devices, b, micro_batch)
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


def stage_placement(cost: CostModel, unit: Unit, start: int, split: int, end: int, low: int,
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
