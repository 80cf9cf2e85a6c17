"""Coalesced liveness writes for the agents' socket: one transaction per flush interval per process.

A heartbeat whose stages say nothing new (docs/deployments.md, "The agents' websocket") is not
written when it arrives: its connection notes it here, and every ``heartbeat_flush_interval_s()``
(0.5 s by default) the process's flusher records the latest one of every connection in one
transaction (``node_heartbeats_flush``). That keeps the database work of 125 agents at two small
transactions a second instead of 125, and Channels' single database thread free for what must be
prompt (stage events, changed stage states). Connections the flush finds stale (the node
re-registered, or was deleted) are refused and closed.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from channels.db import database_sync_to_async

from controlplane.common.loop_service import OnePerLoop
from controlplane.deployments.liveness import HeartbeatSeen, heartbeat_flush_interval_s, node_heartbeats_flush

logger = logging.getLogger(__name__)


class Connection(Protocol):
    node_id: int
    incarnation: int

    async def refuse(self, reason: str) -> None: ...


class HeartbeatFlusher:
    """The heartbeats noted since the last flush, the latest per connection."""

    def __init__(self):
        self.pending: dict[Connection, tuple[float, list[dict[str, Any]]]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self.flushes = 0

    def note(self, connection: Connection, *, received_at: float, stages: list[dict[str, Any]]) -> None:
        self.pending[connection] = (received_at, stages)

    def forget(self, connection: Connection) -> None:
        self.pending.pop(connection, None)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="agent-heartbeat-flush")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(heartbeat_flush_interval_s())
            try:
                await self.flush()
            except Exception:  # the next flush retries; liveness must not stop for one error
                logger.exception("agent heartbeats: flush failed")

    async def flush(self) -> None:
        if not self.pending:
            return
        batch, self.pending = list(self.pending.items()), {}
        seen = [HeartbeatSeen(node_id=c.node_id, incarnation=c.incarnation, stages=stages,
                              received_at=datetime.fromtimestamp(at, UTC))
                for c, (at, stages) in batch]
        try:
            refused = await database_sync_to_async(node_heartbeats_flush)(seen=seen)
        except Exception:
            for connection, noted in batch:  # keep them for the next flush unless superseded
                self.pending.setdefault(connection, noted)
            raise
        self.flushes += 1
        # A socket closed since its heartbeat was noted still had that heartbeat counted (above).
        for i, reason in refused.items():
            try:
                await batch[i][0].refuse(reason)
            except Exception:  # already gone: nothing to tell
                logger.debug("agent heartbeats: could not refuse a closed socket", exc_info=True)


_flushers = OnePerLoop(HeartbeatFlusher)


def running_flusher() -> HeartbeatFlusher:
    """This process's flusher, started on the running event loop unless it runs there (one per loop; at
    the ASGI application's start: controlplane/process_services.py)."""
    return _flushers.get()
