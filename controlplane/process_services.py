"""This server process's own services, started in one place when the ASGI application starts.

Each ASGI server process runs, on its one event loop, a few services that belong to the process:

- the telemetry hub (``telemetry.runtime.running_hub``): subscribed to the channel layer, it keeps
  the history the dashboard draws and stores the 10 s rollups;
- the telemetry keeper (``telemetry.keeper.running_keeper``): writes the agents' latest samples to
  the shared cache off the event loop, a few times a second;
- the heartbeat flusher (``enrollment.heartbeats.running_flusher``): records the agents' liveness in
  one transaction per interval;
- the usage writer (``gateway.accounts.usage_backlog.writer_start``): writes the usage of ended
  requests to the database, in the order they were served;
- the gateway's serving state (``gateway.serving.runtime.gateway``): the served models, their
  routers and pipeline clients (its pollers start with its first read of the served models).

``process_services_start`` starts them all on the running event loop, once per loop (a new loop, as
each test has or a restarted server, gets fresh ones). The ASGI application calls it through
``WithProcessServices`` before it serves its first connection, HTTP or websocket (daphne sends no
lifespan events), and through ``lifespan`` at start-up under a server that sends them. Each
function above still starts its own service when it finds none on the loop: only code driven
without the ASGI application (tests calling a view or a consumer directly) relies on that.
"""

from __future__ import annotations

import asyncio
from typing import Any

from controlplane.enrollment.heartbeats import running_flusher
from controlplane.gateway.accounts.usage_backlog import writer_start
from controlplane.gateway.serving.runtime import gateway
from controlplane.telemetry.keeper import running_keeper
from controlplane.telemetry.runtime import running_hub

_started_on: asyncio.AbstractEventLoop | None = None


def process_services_start() -> None:
    """Start this process's services on the running event loop, unless they run there already."""
    global _started_on
    loop = asyncio.get_running_loop()
    if _started_on is loop:
        return
    running_hub()
    running_keeper()
    running_flusher()
    writer_start()
    gateway()
    _started_on = loop


class WithProcessServices:
    """ASGI wrapper: this process's services run before the wrapped application serves a connection."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send):
        process_services_start()
        return await self.app(scope, receive, send)


async def lifespan(scope, receive, send) -> None:
    """The ASGI lifespan protocol, for servers that speak it: the services start at start-up."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                process_services_start()
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
