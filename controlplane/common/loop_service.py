"""One background service per running event loop, started on first use.

A process's keeper and flusher (``telemetry.keeper``, ``enrollment.heartbeats``) run as tasks on the
event loop of the ASGI application; tests and management commands run several loops one after the
other, and a task belongs to the loop that started it. So each is kept per loop: asked for on another
loop, or after its loop closed, a new one is started there.
"""

from __future__ import annotations

import asyncio
from typing import Generic, Protocol, TypeVar


class LoopService(Protocol):
    loop: asyncio.AbstractEventLoop | None

    def start(self) -> None: ...


S = TypeVar("S", bound=LoopService)


class OnePerLoop(Generic[S]):
    """``get()``: the service started on the running loop (``make()`` then ``start()`` the first time)."""

    def __init__(self, make: type[S]) -> None:
        self._make = make
        self.current: S | None = None

    def get(self) -> S:
        loop = asyncio.get_running_loop()
        if self.current is None or self.current.loop is not loop or loop.is_closed():
            self.current = self._make()
            self.current.start()
        return self.current
