"""Usage the database could not take (unreachable: a PostgreSQL restart, a failover), kept in this
process and written once it can be, so that a request served during the outage is still counted.

``usage_keep`` is how the gateway records usage: written at once when the database answers, else
queued behind what is already waiting (rows are written in the order they were served) and retried
every ``RETRY_S`` by a task on the server's event loop until the queue is empty. Bounded: past
``MAX_PENDING`` records the oldest is dropped, and said so. A process that dies with records queued
loses them (the figures live only here until written); the log names each record dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections

from controlplane.gateway.usage import usage_record

log = logging.getLogger(__name__)

RETRY_S = 1.0
MAX_PENDING = 10_000

_pending: deque[dict[str, Any]] = deque()
_lock = threading.Lock()
_retrying: asyncio.Task | None = None


def usage_keep(**figures: Any) -> None:
    """``usage_record(**figures)`` now, or later if the database cannot take it now (synchronous: the
    caller is on a thread that may use the database)."""
    with _lock:
        if _pending:  # behind what waits: a row is written in the order it was served
            _queue(figures)
            return
        try:
            usage_record(**figures)
        except DatabaseError as exc:
            log.warning("usage kept for later, the database is unreachable: %s", exc)
            _queue(figures)


def pending() -> int:
    return len(_pending)


def retry_soon() -> None:
    """Start the retry task on the running loop when records wait and none runs (async callers)."""
    global _retrying
    loop = asyncio.get_running_loop()
    if _pending and (_retrying is None or _retrying.done() or _retrying.get_loop() is not loop):
        _retrying = loop.create_task(_retry())


def flush() -> bool:
    """Write what waits, oldest first, until the database refuses; True when nothing waits."""
    with _lock:
        close_old_connections()  # the connection the outage broke is replaced, not reused
        while _pending:
            try:
                usage_record(**_pending[0])
            except DatabaseError:
                return False
            _pending.popleft()
        return True


def _queue(figures: dict[str, Any]) -> None:
    if len(_pending) >= MAX_PENDING:
        log.error("usage backlog full (%d records): dropped %s", MAX_PENDING, _pending.popleft())
    _pending.append(figures)


async def _retry() -> None:
    while not await sync_to_async(flush, thread_sensitive=True)():
        await asyncio.sleep(RETRY_S)
    log.info("usage kept during the database's outage is written")
