"""The chain search: the partition with the least sum of stage times and hops (one micro-batch).

With a single micro-batch the pipeline is a chain: a token's round is the sum of every stage's step
and every hop. ``sum_partition`` minimises that sum over the given order, where a device may be
skipped. A dynamic programme over (last device used, layer boundary, low-bit layers so far, at most
the budget) is exact: a plan's sum adds up along the chain, and the state holds all that the rest of
the plan depends on (the last device sets the next hop, the count what the budget still allows).
Each stage takes 16 bits or the fastest low precision (one precision per stage). Among minimal plans
it returns one with the fewest low-bit layers.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel
from controlplane.planning.plan import Placement
from controlplane.planning.price_tables import INF, Hops, Partition, PriceTables, price_tables


def sum_partition(cost: CostModel, devices: Sequence[DeviceSpec], micro_batch: float, budget: int,
                  bits: Sequence[int], pins: dict[str, tuple[int, int]] | None = None) -> Partition | None:
    """Minimal sum of stage times and hops over the given order (see module doc), with the fewest
    low-bit layers among minimal plans; None when nothing fits within the budget."""
    tables = price_tables(cost, devices, sorted(bits, reverse=True), micro_batch, pins or {}, splits=False)
    hop_s = Hops(cost, devices, micro_batch).seconds
    floors = _pinned_before(tables)
    values = _chain_values(tables, hop_s, floors, min(budget, tables.num_layers))
    first_last = max(floors[-1], 0)  # the last stage is on the last pinned device or after it
    ends = values[first_last:, :, -1]  # [last device, low-bit layers]
    best = float(ends.min())
    if not np.isfinite(best):
        return None
    count = int(np.flatnonzero((ends == best).any(axis=0))[0])
    last = first_last + int(ends[:, count].argmin())
    return Partition(_chain_stages(tables, values, hop_s, floors, last, count), best, count)


def _pinned_before(tables: PriceTables) -> list[int]:
    """Per device, and once more past the last: the last pinned device before it (-1: none). A
    pinned device cannot be skipped, so no stage hands over from a device earlier than that."""
    floors, last = [], -1
    for index, pin in enumerate(tables.pins):
        floors.append(last)
        if pin is not None:
            last = index
    return floors + [last]


def _chain_values(tables: PriceTables, hop_s: np.ndarray, floors: list[int], budget: int) -> np.ndarray:
    """V[k, c, j] = least sum of stage times and hops that covers [0, j) with exactly c low-bit
    layers and ends with a stage on device k (inf: none). The last device used is part of the state
    because the hop into the next stage depends on it, whichever devices were skipped between."""
    count, n = len(tables.devices), tables.num_layers + 1
    values = np.full((count, budget + 1, n), INF)
    bands: dict[tuple[int, int], np.ndarray] = {}  # alike devices share their price matrices
    for device in range(count):
        entry = _chain_entry(values, hop_s, floors[device], device)
        for matrix, counted in ((tables.full[device], 0), (tables.low[device], 1)):
            key = (id(matrix), counted)
            if key not in bands:
                bands[key] = _band(matrix, min(_longest(matrix), budget if counted else n))
            band = bands[key]
            if len(band):
                reached = (_windows(entry, len(band), counted) + band).min(axis=1)
                values[device] = np.minimum(values[device], reached)
    return values


def _chain_entry(values: np.ndarray, hop_s: np.ndarray, floor: int, device: int) -> np.ndarray:
    """E[c, i] = least time to cover [0, i) with c low-bit layers and hand layer i to ``device``:
    the best previous last device plus its hop, or the start (i = 0) when no pinned device must
    come first."""
    low = max(floor, 0)
    if low < device:
        entry = (values[low:device] + hop_s[low:device, device, None, None]).min(axis=0)
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


def _chain_stages(tables: PriceTables, values: np.ndarray, hop_s: np.ndarray, floors: list[int], last: int,
                  count: int) -> tuple[Placement, ...]:
    """Walks the DP back from (last device, count, all layers), redoing each state's minimum."""
    stages = []
    device, end = last, tables.num_layers
    while end > 0:
        entry = _chain_entry(values, hop_s, floors[device], device)
        start, bits = _chain_stage(tables, entry, device, count, end)
        stages.append(Placement(tables.devices[device].name, start, end, bits))
        count -= (end - start) * (bits < 16)
        end = start
        if end > 0:
            low = max(floors[device], 0)
            device = low + int((values[low:device, count, end] + hop_s[low:device, device]).argmin())
    return tuple(reversed(stages))


def _chain_stage(tables: PriceTables, entry: np.ndarray, device: int, count: int,
                 end: int) -> tuple[int, int]:
    """The start and precision of the stage ending at ``end`` on ``device`` that reaches ``count``
    low-bit layers the fastest: 16 bits on a tie, else the highest low precision as fast as any."""
    starts = np.arange(end)
    full = entry[count, :end] + tables.full[device][:end, end]
    before = count - (end - starts)
    low = np.where(before >= 0, entry[np.maximum(before, 0), starts] + tables.low[device][:end, end], INF)
    if full.min() <= low.min():
        return int(full.argmin()), 16
    start = int(low.argmin())
    fastest = tables.low[device][start, end]
    return start, next(b for b in tables.bits
                       if b < 16 and tables.matrices[device][b][start, end] == fastest)
