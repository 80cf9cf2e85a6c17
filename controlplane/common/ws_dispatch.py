"""Websocket consumers whose frames skip Channels' per-message sweep of old database connections.

Channels (4.2 on) awaits ``aclose_old_connections()`` before handing any message to a consumer's
handler: a hop to the one thread Django's database work runs on, and a wait behind whatever runs
there. On the agents' socket that is every heartbeat (1,250 a second at 10,000 GPUs), on the
dashboard's every ack; under the telemetry benchmark the hops cost 9 % of the server's CPU, half as
much as the handlers, and a heartbeat waited for a coalesced database flush it has no part in. Those
handlers reach the database only through ``database_sync_to_async``, which closes old connections
itself around each call, so the sweep before a received frame protects nothing. Connect and
disconnect keep it.
"""

from __future__ import annotations

from channels.consumer import get_handler_name

RECEIVE = "websocket.receive"


class FramesWithoutSweep:
    """Mixin for a websocket consumer: received frames go straight to their handler."""

    async def dispatch(self, message):
        if message.get("type") != RECEIVE:
            return await super().dispatch(message)
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        return await handler(message)
