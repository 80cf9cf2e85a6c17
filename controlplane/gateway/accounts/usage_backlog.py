"""Usage records on their way to the database: queued in this process and written, in the order they
were served, by one writer task on the server's event loop (started with the process's other
services: controlplane/process_services.py).

Why not written by the request itself before its last bytes go out: on the embedded default (SQLite:
one writer at a time, IMMEDIATE transactions) every request that ended while the control plane wrote
(a plan applied, a reconcile, the agents' stage reports) would wait for that write before its client
saw the end; written that way, `benchmarks/replacement_bench.py --room beside` sees no request complete
for 0.5-0.7 s after each change's apply against 0.3 s in the steady state, and 0.3 s with the record
written after the response. A usage read of this process (the usage API, the dashboard, a token
budget's counter seeded anew) first writes what waits here (``flush``), so a client that reads its
usage after a response still finds it counted, and a budget counts it.

When the database cannot take a record (unreachable: a PostgreSQL restart, a failover) it waits and
the writer retries every ``RETRY_S`` until the queue is empty. Bounded: past ``MAX_PENDING`` records
the oldest is dropped, and said so. A process that dies with records queued loses them (the figures
live only here until written); the log names each record dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections import deque
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections

from controlplane.gateway.accounts.usage import usage_record

log = logging.getLogger(__name__)

RETRY_S = 1.0
MAX_PENDING = 10_000

_pending: deque[dict[str, Any]] = deque()
_lock = threading.Lock()  # the queue itself: held only to look at or change it, never across a write
_flushing = threading.Lock()  # one writer at a time, so the oldest record is written once
_writer: asyncio.Task | None = None
_wake: asyncio.Event | None = None  # set when records wait: the writer writes them


def usage_keep(**figures: Any) -> None:
    """Queue ``usage_record(**figures)`` (any thread); ``write_soon`` on the loop has it written."""
    with _lock:
        if len(_pending) >= MAX_PENDING:
            log.error("usage backlog full (%d records): dropped %s", MAX_PENDING, _pending.popleft())
        _pending.append(figures)


def pending() -> int:
    return len(_pending)


def writer_start() -> None:
    """Start this process's writer on the running loop, unless it runs there. In a context of its own
    (one inherited from the request that started it would outlive that request's thread-sensitive
    context), writing from a pool thread: a write that waits for the database holds up no
    thread-sensitive work of the gateway."""
    global _writer, _wake
    loop = asyncio.get_running_loop()
    if _writer is None or _writer.done() or _writer.get_loop() is not loop:
        _wake = asyncio.Event()
        _writer = loop.create_task(_serve(_wake), name="usage-writer", context=contextvars.Context())


def write_soon() -> None:
    """Have the writer write what waits (async callers, on the loop; the writer is started here when
    this loop has none, as when a test drives the gateway without the ASGI application)."""
    writer_start()
    if _pending:
        _wake.set()


def discard() -> None:
    """Drop what waits without writing it (a test's records, once its database is rolled back)."""
    with _lock:
        _pending.clear()


def flush() -> bool:
    """Write what waits, oldest first, until the database refuses; True when nothing waits. Also on a
    request's thread (a usage read), in its transaction: the connection is the caller's."""
    with _flushing:
        while True:
            with _lock:
                if not _pending:
                    return True
                figures = _pending[0]
            try:
                usage_record(**figures)
            except DatabaseError as exc:
                log.debug("usage not written, the database cannot take it now: %s", exc)
                return False
            with _lock:
                _pending.popleft()


def _flush_on_a_sound_connection() -> bool:
    """``flush`` from the writer's pool thread, whose connection lives on between runs: one an outage
    broke (or past its age) is replaced first, not reused."""
    close_old_connections()
    return flush()


async def _serve(wake: asyncio.Event) -> None:
    while True:
        await wake.wait()
        wake.clear()
        await _write()


async def _write() -> None:
    """Until nothing waits: a record queued while a flush finished is seen by the next turn."""
    failed = False
    while _pending:
        if await sync_to_async(_flush_on_a_sound_connection, thread_sensitive=False)():
            continue
        if not failed:
            log.warning("usage kept for later, the database cannot take it now (%d records)", len(_pending))
        failed = True
        await asyncio.sleep(RETRY_S)
    if failed:
        log.info("usage kept while the database could not take it is written")
