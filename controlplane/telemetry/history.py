"""The recent history of one GPU or stage, as the hub keeps it in memory: rows of (time, one value per
field), oldest first, in two flat arrays of doubles, one of times and one of values.

A deque holding one small array per row made every sample an object the garbage collector tracks:
at 10,000 GPUs and five minutes of history that was three million objects, and each full collection
over them stopped the server's event loop for most of a second, every socket with it. Flat arrays are
two objects however many rows they hold; rows older than the window are dropped from their front in
bulk, once they are half of them, so appending stays cheap, and rows are found by bisecting the
times (the server's clock stamps them in the order they arrive).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable

# Rows dropped from the front are cut out once there are this many or more and they are half the
# arrays: a memmove per this many appends at most.
_COMPACT_ROWS = 64


class Series:
    """Rows of a time and ``fields`` values each (NaN for a gap)."""

    __slots__ = ("_fields", "_start", "_times", "_values")

    def __init__(self, fields: int):
        self._fields = fields
        self._times = array("d")
        self._values = array("d")
        self._start = 0  # the oldest row kept

    def __len__(self) -> int:
        return len(self._times) - self._start

    def append(self, t: float, values: Iterable[float]) -> None:
        self._times.append(t)
        self._values.extend(values)

    def drop_before(self, t: float) -> None:
        """Forget the rows older than ``t``."""
        self._start = bisect_left(self._times, t, self._start)
        if self._start >= _COMPACT_ROWS and 2 * self._start >= len(self._times):
            del self._times[:self._start]
            del self._values[:self._start * self._fields]
            self._start = 0

    def columns_between(self, start: float, end: float) -> list[list[float]]:
        """The rows from ``start`` until ``end`` (excluded), as columns: times, then each field's."""
        first = bisect_left(self._times, start, self._start)
        last = bisect_left(self._times, end, first)
        block, width = self._values[first * self._fields:last * self._fields], self._fields
        return [self._times[first:last].tolist(), *(block[c::width].tolist() for c in range(width))]
