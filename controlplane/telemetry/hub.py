"""Live telemetry for browsers: one subscriber per server process, snapshots rendered once.

Agents push a heartbeat every second on ``/ws/agents/``; the agents' socket publishes each
heartbeat's sample to the channel-layer group ``telemetry`` as it arrives (``services.py``). One
``TelemetryHub`` per process joins that group (one subscription, however many browsers are open),
keeps the latest sample of every GPU and stage and the last few minutes of history in memory, and
remembers, per node, the version at which its figures last changed and which of its GPUs and stages
went away (``NodeState``, tombstones), so that ``frames.py`` can render the frames browsers are sent
(a snapshot, or a delta from the version a browser holds, of the nodes it shows) once per tick for
every socket that wants the same. Browser sockets (``controlplane/dashboard/consumers.py``) each take
frames at their own pace, so the cost of a heartbeat does not grow with the number of browsers and a
slow browser only skips ticks.

Every ``MOTLEY_TELEMETRY_ROLLUP_S`` the hub closes the rollup buckets that ended and hands them to the
store it was started with (mean and peak per field); ``runtime.py`` starts this process's hub with
``rollups.rollups_store``, which keeps them in the database for the "last hour" views. This module
imports neither Django nor the store: the shapes it shares with them are in ``schema.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from contracts.metrics import GPU_FIELDS, SLOWDOWN_REASONS, STAGE_FIELDS
from contracts.names import device_name
from controlplane.telemetry.frames import Frames, Subscription
from controlplane.telemetry.history import Series
from controlplane.telemetry.schema import FIELDS, GROUP, Rollup

logger = logging.getLogger(__name__)

_MISSING = float("nan")
# How long a removed GPU or stage is remembered: a browser holding a version older than the oldest
# tombstone forgotten is sent a full snapshot instead of a delta.
TOMBSTONE_KEEP_S = 60.0
# How many of a node's earlier samples a delta can patch against: a browser a few seconds behind (a
# busy server, a slow page) still gets its GPUs as patches rather than whole, so a late delta stays
# the size of a delta instead of nearly a snapshot's, which would make it later still.
PAST_KEPT = 4


class NodeState:
    """What the latest sample of one node holds, the hub version at which that last changed, and its
    GPUs' entries at each of its last ``PAST_KEPT`` earlier versions (oldest first), which a delta
    patches field by field for a browser that holds one of them."""

    __slots__ = ("devices", "past", "stages", "throttled", "version")

    def __init__(self) -> None:
        self.version, self.throttled = 0, 0
        self.devices: tuple[str, ...] = ()
        self.past: deque[tuple[int, dict[str, dict[str, Any]]]] = deque(maxlen=PAST_KEPT)
        self.stages: set[str] = set()

    def changed(self, version: int, before: dict[str, dict[str, Any]]) -> None:
        self.past.append((self.version, before))
        self.version = version

    def held_at(self, since: int) -> tuple[int, dict[str, dict[str, Any]]] | None:
        """Which of the kept earlier versions, with its entries, a browser holding hub version
        ``since`` has of this node (the newest not after it), or None when it is older than all."""
        for held in reversed(self.past):
            if held[0] <= since:
                return held
        return None


class TelemetryHub:
    """Latest samples, recent history and open rollup buckets of every GPU and stage."""

    def __init__(self, *, history_s: float = 300, rollup_s: int = 10, clock: Callable[[], float] = time.time):
        self.history_s, self.rollup_s, self.clock = history_s, rollup_s, clock
        self.devices: dict[str, dict[str, Any]] = {}
        self.stages: dict[str, dict[str, Any]] = {}
        self.history: dict[tuple[str, str], Series] = {}
        self.version = 0
        self.nodes: dict[str, NodeState] = {}
        # (version, time, node, "devices" | "stages", key) of every GPU or stage that went away, oldest first
        self.tombstones: deque[tuple[int, float, str, str, str]] = deque()
        self.forgotten = 0  # the version of the newest tombstone dropped: deltas start after it
        self._open: dict[tuple[str, str], float] = {}  # the start of each series' open rollup bucket
        self._closed: list[Rollup] = []
        self._tasks: list[asyncio.Task] = []  # held: the loop keeps only weak references to tasks
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.Event | None = None  # set (and replaced) at each tick
        self.tick = 0  # counts the ticks: a socket is sent at most one frame per tick
        self._tick_waiting = 0
        self.frames = Frames(self)

    # -- ingest ---------------------------------------------------------------------------------
    def ingest(self, message: Mapping[str, Any]) -> None:
        """Take one published message; anything malformed is skipped, not raised.

        ``services.telemetry_message`` is the one shape published: ``{"type": "telemetry.sample",
        "sample": {"node_id", "node", "received_at", "sent_at", "devices": [GpuMetrics], "stages":
        [StageStatus less pid, exit_code, restarts, message]}}``, one message per heartbeat (contracts
        §3), so every message is news.
        """
        sample = message.get("sample")
        if isinstance(sample, Mapping) and isinstance(sample.get("node"), str):
            self.version += 1
            self._ingest_sample(sample)
            self._forget(self.clock())

    def _ingest_sample(self, sample: Mapping[str, Any]) -> None:
        """Replace the node's GPUs and stages by the sample's; the ones it no longer lists go away."""
        node = sample["node"]
        state = self.nodes.get(node)
        if state is None:
            state = self.nodes[node] = NodeState()
        t = _number(sample.get("received_at"), self.clock())
        sent_at = _number(sample.get("sent_at"), t)
        before = {name: self.devices[name] for name in state.devices}
        devices, throttled = [], 0
        for metrics in sample.get("devices") or ():
            try:
                name = device_name(node, int(metrics["index"]))
            except (KeyError, TypeError, ValueError):
                continue
            values = [_number(metrics.get(f)) for f in GPU_FIELDS]
            throttle = tuple(metrics.get("throttle_reasons") or ())
            throttled += any(r in SLOWDOWN_REASONS for r in throttle)
            # Two decimals are plenty on a screen and keep a 1,000-GPU snapshot small.
            self.devices[name] = {"t": t, "sent_at": sent_at, "node": node, **_present(GPU_FIELDS, values, 2),
                                  "throttle": throttle}
            devices.append(name)
            self._record("device", name, t, values)
        stages = set()
        for status in sample.get("stages") or ():
            if not isinstance(status, Mapping) or not status.get("stage_key"):
                continue
            stats = status.get("stats") if isinstance(status.get("stats"), Mapping) else {}
            values = [_number(stats.get(f)) for f in STAGE_FIELDS]
            key = str(status["stage_key"])
            moved_from = self.stages.get(key, {}).get("node", node)
            if moved_from != node and moved_from in self.nodes:  # a stage moved: gone from its old node
                old = self.nodes[moved_from]
                old.stages.discard(key)
                old.changed(self.version, {name: self.devices[name] for name in old.devices})
                self._bury(moved_from, "stages", key)
            self.stages[key] = {
                "t": t, "sent_at": sent_at, "node": node, "state": status.get("state"),
                **{k: status.get(k) for k in ("deployment_id", "replica", "stage_index")},
                **_present(STAGE_FIELDS, values),
            }
            stages.add(key)
            if stats:
                self._record("stage", key, t, values)
        for name in set(state.devices) - set(devices):
            del self.devices[name]
            self._bury(node, "devices", name)
        for key in state.stages - stages:
            del self.stages[key]
            self._bury(node, "stages", key)
        state.devices, state.stages, state.throttled = tuple(devices), stages, throttled
        state.changed(self.version, before)

    def _bury(self, node: str, kind: str, key: str) -> None:
        self.tombstones.append((self.version, self.clock(), node, kind, key))

    def _forget(self, now: float) -> None:
        while self.tombstones and self.tombstones[0][1] < now - TOMBSTONE_KEEP_S:
            self.forgotten = self.tombstones.popleft()[0]

    def _record(self, kind: str, key: str, now: float, values: list[float]) -> None:
        """Keep the row in the series' history; a row in a later rollup bucket closes the open one,
        whose rollup is worked out from the history's rows then (not summed row by row: a Python
        loop over every field of every sample cost more than the rest of the ingest)."""
        series = self.history.get((kind, key))
        if series is None:
            series = self.history[(kind, key)] = Series(len(values))
        start = now - now % self.rollup_s
        opened = self._open.get((kind, key))
        if opened is not None and opened != start:
            self._closed.append(self._rollup(kind, key, opened))
        self._open[(kind, key)] = start
        series.append(now, values)
        series.drop_before(min(now - self.history_s, start))  # the open bucket's rows stay

    def _rollup(self, kind: str, key: str, start: float) -> Rollup:
        """The mean and peak of each field over the series' rows in the bucket from ``start``."""
        times, *columns = self.history[(kind, key)].columns_between(start, start + self.rollup_s)
        mean, peak = {}, {}
        for field, column in zip(FIELDS[kind], columns):
            seen = [v for v in column if v == v]  # not NaN
            if seen:
                mean[field], peak[field] = sum(seen) / len(seen), max(seen)
        return Rollup(kind, key, start, self.rollup_s, len(times), mean, peak)

    # -- reads ----------------------------------------------------------------------------------
    def snapshot_text(self) -> str:
        """The full current state of every node as one JSON text (``frames.py``'s snapshot frame)."""
        return self.frames.render(Subscription(), None)[1]

    async def next_tick(self, interval_s: float) -> int:
        """Wait for the next tick (every ``interval_s``, the first caller's) and return its number.

        Every browser socket wakes on the same tick; the frames they are sent are rendered once per
        tick for all sockets that want the same (``frames.py``), however many browsers are open.
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
        return self.tick

    async def _ticks(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if self._tick_waiting:
                self.tick += 1
                self.frames.new_tick()
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
        for (k, key), kept in list(self.history.items()):
            if k != kind or (wanted is not None and key not in wanted):
                continue
            times, *columns = kept.columns_between(since, float("inf"))
            series[key] = {"t": times} | {f: [_or_none(v) for v in column]
                                          for f, column in zip(fields, columns)}
        return series

    def take_closed_rollups(self, *, flush_all: bool = False) -> list[Rollup]:
        """Buckets that ended (and, with ``flush_all``, the open ones too), each returned once."""
        now = self.clock()
        for (kind, key), start in list(self._open.items()):
            if flush_all or start + self.rollup_s <= now:
                self._closed.append(self._rollup(kind, key, start))
                del self._open[(kind, key)]
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
            self.take(await layer.receive(self.channel))

    def take(self, message: Mapping[str, Any]) -> None:
        """``ingest``, logging what it raises: one bad message must not stop live telemetry for every
        browser, nor the agent's socket that handed it over (``services.telemetry_publish``)."""
        try:
            self.ingest(message)
        except Exception:
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


def _number(value: Any, default: float = _MISSING) -> float:
    """``value`` as a finite float, else ``default``; called for every field of every GPU a heartbeat
    reports, so the usual cases (a float, a missing field) take no exception."""
    if value is None:  # a field the card does not report (NVLink on a PCIe card)
        return default
    if value.__class__ is not float:
        try:
            value = float(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
            return default
    return value if value - value == 0.0 else default  # NaN and infinities give NaN


def _or_none(value: float) -> float | None:
    """NaN (a field the sample lacked) as JSON null."""
    return None if value != value else value


def _present(fields: tuple[str, ...], values: list[float], digits: int | None = None) -> dict[str, float]:
    """The values a sample has (not NaN) by field, rounded to ``digits`` decimals if given.

    ``round(v * 10**digits) / 10**digits`` rounds as ``round(v, digits)`` does but for exact halves,
    in half its time (called for every field of every GPU). A float past 1e15 has no decimals to lose
    and is kept as it is, so the product cannot overflow."""
    if digits is None:
        return {f: v for f, v in zip(fields, values) if v == v}
    scale = 10 ** digits
    return {f: (round(v * scale) / scale if -1e15 < v < 1e15 else v)
            for f, v in zip(fields, values) if v == v}
