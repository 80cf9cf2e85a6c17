"""Stages that hold their last layers below 16 bits: the fewest such layers for a step time.

A stage [i, j) may run its last k layers (and its head, on the last stage) at a low precision and
the rest at 16 bits, so one card can spend part of the quality budget. The partition search asks,
for a candidate bottleneck tau, how few low-bit layers each [i, j) needs to finish its step within
tau; pricing every k of every [i, j) (n^3 figures) at every tau would dominate planning, so this
answers from the structure of the cost model instead:

with k >= 1 layers low, a step reads R(i, j) - (D[j] - D[j - k]) bytes, R being [i, j) at 16 bits
with a low-bit head plus its KV, and D the prefix sums of what each layer saves at low precision.
D never decreases, so the smallest k that brings the bytes within what tau leaves after overheads
is one ``searchsorted`` per [i, j); memory (weights + KV + workspace within capacity) is a second
byte bound of the same form, without tau. Which layers are low is fixed (the stage's last ones),
so on models whose layers differ in size the search is exact over plans of that shape.

``between`` lists the step times that such stages can have in a window of tau, for the search's
exact finish (the optimum bottleneck is one of them); it counts them first and declines when
there are too many, and the search narrows the window by bisection until there are not.
"""

from __future__ import annotations

import functools

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel

INF = float("inf")
# A stage within tau * (1 + SLACK) counts as within tau: the byte bound and the stage's priced time
# are the same figure computed in different orders, and may differ in the last bits.
SLACK = 1e-12
UNBOUNDED = 1e300  # a step time no stage reaches (finite, so the byte bounds stay finite)


class SplitPrices:
    """For one device, low precision and micro-batch. ``ends_only``: only ranges that start at the
    first layer or end at the last are priced (all a search over one or two devices can use)."""

    def __init__(self, cost: CostModel, device: DeviceSpec, low_bits: int, micro_batch: float,
                 pin: tuple[int, int] | None = None, ends_only: bool = False) -> None:
        self.cost, self.device, self.low_bits, self.micro_batch = cost, device, low_bits, micro_batch
        n = self.size = cost.num_layers + 1
        starts, ends = np.arange(n)[:, None], np.arange(n)[None, :]
        allowed = np.broadcast_to(ends > starts, (n, n)).copy()
        if ends_only:
            allowed &= (starts == 0) | (ends == cost.num_layers)
        if pin is not None:
            allowed[:] = False
            allowed[pin] = True
        self.cells = np.flatnonzero(allowed)  # the ranges [i, j) considered, flattened
        figures = cost.stage_figures(device, micro_batch, low_bits)
        self.slowdown, self.bandwidth = figures.slowdown, figures.bandwidth
        head_saving = (cost.head_bytes[16] - cost.head_bytes[low_bits]) * (ends == cost.num_layers)

        def flat(matrix) -> np.ndarray:
            return np.broadcast_to(matrix, (n, n)).ravel()[self.cells]

        self.starts, self.ends = flat(starts), flat(ends)
        self.saved = cost.weights[16] - cost.weights[low_bits]  # D: prefix sums of per-layer savings
        # With k >= 1 layers low the head is low too. Per range, D[j - k] may be at most
        # D[j] - (bytes read + overhead in bytes - bytes tau allows), and at most D[j] - (bytes kept
        # beyond capacity): ``read_room`` + tau's bytes, and ``memory_room``.
        saved_by_end = self.saved[self.ends]
        self.read_room = saved_by_end - flat(figures.read_bytes - head_saving
                                             + figures.overhead_s * self.bandwidth)
        self.memory_room = saved_by_end - flat(figures.excess_bytes - head_saving)
        self.compute_s = flat(figures.compute_s + figures.overhead_s)  # FLOP seconds plus overhead
        self.full = flat(cost.decode_matrix(device, 16, micro_batch))  # the 16-bit step time
        self._recent: dict[float, np.ndarray] = {}

    def fewest(self, tau: float) -> np.ndarray:
        """F[i, j] = fewest low-bit layers for [i, j) to finish a step within tau (0: all at 16
        bits; inf: no k does, or the range is not considered). Read-only; the last few are kept,
        as the search asks for the same tau more than once."""
        if tau in self._recent:
            return self._recent[tau]
        seconds = tau * (1.0 + SLACK) / self.slowdown  # for max(memory, compute) plus overhead
        room = np.minimum(self.read_room + seconds * self.bandwidth, self.memory_room)
        split = np.searchsorted(self.saved, room, side="right") - 1  # the first low layer: as late as can be
        counts = np.where((self.compute_s <= seconds) & (split >= self.starts),
                          np.maximum(self.ends - split, 1), INF)
        result = np.full(self.size * self.size, INF)
        result[self.cells] = np.where(self.full <= tau, 0.0, counts)
        result = result.reshape(self.size, self.size)
        result.setflags(write=False)
        if len(self._recent) >= 8:
            self._recent.pop(next(iter(self._recent)))
        self._recent[tau] = result
        return result

    @functools.cached_property
    def slowest(self) -> float:
        """The longest step a stage of this device can take: each range with as few low-bit layers
        as fit in memory (with none fitting at 16 bits, it can be longer than any one-precision stage)."""
        fewest = self.fewest(UNBOUNDED).ravel()[self.cells]
        fits = np.isfinite(fewest)
        times = self.cost.split_times(self.device, self.low_bits, self.micro_batch, self.starts[fits],
                                      self.ends[fits], fewest[fits].astype(int))
        return float(times[np.isfinite(times)].max(initial=0.0))

    def between(self, lo: float, hi: float, limit: int | None) -> np.ndarray | None:
        """Every step time in (lo, hi] a stage of this device can have (with repeats), or None if
        more than ``limit``."""
        upper = self.fewest(lo).ravel()[self.cells]
        lower = self.fewest(hi).ravel()[self.cells]
        upper = np.minimum(upper, self.ends - self.starts + 1)  # k below this: slower than lo
        counts = np.where(np.isfinite(lower), np.maximum(upper - lower, 0), 0).astype(int)
        total = int(counts.sum())
        if limit is not None and total > limit:
            return None
        which = np.flatnonzero(counts)
        repeats = counts[which]
        offsets = np.arange(total) - np.repeat(np.cumsum(repeats) - repeats, repeats)
        low = lower[which].astype(int).repeat(repeats) + offsets
        starts, ends = self.starts[which].repeat(repeats), self.ends[which].repeat(repeats)
        times = self.cost.split_times(self.device, self.low_bits, self.micro_batch, starts, ends, low)
        return times[np.isfinite(times) & (times > lo) & (times <= hi)]
