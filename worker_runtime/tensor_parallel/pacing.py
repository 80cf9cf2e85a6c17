"""Emulation pacing of a tensor-parallel rank: its share's compute paced as its emulated card's, its
collectives left at the real link's time.

A shard is a :class:`~worker_runtime.stage.Stage` of its share's shape (its heads, its MLP columns), so
the stage :class:`~worker_runtime.pacing.Pacer` built on it already models the share's bytes and FLOPs.
What a shard adds is time that is no compute: its all-reduces and broadcast, which wait on the link
and on the slowest rank. :class:`TimedGroup` adds up their wall time, and :class:`ShardPacer` paces
what is left of a step (its compute) to the modeled time, so a group's step comes out as the cost
model composes it: the slowest rank's modeled share, plus the collectives (controlplane/planning/
tensor_parallel.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from contracts.stage_spec import Emulation

from ..pacing import Pacer
from ..stage import Batch
from .shard import StageShard


class TimedGroup:
    """A :class:`~.group.ShardGroup` (or anything with its collectives) whose collectives add up their
    wall time in ``seconds``; ``count`` of them."""

    def __init__(self, group):
        self.group = group
        self.seconds = 0.0
        self.count = 0

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def size(self) -> int:
        return self.group.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self._timed(self.group.all_reduce, x)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        return self._timed(self.group.broadcast, x)

    def _timed(self, collective, x: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        try:
            return collective(x)
        finally:
            self.seconds += time.perf_counter() - started
            self.count += 1


class ShardPacer:
    """Sleeps out each step of a shard to its share's modeled time on the emulated card, the step's
    collectives not counted as compute. The shard's ``group`` must be a :class:`TimedGroup`."""

    def __init__(self, shard: StageShard, emulation: Emulation, clock: Callable[[], float] = time.monotonic):
        if not isinstance(shard.group, TimedGroup):
            raise TypeError("ShardPacer needs a shard built with a TimedGroup (its collectives' time)")
        self.pacer = Pacer(shard, emulation, clock)
        self.group = shard.group
        self._mark = self.group.seconds

    def modeled_s(self, batch: Batch) -> float:
        """Seconds the emulated card needs for this rank's share of ``batch`` (``Pacer.modeled_s``)."""
        return self.pacer.modeled_s(batch)

    def pace(self, batch: Batch, elapsed_s: float) -> float:
        """Sleep whatever of the share's modeled time the step's compute did not take: ``elapsed_s``
        less the collectives' time since the last call. Returns the seconds slept."""
        collectives = self.group.seconds - self._mark
        self._mark = self.group.seconds
        return self.pacer.pace(batch, max(0.0, elapsed_s - collectives))
