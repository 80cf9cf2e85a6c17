"""This process's keeper of the latest samples: the cache written off the event loop, coalesced.

A cache write costs a Redis round trip (service mode) or a file written and renamed (the embedded
default: about a millisecond); 125 agents' heartbeats a second on the event loop would be an eighth
of a core there, and every Redis hiccup a stall of every socket. So the agents' sockets only note
each sample here (a dict write), and every ``KEEP_INTERVAL_S`` (0.25 s) the keeper
writes the latest sample of every node noted since, in one ``services.telemetry_keep_many`` call on
a worker thread: readers see a sample at most an interval after it arrived.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import sync_to_async

from controlplane.common.loop_service import OnePerLoop
from controlplane.telemetry.services import telemetry_keep_many

logger = logging.getLogger(__name__)
# Short against the SUSPECT threshold (3 heartbeats), long against a cache write: a constant, not a setting.
KEEP_INTERVAL_S = 0.25


class SampleKeeper:
    """The samples noted since the last write, the latest per node."""

    def __init__(self):
        self.pending: dict[str, tuple[dict[str, Any], bool]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self.writes = 0

    def note(self, sample: dict[str, Any], *, new_node: bool = False) -> None:
        """Keep ``sample`` at the next write (``new_node``: the connection's first, so list the node)."""
        earlier = self.pending.get(sample["node"])
        self.pending[sample["node"]] = (sample, new_node or (earlier is not None and earlier[1]))

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="telemetry-keeper")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(KEEP_INTERVAL_S)
            try:
                await self.write()
            except Exception:  # the next interval writes newer samples anyway
                logger.exception("telemetry keeper: write failed")

    async def write(self) -> None:
        if not self.pending:
            return
        batch, self.pending = list(self.pending.values()), {}
        await sync_to_async(telemetry_keep_many, thread_sensitive=False)(batch)
        self.writes += 1


_keepers = OnePerLoop(SampleKeeper)


def running_keeper() -> SampleKeeper:
    """This process's keeper, started on the running event loop unless it runs there (one per loop; at
    the ASGI application's start: controlplane/process_services.py)."""
    return _keepers.get()
