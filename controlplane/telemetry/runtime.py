"""This server process's telemetry hub: started on the running event loop, subscribed to the
channel layer, its closed rollup buckets stored in the database (``rollups.rollups_store``).

The one place that wires the pure hub (``hub.py``) to Django's settings, the channel layer and the
rollup store, so that the hub and the store need not import each other.
"""

from __future__ import annotations

import asyncio

from channels.layers import get_channel_layer
from django.conf import settings

from controlplane.telemetry.hub import TelemetryHub
from controlplane.telemetry.rollups import rollups_store

_hub: TelemetryHub | None = None


def current_hub() -> TelemetryHub | None:
    """The hub of this process, if a socket started one (read by the REST views for history)."""
    return _hub


def running_hub() -> TelemetryHub:
    """This process's hub, started on the running event loop unless it runs there (at the ASGI
    application's start: controlplane/process_services.py).

    A hub belongs to one event loop (its tasks run there); a new loop (each test, or a restarted
    server) gets a fresh hub.
    """
    global _hub
    loop = asyncio.get_running_loop()
    if _hub is None or _hub.loop is not loop or loop.is_closed():
        _hub = TelemetryHub(history_s=settings.MOTLEY_TELEMETRY_HISTORY_S,
                            rollup_s=settings.MOTLEY_TELEMETRY_ROLLUP_S)
        _hub.start(get_channel_layer(), rollups_store)
    return _hub

