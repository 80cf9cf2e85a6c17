"""Live telemetry for browsers: one subscriber per server process, snapshots rendered once.

Agents push a heartbeat every second on ``/ws/agents/``; the agents' socket publishes each
heartbeat's sample to the channel-layer group ``telemetry`` as it arrives (``services.py``). One
``TelemetryHub`` per process joins that group (one subscription, however many browsers are open),
keeps the latest sample of every GPU and stage and the last few minutes of history in memory, and
renders the snapshot text at most once per change.
Browser sockets (``controlplane/dashboard/consumers.py``) each take the current text at their own
pace, so the cost of a heartbeat does not grow with the number of browsers and a slow browser only
skips snapshots.

Every ``MOTLEY_TELEMETRY_ROLLUP_S`` the hub closes the rollup buckets that ended and hands them to the
store it was started with (mean and peak per field); ``runtime.py`` starts this process's hub with
``rollups.rollups_store``, which keeps them in the database for the "last hour" views. This module
imports neither Django nor the store: the shapes it shares with them are in ``schema.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from contracts.metrics import GPU_FIELDS, STAGE_FIELDS
from contracts.names import device_name
from controlplane.telemetry.schema import FIELDS, GROUP, Rollup

logger = logging.getLogger(__name__)

_MISSING = float("nan")


class _Bucket:
    __slots__ = ("count", "peaks", "seen", "start", "sums")

    def __init__(self, start: float, width: int):
        self.start, self.count = start, 0
        self.sums, self.peaks, self.seen = [0.0] * width, [float("-inf")] * width, [0] * width


class TelemetryHub:
    """Latest samples, recent history and open rollup buckets of every GPU and stage."""

    def __init__(self, *, history_s: float = 300, rollup_s: int = 10, clock: Callable[[], float] = time.time):
        self.history_s, self.rollup_s, self.clock = history_s, rollup_s, clock
        self.devices: dict[str, dict[str, Any]] = {}
        self.stages: dict[str, dict[str, Any]] = {}
        self.history: dict[tuple[str, str], deque[array]] = {}
        self.version = 0
        self._rendered: tuple[int, str] = (-1, "")
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._closed: list[Rollup] = []
        self._tasks: list[asyncio.Task] = []  # held: the loop keeps only weak references to tasks
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.Event | None = None  # set (and replaced) at each snapshot tick
        self._ticked: tuple[int, str] = (-1, "")
        self._tick_waiting = 0
        self.renders = 0

    # -- ingest ---------------------------------------------------------------------------------
    def ingest(self, message: Mapping[str, Any]) -> None:
        """Take one published message; anything malformed is skipped, not raised.

        ``services.telemetry_message`` is the one shape published: ``{"type": "telemetry.sample",
        "sample": {"node_id", "node", "received_at", "sent_at", "devices": [GpuMetrics], "stages":
        [StageStatus less pid, exit_code, restarts, message]}}``, one message per heartbeat (contracts
        §3), so every message is news.
        """
        sample = message.get("sample")
        if isinstance(sample, Mapping):
            self._ingest_sample(sample)
            self.version += 1

    def _ingest_sample(self, sample: Mapping[str, Any]) -> None:
        node = sample.get("node")
        t = _number(sample.get("received_at"), self.clock())
        sent_at = _number(sample.get("sent_at"), t)
        for metrics in sample.get("devices") or ():
            try:
                name = device_name(node, int(metrics["index"]))
            except (KeyError, TypeError, ValueError):
                continue
            values = [_number(metrics.get(f)) for f in GPU_FIELDS]
            # Two decimals are plenty on a screen and keep a 1,000-GPU snapshot small.
            self.devices[name] = {"t": t, "sent_at": sent_at, "node": node, **_present(GPU_FIELDS, values, 2),
                                  "throttle": list(metrics.get("throttle_reasons") or ())}
            self._record("device", name, t, values)
        for status in sample.get("stages") or ():
            if not isinstance(status, Mapping) or not status.get("stage_key"):
                continue
            stats = status.get("stats") if isinstance(status.get("stats"), Mapping) else {}
            values = [_number(stats.get(f)) for f in STAGE_FIELDS]
            key = str(status["stage_key"])
            self.stages[key] = {
                "t": t, "sent_at": sent_at, "node": node, "state": status.get("state"),
                **{k: status.get(k) for k in ("deployment_id", "replica", "stage_index")},
                **_present(STAGE_FIELDS, values),
            }
            if stats:
                self._record("stage", key, t, values)

    def _record(self, kind: str, key: str, now: float, values: list[float]) -> None:
        ring = self.history.get((kind, key))
        if ring is None:
            ring = self.history[(kind, key)] = deque()
        ring.append(array("d", [now, *values]))
        while ring and ring[0][0] < now - self.history_s:
            ring.popleft()
        start = now - now % self.rollup_s
        bucket = self._buckets.get((kind, key))
        if bucket is None or bucket.start != start:
            if bucket is not None:
                self._closed.append(_close(kind, key, bucket, self.rollup_s))
            bucket = self._buckets[(kind, key)] = _Bucket(start, len(values))
        bucket.count += 1
        for i, value in enumerate(values):
            if value == value:  # not NaN
                bucket.sums[i] += value
                bucket.seen[i] += 1
                bucket.peaks[i] = max(bucket.peaks[i], value)

    # -- reads ----------------------------------------------------------------------------------
    def snapshot_text(self) -> str:
        """The full current state as one JSON text, rendered once per change whoever asks."""
        version, text = self._rendered
        if version != self.version:
            version = self.version
            text = json.dumps({"type": "snapshot", "version": version, "at": self.clock(),
                               "devices": self.devices, "stages": self.stages}, separators=(",", ":"))
            self._rendered = (version, text)
            self.renders += 1
        return text

    @property
    def ticked(self) -> tuple[int, str]:
        """The snapshot (version, text) of the latest tick."""
        return self._ticked

    async def next_snapshot(self, interval_s: float) -> tuple[int, str]:
        """The snapshot (version, text) of the next tick: one render per tick for every socket.

        Ticks come every ``interval_s`` (the first caller's) while sockets wait; the browser sockets
        all wake on the same tick and send the same text, so rendering costs at most one
        ``json.dumps`` per tick (none if nothing changed) however many browsers are open.
        """
        if self._tick is None:
            self._tick = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._ticks(interval_s), name="telemetry-hub-ticks"))
        tick = self._tick
        self._tick_waiting += 1
        try:
            await tick.wait()
        finally:
            self._tick_waiting -= 1
        return self._ticked

    async def _ticks(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if self._tick_waiting:  # a socket acked since the last tick may want the same text
                self._ticked = (self.version, self.snapshot_text())
                tick, self._tick = self._tick, asyncio.Event()
                tick.set()

    def recent(
        self, kind: str, keys: Iterable[str] | None = None, since_s: float | None = None
    ) -> dict[str, Any]:
        """History from memory as columns per key: ``{"t": [...], field: [...]}`` (None for gaps)."""
        fields = FIELDS[kind]
        since = self.clock() - (since_s or self.history_s)
        wanted = None if keys is None else set(keys)
        series: dict[str, Any] = {}
        for (k, key), ring in list(self.history.items()):
            if k != kind or (wanted is not None and key not in wanted):
                continue
            rows = [row for row in list(ring) if row[0] >= since]
            series[key] = {"t": [row[0] for row in rows]} | {
                f: [_or_none(row[i + 1]) for row in rows] for i, f in enumerate(fields)
            }
        return series

    def take_closed_rollups(self, *, flush_all: bool = False) -> list[Rollup]:
        """Buckets that ended (and, with ``flush_all``, the open ones too), each returned once."""
        now = self.clock()
        for (kind, key), bucket in list(self._buckets.items()):
            if flush_all or bucket.start + self.rollup_s <= now:
                self._closed.append(_close(kind, key, bucket, self.rollup_s))
                del self._buckets[(kind, key)]
        closed, self._closed = self._closed, []
        return closed

    # -- running inside a server process --------------------------------------------------------
    def start(self, layer, store: Callable[[list[Rollup]], Any] | None) -> None:
        """Subscribe to the telemetry group and flush rollups to ``store`` (an async callable)."""
        self.loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._receive(layer), name="telemetry-hub-receive"),
                       asyncio.create_task(self._flush(layer, store), name="telemetry-hub-flush")]

    async def _receive(self, layer) -> None:
        self.channel = await layer.new_channel()
        await layer.group_add(GROUP, self.channel)
        while True:
            message = await layer.receive(self.channel)
            try:
                self.ingest(message)
            except Exception:  # one bad message must not stop live telemetry for every browser
                logger.exception("telemetry hub: could not ingest a message")

    async def _flush(self, layer, store) -> None:
        while True:
            await asyncio.sleep(self.rollup_s)
            if getattr(self, "channel", None):  # stay subscribed past the layer's group expiry
                await layer.group_add(GROUP, self.channel)
            rollups = self.take_closed_rollups()
            if rollups and store is not None:
                try:
                    await store(rollups)
                except Exception:
                    logger.exception("telemetry hub: could not store %d rollups", len(rollups))


def _close(kind: str, key: str, bucket: _Bucket, seconds: int) -> Rollup:
    fields = FIELDS[kind]
    mean = {f: bucket.sums[i] / bucket.seen[i] for i, f in enumerate(fields) if bucket.seen[i]}
    peak = {f: bucket.peaks[i] for i, f in enumerate(fields) if bucket.seen[i]}
    return Rollup(kind, key, bucket.start, seconds, bucket.count, mean, peak)


def _number(value: Any, default: float = _MISSING) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return number if number == number and number not in (float("inf"), float("-inf")) else default


def _or_none(value: float) -> float | None:
    """NaN (a field the sample lacked) as JSON null."""
    return None if value != value else value


def _present(fields: tuple[str, ...], values: list[float], digits: int | None = None) -> dict[str, float]:
    return {f: (v if digits is None else round(v, digits)) for f, v in zip(fields, values) if v == v}
